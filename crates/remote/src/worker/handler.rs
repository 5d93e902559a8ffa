//! Typed handlers and what they see of a task.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

use keiro_journal::{Generation, InstanceKey};

use crate::store::{ClaimedTask, TaskFailure};

/// What a handler knows of the task it runs.
#[derive(Debug, Clone)]
pub struct TaskContext {
    /// The stable step id: the same on every attempt and dispatch, the key to deduplicate
    /// side effects on.
    pub step_id: String,
    /// The workflow instance that dispatched the task.
    pub key: InstanceKey,
    /// Its generation.
    pub generation: Generation,
    /// The remote step's name (its journal key): several steps of one run may share one
    /// handler ([`RemoteOptions::handler`](keiro_journal::RemoteOptions::handler)).
    pub step: String,
    /// The group the task was routed to.
    pub group: String,
    /// This attempt, from 1.
    pub attempt: u32,
    /// Attempts in all.
    pub max_attempts: u32,
    /// Dispatches so far (1 + redispatches).
    pub dispatches: u32,
    /// The W3C `traceparent` of the dispatching span, when tracing was exported.
    pub traceparent: Option<String>,
    /// Turns `true` once the worker's heartbeat learns that the task was cancelled; the worker
    /// holds the sender for as long as it runs the handler.
    cancel: watch::Receiver<bool>,
}

impl TaskContext {
    pub(crate) fn of(task: &ClaimedTask, cancel: watch::Receiver<bool>) -> Self {
        Self {
            step_id: task.step_id.clone(),
            key: task.key.clone(),
            generation: task.generation,
            step: task.step.clone(),
            group: task.group.clone(),
            attempt: task.attempt,
            max_attempts: task.max_attempts,
            dispatches: task.dispatches,
            traceparent: task.traceparent.clone(),
            cancel,
        }
    }

    /// Whether the task was cancelled since it was claimed: its run was cancelled, or left the
    /// task's generation by continuing as new. The worker learns it from its heartbeats, so
    /// within [`heartbeat_every`](crate::RemoteWorkerOptions::heartbeat_every) of the
    /// cancellation. Whatever the handler reports afterwards is refused and nothing is
    /// journaled, so a handler should check this before a side effect it can still skip.
    pub fn is_cancelled(&self) -> bool {
        *self.cancel.borrow()
    }

    /// Resolves once the task is cancelled (see [`is_cancelled`](Self::is_cancelled)), and
    /// never if it is not: race it against the handler's work to stop early.
    ///
    /// ```no_run
    /// # use keiro_remote::{TaskContext, TaskError};
    /// # async fn charge(card: &str) -> Result<String, TaskError> { Ok(card.to_owned()) }
    /// async fn handler(card: String, task: TaskContext) -> Result<String, TaskError> {
    ///     tokio::select! {
    ///         receipt = charge(&card) => receipt,
    ///         () = task.cancelled() => Err(TaskError::fatal("the run was cancelled")),
    ///     }
    /// }
    /// ```
    pub async fn cancelled(&self) {
        let mut cancel = self.cancel.clone();
        if cancel.wait_for(|cancelled| *cancelled).await.is_err() {
            // The worker let go of the task without it being cancelled: it never will be.
            std::future::pending::<()>().await;
        }
    }

    /// Whether this is the last attempt the step's retry policy allows.
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }
}

/// A handler's failure: retryable (the step's retry policy decides) or not (the step fails at
/// once), with an optional machine-readable code the workflow body sees in
/// [`RemoteStepError::code`](keiro_journal::RemoteStepError).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TaskError {
    /// For humans.
    pub message: String,
    /// For machines.
    pub code: Option<String>,
    /// Whether another attempt may succeed.
    pub retryable: bool,
}

impl TaskError {
    /// A failure another attempt may fix (a timeout, a 503).
    pub fn retryable(message: impl std::fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            code: None,
            retryable: true,
        }
    }

    /// A failure no retry fixes (a validation error, a 4xx): the step fails at once.
    pub fn fatal(message: impl std::fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            code: None,
            retryable: false,
        }
    }

    /// Adds a code.
    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    pub(crate) fn into_failure(self) -> TaskFailure {
        TaskFailure {
            message: self.message,
            code: self.code,
            retryable: self.retryable,
        }
    }
}

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A handler body taking `I` and answering `O`: any
/// `Fn(I, TaskContext) -> impl Future<Output = Result<O, TaskError>>` that can be shared
/// between tasks. It exists so [`handle_typed`](crate::RemoteWorkerBuilder::handle_typed) is
/// called with the handler's definition alone (`.handle_typed::<PrintLabel>(..)`); write the
/// closure's parameter types, which the compiler then checks against the definition's.
pub trait TaskHandler<I, O>: Send + Sync + 'static {
    /// What a call returns.
    type Future: Future<Output = Result<O, TaskError>> + Send + 'static;

    /// Runs the body on one task.
    fn call(&self, input: I, task: TaskContext) -> Self::Future;
}

impl<I, O, F, Fut> TaskHandler<I, O> for F
where
    F: Fn(I, TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, TaskError>> + Send + 'static,
{
    type Future = Fut;

    fn call(&self, input: I, task: TaskContext) -> Fut {
        self(input, task)
    }
}

/// The code of an attempt refused for an input sealed with a key the worker lacks.
pub(crate) const PAYLOAD_ENCRYPTED: &str = "payload_encrypted";

/// A handler with its input and output types erased to JSON.
pub(crate) type ErasedHandler =
    Arc<dyn Fn(Value, TaskContext) -> BoxFuture<Result<Value, TaskError>> + Send + Sync>;

/// Erases a typed handler: decodes the input (a bad input fails the step at once with code
/// `bad_input`, since no retry can decode it) and encodes the output. An input still sealed by
/// a payload codec (this worker lacks the key it names) fails the attempt, retryable, with code
/// `payload_encrypted` naming the key id: a worker that has the key can run a later attempt.
pub(crate) fn erase<I, O, F, Fut>(handler: F) -> ErasedHandler
where
    I: DeserializeOwned + Send + 'static,
    O: Serialize + Send + 'static,
    F: Fn(I, TaskContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, TaskError>> + Send + 'static,
{
    let handler = Arc::new(handler);
    Arc::new(move |input: Value, task: TaskContext| {
        let handler = handler.clone();
        Box::pin(async move {
            if let Some(key_id) = keiro_journal::codec::first_sealed_key_id(&input) {
                return Err(TaskError::retryable(format!(
                    "the input is sealed with key {key_id:?}, which this worker does not have"
                ))
                .with_code(PAYLOAD_ENCRYPTED));
            }
            let input: I = serde_json::from_value(input).map_err(|e| {
                TaskError::fatal(format!("the input does not decode: {e}")).with_code("bad_input")
            })?;
            let output = handler(input, task).await?;
            serde_json::to_value(output).map_err(|e| {
                TaskError::fatal(format!("the output does not encode: {e}")).with_code("bad_output")
            })
        })
    })
}
