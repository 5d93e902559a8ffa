//! Fault injection for tests: crash a run right after a step is journaled, as a process that
//! dies after its commit would (`keiro::testing`'s `crash_after`).

use crate::InstanceKey;

/// Decides where runs crash. Consulted by the context after each fresh step it journals; a
/// `true` ends the run as a crash (an attempt counted, retried with backoff by the resume
/// worker) while the step stays journaled, so the next drive replays it and runs only the tail.
pub trait Faults: Send + Sync + std::fmt::Debug {
    /// Whether the run of `key` crashes right after `step` was journaled.
    fn crash_after(&self, key: &InstanceKey, step: &str) -> bool;
}
