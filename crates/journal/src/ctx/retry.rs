//! Steps with a retry policy: [`Ctx::step_with`].
//!
//! A plain [`Ctx::step`] runs its action once per drive; an error crashes the run and the
//! resume worker retries the whole run with crash backoff. A step run with `step_with` retries
//! its action in place instead, by its own policy ([`StepOptions`]), without re-driving the
//! body, and keeps the run's lease alive while it waits between attempts. The attempts are
//! journaled (see [`StepOptions`]), so a crash during the retries does not reset the budget.

use std::future::Future;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::model::retry::Attempt;
use crate::unwind::CatchPanic;
use crate::{Ctx, StepKind, StepOptions, WorkflowError};

impl Ctx {
    /// Runs `action` under a retry policy and journals its result under `name`; on replay
    /// returns the recorded result (or the recorded final failure) without running it.
    ///
    /// Failed attempts are retried in place after the policy's wait, without re-driving the
    /// body; the run's lease is kept alive meanwhile. Attempts are journaled, so a crash during
    /// the retries does not reset the budget. A panic inside the action counts as a failed
    /// attempt.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use keiro_journal::{StepOptions, WorkflowError};
    /// # async fn charge() -> Result<u64, std::io::Error> { Ok(1) }
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), WorkflowError> {
    /// let policy = StepOptions::new(5).initial_interval(Duration::from_millis(500));
    /// match ctx.step_with("charge", &policy, charge).await {
    ///     Ok(receipt) => { let _: u64 = receipt; }
    ///     Err(WorkflowError::StepFailed { attempts, message, .. }) => {
    ///         // the attempts are spent: handle it (a fallback step, a compensation)
    ///         let _ = (attempts, message);
    ///     }
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::StepFailed`] once the attempts are spent or the policy does not retry
    /// an error; otherwise the errors of [`step`](Self::step).
    pub async fn step_with<T, E, F, Fut>(
        &self,
        name: &str,
        options: &StepOptions,
        mut action: F,
    ) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display + 'static,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let started = Instant::now();
        self.retrying(name, options, |attempt| {
            let span = tracing::debug_span!("step", keiro.workflow.step = name, attempt);
            let run = tracing::Instrument::instrument(CatchPanic::new(action()), span);
            async move {
                match self.inner.keep_alive(run).await {
                    Ok(Ok(value)) => {
                        let recorded = self
                            .record_encoded(name, StepKind::Step, started, &value)
                            .await?;
                        Ok(Attempt::Succeeded(recorded))
                    }
                    Ok(Err(error)) => Ok(Attempt::Failed {
                        message: error.to_string(),
                        retry: options.retries(&error),
                    }),
                    Err(panic) => Ok(Attempt::Failed {
                        message: format!("panicked: {panic}"),
                        retry: true,
                    }),
                }
            }
        })
        .await
    }
}
