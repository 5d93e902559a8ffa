//! The store's clock: the wall clock unless a test pins it.

use std::time::Duration;

use time::{OffsetDateTime, PrimitiveDateTime};

/// The latest instant `time` can represent; a span that would pass it stops there.
const LATEST: OffsetDateTime = PrimitiveDateTime::MAX.assume_utc();

/// Where a store reads "now" from. It lives inside the store's lock, so one operation reads
/// one instant and every timestamp it writes agrees, as with a transaction's `now()`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Clock {
    pinned: Option<OffsetDateTime>,
}

impl Clock {
    /// Pins the clock to `at`, or returns it to the wall clock with `None`.
    pub(crate) fn pin(&mut self, at: Option<OffsetDateTime>) {
        self.pinned = at;
    }

    /// The pinned instant, or the wall clock.
    pub(crate) fn now(&self) -> OffsetDateTime {
        self.pinned.unwrap_or_else(OffsetDateTime::now_utc)
    }
}

/// `at + span`, saturating instead of panicking: a caller asking for a lease of
/// `Duration::MAX` means "as long as possible", not a crash of the store.
pub(crate) fn later(at: OffsetDateTime, span: Duration) -> OffsetDateTime {
    time::Duration::try_from(span)
        .ok()
        .and_then(|span| at.checked_add(span))
        .unwrap_or(LATEST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_clock_stays_put_and_spans_saturate() {
        let mut clock = Clock::default();
        let at = OffsetDateTime::UNIX_EPOCH;
        clock.pin(Some(at));
        assert_eq!(clock.now(), at);
        assert_eq!(
            later(at, Duration::from_secs(60)),
            at + time::Duration::minutes(1)
        );
        assert_eq!(later(at, Duration::MAX), LATEST);
        clock.pin(None);
        assert!(clock.now() > at);
    }
}
