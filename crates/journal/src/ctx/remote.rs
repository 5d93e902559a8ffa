//! Remote steps, the workflow side: `ctx.remote` dispatches a task to a worker group and
//! suspends until the task's result is journaled; `ctx.remote_typed::<H>` does the same with
//! the types of a [`RemoteHandlerDef`].
//!
//! The dispatch is an await arm, like a sleep's timer: on a journal miss the context asks the
//! store to write the task row (once per step id; a replay finds it and only learns its state),
//! in one transaction of its own. Workers claim tasks, run handlers and report; the report
//! journals the result into this run and flips its row in the same transaction (the workers
//! live in `keiro-remote`). Retries with backoff happen in the task table, without waking the
//! run; only the final result is journaled, as `{"ok": value}` or `{"error": {..}}`.

use serde::de::DeserializeOwned;
use serde::Serialize;
use time::OffsetDateTime;

use crate::ctx::{decode, Armed};
use crate::model::remote::{remote_error, validate_partition, validate_remote_step};
use crate::model::wake::{open, Opened};
use crate::{
    remote_group, remote_step_id, Ctx, RemoteArm, RemoteArmOutcome, RemoteHandlerDef,
    RemoteOptions, StepKind, WorkflowError,
};

impl Ctx {
    /// Runs the remote step `name` on a worker serving its group and returns the handler's
    /// output. The task is written once (with a stable step id) and the run parks; whichever
    /// process receives the worker's report journals the result and wakes the run.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// use std::time::Duration;
    /// use keiro_journal::{Backoff, RemoteOptions};
    /// let options = RemoteOptions::default()
    ///     .retries(3, Backoff::exponential(Duration::from_millis(200), Duration::from_secs(10)));
    /// let label: String = ctx.remote("print-label", &"order-42", &options).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until the result arrives (propagate it),
    /// [`WorkflowError::Remote`] when the step failed for good (handle it, or propagate it to
    /// fail the run), [`WorkflowError::InvalidStep`] for a bad name or partition,
    /// [`WorkflowError::InvalidQueue`] for a bad queue name or key, or a key without a queue;
    /// an undeclared queue is the store's [`QueueRefused`](crate::store::Error::QueueRefused)
    /// (as [`WorkflowError::Store`]), and nothing is written.
    pub async fn remote<I, O>(
        &self,
        name: &str,
        input: &I,
        options: &RemoteOptions,
    ) -> Result<O, WorkflowError>
    where
        I: Serialize + ?Sized,
        O: DeserializeOwned,
    {
        validate_remote_step(name)?;
        if let Some(handler) = &options.handler {
            validate_remote_step(handler)?;
        }
        if let Some(partition) = &options.partition {
            validate_partition(partition)?;
        }
        let queue = options.queue_start()?;
        let handler = options.handler.as_deref().unwrap_or(name);
        let journal_step = format!("remote:{name}");
        let arm = RemoteArm {
            step_id: remote_step_id(self.key(), self.generation(), name),
            key: self.key().clone(),
            generation: self.generation(),
            step: name.to_owned(),
            journal_step: journal_step.clone(),
            group: remote_group(handler, options.partition.as_deref()),
            input: serde_json::Value::Null,
            priority: options.priority,
            traceparent: None,
            max_attempts: options.retries.saturating_add(1),
            backoff: options.backoff,
            redispatch_after: options.redispatch_after,
            redispatch_max: options.redispatch_max.max(1),
            queue_key: queue.as_ref().and_then(|q| q.key.clone()),
            queue: queue.map(|q| q.queue),
            fence: self.options().fence.clone(),
        };
        let value = self
            .awaited_deferring(&journal_step, StepKind::Remote, || async {
                // The task is written with the park that follows (one transaction for both),
                // or before the body's next other fresh action, whichever comes first; at once
                // if a step action is already running beside this await.
                let arm = RemoteArm {
                    input: self.inner.encode(&journal_step, input)?,
                    traceparent: self
                        .options()
                        .trace_context
                        .as_ref()
                        .and_then(|t| t.traceparent()),
                    ..arm
                };
                let provisional = arm
                    .redispatch_after
                    .map(|after| OffsetDateTime::now_utc() + after);
                Ok(match self.dispatch(arm).await? {
                    None => Armed::Deadline(provisional),
                    Some(RemoteArmOutcome::Settled { value, .. }) => Armed::Ready(value),
                    Some(outcome) => Armed::Deadline(outcome.deadline()),
                })
            })
            .await?;
        match open(value.clone()) {
            Some(Opened::Ok(v)) => decode(&journal_step, v),
            Some(Opened::Error(error)) => Err(WorkflowError::Remote(remote_error(name, &error))),
            _ => decode(&journal_step, value),
        }
    }
}

impl Ctx {
    /// Runs the remote step `step` on a worker serving the handler `H`: [`remote`](Self::remote)
    /// with the input and output types fixed by `H` and the handler set to `H::NAME` (whatever
    /// `options.handler` says), so one handler serves many steps of one run under their own
    /// journal keys.
    ///
    /// ```no_run
    /// # use keiro_journal::{Ctx, RemoteHandlerDef, RemoteOptions, StepKind, WorkflowError};
    /// # struct PrintLabel;
    /// # impl RemoteHandlerDef for PrintLabel {
    /// #     const NAME: &'static str = "print-label";
    /// #     type Input = String;
    /// #     type Output = String;
    /// # }
    /// # async fn body(ctx: Ctx) -> Result<(), WorkflowError> {
    /// let options = RemoteOptions::default();
    /// let first = ctx.remote_typed::<PrintLabel>("label-1", &"order-42".to_owned(), &options).await?;
    /// let second = ctx.remote_typed::<PrintLabel>("label-2", &"order-43".to_owned(), &options).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// An input or output of another type does not compile:
    ///
    /// ```compile_fail
    /// # use keiro_journal::{Ctx, RemoteHandlerDef, RemoteOptions, StepKind, WorkflowError};
    /// # struct PrintLabel;
    /// # impl RemoteHandlerDef for PrintLabel {
    /// #     const NAME: &'static str = "print-label";
    /// #     type Input = String;
    /// #     type Output = String;
    /// # }
    /// # async fn body(ctx: Ctx) -> Result<(), WorkflowError> {
    /// ctx.remote_typed::<PrintLabel>("label-1", &42_u32, &RemoteOptions::default()).await?; // expected `&String`
    /// # Ok(()) }
    /// ```
    ///
    /// ```compile_fail
    /// # use keiro_journal::{Ctx, RemoteHandlerDef, RemoteOptions, StepKind, WorkflowError};
    /// # struct PrintLabel;
    /// # impl RemoteHandlerDef for PrintLabel {
    /// #     const NAME: &'static str = "print-label";
    /// #     type Input = String;
    /// #     type Output = String;
    /// # }
    /// # async fn body(ctx: Ctx) -> Result<(), WorkflowError> {
    /// let grams: u32 = ctx
    ///     .remote_typed::<PrintLabel>("label-1", &"order-42".to_owned(), &RemoteOptions::default())
    ///     .await?; // expected `u32`, found `String`
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`remote`](Self::remote); [`WorkflowError::InvalidStep`] also for an invalid
    /// `H::NAME`.
    pub async fn remote_typed<H: RemoteHandlerDef>(
        &self,
        step: &str,
        input: &H::Input,
        options: &RemoteOptions,
    ) -> Result<H::Output, WorkflowError> {
        let options = options.clone().handler(H::NAME);
        self.remote(step, input, &options).await
    }
}
