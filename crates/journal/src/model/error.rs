//! The error a workflow body sees and returns.

use crate::model::store_error;
use crate::IdError;

/// The error type of workflow bodies and of every context call.
///
/// # Control flow
///
/// Three variants are not failures but the run's control flow, and a body propagates them with
/// `?` like any other error: [`Suspended`](Self::Suspended) (the run waits on a wake source),
/// [`Halted`](Self::Halted) (the run must stop: cancelled, lease lost, store error) and
/// [`ContinueAsNew`](Self::ContinueAsNew). [`is_control_flow`](Self::is_control_flow) names
/// them, so a body that catches errors knows what to re-raise. The run driver reads the real
/// reason from the context, so a body that swallows one still stops the right way, but the
/// code after the swallowed error runs for nothing.
///
/// ```
/// use keiro_journal::WorkflowError;
///
/// fn recover(err: WorkflowError) -> Result<&'static str, WorkflowError> {
///     if err.is_control_flow() {
///         return Err(err); // never swallow a suspension, a halt or a continue-as-new
///     }
///     Ok("fallback")
/// }
/// assert!(recover(WorkflowError::ContinueAsNew).is_err());
/// assert_eq!(recover(WorkflowError::app("declined")).ok(), Some("fallback"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkflowError {
    /// The run waits on a wake source and will be re-driven once it resolves.
    #[error("the workflow is suspended until {step} is journaled")]
    Suspended {
        /// The awaited step.
        step: String,
    },
    /// The run must stop: it was cancelled or failed elsewhere, lost its lease, hit a store
    /// error, or diverged from its journal. No further side effect runs.
    #[error("the workflow run is halted: {reason}")]
    Halted {
        /// Why, for humans.
        reason: String,
    },
    /// The body asked to continue as new; propagate it.
    #[error("the workflow continues as new")]
    ContinueAsNew,
    /// The code no longer matches the journal.
    #[error("non-determinism at step {step:?}: {detail}")]
    NonDeterminism {
        /// The step where divergence was detected.
        step: String,
        /// What differs.
        detail: String,
    },
    /// A recorded value could not be decoded into the type the body asked for.
    #[error("step {step:?}: the recorded value does not decode into the requested type")]
    Decode {
        /// The step.
        step: String,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// A value could not be encoded as JSON.
    #[error("step {step:?}: the value does not encode as JSON")]
    Encode {
        /// The step.
        step: String,
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// A value was larger than the configured payload limit.
    #[error("step {step:?}: the payload is {len} bytes, the limit is {limit}")]
    PayloadTooLarge {
        /// The step.
        step: String,
        /// Its encoded length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The store refuses the value (a NUL character in a string, for PostgreSQL's jsonb and
    /// text). Deterministic: the run fails at once with this reason, and a step whose result
    /// was refused is not run again.
    #[error("step {step:?}: the value cannot be stored: {reason}")]
    PayloadRefused {
        /// The step (or `__workflow_input__`, `__workflow_output__`).
        step: String,
        /// Why.
        reason: String,
    },
    /// A step run under a retry policy ([`Ctx::step_with`](crate::Ctx::step_with)) failed on
    /// every attempt it was allowed, or with an error the policy does not retry. Journaled:
    /// every replay returns it without running the action again. The body may handle it.
    #[error("step {step:?} failed after {attempts} attempt(s): {message}")]
    StepFailed {
        /// The step.
        step: String,
        /// How many attempts ran.
        attempts: u32,
        /// The last attempt's error, rendered.
        message: String,
    },
    /// The generation's journal reached its budget (`RunOptions::journal_budget`). Continue as
    /// new (`ctx.continue_as_new`) to go on with an empty journal.
    #[error(
        "step {step:?}: the journal is full ({steps} entries, {bytes} bytes; the budget is \
         {budget_steps} entries, {budget_bytes} bytes): continue as new to start an empty one"
    )]
    JournalFull {
        /// The step that did not fit.
        step: String,
        /// The entries it would take the journal to.
        steps: usize,
        /// The bytes it would take the journal to.
        bytes: usize,
        /// The entries budget.
        budget_steps: usize,
        /// The bytes budget.
        budget_bytes: usize,
    },
    /// A stream write went past its [`StreamBudget`](crate::message::StreamBudget): the stream's own
    /// bounds, or what one generation may append to its streams. Nothing was written.
    #[error(
        "stream {key:?}: the {scope} budget is spent ({items} items, {bytes} bytes; the budget \
         is {budget_items} items, {budget_bytes} bytes)"
    )]
    StreamFull {
        /// The stream.
        key: String,
        /// `"stream"` or `"generation"`: which bound refused it.
        scope: &'static str,
        /// The items the write would take it to.
        items: u64,
        /// The bytes the write would take it to.
        bytes: u64,
        /// The items budget.
        budget_items: u64,
        /// The bytes budget.
        budget_bytes: u64,
    },
    /// Search attributes refused: a bad name or value, or more names than a run may carry.
    /// Nothing was written; the body may go on.
    #[error("search attributes refused: {0}")]
    InvalidAttributes(#[from] crate::attribute::AttrError),
    /// A write to a stream the run closed. Nothing was written.
    #[error("stream {key:?} is closed")]
    StreamClosed {
        /// The stream.
        key: String,
    },
    /// An answer to an update the instance does not have (no update of that name under that
    /// id). Nothing was written.
    #[error("no update {name:?} with id {id:?} to answer")]
    UpdateUnknown {
        /// The update's name.
        name: String,
        /// Its id.
        id: String,
    },
    /// A second answer to an update (answered already, or settled when the run ended). Nothing
    /// was written.
    #[error("update {name:?} with id {id:?} is answered already")]
    UpdateAnswered {
        /// The update's name.
        name: String,
        /// Its id.
        id: String,
    },
    /// The step name is not valid.
    #[error("invalid step name")]
    InvalidStep(#[from] IdError),
    /// A remote step's queue options are not valid: a bad queue name or key, or a key with no
    /// queue. Deterministic: the run fails at once.
    #[error("invalid queue option")]
    InvalidQueue(#[from] crate::queue::QueueError),
    /// A step's action returned an error. The run crashes; the resume worker retries it with
    /// backoff and fails it at the attempt ceiling.
    #[error("step {step:?} failed: {message}")]
    Step {
        /// The step.
        step: String,
        /// The action's error, rendered.
        message: String,
    },
    /// A step's action panicked.
    #[error("step {step:?} panicked: {message}")]
    Panicked {
        /// The step.
        step: String,
        /// The panic payload, when it was a string.
        message: String,
    },
    /// The call needs something this run's store does not offer (a Postgres transaction step
    /// on another store). The run fails at once: retrying on the same store cannot help.
    #[error("step {step:?} cannot run on this store: {reason}")]
    Unsupported {
        /// The step.
        step: String,
        /// What is missing.
        reason: String,
    },
    /// A store call made by the context failed.
    #[error("store error in the workflow context")]
    Store(#[source] store_error::Error),
    /// The awakeable was cancelled instead of completed.
    #[error("awakeable {id} was cancelled")]
    AwakeableCancelled {
        /// The awakeable.
        id: uuid::Uuid,
    },
    /// A signal wait timed out.
    #[error("no signal on token {token:?} before the timeout")]
    SignalTimeout {
        /// The token.
        token: String,
    },
    /// A child workflow failed.
    #[error("child workflow {child} failed: {reason}")]
    ChildFailed {
        /// The child.
        child: crate::InstanceKey,
        /// Its failure reason.
        reason: String,
    },
    /// A child workflow was cancelled.
    #[error("child workflow {child} was cancelled")]
    ChildCancelled {
        /// The child.
        child: crate::InstanceKey,
    },
    /// The spawn was refused: an instance with the child's key is running for another parent,
    /// which alone receives its result. Journaled with the spawn, so every replay sees it too.
    #[error("child workflow {child} is already running for {parent}")]
    ChildTaken {
        /// The child.
        child: crate::InstanceKey,
        /// The parent it runs for.
        parent: crate::InstanceKey,
    },
    /// A remote step failed for good (retries spent, not retryable, or lost).
    #[error(transparent)]
    Remote(#[from] crate::RemoteStepError),
    /// The body's own failure.
    #[error("{0}")]
    Application(String),
}

impl WorkflowError {
    /// Whether a body that returns this error fails its run at once instead of crashing and
    /// being retried: the body's own [`Application`](Self::Application) failure (a business
    /// outcome), a value that cannot be encoded, is over the payload limit or is refused by the
    /// store (every retry would meet it again), and every
    /// [journaled failure](Self::is_journaled_failure).
    pub fn fails_run_at_once(&self) -> bool {
        self.is_journaled_failure()
            || matches!(
                self,
                Self::Application(_)
                    | Self::Encode { .. }
                    | Self::PayloadTooLarge { .. }
                    | Self::PayloadRefused { .. }
                    | Self::JournalFull { .. }
                    | Self::StreamFull { .. }
                    | Self::StreamClosed { .. }
                    | Self::InvalidAttributes(_)
                    | Self::UpdateUnknown { .. }
                    | Self::UpdateAnswered { .. }
                    | Self::InvalidQueue(_)
                    | Self::Unsupported { .. }
            )
    }

    /// The body's own failure, from anything printable.
    ///
    /// ```
    /// use keiro_journal::WorkflowError;
    /// let err = WorkflowError::app("card declined");
    /// assert_eq!(err.to_string(), "card declined");
    /// ```
    pub fn app(message: impl std::fmt::Display) -> Self {
        Self::Application(message.to_string())
    }

    /// Whether this is the run's control flow rather than a failure:
    /// [`Suspended`](Self::Suspended), [`Halted`](Self::Halted) or
    /// [`ContinueAsNew`](Self::ContinueAsNew). A body that catches errors re-raises these.
    ///
    /// ```
    /// use keiro_journal::WorkflowError;
    /// assert!(WorkflowError::ContinueAsNew.is_control_flow());
    /// assert!(!WorkflowError::app("card declined").is_control_flow());
    /// ```
    pub fn is_control_flow(&self) -> bool {
        matches!(
            self,
            Self::Suspended { .. } | Self::Halted { .. } | Self::ContinueAsNew
        )
    }

    /// Whether this is the suspension signal.
    pub fn is_suspended(&self) -> bool {
        matches!(self, Self::Suspended { .. })
    }

    /// Whether the error was read from the journal (a remote step's final failure, a child's
    /// failure or cancellation, a refused spawn, a cancelled awakeable, a signal timeout):
    /// every re-drive would meet it again, so a body that returns it fails the run at once
    /// instead of crashing and retrying. An operator's `requeue` resets remote and child
    /// failures.
    pub fn is_journaled_failure(&self) -> bool {
        matches!(
            self,
            Self::Remote(_)
                | Self::StepFailed { .. }
                | Self::ChildFailed { .. }
                | Self::ChildCancelled { .. }
                | Self::ChildTaken { .. }
                | Self::AwakeableCancelled { .. }
                | Self::SignalTimeout { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::WorkflowError;

    #[test]
    fn control_flow_is_suspended_halted_and_continue_as_new_only() {
        let control = [
            WorkflowError::Suspended {
                step: "sleep:wait".to_owned(),
            },
            WorkflowError::Halted {
                reason: "cancelled".to_owned(),
            },
            WorkflowError::ContinueAsNew,
        ];
        for err in &control {
            assert!(err.is_control_flow(), "{err:?} is control flow");
            assert!(!err.fails_run_at_once(), "{err:?} does not fail the run");
        }
        let failures = [
            WorkflowError::app("card declined"),
            WorkflowError::NonDeterminism {
                step: "charge".to_owned(),
                detail: "kind differs".to_owned(),
            },
            WorkflowError::Unsupported {
                step: "tx".to_owned(),
                reason: "no Postgres".to_owned(),
            },
            WorkflowError::AwakeableCancelled {
                id: uuid::Uuid::nil(),
            },
        ];
        for err in &failures {
            assert!(!err.is_control_flow(), "{err:?} is a failure");
        }
    }
}
