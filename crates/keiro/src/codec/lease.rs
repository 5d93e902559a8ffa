//! [`LeaseStore`] and [`QueueStore`] through the codec: a claim hands the run its instance
//! and journal opened (a claim it cannot open is handed back with a backoff); a start's or a
//! debounce's input is sealed.

use std::time::Duration;

use keiro_journal::queue::{DebounceRequest, QueueInfo, QueueSpec};
use keiro_journal::store::{storable_text, Result, StartRequest};
use keiro_journal::{Fence, InstanceKey, Started, StoreError, WorkflowName};
use keiro_lease::{
    crash_delay, Claim, ClaimBatch, ClaimOutcome, Crash, CrashOutcome, LeaseStore, OpenRefusal,
    QueueStore, RefusalOutcome, ResurrectOutcome, StartClaim, Versions,
};
use time::OffsetDateTime;

use super::{Sealing, OPEN_REFUSED, OPEN_REFUSED_BACKOFF};

/// What a refused claim records after [`OPEN_REFUSED`]: the codec's own words (which key,
/// what went wrong), without the operation the store error adds.
fn open_refusal(error: &StoreError) -> String {
    match error {
        StoreError::Codec { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

const CLAIM: &str = "claiming an instance (payload codec)";
const START: &str = "starting an instance (payload codec)";

impl<T: LeaseStore + ?Sized> Sealing<T> {
    /// `claims` opened. A claim the codec cannot open (its payloads are sealed with a key this
    /// process lacks, or an envelope is corrupt) is handed back at once
    /// ([`refuse`](Self::refuse)), so the run is claimed again only after a growing backoff
    /// and says why it does not progress; it is logged with the key id. The claims that opened
    /// are returned; when none did, the first error is.
    async fn open_or_release(&self, claims: Vec<Claim>) -> Result<Vec<Claim>> {
        let mut opened = Vec::with_capacity(claims.len());
        let mut refused = None;
        for claim in claims {
            let (key, fence) = (claim.instance.key.clone(), claim.fence.clone());
            let refusals = claim.instance.open_refusals;
            match self.open_claim(CLAIM, claim) {
                Ok(claim) => opened.push(claim),
                Err(error) => {
                    self.refuse(&key, &fence, refusals, &error).await;
                    refused.get_or_insert(error);
                }
            }
        }
        match refused {
            Some(error) if opened.is_empty() => Err(error),
            _ => Ok(opened),
        }
    }

    /// Hands back a claim whose payload could not be opened
    /// ([`LeaseStore::instance_refuse_open`]), which is not a crash: `last_error` says which key
    /// it needs, the run's open refusals count it, and the next claim waits
    /// [`OPEN_REFUSED_BACKOFF`]'s rung for the `refusals` it had (the run's queue slot, if any,
    /// is given back meanwhile). Its attempts stay, so a worker that holds the key runs it with
    /// its whole crash budget, as it would have. Best effort, like the release it replaces:
    /// when the hand-back fails the lease is released plainly, and when that fails too the
    /// lease expires.
    async fn refuse(&self, key: &InstanceKey, fence: &Fence, refusals: i32, error: &StoreError) {
        let refusal = OpenRefusal {
            error: storable_text(&format!("{OPEN_REFUSED}{}", open_refusal(error))).into_owned(),
            retry_delay: crash_delay(&OPEN_REFUSED_BACKOFF, refusals),
        };
        match self.inner.instance_refuse_open(key, fence, &refusal).await {
            Ok(RefusalOutcome::Released {
                refusals,
                next_attempt_at,
            }) => {
                tracing::warn!(%key, %error, refusals, %next_attempt_at,
                    "a claimed run's payload cannot be opened; released until its backoff passes");
            }
            Ok(RefusalOutcome::AlreadyTerminal) => {}
            Err(record) if record.is_lease_lost() => {}
            Err(record) => {
                tracing::warn!(%key, %error, %record,
                    "a claimed run's payload cannot be opened; released without a backoff");
                let _ = self.inner.instance_release(key, fence, false).await;
            }
        }
    }

    async fn open_or_release_outcome(&self, outcome: ClaimOutcome) -> Result<ClaimOutcome> {
        Ok(match outcome {
            ClaimOutcome::Acquired(claim) => {
                let mut opened = self.open_or_release(vec![*claim]).await?;
                ClaimOutcome::Acquired(Box::new(opened.remove(0)))
            }
            other => other,
        })
    }
}

#[async_trait::async_trait]
impl<T: LeaseStore + ?Sized> LeaseStore for Sealing<T> {
    async fn instances_runnable(
        &self,
        now: Option<OffsetDateTime>,
        limit: Option<i64>,
    ) -> Result<Vec<InstanceKey>> {
        self.inner.instances_runnable(now, limit).await
    }

    async fn instance_claim_serving(
        &self,
        key: &InstanceKey,
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        let outcome = self
            .inner
            .instance_claim_serving(key, versions, owner, ttl, now)
            .await?;
        self.open_or_release_outcome(outcome).await
    }

    async fn instances_claim_batch_serving(
        &self,
        names: &[WorkflowName],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        let claims = self
            .inner
            .instances_claim_batch_serving(names, versions, owner, ttl, limit, now)
            .await?;
        self.open_or_release(claims).await
    }

    async fn queue_admit_serving(
        &self,
        queues: &[String],
        names: &[WorkflowName],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        let claims = self
            .inner
            .queue_admit_serving(queues, names, versions, owner, ttl, limit, now)
            .await?;
        self.open_or_release(claims).await
    }

    async fn claim_and_admit_serving(
        &self,
        names: &[WorkflowName],
        queues: &[String],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimBatch> {
        let batch = self
            .inner
            .claim_and_admit_serving(names, queues, versions, owner, ttl, limit, now)
            .await?;
        let claimed = self.open_or_release(batch.claimed).await;
        let admitted = self.open_or_release(batch.admitted).await;
        // A side whose every claim was refused is an error only when nothing else opened.
        match (claimed, admitted) {
            (Ok(claimed), Ok(admitted)) => Ok(ClaimBatch { claimed, admitted }),
            (Ok(claimed), Err(error)) if claimed.is_empty() => Err(error),
            (Err(error), Ok(admitted)) if admitted.is_empty() => Err(error),
            (Err(error), Err(_)) => Err(error),
            (Ok(claimed), Err(_)) => Ok(ClaimBatch {
                claimed,
                admitted: Vec::new(),
            }),
            (Err(_), Ok(admitted)) => Ok(ClaimBatch {
                claimed: Vec::new(),
                admitted,
            }),
        }
    }

    async fn instance_start_claimed(
        &self,
        request: &StartRequest,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<StartClaim> {
        let request = self.seal_start(START, request)?;
        let started = self
            .inner
            .instance_start_claimed(&request, owner, ttl, now)
            .await?;
        Ok(StartClaim {
            created: started.created,
            claim: self.open_or_release_outcome(started.claim).await?,
        })
    }

    async fn instance_lease_renew(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<()> {
        self.inner.instance_lease_renew(key, fence, ttl).await
    }

    async fn instance_release(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        progressed: bool,
    ) -> Result<bool> {
        self.inner.instance_release(key, fence, progressed).await
    }

    async fn instance_lease_force_release(&self, key: &InstanceKey) -> Result<bool> {
        self.inner.instance_lease_force_release(key).await
    }

    async fn instance_record_crash(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        crash: &Crash,
    ) -> Result<CrashOutcome> {
        self.inner.instance_record_crash(key, fence, crash).await
    }

    async fn instance_refuse_open(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        refusal: &OpenRefusal,
    ) -> Result<RefusalOutcome> {
        self.inner.instance_refuse_open(key, fence, refusal).await
    }

    async fn instance_resurrect(&self, key: &InstanceKey) -> Result<ResurrectOutcome> {
        self.inner.instance_resurrect(key).await
    }
}

#[async_trait::async_trait]
impl<T: QueueStore + ?Sized> QueueStore for Sealing<T> {
    async fn queue_declare(&self, spec: &QueueSpec) -> Result<()> {
        self.inner.queue_declare(spec).await
    }

    async fn queue_set_paused(&self, queue: &str, paused: bool) -> Result<bool> {
        self.inner.queue_set_paused(queue, paused).await
    }

    async fn queue_key_weight(&self, queue: &str, key: &str, weight: i32) -> Result<bool> {
        self.inner.queue_key_weight(queue, key, weight).await
    }

    async fn queue_debounce(&self, request: &DebounceRequest) -> Result<Started> {
        let request = DebounceRequest {
            input: self.seal(START, &request.input)?,
            ..request.clone()
        };
        let started = self.inner.queue_debounce(&request).await?;
        self.open_started(START, started)
    }

    async fn queues_list(
        &self,
        only: Option<&str>,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<QueueInfo>> {
        self.inner.queues_list(only, now).await
    }
}
