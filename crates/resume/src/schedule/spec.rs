//! What a schedule is: its definition (what to start, when, with which policies), the row a
//! store keeps for it, and the ids of the instances it starts.

use keiro_journal::{IdError, WorkflowId, WorkflowName, ID_LEN_MAX};
use serde_json::Value;
use time::macros::format_description;
use time::OffsetDateTime;

use super::cadence::Cadence;
use super::ScheduleError;

/// The most missed ticks [`CatchUp::All`] may start after downtime.
pub const CATCH_UP_MAX: u32 = 1_000;

/// The length of the tick part of a started instance's id (`@20261201T023000Z`).
const TICK_SUFFIX_LEN: usize = 18;
/// The longest schedule name: the started instance's id (`<name>@<tick>`) must fit
/// [`ID_LEN_MAX`]. A trigger's id has milliseconds as well, so it is counted.
pub const SCHEDULE_NAME_LEN_MAX: usize = ID_LEN_MAX - TICK_SUFFIX_LEN - 4;

/// What a tick does while the schedule's previous run is still running or suspended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// Start nothing; the tick is dropped. With several ticks due at once (after downtime) at
    /// most one run starts, for the latest of them.
    #[default]
    Skip,
    /// Keep one tick and start it once the previous run ends; further ticks meanwhile are
    /// dropped. With several ticks due at once, the first starts and the next is kept.
    BufferOne,
    /// Start every tick, whatever is running.
    AllowAll,
}

impl Overlap {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::BufferOne => "buffer_one",
            Self::AllowAll => "allow_all",
        }
    }

    /// Parses a stored name.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "skip" => Some(Self::Skip),
            "buffer_one" => Some(Self::BufferOne),
            "allow_all" => Some(Self::AllowAll),
            _ => None,
        }
    }
}

/// What happens to ticks missed while no scheduler ran (the workers were down, or the store
/// refused to start the schedule's runs and the scheduler backed it off). A tick is missed when the scheduler first sees it more
/// than `catch_up_window` ([`SchedulerOptions`](crate::SchedulerOptions)) late; ticks seen
/// sooner are on time and always start (subject to [`Overlap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// Missed ticks are dropped.
    #[default]
    None,
    /// The latest missed tick starts; older ones are dropped.
    Last,
    /// The latest `max` missed ticks start, oldest first (1..=[`CATCH_UP_MAX`]).
    All {
        /// How many missed ticks at most.
        max: u32,
    },
}

impl CatchUp {
    /// The stored name and bound.
    pub fn as_parts(self) -> (&'static str, i32) {
        match self {
            Self::None => ("none", 0),
            Self::Last => ("last", 1),
            Self::All { max } => ("all", i32::try_from(max).unwrap_or(i32::MAX)),
        }
    }

    /// Parses a stored name and bound.
    pub fn from_parts(text: &str, max: i32) -> Option<Self> {
        match text {
            "none" => Some(Self::None),
            "last" => Some(Self::Last),
            "all" => Some(Self::All {
                max: u32::try_from(max).ok()?,
            }),
            _ => None,
        }
    }
}

/// A schedule's definition: what a create or an update writes.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleSpec {
    /// The schedule's name, the prefix of every id it starts (`<name>@<tick>`).
    pub name: String,
    /// The workflow it starts.
    pub workflow: WorkflowName,
    /// When it ticks.
    pub cadence: Cadence,
    /// The input of every run it starts.
    pub input: Value,
    /// What a tick does while the previous run is live.
    pub overlap: Overlap,
    /// What happens to missed ticks.
    pub catch_up: CatchUp,
}

impl ScheduleSpec {
    /// Checks the name, the cadence and the catch-up bound.
    ///
    /// # Errors
    ///
    /// The [`ScheduleError`] naming the first problem.
    pub fn validate(&self) -> Result<(), ScheduleError> {
        validate_name(&self.name)?;
        self.cadence.validate()?;
        if let CatchUp::All { max } = self.catch_up {
            if max == 0 || max > CATCH_UP_MAX {
                return Err(ScheduleError::CatchUpBound { max });
            }
        }
        Ok(())
    }

    /// The first tick strictly after `now`, which a create (or an update, or a resume) sets.
    ///
    /// # Errors
    ///
    /// [`ScheduleError::NeverTicks`], or the cadence's error.
    pub fn first_tick_after(&self, now: OffsetDateTime) -> Result<OffsetDateTime, ScheduleError> {
        self.cadence
            .next_after(now)?
            .ok_or_else(|| ScheduleError::NeverTicks {
                name: self.name.clone(),
            })
    }
}

/// Checks a schedule name: a valid instance id of at most [`SCHEDULE_NAME_LEN_MAX`] bytes.
///
/// # Errors
///
/// [`ScheduleError::InvalidName`] or [`ScheduleError::NameTooLong`].
pub fn validate_name(name: &str) -> Result<(), ScheduleError> {
    WorkflowId::new(name).map_err(ScheduleError::InvalidName)?;
    if name.len() > SCHEDULE_NAME_LEN_MAX {
        return Err(ScheduleError::NameTooLong {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// A schedule as a store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The definition.
    pub spec: ScheduleSpec,
    /// Paused: no tick starts anything; resuming skips the ticks that fell meanwhile.
    pub paused: bool,
    /// The next tick not yet handled.
    pub next_tick: Option<OffsetDateTime>,
    /// The latest tick handled (started, buffered or dropped).
    pub last_tick: Option<OffsetDateTime>,
    /// The tick kept by [`Overlap::BufferOne`], started when the previous run ends.
    pub buffered_tick: Option<OffsetDateTime>,
    /// The id of the instance the schedule started last (by a tick or a trigger).
    pub last_instance: Option<WorkflowId>,
    /// Why the last scheduler pass could not start it, if it could not; cleared by the next
    /// fire and by an update.
    pub last_error: Option<String>,
    /// Scheduler passes in a row that could not start it (0 once one does): how far it is
    /// backed off.
    pub failures: u32,
    /// Until when the scheduler leaves it alone after a failure ([`last_error`](Self::last_error));
    /// its ticks stay due meanwhile and follow [`CatchUp`] once it starts again.
    pub retry_at: Option<OffsetDateTime>,
    /// Bumped by every write: a scheduler's write names the revision it planned from, so a
    /// write planned from a stale read changes nothing.
    pub revision: i64,
    /// When it was created.
    pub created_at: OffsetDateTime,
    /// When it was last written.
    pub updated_at: OffsetDateTime,
}

/// The id of the instance a tick starts: `<schedule>@<tick>`, the tick in UTC in ISO 8601's
/// basic format (`20261201T023000Z`), which is RFC 3339's instant without the `:` separators
/// keiro reserves in ids. One id per tick is what makes a tick start at most once, whichever
/// scheduler starts it and however often.
///
/// ```
/// use time::macros::datetime;
/// let id = keiro_resume::tick_instance_id("nightly", datetime!(2026-12-01 2:30 UTC))?;
/// assert_eq!(id.as_str(), "nightly@20261201T023000Z");
/// # Ok::<(), keiro_journal::IdError>(())
/// ```
///
/// # Errors
///
/// [`IdError`] when the schedule name is not a valid id prefix.
pub fn tick_instance_id(schedule: &str, tick: OffsetDateTime) -> Result<WorkflowId, IdError> {
    let utc = tick.to_offset(time::UtcOffset::UTC);
    let format = format_description!("[year][month][day]T[hour][minute][second]Z");
    let text = utc.format(&format).unwrap_or_default();
    WorkflowId::new(format!("{schedule}@{text}"))
}

/// The id of the instance a trigger starts: as [`tick_instance_id`] with milliseconds
/// (`nightly@20261201T023000.123Z`), so a trigger never takes the id of a tick.
///
/// # Errors
///
/// [`IdError`] when the schedule name is not a valid id prefix.
pub fn trigger_instance_id(schedule: &str, at: OffsetDateTime) -> Result<WorkflowId, IdError> {
    let utc = at.to_offset(time::UtcOffset::UTC);
    let format =
        format_description!("[year][month][day]T[hour][minute][second].[subsecond digits:3]Z");
    let text = utc.format(&format).unwrap_or_default();
    WorkflowId::new(format!("{schedule}@{text}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn ids_fit_and_never_collide_between_ticks_and_triggers() {
        let name = "n".repeat(SCHEDULE_NAME_LEN_MAX);
        let at = datetime!(2026-12-01 2:30 UTC);
        assert!(tick_instance_id(&name, at).is_ok());
        assert!(trigger_instance_id(&name, at).is_ok());
        assert_ne!(
            tick_instance_id("a", at).expect("valid"),
            trigger_instance_id("a", at).expect("valid")
        );
        assert!(matches!(
            validate_name(&"n".repeat(SCHEDULE_NAME_LEN_MAX + 1)),
            Err(ScheduleError::NameTooLong { .. })
        ));
        assert!(matches!(
            validate_name("a/b"),
            Err(ScheduleError::InvalidName(_))
        ));
    }

    #[test]
    fn policies_round_trip_through_their_stored_names() {
        for o in [Overlap::Skip, Overlap::BufferOne, Overlap::AllowAll] {
            assert_eq!(Overlap::parse(o.as_str()), Some(o));
        }
        for c in [CatchUp::None, CatchUp::Last, CatchUp::All { max: 7 }] {
            let (name, max) = c.as_parts();
            assert_eq!(CatchUp::from_parts(name, max), Some(c));
        }
    }
}
