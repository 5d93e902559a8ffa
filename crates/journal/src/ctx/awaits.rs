//! Awaits of values journaled from outside the run: [`Ctx::await_step`] (a delivery, see
//! [`deliver`](crate::deliver)) and the general [`Ctx::awaited`] for keiro's own wake sources.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::ctx::{decode, Armed};
use crate::model::id;
use crate::state::replay::Lookup;
use crate::{Ctx, StepKind, WorkflowError};

impl Ctx {
    /// Waits for a value that something outside the run journals under `name` (see
    /// `deliver`). The first time, the run suspends; once the value is journaled the
    /// instance becomes runnable and the re-driven run returns it.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// let approved: bool = ctx.await_step("approval").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] while the value is absent (propagate it with `?`), and the
    /// errors of [`step`](Self::step).
    pub async fn await_step<T: DeserializeOwned>(&self, name: &str) -> Result<T, WorkflowError> {
        id::validate_user_step(name)?;
        if let Some(value) = self.delivered_under_bare_name(name) {
            return decode(name, value);
        }
        let stored = crate::model::event::await_step_name(name);
        let value = self
            .awaited_with(&stored, StepKind::Await, || async {
                Ok(Armed::Deadline(None))
            })
            .await?;
        decode(name, value)
    }

    /// A value an older keiro delivered under the await's bare name, before deliveries got
    /// their own `await:` namespace: a run parked across the upgrade still reads it. Anything
    /// else recorded under the bare name is the body's own step and not this await's business.
    fn delivered_under_bare_name(&self, name: &str) -> Option<Value> {
        let mut state = self.state();
        if state.halt.is_some() {
            return None; // the await itself reports the halt
        }
        match state.replay.lookup(name, StepKind::Await) {
            Lookup::Hit(value) => {
                state.stats.replayed += 1;
                if state.race_marks.is_some() {
                    let position = state.replay.position(name);
                    if let Some(marks) = &mut state.race_marks {
                        marks.read(position);
                    }
                }
                Some(value)
            }
            Lookup::KindMismatch { .. } | Lookup::Miss => None,
        }
    }
}
