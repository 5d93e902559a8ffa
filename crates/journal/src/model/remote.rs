//! Remote steps, the vocabulary: how a remote step is dispatched ([`RemoteOptions`]), the task
//! a run writes for it ([`RemoteArm`]) and what the write found, the error a failed remote step
//! gives the body, and a handler's typed contract ([`RemoteHandlerDef`]). The workflow side is
//! [`Ctx::remote`](crate::Ctx::remote).

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use crate::model::id;
use crate::model::queue::{checked_queue, QueueError, QueueStart};
use crate::{Backoff, Fence, Generation, IdError, InstanceKey};

/// The default number of times a lost dispatch is re-dispatched before the step fails with
/// [`RemoteStepError::LOST`].
pub const REDISPATCH_MAX_DEFAULT: u32 = 10;

/// How a remote step is dispatched, retried and recovered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteOptions {
    /// The handler that runs the step: the task goes to the worker group `<handler>` (or
    /// `<handler>@<partition>`), served by a remote worker's `.handle("<handler>", ..)`, while
    /// the step keeps its own name as its journal key and step id. So one handler serves many
    /// steps of one run (`label-1`, `label-2`, ... all printed by `print-label`). Defaults to
    /// `None`: the step's name is its handler.
    pub handler: Option<String>,
    /// Routes the task to the worker group `<handler>@<partition>` instead of `<handler>`.
    /// Defaults to `None`.
    pub partition: Option<String>,
    /// Higher priorities are claimed first; equal priorities oldest first. Defaults to 0.
    pub priority: i32,
    /// How many times a failed attempt is retried (so `retries + 1` attempts in all).
    /// A failure reported as not retryable is never retried. A claim that expires without a
    /// report (the handler's process died) is a failed attempt too; at the last one the step
    /// fails with [`RemoteStepError::CRASHED`]. Defaults to 0.
    pub retries: u32,
    /// The delays between attempts. Defaults to [`Backoff::default`].
    pub backoff: Backoff,
    /// Opt-in recovery of a lost dispatch: when no result arrived this long after the task
    /// became available, re-dispatch the same step id (a worker may then run it twice, so
    /// handlers should be idempotent by step id). Defaults to `None` (off).
    pub redispatch_after: Option<Duration>,
    /// How many dispatches in all before the step fails with [`RemoteStepError::LOST`].
    /// Defaults to [`REDISPATCH_MAX_DEFAULT`].
    pub redispatch_max: u32,
    /// The declared queue whose limits the task is claimed under (concurrency, per worker,
    /// per key, rates, pause, fairness), across every worker group and remote worker process,
    /// and together with the runs started on the same queue. A task holds a slot while it is
    /// claimed (until it completes, fails or its claim expires); its first claim counts in the
    /// rate windows. An undeclared queue is refused when the task is armed. Defaults to `None`
    /// (claimed as soon as a worker has room).
    pub queue: Option<String>,
    /// The key the queue's per-key limits and fairness count the task under (a merchant, a
    /// tenant). Only with a queue. Defaults to `None`.
    pub key: Option<String>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            handler: None,
            partition: None,
            priority: 0,
            retries: 0,
            backoff: Backoff::default(),
            redispatch_after: None,
            redispatch_max: REDISPATCH_MAX_DEFAULT,
            queue: None,
            key: None,
        }
    }
}

impl RemoteOptions {
    /// Retries a failed attempt `retries` times with `backoff` between attempts.
    pub fn retries(mut self, retries: u32, backoff: Backoff) -> Self {
        self.retries = retries;
        self.backoff = backoff;
        self
    }

    /// Runs the step with `handler`'s workers (group `<handler>`) instead of the step name's;
    /// the step's name stays its journal key.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// use keiro_journal::RemoteOptions;
    /// let print = RemoteOptions::default().handler("print-label");
    /// let first: String = ctx.remote("label-1", &"parcel-1", &print).await?;
    /// let second: String = ctx.remote("label-2", &"parcel-2", &print).await?;
    /// # Ok(()) }
    /// ```
    pub fn handler(mut self, handler: impl Into<String>) -> Self {
        self.handler = Some(handler.into());
        self
    }

    /// Routes to the group `<handler>@<partition>`.
    pub fn partition(mut self, partition: impl Into<String>) -> Self {
        self.partition = Some(partition.into());
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Re-dispatches a task with no result after `after`, at most `max` dispatches in all.
    pub fn redispatch(mut self, after: Duration, max: u32) -> Self {
        self.redispatch_after = Some(after);
        self.redispatch_max = max.max(1);
        self
    }

    /// Claims the task under the limits of the declared queue `queue`, shared by every worker
    /// group, every remote worker and the runs started on that queue.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// use keiro_journal::RemoteOptions;
    /// // At most as many calls at once per merchant as the queue "payments" allows.
    /// let charge = RemoteOptions::default().queue("payments").key("merchant-42");
    /// let receipt: String = ctx.remote("charge", &1999, &charge).await?;
    /// # Ok(()) }
    /// ```
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// Counts the task under `key` for its queue's per-key limits and fairness.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The task's queue part, checked as a start's is ([`checked_queue`]).
    ///
    /// # Errors
    ///
    /// [`QueueError::NoQueue`] for a key without a queue, [`QueueError::InvalidName`] and
    /// [`QueueError::InvalidKey`].
    pub(crate) fn queue_start(&self) -> Result<Option<QueueStart>, QueueError> {
        let queue = self.queue.as_ref().map(|name| QueueStart {
            key: self.key.clone(),
            ..QueueStart::new(name.clone())
        });
        checked_queue(queue, &[("key", self.key.is_some())])
    }
}

/// The final failure of a remote step, as the body sees it: all retries are spent, the
/// handler said the failure is not retryable, the dispatch was lost too often, or the last
/// attempt's claim expired without a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("remote step {step:?} failed after {attempts} attempt(s): {message}")]
pub struct RemoteStepError {
    /// The remote step (its user name).
    pub step: String,
    /// The handler's message.
    pub message: String,
    /// The handler's error code, [`RemoteStepError::LOST`] or [`RemoteStepError::CRASHED`].
    pub code: Option<String>,
    /// Whether the handler called the last failure retryable.
    pub retryable: bool,
    /// How many attempts failed.
    pub attempts: u32,
}

impl RemoteStepError {
    /// The code of a step whose dispatch was lost `redispatch_max` times.
    pub const LOST: &'static str = "remote_step_lost";

    /// The code of a step whose last attempt ended with its claim expiring without a report:
    /// the handler's process died (killed, out of memory, aborted) or lost touch with the
    /// store. An expired claim counts as a failed attempt, so this comes after as many
    /// attempts as a retryable failure gets (`retries + 1`).
    pub const CRASHED: &'static str = "remote_step_crashed";

    /// Whether the dispatch was lost rather than failed by a handler.
    pub fn is_lost(&self) -> bool {
        self.code.as_deref() == Some(Self::LOST)
    }

    /// Whether the last attempt's claim expired without a report (see [`Self::CRASHED`]).
    pub fn is_crashed(&self) -> bool {
        self.code.as_deref() == Some(Self::CRASHED)
    }
}

/// The task a remote step writes, and what the dispatch knows of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteArm {
    /// The stable task id, `<name>/<id>/<generation>/<step>`: every dispatch of the step uses
    /// it, so handlers can deduplicate on it.
    pub step_id: String,
    /// The owner.
    pub key: InstanceKey,
    /// The owner's generation; the result is journaled into it and no other.
    pub generation: Generation,
    /// The remote step's user name, which is also the handler's name.
    pub step: String,
    /// The journal step the result is recorded under (`remote:<step>`).
    pub journal_step: String,
    /// The worker group: `<handler>` or `<handler>@<partition>`, where the handler is the
    /// step's name unless [`RemoteOptions::handler`] names another.
    pub group: String,
    /// The handler's input.
    pub input: Value,
    /// Claim priority, higher first.
    pub priority: i32,
    /// The W3C `traceparent` of the dispatching span, if tracing is exported.
    pub traceparent: Option<String>,
    /// Attempts in all (`retries + 1`).
    pub max_attempts: u32,
    /// The delays between attempts.
    pub backoff: Backoff,
    /// See [`RemoteOptions::redispatch_after`].
    pub redispatch_after: Option<Duration>,
    /// See [`RemoteOptions::redispatch_max`].
    pub redispatch_max: u32,
    /// The queue the task is claimed under ([`RemoteOptions::queue`]); the store refuses an
    /// undeclared one.
    pub queue: Option<String>,
    /// Its key on the queue ([`RemoteOptions::key`]); only with a queue.
    pub queue_key: Option<String>,
    /// The run's lease; a stale holder dispatches nothing.
    pub fence: Option<Fence>,
}

/// What arming a remote step did.
#[derive(Debug, Clone, PartialEq)]
pub enum RemoteArmOutcome {
    /// The task was written now.
    Dispatched {
        /// When the run should look again if no result arrives (the redispatch deadline).
        deadline: Option<OffsetDateTime>,
    },
    /// The task exists and waits for a worker or its result.
    Waiting {
        /// As for `Dispatched`.
        deadline: Option<OffsetDateTime>,
    },
    /// The task's redispatch deadline had passed with no result: it was dispatched again.
    Redispatched {
        /// The new deadline.
        deadline: Option<OffsetDateTime>,
    },
    /// The task has its result, journaled (now or before) as this envelope. `lost` when this
    /// arm failed it with [`RemoteStepError::LOST`].
    Settled {
        /// The journaled envelope.
        value: Value,
        /// Whether the dispatch was declared lost by this arm.
        lost: bool,
    },
}

impl RemoteArmOutcome {
    /// The redispatch deadline the run should wake by, when the step still waits.
    pub fn deadline(&self) -> Option<OffsetDateTime> {
        match self {
            Self::Dispatched { deadline }
            | Self::Waiting { deadline }
            | Self::Redispatched { deadline } => *deadline,
            Self::Settled { .. } => None,
        }
    }

    /// Tells `observer` what the arm did: a dispatch, a redispatch or a loss.
    pub(crate) fn observe(
        &self,
        observer: Option<&std::sync::Arc<dyn crate::StepObserver>>,
        group: &str,
    ) {
        let Some(observer) = observer else { return };
        match self {
            Self::Dispatched { .. } => observer.remote_dispatched(group),
            Self::Redispatched { .. } => observer.remote_redispatched(group),
            Self::Settled { lost: true, .. } => observer.remote_lost(group),
            Self::Waiting { .. } | Self::Settled { lost: false, .. } => {}
        }
    }
}

/// The stable task id of a remote step.
pub fn remote_step_id(key: &InstanceKey, generation: Generation, step: &str) -> String {
    format!("{}/{}/{generation}/{step}", key.name, key.id)
}

/// The worker group a remote step routes to.
pub fn remote_group(step: &str, partition: Option<&str>) -> String {
    match partition {
        Some(p) if !p.is_empty() && p != "default" => format!("{step}@{p}"),
        _ => step.to_owned(),
    }
}

/// Checks a remote step name: a user step name without `#` (it marks revisions) or `@` (it
/// separates the partition of a group).
pub(crate) fn validate_remote_step(name: &str) -> Result<(), IdError> {
    id::validate_user_step(name)?;
    if let Some(ch) = name.chars().find(|c| matches!(c, '#' | '@')) {
        return Err(IdError::ForbiddenChar {
            what: "remote step name",
            value: name.to_owned(),
            ch,
        });
    }
    Ok(())
}

pub(crate) fn validate_partition(partition: &str) -> Result<(), IdError> {
    if partition.is_empty() {
        return Err(IdError::Empty { what: "partition" });
    }
    if let Some(ch) = partition
        .chars()
        .find(|c| c.is_control() || matches!(c, '#' | '@'))
    {
        return Err(IdError::ForbiddenChar {
            what: "partition",
            value: partition.to_owned(),
            ch,
        });
    }
    Ok(())
}

/// A remote handler's contract: the worker group it serves and the types it takes and returns,
/// so the workflow that calls it and the worker that serves it are checked against the same
/// types when both see this definition (a crate of contracts that both depend on, or one crate
/// holding both sides).
///
/// It holds no body: the workflow side needs only the contract, so the crate that calls a
/// handler does not link what the handler needs (a printer driver, a payment client), and a
/// worker binary registers the body with
/// `RemoteWorkerBuilder::handle_typed::<H>(..)` (keiro-remote), whose closure must take
/// `H::Input` and return `H::Output`. The wire format is the stringly API's (JSON of the
/// input and output), so a typed caller and a stringly worker, or the reverse, interoperate.
///
/// ```
/// use keiro_journal::RemoteHandlerDef;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct Parcel { order: String, grams: u32 }
///
/// /// Prints a shipping label; runs on the warehouse's workers.
/// struct PrintLabel;
///
/// impl RemoteHandlerDef for PrintLabel {
///     const NAME: &'static str = "print-label";
///     type Input = Parcel;
///     type Output = String; // the label's tracking number
/// }
/// ```
pub trait RemoteHandlerDef: 'static {
    /// The handler's name: its tasks go to the worker group `NAME` (or `NAME@<partition>`).
    /// A valid remote step name (no `#`, `@`, `:`, `/`, surrounding whitespace or control
    /// characters), checked at each call.
    const NAME: &'static str;
    /// What the workflow sends and the handler receives.
    type Input: Serialize + DeserializeOwned + Send + 'static;
    /// What the handler returns and the workflow receives.
    type Output: Serialize + DeserializeOwned + Send + 'static;
}

/// Reads the `error` of a journaled failure envelope, tolerating missing fields.
pub(crate) fn remote_error(step: &str, error: &Value) -> RemoteStepError {
    let text = |field: &str| error.get(field).and_then(Value::as_str).map(str::to_owned);
    RemoteStepError {
        step: step.to_owned(),
        message: text("message").unwrap_or_default(),
        code: text("code"),
        retryable: error
            .get("retryable")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        attempts: error
            .get("attempts")
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_carry_the_partition() {
        assert_eq!(remote_group("label", None), "label");
        assert_eq!(remote_group("label", Some("eu")), "label@eu");
        assert_eq!(remote_group("label", Some("default")), "label");
    }

    #[test]
    fn remote_step_names_reject_revision_and_partition_marks() {
        assert!(validate_remote_step("print-label").is_ok());
        assert!(validate_remote_step("a#1").is_err());
        assert!(validate_remote_step("a@b").is_err());
        assert!(validate_remote_step("remote:x").is_err());
        assert!(validate_partition("").is_err());
    }

    #[test]
    fn failure_envelopes_read_back_as_errors() {
        let e = remote_error(
            "label",
            &serde_json::json!({"message": "m", "code": RemoteStepError::LOST, "retryable": true, "attempts": 3}),
        );
        assert!(e.is_lost());
        assert_eq!(e.attempts, 3);
        assert!(e.retryable);
    }

    #[test]
    fn queue_options_are_checked_as_a_starts() {
        let plain = RemoteOptions::default();
        assert_eq!(plain.queue_start(), Ok(None));
        let keyed = RemoteOptions::default().key("merchant-42");
        assert_eq!(
            keyed.queue_start(),
            Err(QueueError::NoQueue { option: "key" })
        );
        let queued = RemoteOptions::default()
            .queue("payments")
            .key("merchant-42");
        let queue = queued.queue_start().unwrap().unwrap();
        assert_eq!(
            (queue.queue.as_str(), queue.key.as_deref()),
            ("payments", Some("merchant-42"))
        );
        let long = RemoteOptions::default()
            .queue("payments")
            .key("k".repeat(crate::model::id::ID_LEN_MAX + 1));
        assert!(matches!(
            long.queue_start(),
            Err(QueueError::InvalidKey { .. })
        ));
        let bad_name = RemoteOptions::default().queue("pay/ments");
        assert!(matches!(
            bad_name.queue_start(),
            Err(QueueError::InvalidName { .. })
        ));
    }
}
