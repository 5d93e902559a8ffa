//! Steps whose action journals its own result, in the action's own transaction.
//!
//! A plain step runs its action, then journals the result in a second transaction: a crash
//! between the two runs the action again, so its effects are at-least-once. When the action's
//! effects live in the store's own database (the Postgres store's `ctx.transaction`), the
//! action can instead make the step's journal append itself, inside the transaction that holds
//! its effects, and commit both at once: the effects then happen exactly once.
//!
//! The context keeps every rule of a plain step: replay returns the journaled value without
//! running the action; the divergence and lease checks run before it; the lease is kept alive
//! while it runs; and the append the action makes carries the run's fence, so a writer that
//! lost its lease is refused and must roll its effects back.
//!
//! An action may hold the run's instance row locked in its transaction, fenced, from before
//! its effects ([`StepJournal::hold_lease`]): no other writer can then take the lease over
//! until that transaction ends, so the heartbeat stops renewing it meanwhile (its renewal would
//! only wait for the lock, or make a snapshot transaction's append fail).
//!
//! Failures keep the plain step's rules too: the action's own error, or a failure the store
//! reports that the action caused ([`SelfJournalError::Failed`]: a transaction it left aborted,
//! a commit its statements made the database refuse), is a failed attempt; a store that could
//! not be reached is a store error the run stops on, with no attempt counted.

use std::future::Future;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::ctx::{decode, ActionRunning};
use crate::model::retry::Attempt;
use crate::unwind::CatchPanic;
use crate::{
    store, Append, AppendOutcome, Ctx, Fence, InstanceKey, StepKind, StepOptions, WorkflowError,
};

/// What a self-journaling step's action gets: the step's name and the append its result must
/// be journaled with.
pub struct StepJournal<'a> {
    ctx: &'a Ctx,
    step: &'a str,
}

impl std::fmt::Debug for StepJournal<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepJournal")
            .field("key", self.ctx.key())
            .field("step", &self.step)
            .finish()
    }
}

impl<'a> StepJournal<'a> {
    /// The step being run.
    pub fn step(&self) -> &str {
        self.step
    }

    /// The instance the step belongs to.
    pub fn key(&self) -> &InstanceKey {
        self.ctx.key()
    }

    /// The lease the run holds (`None` for an unfenced run), which the action checks before
    /// its effects when it locks the instance row itself (see [`hold_lease`](Self::hold_lease)).
    pub fn fence(&self) -> Option<&Fence> {
        self.ctx.options().fence.as_ref()
    }

    /// Tells the run that the action is about to hold the instance row locked in its own
    /// transaction, its fence checked: until the returned guard is dropped, no other writer can
    /// take the lease over, so the lease heartbeat skips its renewals (each would wait for the
    /// lock, holding a connection, and under REPEATABLE READ or SERIALIZABLE its write would
    /// make the transaction's own append fail). Drop the guard once the transaction has ended;
    /// the step's append renews the lease as it commits.
    pub fn hold_lease(&self) -> LeaseHeld<'a> {
        self.ctx.state().leases_held += 1;
        LeaseHeld(self.ctx)
    }

    /// The payload codec of the run's store ([`JournalStore::payload_codec`]): the action seals
    /// its append's value with it, as the store's own appends are sealed.
    ///
    /// [`JournalStore::payload_codec`]: crate::JournalStore::payload_codec
    pub fn payload_codec(&self) -> Option<std::sync::Arc<dyn crate::codec::Codec>> {
        self.ctx.store().payload_codec()
    }

    /// The append that journals `value` as this step's result, carrying the run's fence and
    /// lease renewal. The action makes it inside its own transaction and commits only when it
    /// answers [`AppendOutcome::Appended`].
    ///
    /// # Errors
    ///
    /// The errors of an unstorable result ([`WorkflowError::Encode`],
    /// [`WorkflowError::PayloadTooLarge`]) and [`WorkflowError::JournalFull`]: the action
    /// rolls back and returns them as [`SelfJournalError::Refused`].
    pub fn append_for<T: Serialize + ?Sized>(&self, value: &T) -> Result<Append, WorkflowError> {
        let json = self.ctx.inner.encode(self.step, value)?;
        self.ctx
            .inner
            .check_budget_for(self.step, crate::encoded_len(&json))?;
        Ok(self.ctx.inner.fresh_append(self.step, StepKind::Step, json))
    }
}

/// The guard of [`StepJournal::hold_lease`]: while it lives the heartbeat renews nothing.
#[derive(Debug)]
#[must_use = "the heartbeat resumes as soon as the guard is dropped"]
pub struct LeaseHeld<'a>(&'a Ctx);

impl Drop for LeaseHeld<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.leases_held = state.leases_held.saturating_sub(1);
    }
}

/// What a self-journaling step's action reports when it ran to its append.
#[derive(Debug)]
pub struct SelfJournaled {
    /// The result the action journaled (or tried to), as its append carried it.
    pub value: Value,
    /// What the append answered. The action committed its transaction exactly when this is
    /// [`AppendOutcome::Appended`], and rolled it back otherwise.
    pub outcome: AppendOutcome,
}

/// Why a self-journaling step's action did not reach a committed append.
#[derive(Debug)]
pub enum SelfJournalError<E> {
    /// The action's own error; its transaction was rolled back. The run crashes and is retried,
    /// as for a failing [`Ctx::step`].
    Action(E),
    /// The result was refused by [`StepJournal::append_for`]; the transaction was rolled back.
    Refused(WorkflowError),
    /// The step failed for a reason of the action's making that the store, not the action,
    /// reported, such as a transaction the action left aborted or a commit the database
    /// refused for what its statements did; the transaction was rolled back. A failed attempt,
    /// as [`Action`](Self::Action) is: the run crashes, or under a retry policy the attempt
    /// is journaled and retried. A policy's [`retry_if`](StepOptions::retry_if) sees the boxed
    /// error (the type `Box<dyn std::error::Error + Send + Sync>`).
    Failed(Box<dyn std::error::Error + Send + Sync>),
    /// The store failed: the append, the commit, or the transaction itself. A commit that
    /// failed may still have committed; the next drive's journal tells.
    Store(store::Error),
}

impl Ctx {
    /// Runs a step whose `action` journals its own result, inside the action's own
    /// transaction (see the module docs of `self_journaled`): on replay returns the journaled
    /// value without running `action`.
    ///
    /// This is for store crates that offer such steps (the Postgres store's
    /// `ctx.transaction`); a workflow body calls theirs.
    ///
    /// # Errors
    ///
    /// As [`step`](Self::step); an action that lost the lease or raced another holder sees
    /// its append refused and rolls back, and the run stops.
    pub async fn step_journaled_by<'c, T, E, F, Fut>(
        &'c self,
        name: &'c str,
        action: F,
    ) -> Result<T, WorkflowError>
    where
        T: DeserializeOwned,
        E: std::fmt::Display + 'static,
        F: FnOnce(StepJournal<'c>) -> Fut,
        Fut: Future<Output = Result<SelfJournaled, SelfJournalError<E>>>,
    {
        crate::model::id::validate_user_step(name)?;
        if let Some(value) = self.replayed(name, StepKind::Step)? {
            return decode(name, value);
        }
        self.before_fresh_work(name).await?;
        let run = action(StepJournal {
            ctx: self,
            step: name,
        });
        let attempt = self.self_journaled_attempt(name, Instant::now(), run, None);
        let outcome = attempt.await;
        self.state().stats.executed += 1;
        match outcome? {
            Attempt::Succeeded(value) => decode(name, value),
            Attempt::Failed { message, .. } => Err(WorkflowError::Step {
                step: name.to_owned(),
                message,
            }),
        }
    }

    /// [`step_journaled_by`](Self::step_journaled_by) under a retry policy, as
    /// [`step_with`](Self::step_with) runs a plain step: an action error rolls its transaction
    /// back and counts as a failed attempt; when the attempts are spent the body gets
    /// [`WorkflowError::StepFailed`].
    ///
    /// # Errors
    ///
    /// As [`step_with`](Self::step_with).
    pub async fn step_journaled_with<'c, T, E, F, Fut>(
        &'c self,
        name: &'c str,
        options: &StepOptions,
        mut action: F,
    ) -> Result<T, WorkflowError>
    where
        T: DeserializeOwned,
        E: std::fmt::Display + 'static,
        F: FnMut(StepJournal<'c>) -> Fut,
        Fut: Future<Output = Result<SelfJournaled, SelfJournalError<E>>>,
    {
        let started = Instant::now();
        self.retrying(name, options, |_| {
            let run = action(StepJournal {
                ctx: self,
                step: name,
            });
            self.self_journaled_attempt(name, started, run, Some(options))
        })
        .await
    }

    /// One attempt of a self-journaling step: the action runs under the lease's heartbeat, and
    /// what its append answered is adopted. Without a retry policy (`options` is `None`) an
    /// action error, a failure of the action's making, or a panic is reported as a failed
    /// attempt that may not be retried.
    async fn self_journaled_attempt<E, Fut>(
        &self,
        name: &str,
        started: Instant,
        run: Fut,
        options: Option<&StepOptions>,
    ) -> Result<Attempt, WorkflowError>
    where
        E: std::fmt::Display + 'static,
        Fut: Future<Output = Result<SelfJournaled, SelfJournalError<E>>>,
    {
        let ran = {
            let _running = ActionRunning::new(self);
            let span = tracing::debug_span!("step", keiro.workflow.step = name);
            let run = tracing::Instrument::instrument(CatchPanic::new(run), span);
            self.inner.keep_alive(run).await
        };
        match ran {
            Ok(Ok(journaled)) => {
                let len = crate::encoded_len(&journaled.value);
                let value = self.inner.adopt(
                    name,
                    StepKind::Step,
                    journaled.value,
                    len,
                    journaled.outcome,
                    started,
                )?;
                if let Some(observer) = &self.options().observer {
                    observer.step_finished(&self.key().name, StepKind::Step, started.elapsed());
                }
                Ok(Attempt::Succeeded(value))
            }
            Ok(Err(SelfJournalError::Action(e))) => Ok(Attempt::Failed {
                message: e.to_string(),
                retry: options.is_some_and(|options| options.retries(&e)),
            }),
            Ok(Err(SelfJournalError::Failed(error))) => Ok(Attempt::Failed {
                message: crate::error_chain(&*error),
                retry: options.is_some_and(|options| options.retries(&error)),
            }),
            Ok(Err(SelfJournalError::Refused(error))) => Err(if error.fails_run_at_once() {
                self.inner.fail_at_once(error)
            } else {
                error
            }),
            Ok(Err(SelfJournalError::Store(error))) => Err(self.inner.store_failed(name, error)),
            Err(message) if options.is_some() => Ok(Attempt::Failed {
                message: format!("panicked: {message}"),
                retry: true,
            }),
            Err(message) => Err(WorkflowError::Panicked {
                step: name.to_owned(),
                message,
            }),
        }
    }
}
