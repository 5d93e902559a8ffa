//! A start made beside a running worker of the same handle: the run is started leased to that
//! worker's loop and handed to it in memory (`keiro_resume::HandOffs`), so the caller that
//! then awaits its result waits for the run alone, not for a notification and a claim first.

use std::time::Instant;

use keiro_journal::store::{encode_payload, StartRequest, INPUT_STEP};
use keiro_journal::{InstanceKey, Started};
use keiro_lease::ClaimOutcome;
use keiro_resume::{NotDelivered, Reservation};
use serde::Serialize;

use crate::{Error, Keiro};

impl Keiro {
    /// [`start`](Self::start) through a worker loop of this handle that serves `key`'s
    /// workflow and has room, when one does; `None` when none does (start it the ordinary
    /// way).
    pub(crate) async fn start_handed_off<I: Serialize + ?Sized>(
        &self,
        key: &InstanceKey,
        input: &I,
    ) -> Option<Result<Started, Error>> {
        let reservation = self.hand_offs.reserve(&key.name, self.app_version())?;
        Some(self.start_reserved(key, input, reservation).await)
    }

    async fn start_reserved<I: Serialize + ?Sized>(
        &self,
        key: &InstanceKey,
        input: &I,
        reservation: Reservation,
    ) -> Result<Started, Error> {
        let input =
            encode_payload(INPUT_STEP, input, self.payload_len_max).map_err(Error::Payload)?;
        let request = StartRequest::new(key.clone(), input);
        // The lease is granted no earlier than this: the loop's first confirmation time.
        let asked = Instant::now();
        let started = self
            .store
            .instance_start_claimed(&request, reservation.owner(), reservation.ttl(), None)
            .await?;
        let ClaimOutcome::Acquired(claim) = started.claim else {
            // It existed and is not claimable now (running elsewhere, parked, ended): what a
            // start answers for it, read the ordinary way.
            drop(reservation);
            return Ok(self.store.instance_start(&request).await?);
        };
        let instance = claim.instance.clone();
        if let Err(NotDelivered(claim)) = reservation.deliver(claim, asked) {
            // The loop stopped meanwhile, or serves another version: the lease goes back so
            // that any worker claims the run now; failing that, it expires.
            if let Err(error) = self
                .store
                .instance_release(&claim.instance.key, &claim.fence, false)
                .await
            {
                tracing::warn!(key = %claim.instance.key, %error, "a started run's lease was not given back");
            }
        }
        Ok(Started {
            instance,
            created: started.created,
        })
    }
}
