//! Schedules on Postgres: the `schedules` table and the `schedule_leader` row (migration 0017;
//! the back-off columns `failures` and `retry_at`, 0018).
//!
//! Plain parameterized SQL, no plpgsql: the operations that write more than one row (a fire's
//! starts with its row update, a trigger, a resume that computes the next tick in Rust) run in
//! one explicit transaction on one pooled connection. Every "now" is the database's `now()`
//! unless the caller passes one, so the database clock decides when a tick is due.

use std::time::Duration;

use keiro_journal::store::{Error as StoreError, Result};
use keiro_journal::{span::traced, store_span, Fence, Started, WorkflowId, WorkflowName};
use keiro_resume::{
    trigger_instance_id, Cadence, CatchUp, DueSchedule, FireOutcome, Overlap, Schedule,
    ScheduleFire, ScheduleSpec, ScheduleStore, SchedulesDue, UnreadableSchedule,
};
use time::OffsetDateTime;
use tokio_postgres::Row;

use crate::ops::instance::INSTANCE_START;
use crate::ops::span_ms;
use crate::row::{self, column, malformed};
use crate::PgStore;

/// The columns of a schedule row, in the order [`schedule`] reads them by name.
macro_rules! schedule_columns {
    ($source:literal) => {
        concat!(
            $source,
            "name, ",
            $source,
            "workflow_name, ",
            $source,
            "cron, ",
            $source,
            "interval_ms, ",
            $source,
            "time_zone, ",
            $source,
            "input, ",
            $source,
            "overlap, ",
            $source,
            "catch_up, ",
            $source,
            "catch_up_max, ",
            $source,
            "paused, ",
            $source,
            "next_tick, ",
            $source,
            "last_tick, ",
            $source,
            "buffered_tick, ",
            $source,
            "last_instance, ",
            $source,
            "last_error, ",
            $source,
            "failures, ",
            $source,
            "retry_at, ",
            $source,
            "revision, ",
            $source,
            "created_at, ",
            $source,
            "updated_at"
        )
    };
}

/// Reads a schedule row.
fn schedule(row: &Row, operation: &'static str) -> Result<Schedule> {
    let cron: Option<String> = column(row, "cron", operation)?;
    let interval_ms: Option<i64> = column(row, "interval_ms", operation)?;
    let cadence = match (cron, interval_ms) {
        (Some(expression), None) => Cadence::Cron {
            expression,
            time_zone: column(row, "time_zone", operation)?,
        },
        (None, Some(ms)) => Cadence::Every(Duration::from_millis(
            u64::try_from(ms).map_err(|_| malformed(operation, "a negative interval"))?,
        )),
        _ => return Err(malformed(operation, "neither or both of cron and interval")),
    };
    let overlap: String = column(row, "overlap", operation)?;
    let catch_up: String = column(row, "catch_up", operation)?;
    let workflow: String = column(row, "workflow_name", operation)?;
    let last_instance: Option<String> = column(row, "last_instance", operation)?;
    Ok(Schedule {
        spec: ScheduleSpec {
            name: column(row, "name", operation)?,
            workflow: WorkflowName::new(workflow).map_err(|e| malformed(operation, e))?,
            cadence,
            input: column(row, "input", operation)?,
            overlap: Overlap::parse(&overlap)
                .ok_or_else(|| malformed(operation, format_args!("overlap {overlap:?}")))?,
            catch_up: CatchUp::from_parts(&catch_up, column(row, "catch_up_max", operation)?)
                .ok_or_else(|| malformed(operation, format_args!("catch-up {catch_up:?}")))?,
        },
        paused: column(row, "paused", operation)?,
        next_tick: column(row, "next_tick", operation)?,
        last_tick: column(row, "last_tick", operation)?,
        buffered_tick: column(row, "buffered_tick", operation)?,
        last_instance: last_instance
            .map(WorkflowId::new)
            .transpose()
            .map_err(|e| malformed(operation, e))?,
        last_error: column(row, "last_error", operation)?,
        failures: u32::try_from(column::<i32>(row, "failures", operation)?)
            .map_err(|_| malformed(operation, "a negative failure count"))?,
        retry_at: column(row, "retry_at", operation)?,
        revision: column(row, "revision", operation)?,
        created_at: column(row, "created_at", operation)?,
        updated_at: column(row, "updated_at", operation)?,
    })
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

fn failed<'s>(
    store: &'s PgStore,
    operation: &'static str,
) -> impl Fn(tokio_postgres::Error) -> StoreError + 's {
    move |e| store.failed(operation, e)
}

const UPSERT: &str = "writing a schedule";
const SCHEDULE_NOW: &str = "SELECT coalesce($1::timestamptz, now()) AS now";

/// Keeps the paused flag, last tick and last instance of an existing row; moves it to the new
/// cadence's next tick and bumps its revision, so a plan made from the old definition is stale.
const SCHEDULE_UPSERT: &str = concat!(
    "INSERT INTO schedules AS s (name, workflow_name, cron, interval_ms, time_zone, input, ",
    "overlap, catch_up, catch_up_max, next_tick, created_at, updated_at) ",
    "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11) ",
    "ON CONFLICT (name) DO UPDATE SET workflow_name = EXCLUDED.workflow_name, ",
    "cron = EXCLUDED.cron, interval_ms = EXCLUDED.interval_ms, time_zone = EXCLUDED.time_zone, ",
    "input = EXCLUDED.input, overlap = EXCLUDED.overlap, catch_up = EXCLUDED.catch_up, ",
    "catch_up_max = EXCLUDED.catch_up_max, next_tick = EXCLUDED.next_tick, ",
    "buffered_tick = NULL, last_error = NULL, failures = 0, retry_at = NULL, ",
    "revision = s.revision + 1, ",
    "updated_at = EXCLUDED.updated_at RETURNING ",
    schedule_columns!("s.")
);

async fn schedule_upsert(
    store: &PgStore,
    spec: &ScheduleSpec,
    now: Option<OffsetDateTime>,
) -> Result<Schedule> {
    // The database's clock first, then the write: the next tick is computed here, in Rust,
    // from the cadence; a "now" a round trip old only makes it no later than it should be.
    let now: OffsetDateTime = column(
        &store.query_one(UPSERT, SCHEDULE_NOW, &[&now]).await?,
        "now",
        UPSERT,
    )?;
    let next_tick = next_tick_after(spec, now, UPSERT)?;
    let (cron, interval_ms, time_zone) = cadence_parts(&spec.cadence);
    let (catch_up, catch_up_max) = spec.catch_up.as_parts();
    let row = store
        .query_one(
            UPSERT,
            SCHEDULE_UPSERT,
            &[
                &spec.name,
                &spec.workflow.as_str(),
                &cron,
                &interval_ms,
                &time_zone,
                &spec.input,
                &spec.overlap.as_str(),
                &catch_up,
                &catch_up_max,
                &next_tick,
                &now,
            ],
        )
        .await?;
    schedule(&row, UPSERT)
}

const SCHEDULE_GET: &str = concat!(
    "SELECT ",
    schedule_columns!(""),
    " FROM schedules WHERE name = $1"
);
const SCHEDULES_LIST: &str = concat!(
    "SELECT ",
    schedule_columns!(""),
    " FROM schedules ORDER BY name"
);
const SCHEDULE_DELETE: &str = "DELETE FROM schedules WHERE name = $1";

const PAUSE: &str = "pausing or resuming a schedule";
const SCHEDULE_LOCK: &str = concat!(
    "SELECT ",
    schedule_columns!(""),
    ", coalesce($2::timestamptz, now()) AS now FROM schedules WHERE name = $1 FOR UPDATE"
);
/// A pause keeps the next tick (it is recomputed on resume), any buffered tick and the
/// back-off; a resume drops the buffered tick with the other ticks that fell while paused, and
/// the back-off (the operator's act is the retry).
const SCHEDULE_SET_PAUSED: &str = concat!(
    "UPDATE schedules SET paused = $2, next_tick = $3, ",
    "buffered_tick = CASE WHEN $2 THEN buffered_tick END, ",
    "failures = CASE WHEN $2 THEN failures ELSE 0 END, ",
    "retry_at = CASE WHEN $2 THEN retry_at END, ",
    "revision = revision + 1, updated_at = $4 WHERE name = $1 RETURNING ",
    schedule_columns!("")
);

async fn schedule_set_paused(
    store: &PgStore,
    name: &str,
    paused: bool,
    now: Option<OffsetDateTime>,
) -> Result<Option<Schedule>> {
    let fail = failed(store, PAUSE);
    let mut client = store.client(PAUSE).await?;
    // One transaction: the row is locked while its next tick is computed from its cadence.
    let tx = client.transaction().await.map_err(&fail)?;
    let rows = tx
        .query(SCHEDULE_LOCK, &[&name, &now])
        .await
        .map_err(&fail)?;
    let Some(locked) = rows.first() else {
        store.count_round_trips(2);
        return Ok(None);
    };
    let row = schedule(locked, PAUSE)?;
    if row.paused == paused {
        store.count_round_trips(2);
        return Ok(Some(row));
    }
    let now: OffsetDateTime = column(locked, "now", PAUSE)?;
    let next_tick = if paused {
        row.next_tick
    } else {
        next_tick_after(&row.spec, now, PAUSE)?
    };
    let updated = tx
        .query_one(SCHEDULE_SET_PAUSED, &[&name, &paused, &next_tick, &now])
        .await
        .map_err(&fail)?;
    tx.commit().await.map_err(&fail)?;
    store.count_round_trips(4);
    schedule(&updated, PAUSE).map(Some)
}

const TRIGGER: &str = "triggering a schedule";
const SCHEDULE_TRIGGERED: &str = "UPDATE schedules SET last_instance = $2, \
     revision = revision + 1, updated_at = now() WHERE name = $1";

async fn schedule_trigger(
    store: &PgStore,
    name: &str,
    now: Option<OffsetDateTime>,
) -> Result<Option<Started>> {
    let fail = failed(store, TRIGGER);
    let mut client = store.client(TRIGGER).await?;
    // The start and the row's last instance in one transaction, so an overlap check never
    // sees the one without the other.
    let tx = client.transaction().await.map_err(&fail)?;
    let rows = tx
        .query(SCHEDULE_LOCK, &[&name, &now])
        .await
        .map_err(&fail)?;
    let Some(locked) = rows.first() else {
        store.count_round_trips(2);
        return Ok(None);
    };
    let row = schedule(locked, TRIGGER)?;
    let at: OffsetDateTime = column(locked, "now", TRIGGER)?;
    let id = trigger_instance_id(name, at).map_err(|e| StoreError::ValueRefused {
        operation: TRIGGER,
        reason: e.to_string(),
    })?;
    let started = start(
        store,
        &tx,
        &row.spec.workflow,
        &id,
        &row.spec.input,
        TRIGGER,
    )
    .await?;
    tx.execute(SCHEDULE_TRIGGERED, &[&name, &id.as_str()])
        .await
        .map_err(&fail)?;
    tx.commit().await.map_err(&fail)?;
    store.count_round_trips(5);
    Ok(Some(started))
}

/// Starts one instance inside the caller's transaction, through the same function as
/// `instance_start` (insert or find, and NOTIFY on create).
async fn start(
    store: &PgStore,
    tx: &deadpool_postgres::Transaction<'_>,
    workflow: &WorkflowName,
    id: &WorkflowId,
    input: &serde_json::Value,
    operation: &'static str,
) -> Result<Started> {
    let no_parent: Option<&str> = None;
    let row = tx
        .query_one(
            INSTANCE_START,
            &[
                &workflow.as_str(),
                &id.as_str(),
                input,
                &no_parent,
                &no_parent,
                &0_i32,
            ],
        )
        .await
        .map_err(failed(store, operation))?;
    Ok(Started {
        created: column(&row, "created", operation)?,
        instance: row::instance(&row, operation)?,
    })
}

const LEASE: &str = "taking the scheduler lease";
/// Granted when free, expired or already the caller's; the epoch moves only when the holder
/// changes, so a holder's renewals keep its fence valid.
const SCHEDULER_LEASE: &str = "UPDATE schedule_leader SET \
     epoch = CASE WHEN owner IS DISTINCT FROM $1 THEN epoch + 1 ELSE epoch END, \
     owner = $1, \
     expires_at = coalesce($3::timestamptz, now()) + $2::bigint * interval '1 millisecond' \
     WHERE owner = $1 OR owner IS NULL OR expires_at <= coalesce($3::timestamptz, now()) \
     RETURNING epoch";
const SCHEDULER_RELEASE: &str =
    "UPDATE schedule_leader SET owner = NULL, expires_at = NULL WHERE owner = $1";

const DUE: &str = "reading due schedules";
/// One round trip: the clock, the due rows (with the status of each one's last instance) and
/// the earliest instant any schedule is due (`greatest` ignores a missing retry). A row backed
/// off past the clock is left out. The lateral subquery keeps one row even when nothing is due.
/// The outer `ORDER BY` gives the rows back next tick first: the subquery's order does not
/// survive the joins around it.
const SCHEDULES_DUE: &str = concat!(
    "WITH c AS (SELECT coalesce($1::timestamptz, now()) AS clock) ",
    "SELECT c.clock, ",
    "(SELECT min(greatest(n.next_tick, n.retry_at)) FROM schedules n WHERE NOT n.paused) ",
    "AS next_due, ",
    "coalesce(w.status IN ('running', 'suspended'), false) AS previous_live, ",
    schedule_columns!("s."),
    " FROM c LEFT JOIN LATERAL (SELECT * FROM schedules d WHERE NOT d.paused ",
    "AND (d.next_tick <= c.clock OR d.buffered_tick IS NOT NULL) ",
    "AND (d.retry_at IS NULL OR d.retry_at <= c.clock) ",
    "ORDER BY d.next_tick NULLS LAST LIMIT $2) s ON true ",
    "LEFT JOIN workflows w ON w.workflow_name = s.workflow_name ",
    "AND w.workflow_id = s.last_instance ",
    "ORDER BY s.next_tick NULLS LAST, s.name"
);

const FIRE: &str = "firing a schedule";
/// Held until commit (FOR SHARE): a new leader's lease UPDATE waits for this fire to finish,
/// so no fire of a former leader commits after the leadership changed hands.
const FIRE_LEADER: &str = "SELECT 1 FROM schedule_leader WHERE owner = $1 AND epoch = $2 FOR SHARE";
const FIRE_ROW: &str = "UPDATE schedules SET next_tick = $3, last_tick = $4, \
     buffered_tick = $5, last_instance = coalesce($6, last_instance), last_error = NULL, \
     failures = 0, retry_at = NULL, revision = revision + 1, updated_at = now() \
     WHERE name = $1 AND revision = $2 AND NOT paused";

async fn schedule_fire(store: &PgStore, fire: &ScheduleFire) -> Result<FireOutcome> {
    let fail = failed(store, FIRE);
    let mut client = store.client(FIRE).await?;
    // One transaction: the starts commit with the row that moved past their ticks, or neither.
    let tx = client.transaction().await.map_err(&fail)?;
    let leads = tx
        .query(FIRE_LEADER, &[&fire.leader.owner, &fire.leader.epoch])
        .await
        .map_err(&fail)?;
    if leads.is_empty() {
        store.count_round_trips(2);
        return Ok(FireOutcome::NotLeader);
    }
    let last_instance = fire.starts.last().map(|r| r.key.id.as_str());
    let moved = tx
        .execute(
            FIRE_ROW,
            &[
                &fire.name,
                &fire.revision,
                &fire.next_tick,
                &fire.last_tick,
                &fire.buffered_tick,
                &last_instance,
            ],
        )
        .await
        .map_err(&fail)?;
    if moved == 0 {
        store.count_round_trips(3);
        return Ok(FireOutcome::Stale);
    }
    let mut started = Vec::with_capacity(fire.starts.len());
    for request in &fire.starts {
        started.push(
            start(
                store,
                &tx,
                &request.key.name,
                &request.key.id,
                &request.input,
                FIRE,
            )
            .await?,
        );
    }
    tx.commit().await.map_err(&fail)?;
    store.count_round_trips(4 + u64::try_from(fire.starts.len()).unwrap_or(0));
    Ok(FireOutcome::Fired(started))
}

const SCHEDULE_RECORD_ERROR: &str = "UPDATE schedules SET last_error = $3, \
     failures = least(failures, 2147483646) + 1, retry_at = $4, updated_at = now() \
     WHERE name = $1 AND revision = $2";

#[async_trait::async_trait]
impl ScheduleStore for PgStore {
    async fn schedule_upsert(
        &self,
        spec: &ScheduleSpec,
        now: Option<OffsetDateTime>,
    ) -> Result<Schedule> {
        let span = store_span!("schedule_upsert", keiro.schedule.name = %spec.name);
        traced(span, schedule_upsert(self, spec, now)).await
    }

    async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>> {
        const GET: &str = "reading a schedule";
        let span = store_span!("schedule_get", keiro.schedule.name = %name);
        traced(span, async {
            self.query(GET, SCHEDULE_GET, &[&name])
                .await?
                .first()
                .map(|row| schedule(row, GET))
                .transpose()
        })
        .await
    }

    async fn schedules_list(&self) -> Result<Vec<Schedule>> {
        const LIST: &str = "listing schedules";
        traced(store_span!("schedules_list"), async {
            self.query(LIST, SCHEDULES_LIST, &[])
                .await?
                .iter()
                .map(|row| schedule(row, LIST))
                .collect()
        })
        .await
    }

    async fn schedule_delete(&self, name: &str) -> Result<bool> {
        let span = store_span!("schedule_delete", keiro.schedule.name = %name);
        traced(span, async {
            Ok(self
                .execute("deleting a schedule", SCHEDULE_DELETE, &[&name])
                .await?
                > 0)
        })
        .await
    }

    async fn schedule_set_paused(
        &self,
        name: &str,
        paused: bool,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Schedule>> {
        let span = store_span!("schedule_set_paused", keiro.schedule.name = %name);
        traced(span, schedule_set_paused(self, name, paused, now)).await
    }

    async fn schedule_trigger(
        &self,
        name: &str,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Started>> {
        let span = store_span!("schedule_trigger", keiro.schedule.name = %name);
        traced(span, schedule_trigger(self, name, now)).await
    }

    async fn scheduler_lease(
        &self,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Fence>> {
        traced(store_span!("scheduler_lease"), async {
            let rows = self
                .query(LEASE, SCHEDULER_LEASE, &[&owner, &span_ms(ttl), &now])
                .await?;
            rows.first()
                .map(|row| {
                    Ok(Fence {
                        owner: owner.to_owned(),
                        epoch: column(row, "epoch", LEASE)?,
                    })
                })
                .transpose()
        })
        .await
    }

    async fn scheduler_release(&self, owner: &str) -> Result<bool> {
        traced(store_span!("scheduler_release"), async {
            Ok(self
                .execute(
                    "releasing the scheduler lease",
                    SCHEDULER_RELEASE,
                    &[&owner],
                )
                .await?
                > 0)
        })
        .await
    }

    async fn schedules_due(&self, now: Option<OffsetDateTime>, limit: i64) -> Result<SchedulesDue> {
        traced(store_span!("schedules_due"), async {
            // A negative limit asks for nothing, not for an SQL error.
            let limit = limit.max(0);
            let rows = self.query(DUE, SCHEDULES_DUE, &[&now, &limit]).await?;
            let first = rows.first().ok_or_else(|| malformed(DUE, "no clock row"))?;
            let mut due = Vec::with_capacity(rows.len());
            let mut unreadable = Vec::new();
            for row in &rows {
                let Some(name) = column::<Option<String>>(row, "name", DUE)? else {
                    continue; // the lateral join's empty side: nothing is due
                };
                // A row edited by hand or by another build is that schedule's failure, which
                // the scheduler records on it, not the pass's.
                match schedule(row, DUE) {
                    Ok(schedule) => due.push(DueSchedule {
                        schedule,
                        previous_live: column(row, "previous_live", DUE)?,
                    }),
                    Err(error) => unreadable.push(UnreadableSchedule {
                        name,
                        revision: column(row, "revision", DUE)?,
                        failures: u32::try_from(column::<i32>(row, "failures", DUE)?).unwrap_or(0),
                        error: error.to_string(),
                    }),
                }
            }
            Ok(SchedulesDue {
                clock: column(first, "clock", DUE)?,
                due,
                unreadable,
                next_due: column(first, "next_due", DUE)?,
            })
        })
        .await
    }

    async fn schedule_fire(&self, fire: &ScheduleFire) -> Result<FireOutcome> {
        let span = store_span!("schedule_fire", keiro.schedule.name = %fire.name);
        traced(span, schedule_fire(self, fire)).await
    }

    async fn schedule_record_error(
        &self,
        name: &str,
        revision: i64,
        error: &str,
        retry_at: OffsetDateTime,
    ) -> Result<bool> {
        let span = store_span!("schedule_record_error", keiro.schedule.name = %name);
        traced(span, async {
            Ok(self
                .execute(
                    "recording a schedule's error",
                    SCHEDULE_RECORD_ERROR,
                    &[&name, &revision, &error, &retry_at],
                )
                .await?
                > 0)
        })
        .await
    }
}
