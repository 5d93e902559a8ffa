//! Child workflows: [`Ctx::child`], [`Ctx::spawn_child`], [`Ctx::await_child`] and
//! [`Ctx::cancel_child`].
//!
//! Each wake source is an await: a journal hit replays the recorded value; a miss arms the
//! source once, idempotently, and suspends the run. Whoever resolves the source journals the
//! value into this instance and flips its row to `running` in one transaction, so the next drive
//! replays it.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ctx::{decode, Armed, RecordVia};
use crate::model::wake::{open, Opened};
use crate::{
    child_result_step, ChildSpawn, Ctx, InstanceKey, StepKind, WorkflowError, WorkflowId,
    WorkflowName,
};

impl Ctx {
    /// Runs workflow `name` as a child with id `id` and waits for its output.
    ///
    /// The child instance is created in the same transaction as the spawn step (never
    /// re-spawned on replay) and driven by any worker that registers `name`. Its completion,
    /// failure (including failure at the crash ceiling) or cancellation is journaled into this
    /// run in the child's terminal transaction.
    ///
    /// A running child has one parent, which alone receives its result. When an instance with
    /// the child's key already exists:
    /// - finished: its result is journaled here at once (ids are never reused, so a spawn of a
    ///   finished child reads its outcome);
    /// - running with no parent, or for an earlier generation of this very instance (this run
    ///   continued as new since it spawned it): this generation becomes its parent;
    /// - running for another instance: the spawn is refused with
    ///   [`WorkflowError::ChildTaken`], at once and journaled, so every replay takes the same
    ///   branch. Wait for the other parent's outcome another way (a signal it sends, say), or
    ///   give children of different parents different ids.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// let label: String = ctx.child("ship", "order-42-ship", &"order-42").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until the child finishes, [`WorkflowError::ChildFailed`],
    /// [`WorkflowError::ChildCancelled`], [`WorkflowError::ChildTaken`],
    /// [`WorkflowError::InvalidStep`] for a bad name or id.
    pub async fn child<I: Serialize + ?Sized, O: DeserializeOwned>(
        &self,
        name: &str,
        id: &str,
        input: &I,
    ) -> Result<O, WorkflowError> {
        self.spawn_child(name, id, input).await?;
        self.await_child(name, id).await
    }

    /// Spawns child `name`/`id` without waiting for it; await it later with
    /// [`await_child`](Self::await_child), or never (fire and forget). The child row is created
    /// in the spawn step's transaction and never re-created on replay. A child running for
    /// another parent refuses the spawn (see [`child`](Self::child)).
    ///
    /// # Errors
    ///
    /// [`WorkflowError::ChildTaken`], [`WorkflowError::InvalidStep`] for a bad name or id,
    /// [`WorkflowError::Halted`].
    pub async fn spawn_child<I: Serialize + ?Sized>(
        &self,
        name: &str,
        id: &str,
        input: &I,
    ) -> Result<(), WorkflowError> {
        let child = child_key(name, id)?;
        let spawn_step = format!("child:{}/{}", child.name, child.id);
        let recorded = match self.replayed(&spawn_step, StepKind::Child)? {
            Some(recorded) => recorded,
            None => {
                self.before_fresh_work(&spawn_step).await?;
                let input = self.inner.encode(&spawn_step, input)?;
                let spawn = ChildSpawn {
                    await_step: child_result_step(&child),
                    child: child.clone(),
                    input,
                };
                let named = serde_json::json!({ "name": child.name, "id": child.id });
                self.record_via(&spawn_step, StepKind::Child, named, RecordVia::Child(spawn))
                    .await?
            }
        };
        // A refused spawn is recorded with the parent that holds the child.
        match recorded.get("taken") {
            None => Ok(()),
            Some(parent) => {
                let parent: InstanceKey = decode(&spawn_step, parent.clone())?;
                Err(WorkflowError::ChildTaken { child, parent })
            }
        }
    }

    /// Waits for child `name`/`id` (spawned by this run) to finish.
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until it finishes, [`WorkflowError::ChildFailed`],
    /// [`WorkflowError::ChildCancelled`], [`WorkflowError::ChildTaken`] when the spawn was
    /// refused.
    pub async fn await_child<O: DeserializeOwned>(
        &self,
        name: &str,
        id: &str,
    ) -> Result<O, WorkflowError> {
        let child = child_key(name, id)?;
        let await_step = child_result_step(&child);
        let value = self
            .awaited_with(&await_step, StepKind::Child, || async {
                Ok(Armed::Deadline(None))
            })
            .await?;
        match open(value.clone()) {
            Some(Opened::Ok(v)) => decode(&await_step, v),
            Some(Opened::Failed(reason)) => Err(WorkflowError::ChildFailed { child, reason }),
            Some(Opened::Cancelled) => Err(WorkflowError::ChildCancelled { child }),
            Some(Opened::Taken(parent)) => Err(WorkflowError::ChildTaken { child, parent }),
            _ => decode(&await_step, value),
        }
    }

    /// Cancels child `name`/`id` (journaled, so it happens once); a run awaiting it then sees
    /// [`WorkflowError::ChildCancelled`].
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Step`] when the cancel could not be recorded (unknown child),
    /// [`WorkflowError::Halted`] when this run must stop.
    pub async fn cancel_child(&self, name: &str, id: &str) -> Result<(), WorkflowError> {
        let child = child_key(name, id)?;
        let step = format!("child:{}/{}:cancel", child.name, child.id);
        let store = self.store().clone();
        self.journaled(&step, StepKind::Child, || async move {
            store
                .instance_cancel(&child, true)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
    }
}

fn child_key(name: &str, id: &str) -> Result<InstanceKey, WorkflowError> {
    Ok(InstanceKey::new(
        WorkflowName::new(name)?,
        WorkflowId::new(id)?,
    ))
}
