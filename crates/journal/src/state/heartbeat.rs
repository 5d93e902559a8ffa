//! The lease heartbeat a run keeps while a step's action runs.
//!
//! A step's append renews the lease, but nothing renews it while the action itself runs: an
//! action longer than what was left of the lease would let another worker claim the run and
//! run the same action a second time. So while an action (or the waits between a step's
//! retries) is in flight, the run renews its lease every `lease_ttl / 3`, in the same task,
//! interleaved with the action's own polls. A heartbeat that finds the lease lost (or the run
//! cancelled) halts the run: it stops at its next boundary, and the action's result is refused
//! by fencing. An action shorter than a third of the lease never renews: the heartbeat costs a
//! timer and nothing else. While an action holds the instance row locked in its own fenced
//! transaction (a transaction step, `StepJournal::hold_lease`), the lock keeps every other
//! writer out, so the beats that come due meanwhile are skipped rather than sent to wait for it.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Instant;

use crate::state::{Halt, Run};
use crate::{Fence, Marker, Status};

impl Run {
    /// Runs `work` while keeping the run's lease alive. Unfenced runs have no lease to keep.
    pub(crate) async fn keep_alive<F: Future>(&self, work: F) -> F::Output {
        let Some(fence) = self.inner_fence() else {
            return work.await;
        };
        let mut work = pin!(work);
        let mut beat = pin!(self.heartbeat(fence));
        let mut beating = true;
        std::future::poll_fn(|cx| {
            if let Poll::Ready(out) = work.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            // A finished heartbeat (the lease is lost) must not be polled again.
            if beating && beat.as_mut().poll(cx).is_ready() {
                beating = false;
            }
            Poll::Pending
        })
        .await
    }

    fn inner_fence(&self) -> Option<Fence> {
        self.options.fence.clone()
    }

    /// Renews the lease every `lease_ttl / 3` until it is found lost or the run is terminal;
    /// a store error only skips one beat (the next one, or the append's fence, decides).
    async fn heartbeat(&self, fence: Fence) {
        let ttl = self.options.lease_ttl;
        let period = ttl / 3;
        loop {
            tokio::time::sleep(period).await;
            if self.state().leases_held > 0 {
                // The row is locked by the run's own transaction: nobody can take the lease
                // over, and a renewal would only wait for that transaction (see the module).
                continue;
            }
            let asked = Instant::now();
            match self.store.instance_confirm(&self.key, &fence, ttl).await {
                Ok(Status::Running | Status::Suspended) => self.confirmed(asked),
                Ok(status) => {
                    let marker = match status {
                        Status::Completed => Marker::Completed,
                        Status::Failed => Marker::Failed,
                        _ => Marker::Cancelled,
                    };
                    self.halt(Halt::Terminal(marker));
                    return;
                }
                Err(error) if error.is_lease_lost() => {
                    self.store_failed("__workflow_heartbeat__", error);
                    return;
                }
                Err(_) => {}
            }
        }
    }
}
