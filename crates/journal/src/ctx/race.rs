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
//!   an error other than suspension) or suspended. Of those that resolved, the one that
//!   resolved first wins, by journal order: a branch resolved by values loaded with the run
//!   resolved when the last of them was journaled (its `seq`), and one that did fresh work in
//!   this drive (an arm that found its value, a step) after all of those; ties go to the lower
//!   index. So when a drive finds several branches resolved (a signal landed, then the timer
//!   fired, before the run was re-driven) the earliest wins, not the first listed. When every
//!   branch suspends, the race suspends, and the run parks on all of them.
//! - Deciding: the losers' arms made in this drive are undone before the winner is journaled:
//!   their signal waiters are withdrawn (a signal sent later goes to the next waiter or the
//!   buffer), and their awaited steps, deadlines and deferred remote dispatches leave the park.
//!   A sleep's timer or an awakeable a loser armed stays, and at worst wakes the run once. A
//!   signal a losing wait took (delivered before the drive, or taken from the buffer in it) is
//!   given back to its token in the transaction that journals the winner
//!   ([`JournalStore::signal_return`](crate::JournalStore::signal_return)): to the token's next
//!   waiter, or the head of its buffer. The loser's journaled copy is never read again.
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

use crate::ctx::RecordVia;
use crate::model::id;
use crate::state::race_marks::RaceMarks;
use crate::state::Halt;
use crate::{BoxFuture, Ctx, ReturnedSignal, StepKind, WorkflowError};

/// Where a branch stands in the current drive.
enum Branch<T> {
    Running,
    Suspended,
    Resolved(Result<T, WorkflowError>),
}

/// The winner of an undecided race whose branches have all resolved or suspended: the
/// resolved branch that resolved first ([`RaceMarks::resolved_at`]), the lower index on a tie.
fn first_resolved<T>(states: &[Branch<T>], marks: &[RaceMarks]) -> Option<usize> {
    states
        .iter()
        .zip(marks)
        .enumerate()
        .filter(|(_, (state, _))| matches!(state, Branch::Resolved(_)))
        .min_by_key(|(index, (_, marks))| {
            let at = marks.resolved_at();
            (at.is_none(), at.unwrap_or(0), *index)
        })
        .map(|(index, _)| index)
}

impl Ctx {
    /// Races `branches` (awaits mapped into one result type) and returns the winner's result;
    /// the winner is journaled under `race:<name>`, so every replay takes the same branch
    /// however the awaits resolved meanwhile. When several branches have resolved by the time
    /// the run is driven, the one journaled first wins. A losing signal wait is withdrawn, and
    /// a signal it had already taken goes back to its token with the decision.
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
                    return Err(self.inner.diverged(&step, detail));
                }
            },
            None => None,
        };
        let before = self.race_snapshot();
        let (index, result, mut marks) = self.poll_race(branches, winner).await?;
        let won = std::mem::take(&mut marks[index]);
        if let Some(outer) = &mut self.state().race_marks {
            outer.absorb(won);
        }
        if winner.is_none() {
            // What the losers' waits took goes back to the tokens, with the decision.
            let returned: Vec<ReturnedSignal> = marks.into_iter().flat_map(|m| m.signals).collect();
            self.undo_losers(&step, before).await?;
            self.before_fresh_work(&step).await?;
            let decision = json!({ "winner": index });
            let recorded = if returned.is_empty() {
                self.record(&step, StepKind::Race, decision).await?
            } else {
                self.record_via(&step, StepKind::Race, decision, RecordVia::Race(returned))
                    .await?
            };
            if recorded_winner(&recorded, usize::MAX) != Some(index) {
                // Another holder decided the race first; our winner's result is not that one.
                return Err(self.inner.halt(Halt::Conflict { step }));
            }
        }
        result
    }

    /// Polls the branches round by round until one resolves (the recorded `winner` on replay,
    /// the others disarmed), or all suspend. Returns the winner with what each branch read.
    async fn poll_race<T>(
        &self,
        mut branches: Vec<BoxFuture<'_, Result<T, WorkflowError>>>,
        winner: Option<usize>,
    ) -> Result<(usize, Result<T, WorkflowError>, Vec<RaceMarks>), WorkflowError> {
        let mut states: Vec<Branch<T>> = branches.iter().map(|_| Branch::Running).collect();
        let mut marks: Vec<RaceMarks> = branches.iter().map(|_| RaceMarks::default()).collect();
        std::future::poll_fn(|cx| {
            for (index, branch) in branches.iter_mut().enumerate() {
                if !matches!(states[index], Branch::Running) {
                    continue;
                }
                let disarm = winner.is_some_and(|w| w != index);
                let polled =
                    self.polled_as(disarm, &mut marks[index], || Pin::as_mut(branch).poll(cx));
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
                None => first_resolved(&states, &marks),
            };
            if let Some(index) = decided {
                return match std::mem::replace(&mut states[index], Branch::Suspended) {
                    Branch::Resolved(result) => {
                        Poll::Ready(Ok((index, result, std::mem::take(&mut marks))))
                    }
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

    /// Runs `poll` with the branch disarmed when it lost (nested races keep an outer disarm),
    /// noting what it reads in `marks`.
    fn polled_as<R>(&self, disarm: bool, marks: &mut RaceMarks, poll: impl FnOnce() -> R) -> R {
        let (outer_disarm, outer_marks) = {
            let mut state = self.state();
            let outer_disarm = state.disarmed;
            state.disarmed = outer_disarm || disarm;
            let outer_marks = state.race_marks.replace(std::mem::take(marks));
            (outer_disarm, outer_marks)
        };
        let result = poll();
        let mut state = self.state();
        state.disarmed = outer_disarm;
        *marks = std::mem::replace(&mut state.race_marks, outer_marks).unwrap_or_default();
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
            self.inner.send_held_back().await?;
        }
        for wait in withdrawn {
            self.store()
                .signal_withdraw(self.key(), self.generation(), &wait)
                .await
                .map_err(|e| self.inner.store_failed(step, e))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(seq: i64) -> RaceMarks {
        let mut marks = RaceMarks::default();
        marks.read(Some(seq));
        marks
    }

    fn fresh() -> RaceMarks {
        RaceMarks {
            fresh: true,
            ..RaceMarks::default()
        }
    }

    fn resolved() -> Branch<()> {
        Branch::Resolved(Ok(()))
    }

    #[test]
    fn the_branch_journaled_first_wins_whatever_its_index() {
        let states = [resolved(), resolved()];
        assert_eq!(first_resolved(&states, &[loaded(20), loaded(10)]), Some(1));
        assert_eq!(first_resolved(&states, &[loaded(10), loaded(20)]), Some(0));
        // A branch resolves when the last value it needed was journaled.
        let mut late = loaded(5);
        late.read(Some(30));
        assert_eq!(first_resolved(&states, &[late, loaded(20)]), Some(1));
    }

    #[test]
    fn fresh_work_comes_after_every_loaded_value_and_ties_go_to_the_lower_index() {
        let states = [resolved(), resolved(), resolved()];
        assert_eq!(
            first_resolved(&states, &[fresh(), loaded(99), fresh()]),
            Some(1)
        );
        assert_eq!(
            first_resolved(&states, &[fresh(), fresh(), fresh()]),
            Some(0)
        );
        // A branch that read nothing resolved in this drive too.
        assert_eq!(
            first_resolved(&states, &[RaceMarks::default(), loaded(3), fresh()]),
            Some(1)
        );
        // A value recorded earlier in this drive is fresh, whatever was loaded beside it.
        let mut mixed = loaded(1);
        mixed.read(None);
        assert_eq!(first_resolved(&states[..2], &[mixed, loaded(2)]), Some(1));
    }

    #[test]
    fn suspended_branches_never_win() {
        let states = [Branch::Suspended, resolved(), Branch::Suspended];
        assert_eq!(
            first_resolved(&states, &[loaded(1), fresh(), loaded(2)]),
            Some(1)
        );
        let states: [Branch<()>; 2] = [Branch::Suspended, Branch::Suspended];
        assert_eq!(first_resolved(&states, &[loaded(1), loaded(2)]), None);
    }
}
