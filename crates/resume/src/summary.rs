//! The per-pass summary: what a resume pass found and did.

use std::collections::BTreeSet;
use std::ops::{Add, AddAssign};

use keiro_journal::WorkflowName;

/// What one resume pass (or several, added together) found and did.
///
/// The fields and their meanings are the seed's. A summary is a monoid under `+` with
/// `Default` as the identity, and a pass reports the same summary whether its candidates ran
/// one after another or concurrently.
///
/// ```
/// use keiro_resume::ResumeSummary;
/// let a = ResumeSummary { discovered: 2, completed: 1, ..Default::default() };
/// let b = ResumeSummary { discovered: 1, paced: 1, ..Default::default() };
/// let total = a + b;
/// assert_eq!((total.discovered, total.completed, total.paced), (3, 1, 1));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumeSummary {
    /// Candidates the discovery query returned.
    pub discovered: u64,
    /// Candidates whose state moved: a fresh journal append (step, marker, patch decision), a
    /// terminal failure, or a wake that landed during the run. A drain stops when this is 0.
    pub advanced: u64,
    /// Candidates whose lease was acquired and whose run was attempted.
    pub resumed: u64,
    /// Runs that completed.
    pub completed: u64,
    /// Runs that appended and then parked again on a wake source.
    pub still_suspended: u64,
    /// Candidates whose workflow name is not in the registry.
    pub unknown_name: u64,
    /// Runs failed terminally (crash ceiling, divergence).
    pub failed: u64,
    /// Store errors and races that consumed no attempt (retried by a later pass).
    pub transient_errors: u64,
    /// Candidates skipped because another owner holds the lease, the instance went away, or
    /// the run lost its lease midway.
    pub lease_skipped: u64,
    /// Candidates skipped because their crash backoff has not elapsed.
    pub paced: u64,
    /// Runs parked on a sleep that is already due but that no timer worker has fired.
    pub sleep_due: u64,
    /// The distinct names that were not in the registry.
    pub unregistered_names: BTreeSet<WorkflowName>,
}

impl AddAssign for ResumeSummary {
    fn add_assign(&mut self, other: Self) {
        self.discovered += other.discovered;
        self.advanced += other.advanced;
        self.resumed += other.resumed;
        self.completed += other.completed;
        self.still_suspended += other.still_suspended;
        self.unknown_name += other.unknown_name;
        self.failed += other.failed;
        self.transient_errors += other.transient_errors;
        self.lease_skipped += other.lease_skipped;
        self.paced += other.paced;
        self.sleep_due += other.sleep_due;
        self.unregistered_names.extend(other.unregistered_names);
    }
}

impl Add for ResumeSummary {
    type Output = Self;
    fn add(mut self, other: Self) -> Self {
        self += other;
        self
    }
}

impl std::iter::Sum for ResumeSummary {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), Add::add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: u64, name: &str) -> ResumeSummary {
        ResumeSummary {
            discovered: n,
            advanced: n + 1,
            unknown_name: 1,
            unregistered_names: [WorkflowName::new(name).unwrap()].into(),
            ..Default::default()
        }
    }

    #[test]
    fn addition_is_a_monoid() {
        let (a, b, c) = (sample(1, "a"), sample(2, "b"), sample(3, "a"));
        assert_eq!(a.clone() + ResumeSummary::default(), a);
        assert_eq!(
            (a.clone() + b.clone()) + c.clone(),
            a.clone() + (b.clone() + c.clone())
        );
        let total: ResumeSummary = [a, b, c].into_iter().sum();
        assert_eq!(total.discovered, 6);
        assert_eq!(total.unregistered_names.len(), 2);
    }
}
