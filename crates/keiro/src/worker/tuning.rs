//! `Tuning`: the worker options that are rarely changed, set together through
//! [`WorkerBuilder::tuning`](super::WorkerBuilder::tuning). The builder's own methods set the
//! rest, so each option has one way in.

use std::time::Duration;

use keiro_journal::message::StreamBudget;
use keiro_journal::{Backoff, JournalBudget, RECONCILE_DEFAULT};
use keiro_lease::{CRASH_BACKOFF_DEFAULT, MAX_ATTEMPTS_DEFAULT};
use keiro_resume::{ResumeOptions, PASS_LIMIT_DEFAULT};

/// The worker options that are rarely changed: the crash ceiling and backoff, the reconcile
/// fallback, the size of a pass, the journal budget and the stream budget. Set them all at
/// once with [`WorkerBuilder::tuning`](super::WorkerBuilder::tuning), starting from
/// [`Tuning::default`]; what people change day to day (concurrency, lease, poll interval,
/// owner, telemetry) has a method of its own on the builder instead.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use keiro::worker::Tuning;
/// let tuning = Tuning { max_attempts: 3, reconcile: None, ..Tuning::default() };
/// let worker = keiro::Keiro::temporary()?.worker().concurrency(8).tuning(tuning).build()?;
/// assert_eq!(worker.options().max_attempts, 3);
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))] fn main() {}
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    /// Crash ceiling: at this many attempts a run is failed; at least 1. Defaults to
    /// [`MAX_ATTEMPTS_DEFAULT`].
    pub max_attempts: i32,
    /// Crash backoff: after a crash with `n` earlier ones the run waits the ladder's rung
    /// `n + 1`. Defaults to [`CRASH_BACKOFF_DEFAULT`].
    pub backoff: Backoff,
    /// Reconcile fallback for runs parked on an event with no deadline; `None` disables it.
    /// Defaults to `Some(`[`RECONCILE_DEFAULT`]`)`.
    pub reconcile: Option<Duration>,
    /// The most runs one pass of the worker loop claims (`None`: no cap); see
    /// [`ResumeOptions::pass_limit`]. Defaults to `Some(`[`PASS_LIMIT_DEFAULT`]`)`.
    pub pass_limit: Option<usize>,
    /// How long one generation's journal may grow before fresh steps fail with
    /// `WorkflowError::JournalFull`. Defaults to [`JournalBudget::default`].
    pub journal_budget: JournalBudget,
    /// How much a run may write to its streams before a write fails with
    /// `WorkflowError::StreamFull`. Defaults to [`StreamBudget::default`].
    pub stream_budget: StreamBudget,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            max_attempts: MAX_ATTEMPTS_DEFAULT,
            backoff: CRASH_BACKOFF_DEFAULT,
            reconcile: Some(RECONCILE_DEFAULT),
            pass_limit: Some(PASS_LIMIT_DEFAULT),
            journal_budget: JournalBudget::default(),
            stream_budget: StreamBudget::default(),
        }
    }
}

impl Tuning {
    /// Writes every field into `options`, the builder's resume options.
    pub(super) fn apply(self, options: &mut ResumeOptions) {
        // Destructured, so a field added here cannot be forgotten.
        let Self {
            max_attempts,
            backoff,
            reconcile,
            pass_limit,
            journal_budget,
            stream_budget,
        } = self;
        options.max_attempts = max_attempts;
        options.backoff = backoff;
        options.reconcile = reconcile;
        options.pass_limit = pass_limit;
        options.journal_budget = journal_budget;
        options.stream_budget = stream_budget;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_resume_options_defaults() {
        let defaults = ResumeOptions::default();
        let expected = Tuning {
            max_attempts: defaults.max_attempts,
            backoff: defaults.backoff,
            reconcile: defaults.reconcile,
            pass_limit: defaults.pass_limit,
            journal_budget: defaults.journal_budget,
            stream_budget: defaults.stream_budget,
        };
        assert_eq!(Tuning::default(), expected);
    }
}
