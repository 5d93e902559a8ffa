//! The storage side of remote steps: what a worker asks of a transport, and what an operator
//! asks of the store.
//!
//! The workflow side (writing a task in its own transaction) is
//! [`JournalStore::remote_arm`](keiro_journal::JournalStore::remote_arm), beside the other
//! wake sources. The rule-by-rule contract of every operation is in `docs/store-contract.md`.

use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use keiro_journal::{Backoff, Generation, InstanceKey, StoreError};

/// `Result` with the store's error.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What a worker asks for when it claims tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The groups the worker serves (`<step>` or `<step>@<partition>`).
    pub groups: Vec<String>,
    /// Who claims, for inspection (`claimed_by`).
    pub worker: String,
    /// At most this many tasks.
    pub limit: u32,
    /// How long the claim lasts without a heartbeat. A task whose claim expired is claimable
    /// again, so a killed worker's tasks are picked up by another one; the expiry counts as a
    /// failed attempt, so a handler that kills its process cannot run forever.
    pub claim_ttl: Duration,
}

/// A task a worker claimed.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedTask {
    /// The stable step id, `<name>/<id>/<generation>/<step>`: the same on every dispatch, so a
    /// handler with side effects can deduplicate on it.
    pub step_id: String,
    /// This claim; heartbeats and failure reports must carry it.
    pub claim: Uuid,
    /// The workflow instance that dispatched the task.
    pub key: InstanceKey,
    /// Its generation.
    pub generation: Generation,
    /// The remote step's name, which names the handler.
    pub step: String,
    /// The group it was routed to.
    pub group: String,
    /// The handler's input.
    pub input: Value,
    /// Its priority.
    pub priority: i32,
    /// The W3C `traceparent` of the dispatching span.
    pub traceparent: Option<String>,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// Attempts in all.
    pub max_attempts: u32,
    /// The delays between attempts.
    pub backoff: Backoff,
    /// How many times the task has been dispatched (1 + redispatches).
    pub dispatches: u32,
    /// When the task became claimable (its dispatch, or the end of its retry backoff).
    pub available_at: OffsetDateTime,
}

/// A handler's failure, as reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskFailure {
    /// What went wrong, for humans.
    pub message: String,
    /// A machine-readable code, if the handler gave one.
    pub code: Option<String>,
    /// `false` fails the step at once, whatever retries remain.
    pub retryable: bool,
}

/// What a report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportOutcome {
    /// The result was journaled into the owner, whose row was flipped to runnable.
    Delivered,
    /// The task was settled, but its owner is terminal or on another generation, so nothing
    /// was journaled.
    OwnerGone,
    /// The failure was retryable and attempts remain: the task is pending again, claimable at
    /// `at`.
    Retrying {
        /// When it becomes claimable.
        at: OffsetDateTime,
    },
    /// The task already had its result (a late or duplicate report); nothing changed.
    AlreadySettled,
    /// The failure came from a claim that is no longer the task's (it was redispatched or
    /// re-claimed after expiry); it is ignored, the current claimant's report counts.
    Stale,
    /// No task has this step id.
    NotFound,
    /// The task was cancelled: its run was cancelled, or left the task's generation by
    /// continuing as new. The report is refused and nothing is journaled; a failure is not
    /// retried.
    Cancelled,
}

/// What a heartbeat learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatOutcome {
    /// The claim is the task's and was extended.
    Extended,
    /// The claim is no longer the task's (the task was redispatched, re-claimed after the
    /// claim expired, or settled), or there is no such task. The handler may go on: a success
    /// still counts (first result wins), a failure will be ignored as stale.
    Lost,
    /// The task was cancelled (see [`ReportOutcome::Cancelled`]): the handler should stop, and
    /// whatever it reports is refused.
    Cancelled,
}

/// The state of a remote task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    /// Waiting for a worker (possibly until the end of a backoff).
    Pending,
    /// Claimed by a worker.
    Running,
    /// Its output was reported.
    Completed,
    /// It failed for good.
    Failed,
    /// Its run was cancelled, or continued as new on another generation, before it settled:
    /// it is never claimed again and its reports are refused.
    Cancelled,
}

impl TaskStatus {
    /// The text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses the `status` column.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => Self::Pending,
            "running" => Self::Running,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }
}

/// A remote task as stored, for operators and tests.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteTask {
    /// The stable step id.
    pub step_id: String,
    /// The owner.
    pub key: InstanceKey,
    /// The owner's generation.
    pub generation: Generation,
    /// The remote step's name.
    pub step: String,
    /// Where its result is journaled (`remote:<step>`, or `remote:<step>#<n>` after `n`
    /// requeues).
    pub journal_step: String,
    /// The group.
    pub group: String,
    /// Its state.
    pub status: TaskStatus,
    /// Failed attempts so far: reported failures and expired claims.
    pub attempts: u32,
    /// Attempts in all.
    pub max_attempts: u32,
    /// Dispatches so far (1 + redispatches).
    pub dispatches: u32,
    /// The current claimant, while running.
    pub claimed_by: Option<String>,
    /// The last failure, as `{message, code, retryable}`.
    pub last_error: Option<Value>,
    /// The reported output, once completed.
    pub output: Option<Value>,
    /// The W3C `traceparent` it carries.
    pub traceparent: Option<String>,
}

/// The worker-facing side of remote steps: claim, heartbeat, report.
///
/// The default transport is the Postgres task table (`keiro-postgres`), where a task is
/// written in the dispatching run's transaction and a report is one transaction that settles
/// the task and journals the result. The contract, so another transport (a broker such as
/// NATS JetStream) can be added: a task is delivered at least once per dispatch; a claim is
/// exclusive until it expires; `task_complete` is idempotent by step id and accepted from any
/// claimant (first result wins); `task_fail` counts only for the current claim; a report must
/// reach the journal store in one transaction with the task's settlement (a broker transport
/// relays reports to it rather than settling them itself); a task the journal store cancelled
/// with its run is never claimed again, and its heartbeats and reports answer `Cancelled`.
#[async_trait::async_trait]
pub trait Transport: Send + Sync + std::fmt::Debug + 'static {
    /// Claims up to `limit` tasks of the groups: pending tasks that are available, and claimed
    /// tasks whose claim expired, highest priority first, then oldest. Concurrent claimers never
    /// get the same task (`FOR UPDATE SKIP LOCKED`).
    ///
    /// An expired claim counts as a failed attempt, in the same transaction: at the task's
    /// `max_attempts` the task is failed with code
    /// [`RemoteStepError::CRASHED`](keiro_journal::RemoteStepError::CRASHED) and its error
    /// envelope is journaled into the owner (flipping its row) instead of being claimed.
    async fn tasks_claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedTask>>;

    /// Extends a claim to `now + ttl` while it is the task's
    /// ([`Extended`](HeartbeatOutcome::Extended)); tells a claimant whose task was cancelled
    /// ([`Cancelled`](HeartbeatOutcome::Cancelled), whatever the claim), and any other one
    /// that it lost its claim ([`Lost`](HeartbeatOutcome::Lost)).
    async fn task_heartbeat(
        &self,
        step_id: &str,
        claim: Uuid,
        ttl: Duration,
    ) -> Result<HeartbeatOutcome>;

    /// Reports a handler's output: settles the task `completed` and journals `{"ok": output}`
    /// into the owner under the task's journal step, flipping its row, in one transaction. A
    /// cancelled task refuses it ([`ReportOutcome::Cancelled`]).
    async fn task_complete(&self, step_id: &str, output: &Value) -> Result<ReportOutcome>;

    /// Reports several outputs at once: each as by [`task_complete`](Self::task_complete), with
    /// one outcome per report in order. A transport that can settle them in one transaction
    /// should (the Postgres one does: a busy worker then pays one commit for many results);
    /// the default reports them one by one.
    ///
    /// An output the store refuses ([`StoreError::ValueRefused`]) fails the whole call: in one
    /// transaction nothing is settled; with the default, the reports before it are. Either
    /// way the worker then reports the batch again one report at a time, so only the refused
    /// one fails (a report that already landed answers
    /// [`AlreadySettled`](ReportOutcome::AlreadySettled)).
    async fn tasks_complete(&self, reports: &[(String, Value)]) -> Result<Vec<ReportOutcome>> {
        let mut outcomes = Vec::with_capacity(reports.len());
        for (step_id, output) in reports {
            outcomes.push(self.task_complete(step_id, output).await?);
        }
        Ok(outcomes)
    }

    /// Reports a handler's failure for `claim`. With attempts left and `retryable`, the task is
    /// pending again after `retry_delay`; otherwise it is failed and
    /// `{"error": {message, code, retryable, attempts}}` is journaled into the owner, in one
    /// transaction. A cancelled task refuses it ([`ReportOutcome::Cancelled`]), whatever the
    /// claim: it is not retried.
    async fn task_fail(
        &self,
        step_id: &str,
        claim: Uuid,
        failure: &TaskFailure,
        retry_delay: Duration,
    ) -> Result<ReportOutcome>;
}

/// What a requeue did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequeueOutcome {
    /// The instance is runnable again.
    Requeued {
        /// Steps superseded by a `StepReset` (failed remote steps, awaited child failures),
        /// in this instance and in requeued children.
        reset_steps: u64,
        /// Children requeued with it, in the order they were requeued.
        children: Vec<InstanceKey>,
    },
    /// The instance is not failed; nothing changed.
    NotFailed(keiro_journal::Status),
    /// No such instance.
    NotFound,
}

/// What a fix-and-replay start did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryOutcome {
    /// The retry instance was created.
    Started(InstanceKey),
    /// It already existed (same key): nothing changed.
    Exists(InstanceKey),
    /// The origin does not exist.
    OriginNotFound,
}

/// The operator's recovery tools, each one transaction.
#[async_trait::async_trait]
pub trait RemoteAdmin: Send + Sync + std::fmt::Debug + 'static {
    /// Re-dispatches every pending or claimed remote task of the instance's current generation
    /// (same step id, claim dropped, available now, `dispatches + 1`) and returns how many;
    /// `None` for an unknown instance.
    async fn remote_redispatch_pending(&self, key: &InstanceKey) -> Result<Option<u64>>;

    /// Requeues a failed instance (the operator's retry):
    ///
    /// - each failed remote step's journaled error is superseded by a `StepReset` and its task
    ///   is pending again, attempts 0, available now (journaled next under `remote:<step>#<n>`);
    /// - each awaited child's journaled failure is superseded too; if the child (or a
    ///   `<id>~retry~<hex>` fix of it) has since completed, its output is journaled at once;
    ///   if the child is failed, it is requeued too (cycles guarded); otherwise its next result
    ///   lands when it finishes;
    /// - the failure stays in history, a `Resurrected` event is appended, the error and crash
    ///   counters are cleared and the row is `running` (notified).
    ///
    /// Nothing recorded is rewritten.
    async fn instance_requeue(&self, key: &InstanceKey) -> Result<RequeueOutcome>;

    /// Starts `retry` (`<origin id>~retry~<8 hex>`) of the origin's workflow with `input` and a
    /// clean history, linked to the origin's parent so that its success (only its success) is
    /// also journaled where the parent awaits the origin.
    async fn instance_retry_with_input(
        &self,
        origin: &InstanceKey,
        retry: &InstanceKey,
        input: &Value,
    ) -> Result<RetryOutcome>;

    /// Every remote task of an instance, oldest first.
    async fn remote_tasks(&self, key: &InstanceKey) -> Result<Vec<RemoteTask>>;
}
