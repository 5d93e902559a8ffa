//! [`SqliteStore`]'s schedules (`ScheduleStore`): every write one operation of the writer (one
//! transaction), every read one snapshot of a read connection.

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{span::traced, store_span};
use keiro_journal::{Fence, Started};
use keiro_resume::{
    FireOutcome, Schedule, ScheduleFire, ScheduleSpec, ScheduleStore, SchedulesDue,
};
use time::OffsetDateTime;

use crate::schedule;
use crate::storable;

use super::{span_ms, SqliteStore};

const UPSERT: &str = "writing a schedule";
const GET: &str = "reading a schedule";
const LIST: &str = "listing schedules";
const DELETE: &str = "deleting a schedule";
const PAUSE: &str = "pausing or resuming a schedule";
const TRIGGER: &str = "triggering a schedule";
const LEASE: &str = "taking the scheduler lease";
const RELEASE: &str = "releasing the scheduler lease";
const DUE: &str = "reading due schedules";
const FIRE: &str = "firing a schedule";
const RECORD: &str = "recording a schedule's error";

impl SqliteStore {
    /// Creates the schedule or updates its definition; its next tick becomes the first tick
    /// after `now` (the store's clock when `None`) (`ScheduleStore::schedule_upsert`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a cadence that does not compile or a value PostgreSQL refuses.
    pub async fn schedule_upsert(
        &self,
        spec: &ScheduleSpec,
        now: Option<OffsetDateTime>,
    ) -> Result<Schedule> {
        storable::text(UPSERT, "schedule name", &spec.name)?;
        storable::value(UPSERT, &spec.input)?;
        if let keiro_resume::Cadence::Cron {
            expression,
            time_zone,
        } = &spec.cadence
        {
            storable::text(UPSERT, "cron expression", expression)?;
            storable::text(UPSERT, "time zone", time_zone)?;
        }
        let spec = spec.clone();
        self.inner
            .writer
            .write(UPSERT, move |conn, clock| {
                schedule::schedule_upsert(conn, now.unwrap_or(clock), &spec)
            })
            .await
    }

    /// One schedule (`ScheduleStore::schedule_get`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>> {
        let name = name.to_owned();
        self.read(GET, move |conn, _| schedule::schedule_get(conn, &name))
            .await
    }

    /// Every schedule, by name (`ScheduleStore::schedules_list`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn schedules_list(&self) -> Result<Vec<Schedule>> {
        self.read(LIST, |conn, _| schedule::schedules_list(conn))
            .await
    }

    /// Deletes a schedule; `false` when there was none (`ScheduleStore::schedule_delete`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn schedule_delete(&self, name: &str) -> Result<bool> {
        let name = name.to_owned();
        self.inner
            .writer
            .write(DELETE, move |conn, _| {
                schedule::schedule_delete(conn, &name)
            })
            .await
    }

    /// Pauses or resumes a schedule at `now` (`ScheduleStore::schedule_set_paused`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a stored cadence that no longer compiles (on resume).
    pub async fn schedule_set_paused(
        &self,
        name: &str,
        paused: bool,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Schedule>> {
        let name = name.to_owned();
        self.inner
            .writer
            .write(PAUSE, move |conn, clock| {
                schedule::schedule_set_paused(conn, now.unwrap_or(clock), &name, paused)
            })
            .await
    }

    /// Starts one run of the schedule now, whatever its policy
    /// (`ScheduleStore::schedule_trigger`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` when the schedule's name makes no valid instance id.
    pub async fn schedule_trigger(
        &self,
        name: &str,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Started>> {
        let name = name.to_owned();
        self.inner
            .writer
            .write(TRIGGER, move |conn, clock| {
                schedule::schedule_trigger(conn, now.unwrap_or(clock), &name)
            })
            .await
    }

    /// Takes or renews the scheduler's leadership for `owner` until `now + ttl`
    /// (`ScheduleStore::scheduler_lease`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn scheduler_lease(
        &self,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Fence>> {
        storable::text(LEASE, "scheduler owner", owner)?;
        let owner = owner.to_owned();
        let ttl_ms = span_ms(ttl);
        self.inner
            .writer
            .write(LEASE, move |conn, clock| {
                schedule::scheduler_lease(conn, now.unwrap_or(clock), &owner, ttl_ms)
            })
            .await
    }

    /// Gives up the leadership if `owner` holds it (`ScheduleStore::scheduler_release`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn scheduler_release(&self, owner: &str) -> Result<bool> {
        let owner = owner.to_owned();
        self.inner
            .writer
            .write(RELEASE, move |conn, _| {
                schedule::scheduler_release(conn, &owner)
            })
            .await
    }

    /// The due schedules at `now`, at most `limit` (`ScheduleStore::schedules_due`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when a read connection cannot be opened.
    pub async fn schedules_due(
        &self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> Result<SchedulesDue> {
        self.read(DUE, move |conn, clock| {
            schedule::schedules_due(conn, now.unwrap_or(clock), limit)
        })
        .await
    }

    /// Applies a scheduler's plan for one schedule in one transaction
    /// (`ScheduleStore::schedule_fire`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a start input PostgreSQL refuses (nothing is written).
    pub async fn schedule_fire(&self, fire: &ScheduleFire) -> Result<FireOutcome> {
        for start in &fire.starts {
            storable::value(FIRE, &start.input)?;
        }
        let fire = fire.clone();
        self.inner
            .writer
            .write(FIRE, move |conn, now| {
                schedule::schedule_fire(conn, now, &fire)
            })
            .await
    }

    /// Records why the scheduler could not start a schedule and backs it off until
    /// `retry_at`, if the row is still at `revision` (`ScheduleStore::schedule_record_error`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for an error text holding a NUL.
    pub async fn schedule_record_error(
        &self,
        name: &str,
        revision: i64,
        error: &str,
        retry_at: OffsetDateTime,
    ) -> Result<bool> {
        storable::text(RECORD, "schedule error", error)?;
        let (name, error) = (name.to_owned(), error.to_owned());
        self.inner
            .writer
            .write(RECORD, move |conn, now| {
                schedule::schedule_record_error(conn, now, &name, revision, &error, retry_at)
            })
            .await
    }
}

// The trait sits beside its operations, each method its inherent operation of the same name
// run in the `keiro.store.<operation>` span (traits.rs holds the other traits).
#[async_trait::async_trait]
impl ScheduleStore for SqliteStore {
    async fn schedule_upsert(
        &self,
        spec: &ScheduleSpec,
        now: Option<OffsetDateTime>,
    ) -> Result<Schedule> {
        traced(
            store_span!("schedule_upsert", keiro.schedule.name = %spec.name),
            SqliteStore::schedule_upsert(self, spec, now),
        )
        .await
    }

    async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>> {
        traced(
            store_span!("schedule_get", keiro.schedule.name = %name),
            SqliteStore::schedule_get(self, name),
        )
        .await
    }

    async fn schedules_list(&self) -> Result<Vec<Schedule>> {
        traced(
            store_span!("schedules_list"),
            SqliteStore::schedules_list(self),
        )
        .await
    }

    async fn schedule_delete(&self, name: &str) -> Result<bool> {
        traced(
            store_span!("schedule_delete", keiro.schedule.name = %name),
            SqliteStore::schedule_delete(self, name),
        )
        .await
    }

    async fn schedule_set_paused(
        &self,
        name: &str,
        paused: bool,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Schedule>> {
        traced(
            store_span!("schedule_set_paused", keiro.schedule.name = %name),
            SqliteStore::schedule_set_paused(self, name, paused, now),
        )
        .await
    }

    async fn schedule_trigger(
        &self,
        name: &str,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Started>> {
        traced(
            store_span!("schedule_trigger", keiro.schedule.name = %name),
            SqliteStore::schedule_trigger(self, name, now),
        )
        .await
    }

    async fn scheduler_lease(
        &self,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Fence>> {
        traced(
            store_span!("scheduler_lease"),
            SqliteStore::scheduler_lease(self, owner, ttl, now),
        )
        .await
    }

    async fn scheduler_release(&self, owner: &str) -> Result<bool> {
        traced(
            store_span!("scheduler_release"),
            SqliteStore::scheduler_release(self, owner),
        )
        .await
    }

    async fn schedules_due(&self, now: Option<OffsetDateTime>, limit: i64) -> Result<SchedulesDue> {
        traced(
            store_span!("schedules_due"),
            SqliteStore::schedules_due(self, now, limit),
        )
        .await
    }

    async fn schedule_fire(&self, fire: &ScheduleFire) -> Result<FireOutcome> {
        traced(
            store_span!("schedule_fire", keiro.schedule.name = %fire.name),
            SqliteStore::schedule_fire(self, fire),
        )
        .await
    }

    async fn schedule_record_error(
        &self,
        name: &str,
        revision: i64,
        error: &str,
        retry_at: OffsetDateTime,
    ) -> Result<bool> {
        traced(
            store_span!("schedule_record_error", keiro.schedule.name = %name),
            SqliteStore::schedule_record_error(self, name, revision, error, retry_at),
        )
        .await
    }
}
