//! Durable sleeps: [`Ctx::sleep`] and [`Ctx::sleep_until`], armed as timers the store fires.
//!
//! Each wake source is an await: a journal hit replays the recorded value; a miss arms the
//! source once, idempotently, and suspends the run. Whoever resolves the source journals the
//! value into this instance and flips its row to `running` in one transaction, so the next drive
//! replays it.

use std::time::Duration;

use time::OffsetDateTime;

use crate::ctx::Armed;
use crate::model::id;
use crate::{Ctx, StepKind, TimerArm, TimerDue, TimerKind, WorkflowError};

impl Ctx {
    /// Sleeps durably for `duration`: the run parks and costs nothing until a timer worker fires
    /// the sleep. The first arm fixes the deadline; a replay never postpones it. The deadline is
    /// `duration` after the store's clock at the arm (the database's `now()`), the clock that
    /// also decides when the timer is due, so a worker whose own clock is off by a minute still
    /// sleeps `duration`.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// ctx.sleep("cool-off", std::time::Duration::from_secs(3600)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until the sleep has fired (propagate it).
    pub async fn sleep(&self, name: &str, duration: Duration) -> Result<(), WorkflowError> {
        self.sleep_on(name, TimerDue::After(duration)).await
    }

    /// Sleeps durably until `at`, an instant of the store's clock (the database's `now()` for
    /// Postgres), which is what decides when the timer is due: a worker whose clock is skewed
    /// against the database's sees it fire by the database's time. See [`sleep`](Self::sleep).
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until the sleep has fired (propagate it).
    pub async fn sleep_until(&self, name: &str, at: OffsetDateTime) -> Result<(), WorkflowError> {
        self.sleep_on(name, TimerDue::At(at)).await
    }

    async fn sleep_on(&self, name: &str, due: TimerDue) -> Result<(), WorkflowError> {
        id::validate_user_step(name)?;
        let step = format!("sleep:{name}");
        let arm = TimerArm {
            key: self.key().clone(),
            generation: self.generation(),
            step: step.clone(),
            due,
            kind: TimerKind::Sleep,
        };
        self.awaited_with(&step, StepKind::Sleep, || async {
            let fire_at = self
                .store()
                .timer_arm(&arm)
                .await
                .map_err(|e| self.inner.store_failed(&step, e))?;
            Ok(Armed::Deadline(Some(fire_at)))
        })
        .await?;
        Ok(())
    }
}
