//! Changing a workflow's code under running instances, and ending a generation:
//! [`Ctx::patched`] and [`Ctx::continue_as_new`].

use serde::Serialize;
use serde_json::Value;

use crate::ctx::decode;
use crate::model::id;
use crate::state::Halt;
use crate::unwind::YieldNow;
use crate::{Ctx, StepKind, WorkflowError};

impl Ctx {
    /// Whether this run takes the new branch of patch `id`.
    ///
    /// The first time a run meets the patch, it takes the old branch (`false`) when the old
    /// code already ran past this point: the journal holds a step the body recorded (see the
    /// `replay` module docs) that this drive has not replayed yet when the call is reached,
    /// so the new branch could contradict it. Otherwise it takes the new branch (`true`),
    /// wherever the patch sits: a run started on the new code, or an older run that had not
    /// recorded anything past this point (it may have parked on an await past it), gets the
    /// new branch even after any number of parks. Before deciding, the call lets the branches
    /// of a `join` polled with it replay their recorded steps, so a step recorded beside the
    /// patch does not count as past it. The decision is journaled under `patch:<id>`, so every
    /// later replay takes the same branch.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// if ctx.patched("send-receipt").await? {
    ///     ctx.step("receipt", || async { Ok::<_, std::io::Error>(()) }).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Halted`] when the run must stop.
    pub async fn patched(&self, id: &str) -> Result<bool, WorkflowError> {
        id::validate_user_step(id)?;
        let step = format!("patch:{id}");
        if let Some(value) = self.replayed(&step, StepKind::Patch)? {
            return decode(&step, value);
        }
        if self.state().disarmed {
            // A losing branch of a decided race records nothing new.
            return Err(WorkflowError::Suspended { step });
        }
        // As before a fresh step, siblings replay first, so only steps recorded past this
        // point (not beside it) are still unconsumed. No divergence check: a patch met before
        // recorded steps is exactly the in-flight case it exists for.
        YieldNow::new().await;
        let decision = {
            let state = self.state();
            if let Some(halt) = &state.halt {
                return Err(WorkflowError::Halted {
                    reason: halt.describe(),
                });
            }
            state.replay.first_unconsumed().is_none()
        };
        self.confirm_if_stale().await?;
        let recorded = self
            .record(&step, StepKind::Patch, Value::Bool(decision))
            .await?;
        decode(&step, recorded)
    }

    /// Ends this generation and continues the same logical instance on a new generation with
    /// `input` and an empty journal, so long-lived workflows keep a bounded journal.
    ///
    /// Always returns an error to propagate with `?`/`return`.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx, n: u32) -> Result<u32, keiro_journal::WorkflowError> {
    /// if n < 10 {
    ///     return Err(ctx.continue_as_new(&(n + 1)));
    /// }
    /// # Ok(n) }
    /// ```
    pub fn continue_as_new<I: Serialize>(&self, input: &I) -> WorkflowError {
        match self.inner.encode("__workflow_continued_as_new__", input) {
            Ok(input) => {
                self.inner.halt(Halt::ContinueAsNew { input });
                WorkflowError::ContinueAsNew
            }
            Err(e) => e,
        }
    }
}
