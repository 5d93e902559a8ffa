//! Awakeables: durable promises with a random id, completed from anywhere by id
//! ([`Ctx::awakeable`], [`Awakeable`]).
//!
//! Each wake source is an await: a journal hit replays the recorded value; a miss arms the
//! source once, idempotently, and suspends the run. Whoever resolves the source journals the
//! value into this instance and flips its row to `running` in one transaction, so the next drive
//! replays it.

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

use crate::ctx::{decode, Armed, RecordVia};
use crate::model::id;
use crate::model::wake::{open, Opened};
use crate::{awakeable_step, Ctx, StepKind, WorkflowError};

/// An awakeable: a durable promise with a random id, completed from anywhere by id.
///
/// Announce [`id`](Self::id) (from a step, so it is sent once), then await
/// [`value`](Self::value).
#[derive(Debug, Clone)]
pub struct Awakeable<T> {
    ctx: Ctx,
    id: Uuid,
    _value: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Awakeable<T> {
    /// The id to hand to whoever completes it.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// Waits for the completion value: suspends the run until `complete_awakeable(id, ..)`.
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] while pending (propagate it),
    /// [`WorkflowError::AwakeableCancelled`] when it was cancelled.
    pub async fn value(&self) -> Result<T, WorkflowError> {
        let step = awakeable_step(self.id);
        let value = self
            .ctx
            .awaited_with(&step, StepKind::Awakeable, || async {
                Ok(Armed::Deadline(None))
            })
            .await?;
        match open(value.clone()) {
            Some(Opened::Ok(v)) => decode(&step, v),
            Some(Opened::Cancelled) => Err(WorkflowError::AwakeableCancelled { id: self.id }),
            _ => decode(&step, value),
        }
    }
}

impl Ctx {
    /// Creates (or, on replay, recovers) the awakeable `name`: its random id is journaled, so
    /// every drive sees the same one.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// let approval = ctx.awakeable::<bool>("approval").await?;
    /// let id = approval.id();
    /// ctx.step("ask", || async move { println!("approve with {id}"); Ok::<_, std::io::Error>(()) }).await?;
    /// let approved = approval.value().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Halted`] when the run must stop.
    pub async fn awakeable<T: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<Awakeable<T>, WorkflowError> {
        id::validate_user_step(name)?;
        let step = format!("awkid:{name}");
        let recorded = match self.replayed(&step, StepKind::Awakeable)? {
            Some(value) => value,
            None => {
                self.before_fresh_work(&step).await?;
                let fresh = Uuid::new_v4();
                self.record_via(
                    &step,
                    StepKind::Awakeable,
                    Value::String(fresh.to_string()),
                    RecordVia::Awakeable(fresh),
                )
                .await?
            }
        };
        let id: Uuid = decode(&step, recorded)?;
        Ok(Awakeable {
            ctx: self.clone(),
            id,
            _value: PhantomData,
        })
    }
}
