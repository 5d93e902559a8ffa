//! The storage contract of leases, discovery and crash accounting.

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{store::StartRequest, Fence, InstanceKey, JournalStore, Status, WorkflowName};
use time::OffsetDateTime;

use crate::{classify_refusal, Claim, ClaimBatch, ClaimGate, ClaimOutcome, Crash, CrashOutcome};
use crate::{OpenRefusal, RefusalOutcome, ResurrectOutcome, StartClaim, Versions};

/// Lease, discovery and crash operations, each one transaction.
///
/// `now` parameters pin the clock in tests; `None` uses the store's clock (the database's
/// `now()` for Postgres), so the database decides lease expiry.
#[async_trait::async_trait]
pub trait LeaseStore: JournalStore {
    /// Exact discovery: instances `running`, or `suspended` with `wake_after <= now`, highest
    /// priority first, then oldest. One index query, whatever the number of parked instances.
    async fn instances_runnable(
        &self,
        now: Option<OffsetDateTime>,
        limit: Option<i64>,
    ) -> Result<Vec<InstanceKey>>;

    /// Claims `key` for `owner` until `now + ttl` with one conditional update: runnable, lease
    /// free or expired, backoff gate passed. A granted claim bumps the epoch and carries the row
    /// and the current generation's journal; a refusal is classified.
    async fn instance_claim(
        &self,
        key: &InstanceKey,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        self.instance_claim_serving(key, &Versions::Any, owner, ttl, now)
            .await
    }

    /// [`instance_claim`](Self::instance_claim), granted only when the run's version is one
    /// `versions` serves: a run of another version is refused, unchanged (`Unavailable`, or
    /// `LeaseHeld` / `Paced` when that is also true of it).
    async fn instance_claim_serving(
        &self,
        key: &InstanceKey,
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome>;

    /// Claims up to `limit` runnable instances whose workflow name is in `names` for `owner`
    /// until `now + ttl`, in one round trip: runnable as in
    /// [`instances_runnable`](Self::instances_runnable), lease free or expired, backoff gate
    /// open; highest priority first, then oldest. Rows another claimer holds at that moment are
    /// skipped (`SKIP LOCKED`), never waited for, never claimed twice. Each claim carries the
    /// row after the claim and its current generation's journal, like
    /// [`instance_claim`](Self::instance_claim). Worker loops use this; the exact seed pass
    /// (`resume_once`) discovers and classifies instead.
    async fn instances_claim_batch(
        &self,
        names: &[WorkflowName],
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        self.instances_claim_batch_serving(names, &Versions::Any, owner, ttl, limit, now)
            .await
    }

    /// [`instances_claim_batch`](Self::instances_claim_batch) of the runs whose version is
    /// one `versions` serves; the others are passed over, as leased ones are.
    async fn instances_claim_batch_serving(
        &self,
        names: &[WorkflowName],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>>;

    /// Admits and claims up to `limit` waiting runs of the queues `queues` whose workflow
    /// name is in `names`, for `owner` until `now + ttl`: the claim that enforces each queue's
    /// limits (concurrency fleet-wide, per worker and per key; rate fleet-wide and per key),
    /// its order (priority when on, then age) and its fairness across keys, in one
    /// transaction. Paused queues admit nothing. Each claim carries its row and journal as in
    /// [`instances_claim_batch`](Self::instances_claim_batch). A run keeps its slot until it
    /// ends, parks (when its queue releases slots on park), crashes, or its lease expires;
    /// meanwhile [`instances_claim_batch`](Self::instances_claim_batch) may claim it again,
    /// and never claims a run without one.
    async fn queue_admit(
        &self,
        queues: &[String],
        names: &[WorkflowName],
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        self.queue_admit_serving(queues, names, &Versions::Any, owner, ttl, limit, now)
            .await
    }

    /// [`queue_admit`](Self::queue_admit) of the runs whose version is one `versions`
    /// serves; the others wait on.
    #[allow(clippy::too_many_arguments)] // queue_admit's, and the versions
    async fn queue_admit_serving(
        &self,
        queues: &[String],
        names: &[WorkflowName],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>>;

    /// A worker's claim: up to `limit` runs as
    /// [`instances_claim_batch`](Self::instances_claim_batch) claims them, then, with the room
    /// left and when `queues` names any, waiting runs of those queues as
    /// [`queue_admit`](Self::queue_admit) admits them. A store may do both in one transaction
    /// (PostgreSQL does: one round trip and one commit). Here, the two calls: an admission
    /// that fails after runs were claimed leaves them claimed and admits nothing (the next
    /// claim tries the queues again); with nothing claimed its error is the answer.
    async fn claim_and_admit(
        &self,
        names: &[WorkflowName],
        queues: &[String],
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimBatch> {
        self.claim_and_admit_serving(names, queues, &Versions::Any, owner, ttl, limit, now)
            .await
    }

    /// [`claim_and_admit`](Self::claim_and_admit) of the runs whose version is one
    /// `versions` serves: the worker's claim.
    #[allow(clippy::too_many_arguments)] // claim_and_admit's, and the versions
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
        let claimed = self
            .instances_claim_batch_serving(names, versions, owner, ttl, limit, now)
            .await?;
        let room = limit.saturating_sub(i64::try_from(claimed.len()).unwrap_or(i64::MAX));
        let admitted = if room > 0 && !queues.is_empty() {
            match self
                .queue_admit_serving(queues, names, versions, owner, ttl, room, now)
                .await
            {
                Ok(admitted) => admitted,
                Err(error) if claimed.is_empty() => return Err(error),
                Err(_) => Vec::new(),
            }
        } else {
            Vec::new()
        };
        Ok(ClaimBatch { claimed, admitted })
    }

    /// Starts `request`'s instance already leased to `owner` until `now + ttl`, for a caller
    /// that drives the run itself at once (direct execution): no worker is notified, and no
    /// claim round trip follows. Idempotent by key like
    /// [`instance_start`](JournalStore::instance_start): an existing instance keeps its input
    /// and is claimed only when a worker could claim it now (running, or suspended with a due
    /// `wake_after`; lease free or expired; backoff gate open), by the same conditional
    /// update as [`instance_claim`](Self::instance_claim); otherwise it is left alone and the
    /// refusal is classified. See [`StartClaim`].
    ///
    /// The default implementation is [`instance_start`](JournalStore::instance_start) and
    /// then, when the row is runnable, [`instance_claim`](Self::instance_claim): two
    /// transactions, between which a worker woken by the start may claim the instance first
    /// (the caller then finds it leased and awaits it). The Postgres and memory stores do it
    /// in one transaction and do not notify.
    async fn instance_start_claimed(
        &self,
        request: &StartRequest,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<StartClaim> {
        let started = self.instance_start(request).await?;
        let row = &started.instance;
        let clock = now.unwrap_or_else(OffsetDateTime::now_utc);
        let runnable = match row.status {
            Status::Running => true,
            Status::Suspended => row.wake_after.is_some_and(|at| at <= clock),
            Status::Completed | Status::Failed | Status::Cancelled => false,
        };
        let claim = if runnable {
            self.instance_claim(&request.key, owner, ttl, now).await?
        } else {
            let gate = ClaimGate {
                status: row.status,
                lease_expires_at: row.lease_expires_at,
                next_attempt_at: row.next_attempt_at,
            };
            classify_refusal(Some(gate), clock).into()
        };
        Ok(StartClaim {
            created: started.created,
            claim,
        })
    }

    /// Renews a held lease to `now + ttl`.
    ///
    /// # Errors
    ///
    /// `LeaseLost` when the fence no longer matches.
    async fn instance_lease_renew(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<()>;

    /// Releases a held lease; when `progressed`, also resets attempts, open refusals, error and
    /// backoff gate.
    /// Returns `false` when the fence no longer matched (nothing changed).
    async fn instance_release(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        progressed: bool,
    ) -> Result<bool>;

    /// Operator escape hatch: drops whatever lease the instance has. The old holder stops at
    /// its next boundary because its epoch no longer matches. Returns whether a lease was dropped.
    async fn instance_lease_force_release(&self, key: &InstanceKey) -> Result<bool>;

    /// Records a crash of the run holding `fence` and releases its lease, in one transaction:
    /// attempts + 1, `last_error`, `next_attempt_at = now + retry_delay`; at `max_attempts`
    /// the run is failed instead (marker appended, row `failed`).
    async fn instance_record_crash(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        crash: &Crash,
    ) -> Result<CrashOutcome>;

    /// Hands back the lease of the run holding `fence`, whose payload the claiming worker could
    /// not open (it lacks the key), in one transaction: `open_refusals` + 1, `last_error`,
    /// `next_attempt_at = now + retry_delay`, lease cleared, the run's queue slot (if any) given
    /// back. It is not a crash: `attempts` stay, so a run refused any number of times keeps its
    /// whole crash budget for the worker that can open it. `open_refusals` resets wherever
    /// `attempts` does (a park, a completion, a continue-as-new, a release after progress, a
    /// resurrection).
    ///
    /// No default: the other operations could only record the refusal as a crash (spending
    /// the budget) or release without a gate (the run claimed again at every poll).
    ///
    /// # Errors
    ///
    /// `LeaseLost` when the fence no longer matches, `NotFound` when the instance does not
    /// exist.
    async fn instance_refuse_open(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        refusal: &OpenRefusal,
    ) -> Result<RefusalOutcome>;

    /// Returns a failed instance to `running` with fresh attempts, appending `Resurrected`; its
    /// failure history stays. It may fail again later.
    async fn instance_resurrect(&self, key: &InstanceKey) -> Result<ResurrectOutcome>;
}
