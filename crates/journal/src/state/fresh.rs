//! The checks before a fresh call, decided over the run's state.
//!
//! Before a call does fresh work (runs a step's action, arms an await) the run must still be
//! allowed to: it is not a losing branch of a decided race, has not halted, has reached every
//! step the body recorded before (the divergence rule, in the `replay` module docs), is not
//! replaying only, has room in its journal, and holds a lease confirmed recently enough.
//! [`fresh_call`] answers which of these stops the call, in that order, as a value; the
//! context carries the answer out (sends the held-back append, yields, confirms the lease).

use std::time::Instant;

use crate::model::budget::journal_full;
use crate::state::State;
use crate::{RunOptions, WorkflowError};

/// Where a fresh call stands when it asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The call has just missed the journal.
    Entered,
    /// The call has sent the run's held-back append and let its siblings replay.
    Settled,
}

/// What a fresh call does next.
#[derive(Debug)]
pub(crate) enum FreshCall {
    /// A losing branch of a decided race: suspend at the step without arming anything.
    Suspend,
    /// Send the held-back append, yield once to sibling futures, then ask again, `Settled`.
    Settle,
    /// The run has halted: stop with this reason.
    Halted { reason: String },
    /// The code no longer matches the journal: stop the run with this divergence.
    Diverged { detail: String },
    /// The journal is full: refuse the call with this error (before any action runs).
    Refused(WorkflowError),
    /// Go on, confirming the lease first when `confirm`.
    Proceed { confirm: bool },
}

/// Decides what a fresh call at `step` does next from the run's `state` and `options`, at
/// `stage`, at `now` (for the age of the last lease confirmation).
pub(crate) fn fresh_call(
    state: &State,
    options: &RunOptions,
    step: &str,
    stage: Stage,
    now: Instant,
) -> FreshCall {
    if stage == Stage::Entered {
        // A losing branch of a decided race: it replays what is journaled, and waits forever
        // on anything else, without arming it.
        return if state.disarmed {
            FreshCall::Suspend
        } else {
            FreshCall::Settle
        };
    }
    if let Some(halt) = &state.halt {
        return FreshCall::Halted {
            reason: halt.describe(),
        };
    }
    if let Some(recorded) = state.replay.first_unconsumed() {
        return FreshCall::Diverged {
            detail: format!(
                "recorded step {recorded:?} was not reached before fresh step {step:?}"
            ),
        };
    }
    if options.replay_only {
        return FreshCall::Diverged {
            detail: "replay only: the journal has no record of this step".to_owned(),
        };
    }
    // Refused before an action runs, so a body that continues as new on the error has run
    // nothing it cannot journal.
    let budget = options.journal_budget;
    let size = state.journal_size();
    if size.steps >= budget.steps || size.bytes >= budget.bytes {
        return FreshCall::Refused(journal_full(step, size, budget));
    }
    FreshCall::Proceed {
        confirm: now.saturating_duration_since(state.last_confirmed) >= options.confirm_after,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use time::OffsetDateTime;

    use super::*;
    use crate::model::budget::JournalSize;
    use crate::state::replay::Replay;
    use crate::state::Halt;
    use crate::{Event, JournalBudget, JournalEntry, Marker, StepKind};

    fn entry(seq: i64, step: &str) -> JournalEntry {
        JournalEntry {
            seq,
            generation: 0,
            event: Event::StepRecorded {
                step: step.into(),
                kind: StepKind::Step,
                result: json!(seq),
            },
            recorded_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    fn state(entries: &[JournalEntry], confirmed: Instant) -> State {
        State::new(Replay::new(entries), JournalSize::of(entries), confirmed)
    }

    fn settled(state: &State, options: &RunOptions, now: Instant) -> FreshCall {
        fresh_call(state, options, "next", Stage::Settled, now)
    }

    #[test]
    fn a_call_settles_first_unless_its_branch_lost_a_race() {
        let now = Instant::now();
        let options = RunOptions::default();
        let mut state = state(&[], now);
        let entered = |s: &State| fresh_call(s, &options, "next", Stage::Entered, now);
        assert!(matches!(entered(&state), FreshCall::Settle));
        state.disarmed = true;
        assert!(matches!(entered(&state), FreshCall::Suspend));
        // Even a halted run suspends a disarmed branch first: the halt is reported later.
        state.halt = Some(Halt::LeaseLost);
        assert!(matches!(entered(&state), FreshCall::Suspend));
    }

    #[test]
    fn a_settled_call_proceeds_on_a_fresh_lease_and_confirms_a_stale_one() {
        let now = Instant::now();
        let options = RunOptions::new(Duration::from_secs(60));
        let state = state(&[], now);
        assert!(matches!(
            settled(&state, &options, now),
            FreshCall::Proceed { confirm: false }
        ));
        let later = now + options.confirm_after;
        assert!(matches!(
            settled(&state, &options, later),
            FreshCall::Proceed { confirm: true }
        ));
    }

    #[test]
    fn the_checks_stop_a_call_in_order_halt_divergence_replay_only_budget() {
        let now = Instant::now();
        let mut options = RunOptions {
            replay_only: true,
            journal_budget: JournalBudget {
                steps: 1,
                bytes: 1 << 20,
            },
            ..RunOptions::default()
        };
        let mut state = state(&[entry(1, "a")], now);
        state.halt = Some(Halt::Terminal(Marker::Cancelled));
        assert!(matches!(
            settled(&state, &options, now),
            FreshCall::Halted { reason } if reason == "the instance is cancelled"
        ));
        state.halt = None;
        assert!(matches!(
            settled(&state, &options, now),
            FreshCall::Diverged { detail }
                if detail == "recorded step \"a\" was not reached before fresh step \"next\""
        ));
        state.replay.lookup("a", StepKind::Step);
        assert!(matches!(
            settled(&state, &options, now),
            FreshCall::Diverged { detail }
                if detail == "replay only: the journal has no record of this step"
        ));
        options.replay_only = false;
        assert!(matches!(
            settled(&state, &options, now),
            FreshCall::Refused(WorkflowError::JournalFull {
                steps: 1,
                budget_steps: 1,
                ..
            })
        ));
        options.journal_budget.steps = 2;
        assert!(matches!(
            settled(&state, &options, now),
            FreshCall::Proceed { confirm: false }
        ));
    }

    #[test]
    fn the_budget_counts_bytes_too() {
        let now = Instant::now();
        let mut options = RunOptions::default();
        let mut state = state(&[entry(1, "a")], now);
        state.replay.lookup("a", StepKind::Step);
        options.journal_budget = JournalBudget {
            steps: 10,
            bytes: 1,
        };
        assert!(matches!(
            settled(&state, &options, now),
            FreshCall::Refused(WorkflowError::JournalFull { bytes: 1, .. })
        ));
    }
}
