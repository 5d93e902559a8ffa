//! When a schedule ticks: a cron expression in a time zone, or a fixed interval.
//!
//! Pure functions of an instant. Cron expressions are evaluated by croner on the zone's wall
//! clock (chrono-tz's compiled-in IANA database); `time` instants are converted at this edge
//! only, so the rest of keiro never sees chrono.
//!
//! Daylight saving, as croner implements the Open Cron Pattern Specification: a fixed-time job
//! (`30 2 * * *`) whose wall-clock time falls in a spring-forward gap runs at the first instant
//! after the gap on that day (03:00 in Europe/Berlin), and one whose time happens twice on a
//! fall-back day runs once, on the first pass (02:30 CEST, not again at 02:30 CET). A wildcard
//! or stepped job (`*/15 * * * *`) skips the times inside a gap and runs at each real instant
//! of a repeated hour.
//!
//! Fixed intervals are anchored at the Unix epoch, not at the schedule's creation: every five
//! minutes ticks at :00, :05, ..., the same on every worker and after every update, and no
//! daylight-saving rule applies to them.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use croner::parser::{CronParser, Seconds};
use croner::Cron;
use time::OffsetDateTime;

use super::ScheduleError;

/// The shortest fixed interval: ticks are named by whole seconds.
pub const INTERVAL_MIN: Duration = Duration::from_secs(1);

/// The time zone of a cron schedule that names none.
pub const TIME_ZONE_DEFAULT: &str = "UTC";

/// When a schedule ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cadence {
    /// A cron expression (five fields, or six with seconds first), on the wall clock of an IANA
    /// time zone (`"Europe/Berlin"`, `"UTC"`).
    Cron {
        /// The expression, as given.
        expression: String,
        /// The IANA time zone name.
        time_zone: String,
    },
    /// Every `interval`, at the multiples of it since the Unix epoch.
    Every(Duration),
}

/// A cadence checked once, ready to evaluate.
#[derive(Debug, Clone)]
pub(crate) enum Compiled {
    Cron(Box<Cron>, chrono_tz::Tz),
    Every(i128),
}

impl Cadence {
    /// A cron cadence in `time_zone`.
    ///
    /// ```
    /// let cadence = keiro_resume::Cadence::cron("30 2 * * *", "Europe/Berlin");
    /// assert!(cadence.validate().is_ok());
    /// ```
    pub fn cron(expression: impl Into<String>, time_zone: impl Into<String>) -> Self {
        Self::Cron {
            expression: expression.into(),
            time_zone: time_zone.into(),
        }
    }

    /// Checks the expression, the zone or the interval.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::Cron`] for an expression that does not parse,
    /// [`ScheduleError::TimeZone`] for an unknown zone, [`ScheduleError::Interval`] for an
    /// interval that is shorter than [`INTERVAL_MIN`] or not whole seconds.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        self.compile().map(|_| ())
    }

    pub(crate) fn compile(&self) -> Result<Compiled, ScheduleError> {
        match self {
            Self::Cron {
                expression,
                time_zone,
            } => {
                let cron = CronParser::builder()
                    .seconds(Seconds::Optional)
                    .build()
                    .parse(expression)
                    .map_err(|e| ScheduleError::Cron {
                        expression: expression.clone(),
                        reason: e.to_string(),
                    })?;
                let zone =
                    chrono_tz::Tz::from_str(time_zone).map_err(|_| ScheduleError::TimeZone {
                        time_zone: time_zone.clone(),
                    })?;
                Ok(Compiled::Cron(Box::new(cron), zone))
            }
            Self::Every(interval) => {
                if *interval < INTERVAL_MIN || interval.subsec_nanos() != 0 {
                    return Err(ScheduleError::Interval {
                        interval: *interval,
                    });
                }
                Ok(Compiled::Every(i128::from(interval.as_secs()) * NANOS))
            }
        }
    }

    /// The first tick strictly after `at` (`None` when the expression never matches again).
    ///
    /// ```
    /// use time::macros::datetime;
    /// use keiro_resume::Cadence;
    /// let every = Cadence::Every(std::time::Duration::from_secs(300));
    /// assert_eq!(every.next_after(datetime!(2026-01-01 10:02:10 UTC))?,
    ///            Some(datetime!(2026-01-01 10:05 UTC)));
    /// # Ok::<(), keiro_resume::ScheduleError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`validate`](Self::validate).
    pub fn next_after(&self, at: OffsetDateTime) -> Result<Option<OffsetDateTime>, ScheduleError> {
        Ok(self.compile()?.next_after(at))
    }
}

const NANOS: i128 = 1_000_000_000;

impl Compiled {
    /// The first tick strictly after `at`.
    pub(crate) fn next_after(&self, at: OffsetDateTime) -> Option<OffsetDateTime> {
        match self {
            Self::Cron(cron, zone) => {
                let from = to_zoned(at, *zone)?;
                from_zoned(&cron.find_next_occurrence(&from, false).ok()?)
            }
            Self::Every(step) => {
                let n = at.unix_timestamp_nanos();
                from_nanos((n.div_euclid(*step) + 1) * step)
            }
        }
    }

    /// The first tick at or after `at`.
    pub(crate) fn at_or_after(&self, at: OffsetDateTime) -> Option<OffsetDateTime> {
        match self {
            Self::Cron(..) => {
                // Not croner's inclusive search: a tick a daylight-saving gap moved (02:30 to
                // 03:00) does not match the pattern at its own instant, only from before it.
                let mut tick = self.next_after(at - time::Duration::SECOND)?;
                while tick < at {
                    tick = self.next_after(tick)?;
                }
                Some(tick)
            }
            Self::Every(step) => {
                let n = at.unix_timestamp_nanos();
                let floor = n.div_euclid(*step) * step;
                from_nanos(if floor == n { n } else { floor + step })
            }
        }
    }

    /// The last tick strictly before `at`.
    pub(crate) fn before(&self, at: OffsetDateTime) -> Option<OffsetDateTime> {
        match self {
            Self::Cron(cron, zone) => {
                let from = to_zoned(at, *zone)?;
                from_zoned(&cron.find_previous_occurrence(&from, false).ok()?)
            }
            Self::Every(step) => {
                let n = at.unix_timestamp_nanos();
                let floor = n.div_euclid(*step) * step;
                from_nanos(if floor == n { floor - step } else { floor })
            }
        }
    }
}

fn to_zoned(at: OffsetDateTime, zone: chrono_tz::Tz) -> Option<DateTime<chrono_tz::Tz>> {
    let nanos = at.nanosecond();
    let utc = Utc.timestamp_opt(at.unix_timestamp(), nanos).single()?;
    Some(utc.with_timezone(&zone))
}

fn from_zoned(at: &DateTime<chrono_tz::Tz>) -> Option<OffsetDateTime> {
    let nanos = i128::from(at.timestamp()) * NANOS + i128::from(at.timestamp_subsec_nanos());
    from_nanos(nanos)
}

fn from_nanos(nanos: i128) -> Option<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn berlin_0230() -> Compiled {
        Cadence::cron("30 2 * * *", "Europe/Berlin")
            .compile()
            .expect("a valid cadence")
    }

    #[test]
    fn a_daily_0230_in_berlin_runs_at_0300_on_the_spring_forward_day() {
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that day.
        let c = berlin_0230();
        let before = datetime!(2026-03-28 01:30 UTC); // 02:30 CET the day before
        let gap_day = c.next_after(before).expect("a tick");
        assert_eq!(
            gap_day,
            datetime!(2026-03-29 01:00 UTC),
            "03:00 CEST, right after the gap"
        );
        let after = c.next_after(gap_day).expect("a tick");
        assert_eq!(
            after,
            datetime!(2026-03-30 00:30 UTC),
            "02:30 CEST the next day"
        );
        assert_eq!(c.before(after), Some(gap_day));
        assert_eq!(
            c.at_or_after(gap_day),
            Some(gap_day),
            "found again from itself"
        );
    }

    #[test]
    fn a_daily_0230_in_berlin_runs_once_on_the_fall_back_day() {
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET, so 02:30 happens twice.
        let c = berlin_0230();
        let before = datetime!(2026-10-24 00:30 UTC); // 02:30 CEST the day before
        let first = c.next_after(before).expect("a tick");
        assert_eq!(
            first,
            datetime!(2026-10-25 00:30 UTC),
            "02:30 CEST, the first pass"
        );
        let next = c.next_after(first).expect("a tick");
        assert_eq!(
            next,
            datetime!(2026-10-26 01:30 UTC),
            "not 02:30 CET the same day"
        );
    }

    #[test]
    fn intervals_are_anchored_at_the_epoch() {
        let c = Cadence::Every(Duration::from_secs(60))
            .compile()
            .expect("valid");
        let t = datetime!(2026-01-01 10:00 UTC);
        assert_eq!(c.next_after(t), Some(datetime!(2026-01-01 10:01 UTC)));
        assert_eq!(c.at_or_after(t), Some(t));
        assert_eq!(c.before(t), Some(datetime!(2026-01-01 9:59 UTC)));
        let odd = datetime!(2026-01-01 10:00:30.5 UTC);
        assert_eq!(c.at_or_after(odd), Some(datetime!(2026-01-01 10:01 UTC)));
        assert_eq!(c.before(odd), Some(t));
    }

    #[test]
    fn bad_cadences_are_typed_errors() {
        assert!(matches!(
            Cadence::cron("61 * * * *", "UTC").validate(),
            Err(ScheduleError::Cron { .. })
        ));
        assert!(matches!(
            Cadence::cron("not a cron", "UTC").validate(),
            Err(ScheduleError::Cron { .. })
        ));
        assert!(matches!(
            Cadence::cron("* * * * *", "Mars/Olympus").validate(),
            Err(ScheduleError::TimeZone { .. })
        ));
        assert!(matches!(
            Cadence::Every(Duration::from_millis(1500)).validate(),
            Err(ScheduleError::Interval { .. })
        ));
        assert!(
            Cadence::cron("*/10 * * * * *", "UTC").validate().is_ok(),
            "seconds field"
        );
    }
}
