//! The storage contract of schedules: whole atomic operations, as for the journal.
//!
//! Every method is one transaction in the Postgres store and one critical section in the
//! memory store; `docs/store-contract.md` ("Schedules") states each rule and the conformance
//! suite (`keiro_tests::contract::schedule`) checks them on both stores. Time-sensitive methods take
//! an optional `now`; `None` means the store's clock (the database's `now()`, the memory
//! store's pinned or wall clock), so the database clock decides when a tick is due.

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{store::StartRequest, Fence, Started};
use time::OffsetDateTime;

use super::spec::{Schedule, ScheduleSpec};

/// A schedule that is due, with what the scheduler needs to plan it.
#[derive(Debug, Clone, PartialEq)]
pub struct DueSchedule {
    /// The row.
    pub schedule: Schedule,
    /// Whether the instance it started last is still running or suspended.
    pub previous_live: bool,
}

/// A due row the store could not read as a schedule (edited by hand, or written by another
/// build): the scheduler records `error` on it and backs it off, as for a schedule that cannot
/// start, so it never holds up the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableSchedule {
    /// The row's name.
    pub name: String,
    /// Its revision.
    pub revision: i64,
    /// Its failures so far.
    pub failures: u32,
    /// Why it cannot be read.
    pub error: String,
}

/// What [`ScheduleStore::schedules_due`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulesDue {
    /// The store's clock when it looked: the scheduler plans with this instant.
    pub clock: OffsetDateTime,
    /// Unpaused schedules whose next tick is at or before the clock, or that hold a buffered
    /// tick, and that are not backed off past the clock (`retry_at`), earliest next tick first.
    pub due: Vec<DueSchedule>,
    /// Due rows that could not be read as schedules (only a store that reads rows written
    /// outside it has any), counted against the same limit.
    pub unreadable: Vec<UnreadableSchedule>,
    /// The earliest instant any unpaused schedule is due, backed off or not (its next tick, or
    /// its `retry_at` when later): how long a scheduler may wait.
    pub next_due: Option<OffsetDateTime>,
}

/// A scheduler's write for one schedule: the runs to start and the schedule's new state, all
/// in one transaction, refused unless the writer still leads and the row is still at the
/// revision the scheduler planned from.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleFire {
    /// The schedule.
    pub name: String,
    /// The scheduler's leadership.
    pub leader: Fence,
    /// The revision the plan was made from.
    pub revision: i64,
    /// The instances to start (idempotently by id).
    pub starts: Vec<StartRequest>,
    /// The new next tick.
    pub next_tick: Option<OffsetDateTime>,
    /// The new last tick handled.
    pub last_tick: Option<OffsetDateTime>,
    /// The new buffered tick.
    pub buffered_tick: Option<OffsetDateTime>,
}

/// What [`ScheduleStore::schedule_fire`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum FireOutcome {
    /// The starts were made (each `created == false` if its id already existed) and the row
    /// updated.
    Fired(Vec<Started>),
    /// The row changed since the plan (another write, a pause, a delete): nothing was written.
    Stale,
    /// The writer no longer leads: nothing was written.
    NotLeader,
}

/// Storage for schedules and the scheduler's leadership.
#[async_trait::async_trait]
pub trait ScheduleStore: Send + Sync + std::fmt::Debug + 'static {
    /// Creates the schedule, or updates its definition: the next tick becomes the first tick
    /// of the (new) cadence strictly after `now`, a buffered tick, the error and the back-off
    /// are cleared, and the paused flag, last tick and last instance are kept.
    async fn schedule_upsert(
        &self,
        spec: &ScheduleSpec,
        now: Option<OffsetDateTime>,
    ) -> Result<Schedule>;

    /// One schedule.
    async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>>;

    /// Every schedule, by name.
    async fn schedules_list(&self) -> Result<Vec<Schedule>>;

    /// Deletes a schedule; the instances it started stay. `false` when there was none.
    async fn schedule_delete(&self, name: &str) -> Result<bool>;

    /// Pauses (`true`) or resumes (`false`) a schedule. Resuming a paused schedule sets its
    /// next tick to the first tick after `now` and clears its back-off (`retry_at`, the
    /// failure count; the last error stays until a fire): ticks that fell while it was paused
    /// are not caught up. `None` when there is no such schedule.
    async fn schedule_set_paused(
        &self,
        name: &str,
        paused: bool,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Schedule>>;

    /// Starts one run of the schedule now, whatever its overlap policy and even when paused
    /// (an operator's explicit act), with id [`trigger_instance_id`](crate::trigger_instance_id)
    /// of `now`, and records it as the last instance. `None` when there is no such schedule.
    async fn schedule_trigger(
        &self,
        name: &str,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Started>>;

    /// Takes or renews the scheduler's leadership for `owner` until `now + ttl`: granted when
    /// it is free, expired, or already `owner`'s. The epoch grows whenever the holder changes.
    /// `None` when another owner holds it.
    async fn scheduler_lease(
        &self,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Fence>>;

    /// Gives up the leadership if `owner` holds it, so another scheduler takes over at once
    /// instead of after the lease's expiry. `false` when `owner` did not hold it.
    async fn scheduler_release(&self, owner: &str) -> Result<bool>;

    /// The due schedules, at most `limit`.
    async fn schedules_due(&self, now: Option<OffsetDateTime>, limit: i64) -> Result<SchedulesDue>;

    /// Applies a scheduler's plan for one schedule atomically; a fire clears the row's error
    /// and back-off.
    async fn schedule_fire(&self, fire: &ScheduleFire) -> Result<FireOutcome>;

    /// Records why the scheduler could not start a schedule and backs it off: `last_error`
    /// becomes `error`, the failure count grows by one and `retry_at` becomes `retry_at`, if
    /// the row is still at `revision`. The revision is not bumped, so a later plan from the
    /// same read still applies. `false` when the row moved on or is gone.
    async fn schedule_record_error(
        &self,
        name: &str,
        revision: i64,
        error: &str,
        retry_at: OffsetDateTime,
    ) -> Result<bool>;
}
