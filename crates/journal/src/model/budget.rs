//! The journal budget: how long one generation's journal may grow.
//!
//! Every drive loads the whole generation's journal (in the claim's round trip) and replays it,
//! so a drive costs O(n) in the journal's length and a workflow that loops n times in one
//! generation costs O(n²) in all; and a journal past PostgreSQL's limits (a jsonb array of at
//! most 256 MiB) cannot be loaded by a claim at all. The budget stops a generation before
//! either: a fresh step past it fails with [`WorkflowError::JournalFull`], whose message says to
//! continue as new (`ctx.continue_as_new`), which starts an empty journal.
//!
//! A delivery counts once an await has read it. The ones no await has read are the
//! deliverers' doing, not the body's, and have a bound of their own (the `delivery` module):
//! counted here, deliveries under names the body never reads could make its next step fail.

use serde_json::Value;

use crate::{Deliveries, Event, JournalEntry, StepKind, WorkflowError};

/// The default budget of journal entries per generation.
pub const JOURNAL_STEPS_MAX_DEFAULT: usize = 50_000;
/// The default budget of journal bytes (encoded payloads) per generation.
pub const JOURNAL_BYTES_MAX_DEFAULT: usize = 50 * 1024 * 1024;

/// How long one generation's journal may grow (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalBudget {
    /// Entries per generation. Defaults to [`JOURNAL_STEPS_MAX_DEFAULT`].
    pub steps: usize,
    /// Encoded payload bytes per generation. Defaults to [`JOURNAL_BYTES_MAX_DEFAULT`].
    pub bytes: usize,
}

impl Default for JournalBudget {
    fn default() -> Self {
        Self {
            steps: JOURNAL_STEPS_MAX_DEFAULT,
            bytes: JOURNAL_BYTES_MAX_DEFAULT,
        }
    }
}

/// What one generation's journal holds: entries and encoded payload bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct JournalSize {
    pub(crate) steps: usize,
    pub(crate) bytes: usize,
}

impl JournalSize {
    /// The size of a loaded generation, its deliveries left out (the run counts those its
    /// awaits read).
    pub(crate) fn of(entries: &[JournalEntry]) -> Self {
        let counted = entries.iter().filter(|e| !is_delivery(&e.event));
        let (steps, bytes) = counted.fold((0, 0), |(steps, bytes), e| {
            (steps + 1, bytes + payload_len(&e.event))
        });
        Self { steps, bytes }
    }

    /// This size with `read` deliveries added.
    pub(crate) fn with(self, read: Deliveries) -> Self {
        Self {
            steps: self.steps + read.count,
            bytes: self.bytes + read.bytes,
        }
    }
}

/// Whether the event is a delivery (what `deliver` journals for an await).
fn is_delivery(event: &Event) -> bool {
    matches!(
        event,
        Event::StepRecorded {
            kind: StepKind::Await,
            ..
        }
    )
}

/// The encoded length of an event's payload; a step's result is measured in place (a drive
/// measures every entry it loads, so no clone of it).
fn payload_len(event: &Event) -> usize {
    match event {
        Event::StepRecorded { result, .. } => encoded_len(result),
        other => encoded_len(&other.encode().payload),
    }
}

/// The encoded length of a payload in bytes (what every payload limit is measured in), without
/// allocating the encoding.
///
/// ```
/// assert_eq!(keiro_journal::store::encoded_len(&serde_json::json!({"a": 1})), 7);
/// ```
pub fn encoded_len(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing a `Value` into an infallible sink cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// The error of a fresh step at `step` refused because the journal, at `size`, is full.
pub(crate) fn journal_full(step: &str, size: JournalSize, budget: JournalBudget) -> WorkflowError {
    WorkflowError::JournalFull {
        step: step.to_owned(),
        steps: size.steps,
        bytes: size.bytes,
        budget_steps: budget.steps,
        budget_bytes: budget.bytes,
    }
}
