//! Crash accounting: what a crash records and what became of the instance; and the hand-back
//! of a run its worker could not open, which is not a crash.

use std::time::Duration;

use time::OffsetDateTime;

/// A crash to record against a leased instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    /// The error, stored as `last_error`.
    pub error: String,
    /// The backoff before the next claim, from the policy and the attempts seen at claim time.
    pub retry_delay: Duration,
    /// At this many attempts the instance is failed.
    pub max_attempts: i32,
}

/// What recording a crash did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashOutcome {
    /// The attempt was counted; the instance may be claimed again at `next_attempt_at`.
    Retrying {
        /// Attempts so far.
        attempts: i32,
        /// The backoff gate.
        next_attempt_at: OffsetDateTime,
    },
    /// The ceiling was reached: `WorkflowFailed` was appended and the row is `failed`, in the
    /// same transaction (and a parent awaiting this child is woken with the failure).
    Failed {
        /// Attempts so far.
        attempts: i32,
    },
    /// The instance went terminal meanwhile (cancelled, say); no attempt was recorded.
    AlreadyTerminal,
}

/// A claim handed back unopened: the claiming worker could not open the run's payload (it
/// lacks the key). It gates the run's next claim without counting a crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenRefusal {
    /// Why, stored as `last_error` (which key the run needs).
    pub error: String,
    /// The wait before the next claim, from the refusal backoff and the refusals seen at claim
    /// time ([`Instance::open_refusals`](keiro_journal::Instance::open_refusals)).
    pub retry_delay: Duration,
}

/// What handing back an unopened claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalOutcome {
    /// The lease was released and the refusal counted; the run may be claimed again at
    /// `next_attempt_at`. Its attempts are unchanged.
    Released {
        /// Refusals since the run last progressed, this one included.
        refusals: i32,
        /// The gate of the next claim.
        next_attempt_at: OffsetDateTime,
    },
    /// The instance went terminal meanwhile; nothing was recorded.
    AlreadyTerminal,
}

/// What resurrecting did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResurrectOutcome {
    /// The failed instance is `running` again with fresh attempts; its failure stays in history
    /// and a `Resurrected` event was appended.
    Resurrected,
    /// The instance is not failed.
    NotFailed(keiro_journal::Status),
    /// No such instance.
    NotFound,
}
