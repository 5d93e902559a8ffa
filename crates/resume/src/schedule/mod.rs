//! Schedules: cron-style and fixed-interval starts of a workflow, exactly once per tick across
//! any number of workers. The definition and its checks ([`spec`]), when it ticks
//! ([`cadence`]), the pure plan of one pass ([`plan`]), the storage contract ([`store`]) and
//! the elected scheduler loop ([`scheduler`]). This module owns [`ScheduleError`], which the
//! definition and the cadence both return.

pub(crate) mod cadence;
pub(crate) mod plan;
pub(crate) mod scheduler;
pub(crate) mod spec;
pub(crate) mod store;

use std::time::Duration;

use keiro_journal::IdError;

#[cfg(doc)]
use spec::{CatchUp, ScheduleSpec};
use spec::{CATCH_UP_MAX, SCHEDULE_NAME_LEN_MAX};

/// Why a schedule was refused, or could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The schedule's name is not a valid instance id prefix.
    #[error("invalid schedule name")]
    InvalidName(#[source] IdError),
    /// The schedule's name leaves no room for the tick in the ids it starts.
    #[error("schedule name {name:?} is longer than {SCHEDULE_NAME_LEN_MAX} bytes")]
    NameTooLong {
        /// The name.
        name: String,
    },
    /// The workflow name is invalid.
    #[error("invalid workflow name for a schedule")]
    InvalidWorkflow(#[source] IdError),
    /// The cron expression does not parse.
    #[error("cron expression {expression:?} does not parse: {reason}")]
    Cron {
        /// The expression.
        expression: String,
        /// The parser's reason.
        reason: String,
    },
    /// The time zone is not an IANA zone name.
    #[error("unknown time zone {time_zone:?}")]
    TimeZone {
        /// The zone.
        time_zone: String,
    },
    /// A fixed interval shorter than a second, or not whole seconds.
    #[error("interval {interval:?} is not a whole number of seconds of at least one")]
    Interval {
        /// The interval.
        interval: Duration,
    },
    /// The schedule never ticks from now on (a cron expression for a date that never comes).
    #[error("schedule {name} never ticks")]
    NeverTicks {
        /// The schedule.
        name: String,
    },
    /// The builder was given neither a cron expression nor an interval.
    #[error("schedule {name} has neither a cron expression nor an interval")]
    NoCadence {
        /// The schedule.
        name: String,
    },
    /// [`CatchUp::All`] with a bound of zero or above [`CATCH_UP_MAX`].
    #[error("catch-up bound {max} is outside 1..={CATCH_UP_MAX}")]
    CatchUpBound {
        /// The bound.
        max: u32,
    },
    /// A due tick could not be started: its instance id is not valid (a name written past
    /// [`ScheduleSpec::validate`], by hand or by another build). Recorded on the schedule's
    /// row (`last_error`); the scheduler backs the schedule off and goes on with the others.
    #[error("schedule {schedule} cannot start its tick")]
    TickId {
        /// The schedule.
        schedule: String,
        /// Why the id is refused.
        #[source]
        source: IdError,
    },
}
