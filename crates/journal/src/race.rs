//! Races between awaits whose winner is journaled: [`Ctx::select`].
//!
//! A plain `select!` over two awaits is decided by poll order, and after a crash both may
//! replay as journaled, so a re-drive can take the other branch than the first drive took: a
//! false `NonDeterminism`, or worse, a different path. `Ctx::select` journals the winner under
//! `race:<name>` (kind `race`, a body-recorded step) the first time one branch resolves, and
//! every later drive takes that branch again.
//!
//! How a drive runs a race:
//! - Undecided: every branch is polled, in index order, until each has resolved (a value, or
//!   an error other than suspension) or suspended; the lowest-index branch that resolved wins.
//!   When every branch suspends, the race suspends, and the run parks on all of them.
//! - Deciding: the losers' arms made in this drive are undone before the winner is journaled:
//!   their signal waiters are withdrawn (a signal sent later goes to the next waiter or the
//!   buffer), and their awaited steps, deadlines and deferred remote dispatches leave the park.
//!   A sleep's timer or an awakeable a loser armed stays, and at worst wakes the run once.
//! - Decided (replay): the branches are still all polled in index order, so the step names a
//!   body derives from call order (signal waits count per token) come out the same on every
//!   drive; but the losers are disarmed: they may replay journaled values, and any fresh work
//!   they reach (an arm, an action) suspends forever instead of happening.
//!
//! Branches should be awaits (or short sequences of them) mapped into one result type; a branch
//! that runs step actions races them like any future, and only the winner's result is kept.

use std::pin::Pin;
use std::task::Poll;

use serde_json::{json, Value};

use crate::context::Halt;
use crate::{id, BoxFuture, Ctx, StepKind, WorkflowError};

/// Where a branch stands in the current drive.
enum Branch<T> {
    Running,
    Suspended,
    Resolved(Result<T, WorkflowError>),
}

impl Ctx {
    /// Races `branches` (awaits mapped into one result type) and returns the winner's result;
    /// the winner is journaled under `race:<name>`, so every replay takes the same branch
    /// however the awaits resolved meanwhile. A losing signal wait is withdrawn.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use keiro_journal::{Ctx, WorkflowError};
    /// enum Decision { Approved(bool), TimedOut }
    /// # async fn body(ctx: Ctx) -> Result<(), WorkflowError> {
    /// let decision = ctx
    ///     .select(
    ///         "approval-or-timeout",
    ///         vec![
    ///             Box::pin(async { ctx.await_step("approval").await.map(Decision::Approved) }),
    ///             Box::pin(async {
    ///                 ctx.sleep("timeout", Duration::from_secs(3600)).await?;
    ///                 Ok(Decision::TimedOut)
    ///             }),
    ///         ],
    ///     )
    ///     .await?;
    /// # let _ = decision; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] while no branch has resolved; the winning branch's own
    /// error when it resolved with one; [`WorkflowError::Halted`] when the run must stop.
    pub async fn select<'a, T: 'a>(
        &self,
        name: &str,
        branches: Vec<BoxFuture<'a, Result<T, WorkflowError>>>,
    ) -> Result<T, WorkflowError> {
        id::validate_user_step(name)?;
        let step = format!("race:{name}");
        let recorded = self.replayed(&step, StepKind::Race)?;
        let winner = match &recorded {
            Some(value) => match recorded_winner(value, branches.len()) {
                Some(w) => Some(w),
                None => {
                    let detail = format!(
                        "the race record {value} names none of the {} branches given",
                        branches.len()
                    );
                    return Err(self.diverged(&step, detail));
                }
            },
            None => None,
        };
        let before = self.race_snapshot();
        let (index, result) = self.poll_race(branches, winner).await?;
        if winner.is_none() {
            self.undo_losers(&step, before).await?;
            self.before_fresh_work(&step).await?;
            let recorded = self
                .record(&step, StepKind::Race, json!({ "winner": index }))
                .await?;
            if recorded_winner(&recorded, usize::MAX) != Some(index) {
                // Another holder decided the race first; our winner's result is not that one.
                return Err(self.halt(Halt::Conflict { step }));
            }
        }
        result
    }

    /// Polls the branches round by round until one resolves (the recorded `winner` on replay,
    /// the others disarmed), or all suspend.
    async fn poll_race<T>(
        &self,
        mut branches: Vec<BoxFuture<'_, Result<T, WorkflowError>>>,
        winner: Option<usize>,
    ) -> Result<(usize, Result<T, WorkflowError>), WorkflowError> {
        let mut states: Vec<Branch<T>> = branches.iter().map(|_| Branch::Running).collect();
        std::future::poll_fn(|cx| {
            for (index, branch) in branches.iter_mut().enumerate() {
                if !matches!(states[index], Branch::Running) {
                    continue;
                }
                let disarm = winner.is_some_and(|w| w != index);
                let polled = self.polled_as(disarm, || Pin::as_mut(branch).poll(cx));
                if let Poll::Ready(result) = polled {
                    states[index] = match result {
                        Err(WorkflowError::Suspended { .. }) => Branch::Suspended,
                        Err(
                            e @ (WorkflowError::Halted { .. }
                            | WorkflowError::NonDeterminism { .. }
                            | WorkflowError::ContinueAsNew),
                        ) => return Poll::Ready(Err(e)),
                        other => Branch::Resolved(other),
                    };
                }
            }
            // Undecided, every branch runs until it resolves or suspends, so each loser has
            // (re-)armed its waits in this drive and can withdraw them.
            let decided = match winner {
                Some(w) => (!matches!(states[w], Branch::Running)).then_some(w),
                None if states.iter().any(|s| matches!(s, Branch::Running)) => None,
                None => states.iter().position(|s| matches!(s, Branch::Resolved(_))),
            };
            if let Some(index) = decided {
                return match std::mem::replace(&mut states[index], Branch::Suspended) {
                    Branch::Resolved(result) => Poll::Ready(Ok((index, result))),
                    _ => Poll::Ready(Err(self.race_suspended())),
                };
            }
            if states.iter().all(|s| matches!(s, Branch::Suspended)) {
                return Poll::Ready(Err(self.race_suspended()));
            }
            Poll::Pending
        })
        .await
    }

    /// Runs `poll` with the branch disarmed when it lost (nested races keep an outer disarm).
    fn polled_as<R>(&self, disarm: bool, poll: impl FnOnce() -> R) -> R {
        let outer = std::mem::replace(&mut self.state().disarmed, false);
        self.state().disarmed = outer || disarm;
        let result = poll();
        self.state().disarmed = outer;
        result
    }

    fn race_suspended(&self) -> WorkflowError {
        WorkflowError::Suspended {
            step: self
                .state()
                .awaiting
                .last()
                .cloned()
                .unwrap_or_else(|| "a race".into()),
        }
    }

    fn race_snapshot(&self) -> RaceSnapshot {
        let state = self.state();
        RaceSnapshot {
            awaiting: state.awaiting.len(),
            deferred: state.deferred.len(),
            signal_waits: state.signal_waits_armed.len(),
            wake_at: state.wake_at,
            open_ended: state.open_ended,
        }
    }

    /// Undoes what the losers armed in this drive: their waits leave the park, and their
    /// signal waiters are withdrawn before the winner is journaled (a crash in between leaves
    /// the race undecided, and the next drive arms and withdraws again).
    async fn undo_losers(&self, step: &str, before: RaceSnapshot) -> Result<(), WorkflowError> {
        let withdrawn = {
            let mut state = self.state();
            state.awaiting.truncate(before.awaiting);
            state.deferred.truncate(before.deferred);
            state.wake_at = before.wake_at;
            state.open_ended = before.open_ended;
            state.signal_waits_armed.split_off(before.signal_waits)
        };
        if !withdrawn.is_empty() {
            self.send_held_back().await?;
        }
        for wait in withdrawn {
            self.store()
                .signal_withdraw(self.key(), self.generation(), &wait)
                .await
                .map_err(|e| self.store_failed(step, e))?;
        }
        Ok(())
    }
}

/// What the drive had armed when a race began.
struct RaceSnapshot {
    awaiting: usize,
    deferred: usize,
    signal_waits: usize,
    wake_at: Option<time::OffsetDateTime>,
    open_ended: bool,
}

/// The winner a race record names, if it is one of `branches`.
fn recorded_winner(value: &Value, branches: usize) -> Option<usize> {
    value
        .get("winner")
        .and_then(Value::as_u64)
        .and_then(|w| usize::try_from(w).ok())
        .filter(|w| *w < branches)
}
