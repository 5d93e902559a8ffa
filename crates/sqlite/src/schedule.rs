//! Schedules of crates/postgres/src/schedule.rs (plain SQL there too), in its order: the
//! `schedules` rows and the `schedule_leader` row of migration 0001.
//!
//! Every write runs on the writer, so in one transaction that nothing else writes beside: a
//! fire's starts commit with the row that moved past their ticks, or neither. The Postgres
//! fire holds the leader row `FOR SHARE` until it commits so a new leader's lease waits for it;
//! here the lease is a write too, so it cannot run between a fire's leadership check and its
//! commit. Every "now" is the store's clock unless the caller passes one.
//!
//! Migration 0001 creates `schedule_leader` without its one row (PostgreSQL's 0017 inserts it):
//! the lease inserts it when missing, in its own transaction; until then nobody leads.

use crate::cached::Cached;
use std::time::Duration;

use keiro_journal::store::{Error as StoreError, Result};
use keiro_journal::{Fence, Started, WorkflowId, WorkflowName};
use keiro_resume::{
    trigger_instance_id, Cadence, CatchUp, DueSchedule, FireOutcome, Overlap, Schedule,
    ScheduleFire, ScheduleSpec, SchedulesDue, UnreadableSchedule,
};
use rusqlite::{params, Connection, OptionalExtension, Row};
use time::OffsetDateTime;

use crate::error::{malformed, store};
use crate::instance;
use crate::row::{self, micros};

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

/// The columns of a schedule row, in the order [`Stored::from_row`] reads them.
macro_rules! schedule_columns {
    () => {
        "name, workflow_name, cron, interval_ms, time_zone, input, overlap, catch_up, \
         catch_up_max, paused, next_tick, last_tick, buffered_tick, last_instance, last_error, \
         failures, retry_at, revision, created_at, updated_at"
    };
}

/// A schedule row as stored: read whole first, so a row keiro cannot read as a schedule is
/// still named (its name, revision and failures) for the due query's `unreadable`.
#[derive(Debug)]
struct Stored {
    name: String,
    workflow_name: String,
    cron: Option<String>,
    interval_ms: Option<i64>,
    time_zone: String,
    input: String,
    overlap: String,
    catch_up: String,
    catch_up_max: i32,
    paused: bool,
    next_tick: Option<i64>,
    last_tick: Option<i64>,
    buffered_tick: Option<i64>,
    last_instance: Option<String>,
    last_error: Option<String>,
    failures: i64,
    retry_at: Option<i64>,
    revision: i64,
    created_at: i64,
    updated_at: i64,
}

impl Stored {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            name: r.get(0)?,
            workflow_name: r.get(1)?,
            cron: r.get(2)?,
            interval_ms: r.get(3)?,
            time_zone: r.get(4)?,
            input: r.get(5)?,
            overlap: r.get(6)?,
            catch_up: r.get(7)?,
            catch_up_max: r.get(8)?,
            paused: r.get(9)?,
            next_tick: r.get(10)?,
            last_tick: r.get(11)?,
            buffered_tick: r.get(12)?,
            last_instance: r.get(13)?,
            last_error: r.get(14)?,
            failures: r.get(15)?,
            retry_at: r.get(16)?,
            revision: r.get(17)?,
            created_at: r.get(18)?,
            updated_at: r.get(19)?,
        })
    }

    /// The row as a schedule.
    fn schedule(&self, operation: &'static str) -> Result<Schedule> {
        let cadence = match (&self.cron, self.interval_ms) {
            (Some(expression), None) => Cadence::Cron {
                expression: expression.clone(),
                time_zone: self.time_zone.clone(),
            },
            (None, Some(ms)) => Cadence::Every(Duration::from_millis(
                u64::try_from(ms).map_err(|_| malformed(operation, "a negative interval"))?,
            )),
            _ => return Err(malformed(operation, "neither or both of cron and interval")),
        };
        let overlap = &self.overlap;
        let catch_up = &self.catch_up;
        Ok(Schedule {
            spec: ScheduleSpec {
                name: self.name.clone(),
                workflow: WorkflowName::new(self.workflow_name.as_str())
                    .map_err(|e| malformed(operation, e))?,
                cadence,
                input: row::value(&self.input, operation)?,
                overlap: Overlap::parse(overlap)
                    .ok_or_else(|| malformed(operation, format_args!("overlap {overlap:?}")))?,
                catch_up: CatchUp::from_parts(catch_up, self.catch_up_max)
                    .ok_or_else(|| malformed(operation, format_args!("catch-up {catch_up:?}")))?,
            },
            paused: self.paused,
            next_tick: row::instant_opt(self.next_tick, operation)?,
            last_tick: row::instant_opt(self.last_tick, operation)?,
            buffered_tick: row::instant_opt(self.buffered_tick, operation)?,
            last_instance: self
                .last_instance
                .as_deref()
                .map(WorkflowId::new)
                .transpose()
                .map_err(|e| malformed(operation, e))?,
            last_error: self.last_error.clone(),
            failures: u32::try_from(self.failures)
                .map_err(|_| malformed(operation, "a failure count out of range"))?,
            retry_at: row::instant_opt(self.retry_at, operation)?,
            revision: self.revision,
            created_at: row::instant(self.created_at, operation)?,
            updated_at: row::instant(self.updated_at, operation)?,
        })
    }
}

/// The stored form of a cadence: (cron, interval in ms, time zone).
fn cadence_parts(cadence: &Cadence) -> (Option<&str>, Option<i64>, &str) {
    match cadence {
        Cadence::Cron {
            expression,
            time_zone,
        } => (Some(expression), None, time_zone),
        Cadence::Every(interval) => (
            None,
            Some(i64::try_from(interval.as_millis()).unwrap_or(i64::MAX)),
            keiro_resume::TIME_ZONE_DEFAULT,
        ),
    }
}

/// The first tick of `spec` strictly after `now`; a cadence that does not compile is refused.
fn next_tick_after(
    spec: &ScheduleSpec,
    now: OffsetDateTime,
    operation: &'static str,
) -> Result<Option<OffsetDateTime>> {
    spec.cadence
        .next_after(now)
        .map_err(|e| StoreError::ValueRefused {
            operation,
            reason: e.to_string(),
        })
}

/// The one row selected by `sql` with `params`, as a schedule.
fn one(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    operation: &'static str,
) -> Result<Option<Schedule>> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.query_row(params, Stored::from_row).optional())
        .map_err(|e| store(operation, e))?
        .map(|stored| stored.schedule(operation))
        .transpose()
}

/// Keeps the paused flag, last tick and last instance of an existing row; moves it to the new
/// cadence's next tick and bumps its revision, so a plan made from the old definition is stale.
const SCHEDULE_UPSERT: &str = concat!(
    "INSERT INTO schedules (name, workflow_name, cron, interval_ms, time_zone, input, ",
    "overlap, catch_up, catch_up_max, next_tick, created_at, updated_at) ",
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11) ",
    "ON CONFLICT (name) DO UPDATE SET workflow_name = excluded.workflow_name, ",
    "cron = excluded.cron, interval_ms = excluded.interval_ms, time_zone = excluded.time_zone, ",
    "input = excluded.input, overlap = excluded.overlap, catch_up = excluded.catch_up, ",
    "catch_up_max = excluded.catch_up_max, next_tick = excluded.next_tick, ",
    "buffered_tick = NULL, last_error = NULL, failures = 0, retry_at = NULL, ",
    "revision = revision + 1, updated_at = excluded.updated_at RETURNING ",
    schedule_columns!()
);

/// schedule_upsert: creates the schedule or updates its definition at `now`.
pub(crate) fn schedule_upsert(
    conn: &Connection,
    now: OffsetDateTime,
    spec: &ScheduleSpec,
) -> Result<Schedule> {
    let next_tick = next_tick_after(spec, now, UPSERT)?;
    let (cron, interval_ms, time_zone) = cadence_parts(&spec.cadence);
    let (catch_up, catch_up_max) = spec.catch_up.as_parts();
    one(
        conn,
        SCHEDULE_UPSERT,
        params![
            spec.name,
            spec.workflow.as_str(),
            cron,
            interval_ms,
            time_zone,
            row::json(&spec.input),
            spec.overlap.as_str(),
            catch_up,
            catch_up_max,
            next_tick.map(micros),
            micros(now)
        ],
        UPSERT,
    )?
    .ok_or_else(|| malformed(UPSERT, "the written row is missing"))
}

const SCHEDULE_GET: &str = concat!(
    "SELECT ",
    schedule_columns!(),
    " FROM schedules WHERE name = ?1"
);

/// schedule_get: one schedule.
pub(crate) fn schedule_get(conn: &Connection, name: &str) -> Result<Option<Schedule>> {
    one(conn, SCHEDULE_GET, params![name], GET)
}

const SCHEDULES_LIST: &str = concat!(
    "SELECT ",
    schedule_columns!(),
    " FROM schedules ORDER BY name"
);

/// schedules_list: every schedule, by name.
pub(crate) fn schedules_list(conn: &Connection) -> Result<Vec<Schedule>> {
    let stored: Vec<Stored> = conn
        .prepare_cached(SCHEDULES_LIST)
        .and_then(|mut s| s.query_map([], Stored::from_row)?.collect())
        .map_err(|e| store(LIST, e))?;
    stored.iter().map(|s| s.schedule(LIST)).collect()
}

const SCHEDULE_DELETE: &str = "DELETE FROM schedules WHERE name = ?1";

/// schedule_delete: whether there was one to delete.
pub(crate) fn schedule_delete(conn: &Connection, name: &str) -> Result<bool> {
    Ok(conn
        .execute_cached(SCHEDULE_DELETE, params![name])
        .map_err(|e| store(DELETE, e))?
        > 0)
}

/// A pause keeps the next tick (recomputed on resume), any buffered tick and the back-off; a
/// resume drops the buffered tick with the other ticks that fell while paused, and the
/// back-off (the operator's act is the retry).
const SCHEDULE_SET_PAUSED: &str = concat!(
    "UPDATE schedules SET paused = ?2, next_tick = ?3, ",
    "buffered_tick = CASE WHEN ?2 THEN buffered_tick END, ",
    "failures = CASE WHEN ?2 THEN failures ELSE 0 END, ",
    "retry_at = CASE WHEN ?2 THEN retry_at END, ",
    "revision = revision + 1, updated_at = ?4 WHERE name = ?1 RETURNING ",
    schedule_columns!()
);

/// schedule_set_paused: pauses or resumes at `now`; `None` when there is no such schedule.
pub(crate) fn schedule_set_paused(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    paused: bool,
) -> Result<Option<Schedule>> {
    let Some(row) = schedule_get(conn, name)? else {
        return Ok(None);
    };
    if row.paused == paused {
        return Ok(Some(row));
    }
    let next_tick = if paused {
        row.next_tick
    } else {
        next_tick_after(&row.spec, now, PAUSE)?
    };
    one(
        conn,
        SCHEDULE_SET_PAUSED,
        params![name, paused, next_tick.map(micros), micros(now)],
        PAUSE,
    )
}

const SCHEDULE_TRIGGERED: &str = "UPDATE schedules SET last_instance = ?2, \
     revision = revision + 1, updated_at = ?3 WHERE name = ?1";

/// schedule_trigger: starts one run of the schedule at `now` whatever its policy, and records
/// it as the last instance; `None` when there is no such schedule.
pub(crate) fn schedule_trigger(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
) -> Result<Option<Started>> {
    let Some(row) = schedule_get(conn, name)? else {
        return Ok(None);
    };
    let id = trigger_instance_id(name, now).map_err(|e| StoreError::ValueRefused {
        operation: TRIGGER,
        reason: e.to_string(),
    })?;
    let started = start(conn, now, &row.spec.workflow, &id, &row.spec.input, TRIGGER)?;
    conn.execute_cached(SCHEDULE_TRIGGERED, params![name, id.as_str(), micros(now)])
        .map_err(|e| store(TRIGGER, e))?;
    Ok(Some(started))
}

/// Starts one instance in the caller's transaction, through `instance_start` (insert or find).
fn start(
    conn: &Connection,
    now: OffsetDateTime,
    workflow: &WorkflowName,
    id: &WorkflowId,
    input: &serde_json::Value,
    operation: &'static str,
) -> Result<Started> {
    let (created, row) =
        instance::instance_start(conn, now, workflow.as_str(), id.as_str(), input, None, 0)?;
    Ok(Started {
        created,
        instance: row.instance(operation)?,
    })
}

const SCHEDULER_LEADER_ROW: &str = "INSERT INTO schedule_leader (id) VALUES (1) \
     ON CONFLICT (id) DO NOTHING";
/// Granted when free, expired or already the caller's; the epoch moves only when the holder
/// changes, so a holder's renewals keep its fence valid.
const SCHEDULER_LEASE: &str = "UPDATE schedule_leader SET \
     epoch = CASE WHEN owner IS NOT ?1 THEN epoch + 1 ELSE epoch END, \
     owner = ?1, expires_at = ?3 \
     WHERE owner = ?1 OR owner IS NULL OR expires_at <= ?2 RETURNING epoch";

/// scheduler_lease: takes or renews the leadership for `owner` until `now + ttl_ms`; `None`
/// when another owner holds it.
pub(crate) fn scheduler_lease(
    conn: &Connection,
    now: OffsetDateTime,
    owner: &str,
    ttl_ms: i64,
) -> Result<Option<Fence>> {
    conn.execute_cached(SCHEDULER_LEADER_ROW, [])
        .map_err(|e| store(LEASE, e))?;
    let until = now.saturating_add(time::Duration::milliseconds(ttl_ms));
    let epoch: Option<i64> = conn
        .query_row_cached(
            SCHEDULER_LEASE,
            params![owner, micros(now), micros(until)],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| store(LEASE, e))?;
    Ok(epoch.map(|epoch| Fence {
        owner: owner.to_owned(),
        epoch,
    }))
}

const SCHEDULER_RELEASE: &str =
    "UPDATE schedule_leader SET owner = NULL, expires_at = NULL WHERE owner = ?1";

/// scheduler_release: gives up the leadership if `owner` holds it.
pub(crate) fn scheduler_release(conn: &Connection, owner: &str) -> Result<bool> {
    Ok(conn
        .execute_cached(SCHEDULER_RELEASE, params![owner])
        .map_err(|e| store(RELEASE, e))?
        > 0)
}

/// The earliest instant any unpaused schedule is due: its next tick, or its retry when later
/// (PostgreSQL's `greatest`, which ignores a missing value).
const SCHEDULES_NEXT_DUE: &str = "SELECT min(CASE WHEN retry_at IS NULL THEN next_tick \
     WHEN next_tick IS NULL THEN retry_at ELSE max(next_tick, retry_at) END) \
     FROM schedules WHERE NOT paused";
/// The due rows, with the status of each one's last instance; a row backed off past the clock
/// is left out.
const SCHEDULES_DUE: &str = concat!(
    "SELECT ",
    schedule_columns!(),
    ", coalesce((SELECT w.status IN ('running', 'suspended') FROM workflows w ",
    "WHERE w.workflow_name = s.workflow_name AND w.workflow_id = s.last_instance), 0) ",
    "FROM schedules s WHERE NOT s.paused ",
    "AND (s.next_tick <= ?1 OR s.buffered_tick IS NOT NULL) ",
    "AND (s.retry_at IS NULL OR s.retry_at <= ?1) ",
    "ORDER BY s.next_tick NULLS LAST, s.name LIMIT max(?2, 0)"
);

/// schedules_due: the due schedules at `clock`, at most `limit`; a row keiro cannot read as a
/// schedule is reported as unreadable, not as the whole read's failure.
pub(crate) fn schedules_due(
    conn: &Connection,
    clock: OffsetDateTime,
    limit: i64,
) -> Result<SchedulesDue> {
    let next_due: Option<i64> = conn
        .query_row_cached(SCHEDULES_NEXT_DUE, [], |r| r.get(0))
        .map_err(|e| store(DUE, e))?;
    let rows: Vec<(Stored, bool)> = conn
        .prepare_cached(SCHEDULES_DUE)
        .and_then(|mut s| {
            s.query_map(params![micros(clock), limit], |r| {
                Ok((Stored::from_row(r)?, r.get(20)?))
            })?
            .collect()
        })
        .map_err(|e| store(DUE, e))?;
    let mut due = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    for (stored, previous_live) in rows {
        match stored.schedule(DUE) {
            Ok(schedule) => due.push(DueSchedule {
                schedule,
                previous_live,
            }),
            Err(error) => unreadable.push(UnreadableSchedule {
                name: stored.name,
                revision: stored.revision,
                failures: u32::try_from(stored.failures).unwrap_or(0),
                error: error.to_string(),
            }),
        }
    }
    Ok(SchedulesDue {
        clock,
        due,
        unreadable,
        next_due: row::instant_opt(next_due, DUE)?,
    })
}

const FIRE_LEADER: &str =
    "SELECT EXISTS (SELECT 1 FROM schedule_leader WHERE owner = ?1 AND epoch = ?2)";
const FIRE_ROW: &str = "UPDATE schedules SET next_tick = ?3, last_tick = ?4, \
     buffered_tick = ?5, last_instance = coalesce(?6, last_instance), last_error = NULL, \
     failures = 0, retry_at = NULL, revision = revision + 1, updated_at = ?7 \
     WHERE name = ?1 AND revision = ?2 AND NOT paused";

/// schedule_fire: applies a scheduler's plan if its writer still leads and the row is still
/// at the planned revision and unpaused: the row moves, then the starts are made.
pub(crate) fn schedule_fire(
    conn: &Connection,
    now: OffsetDateTime,
    fire: &ScheduleFire,
) -> Result<FireOutcome> {
    let leads: bool = conn
        .query_row_cached(
            FIRE_LEADER,
            params![fire.leader.owner, fire.leader.epoch],
            |r| r.get(0),
        )
        .map_err(|e| store(FIRE, e))?;
    if !leads {
        return Ok(FireOutcome::NotLeader);
    }
    let last_instance = fire.starts.last().map(|r| r.key.id.as_str());
    let moved = conn
        .execute_cached(
            FIRE_ROW,
            params![
                fire.name,
                fire.revision,
                fire.next_tick.map(micros),
                fire.last_tick.map(micros),
                fire.buffered_tick.map(micros),
                last_instance,
                micros(now)
            ],
        )
        .map_err(|e| store(FIRE, e))?;
    if moved == 0 {
        return Ok(FireOutcome::Stale);
    }
    let started = fire
        .starts
        .iter()
        .map(|request| {
            start(
                conn,
                now,
                &request.key.name,
                &request.key.id,
                &request.input,
                FIRE,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(FireOutcome::Fired(started))
}

const SCHEDULE_RECORD_ERROR: &str = "UPDATE schedules SET last_error = ?3, \
     failures = min(failures, 2147483646) + 1, retry_at = ?4, updated_at = ?5 \
     WHERE name = ?1 AND revision = ?2";

/// schedule_record_error: records why a schedule could not start and backs it off until
/// `retry_at`, if the row is still at `revision` (not bumped).
pub(crate) fn schedule_record_error(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    revision: i64,
    error: &str,
    retry_at: OffsetDateTime,
) -> Result<bool> {
    Ok(conn
        .execute_cached(
            SCHEDULE_RECORD_ERROR,
            params![name, revision, error, micros(retry_at), micros(now)],
        )
        .map_err(|e| store(RECORD, e))?
        > 0)
}
