//! Plain steps: [`Ctx::step`] runs an action once and journals its result; on replay the
//! recorded result comes back without the action running. The general form,
//! `Ctx::journaled` (beside the context), records under keiro's own reserved names and kinds.

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::model::id;
use crate::{Ctx, StepKind, WorkflowError};

impl Ctx {
    /// Runs `action` once and journals its result under `name`; on replay returns the recorded
    /// result without running it.
    ///
    /// The first run returns the JSON round-trip of the result, so a lossy `Serialize`/
    /// `Deserialize` pair shows at once rather than only after a crash.
    ///
    /// An `Err` from the action, or a panic inside it, crashes the run: nothing is journaled,
    /// and the resume worker retries the run with backoff.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// let total: u64 = ctx
    ///     .step("sum", || async { Ok::<_, std::io::Error>(40 + 2) })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Step`] or [`WorkflowError::Panicked`] for a failing action;
    /// [`WorkflowError::Halted`] when the run must stop; [`WorkflowError::NonDeterminism`]
    /// when the code no longer matches the journal; [`WorkflowError::Decode`] when the recorded
    /// value does not fit `T`.
    pub async fn step<T, E, F, Fut>(&self, name: &str, action: F) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        id::validate_user_step(name)?;
        self.journaled(name, StepKind::Step, action).await
    }
}
