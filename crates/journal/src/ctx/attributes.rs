//! Search attributes from the body ([`Ctx::set_attributes`]): what an operator's list finds
//! the run by.
//!
//! Each set is a journal step of its own (`attrs:#<n>`, the `n`-th set of the generation),
//! appended fenced in the same transaction as the attribute rows (`model::attribute`). So a
//! replayed set finds its step and writes nothing, and the latest set of a name wins.

use std::time::Instant;

use crate::attribute::{AttrError, Attributes};
use crate::ctx::RecordVia;
use crate::model::attribute::{attributes_step, ATTRIBUTES_STEP_PREFIX};
use crate::{Ctx, StepKind, WorkflowError};

impl Ctx {
    /// Sets the run's search attributes in `attributes` (a name set earlier, here or at the
    /// start, gets the new value; other names keep theirs). The list finds the run by them as
    /// soon as this returns. On replay it returns at once, writing nothing; an empty set writes
    /// nothing either.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// use keiro_journal::attribute::Attributes;
    /// ctx.set_attributes(&Attributes::new().with("stage", "shipped").with("amount", 1200)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::InvalidAttributes`] for a name or value
    /// [`Attributes::validate`] refuses, or when the run would carry more than
    /// [`ATTRIBUTES_MAX`](crate::attribute::ATTRIBUTES_MAX) names: nothing is written then, and the body
    /// may go on. [`WorkflowError::Halted`] when the run must stop (its lease was lost, it was
    /// cancelled).
    pub async fn set_attributes(&self, attributes: &Attributes) -> Result<(), WorkflowError> {
        attributes.validate()?;
        if attributes.is_empty() {
            return Ok(());
        }
        let step = {
            let mut state = self.state();
            let next = state
                .message_ordinals
                .entry(ATTRIBUTES_STEP_PREFIX.to_owned())
                .or_insert(0);
            *next += 1;
            attributes_step(*next)
        };
        if self.replayed(&step, StepKind::Attributes)?.is_some() {
            return Ok(());
        }
        self.before_fresh_work(&step).await?;
        let json = self.inner.encode(&step, attributes)?;
        let started = Instant::now();
        self.record_via(
            &step,
            StepKind::Attributes,
            json,
            RecordVia::Attributes(attributes.clone()),
        )
        .await?;
        if let Some(observer) = &self.inner.options.observer {
            observer.step_finished(
                &self.inner.key.name,
                StepKind::Attributes,
                started.elapsed(),
            );
        }
        Ok(())
    }
}

/// The refusal of a set that would take the run past its names' bound.
pub(crate) fn too_many(count: u64) -> WorkflowError {
    WorkflowError::InvalidAttributes(AttrError::TooMany {
        count: usize::try_from(count).unwrap_or(usize::MAX),
        max: crate::attribute::ATTRIBUTES_MAX,
    })
}
