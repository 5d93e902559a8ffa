//! The store's clock: the wall clock unless a test pins or moves it. Times are passed into
//! every rule (SQLite's own clock is never read), so one operation reads one instant, as a
//! PostgreSQL transaction's `now()`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use time::{OffsetDateTime, PrimitiveDateTime};

/// The latest instant `time` can represent; a span that would pass it stops there.
const LATEST: OffsetDateTime = PrimitiveDateTime::MAX.assume_utc();

#[derive(Debug, Default)]
struct State {
    pinned: Option<OffsetDateTime>,
    offset: time::Duration,
}

/// A shared clock: every handle of one store reads the same one.
#[derive(Debug, Clone, Default)]
pub(crate) struct Clock(Arc<Mutex<State>>);

impl Clock {
    /// Pins the clock at `at`, or lets it run again with `None`.
    pub(crate) fn pin(&self, at: Option<OffsetDateTime>) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).pinned = at;
    }

    /// Moves the running clock `by` ahead of the wall clock (or a pinned one along).
    pub(crate) fn advance(&self, by: Duration) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let by = time::Duration::try_from(by).unwrap_or(time::Duration::MAX);
        state.offset = state.offset.saturating_add(by);
        state.pinned = state.pinned.map(|at| at.checked_add(by).unwrap_or(LATEST));
    }

    /// Sets how far the running clock is from the wall clock (negative: behind it).
    pub(crate) fn set_offset(&self, offset: time::Duration) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).offset = offset;
    }

    /// Now.
    pub(crate) fn now(&self) -> OffsetDateTime {
        let state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        state.pinned.unwrap_or_else(|| {
            OffsetDateTime::now_utc()
                .checked_add(state.offset)
                .unwrap_or(LATEST)
        })
    }
}

/// `at + span`, saturating at the latest instant `time` represents.
pub(crate) fn later(at: OffsetDateTime, span: Duration) -> OffsetDateTime {
    time::Duration::try_from(span)
        .ok()
        .and_then(|span| at.checked_add(span))
        .unwrap_or(LATEST)
}
