//! The store's clock: the wall clock unless a test pins it.

use std::time::Duration;

use time::{OffsetDateTime, PrimitiveDateTime};

/// The latest instant `time` can represent; a span that would pass it stops there.
const LATEST: OffsetDateTime = PrimitiveDateTime::MAX.assume_utc();
/// The earliest one, where an offset into the past stops.
const EARLIEST: OffsetDateTime = PrimitiveDateTime::MIN.assume_utc();

/// Where a store reads "now" from. It lives inside the store's lock, so one operation reads
/// one instant and every timestamp it writes agrees, as with a transaction's `now()`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Clock {
    pinned: Option<OffsetDateTime>,
    /// How far the running clock is ahead of the wall clock: the skew between a database
    /// server and the workers, which tests reproduce in one process.
    offset: time::Duration,
}

impl Clock {
    /// Pins the clock to `at`, or returns it to the running clock with `None`.
    pub(crate) fn pin(&mut self, at: Option<OffsetDateTime>) {
        self.pinned = at;
    }

    /// Runs the clock `offset` ahead of the wall clock (behind, when negative).
    pub(crate) fn skew(&mut self, offset: time::Duration) {
        self.offset = offset;
    }

    /// The pinned instant, or the wall clock moved by the offset (saturating at the ends of
    /// the representable range rather than panicking).
    pub(crate) fn now(&self) -> OffsetDateTime {
        self.pinned.unwrap_or_else(|| {
            let wall = OffsetDateTime::now_utc();
            wall.checked_add(self.offset)
                .unwrap_or(if self.offset.is_negative() {
                    EARLIEST
                } else {
                    LATEST
                })
        })
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

    #[test]
    fn a_skewed_clock_runs_its_offset_from_the_wall_clock_unless_pinned() {
        let mut clock = Clock::default();
        clock.skew(time::Duration::minutes(1));
        let ahead = clock.now() - OffsetDateTime::now_utc();
        assert!(
            ahead > time::Duration::seconds(59) && ahead <= time::Duration::minutes(1),
            "{ahead}"
        );
        clock.skew(time::Duration::minutes(-1));
        let skewed = clock.now();
        let behind = OffsetDateTime::now_utc() - skewed;
        assert!(behind >= time::Duration::minutes(1), "{behind}");
        let at = OffsetDateTime::UNIX_EPOCH;
        clock.pin(Some(at));
        assert_eq!(clock.now(), at, "a pinned instant wins");
        clock.pin(None);
        clock.skew(time::Duration::MAX);
        assert_eq!(clock.now(), LATEST);
        clock.skew(time::Duration::MIN);
        assert_eq!(clock.now(), EARLIEST);
    }
}
