//! Rules of crates/migrations/functions/timer.sql (durable timers: arm, fire the due ones), then the
//! one-statement timer operations the Postgres store runs from Rust (crates/postgres/src/
//! timer.rs: requeue stuck, count due).
//!
//! A new timer notifies `timer` (`keiro_notify_timer`), as in plpgsql.

use crate::cached::Cached;
use keiro_journal::store::Result;
use keiro_journal::Generation;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::error::store;
use crate::journal::{journal_append_step, AppendCode, AppendTo};
use crate::notify;
use crate::row::micros;

const ARM: &str = "arming a timer";
const FIRE_DUE: &str = "firing due timers";
const REQUEUE_STUCK: &str = "requeueing stuck timers";
const DUE_COUNT: &str = "counting due timers";

/// keiro_timer_arm's outcomes: armed or present with the stored `fire_at` (microseconds),
/// or not found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArmCode {
    Armed(i64),
    Present(i64),
    NotFound,
}

const INSTANCE_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM workflows WHERE workflow_name = ?1 AND workflow_id = ?2)";

const TIMER_INSERT: &str = "INSERT INTO timers \
         (workflow_name, workflow_id, generation, step, kind, token, fire_at, created_at, updated_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8) \
     ON CONFLICT (workflow_name, workflow_id, generation, step) DO NOTHING";

const TIMER_FIRE_AT: &str = "SELECT fire_at FROM timers \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step = ?4";

/// keiro_timer_arm: inserts the timer unless one exists for the step (first arm wins; a re-arm
/// never moves `fire_at`, even after the timer fired) and returns the stored `fire_at`. Not
/// fenced. `fire_at` is computed by the caller on the store's clock.
#[allow(clippy::too_many_arguments)] // keiro_timer_arm's parameters, in its order
pub(crate) fn timer_arm(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    generation: Generation,
    step: &str,
    kind: &str,
    token: Option<&str>,
    fire_at: OffsetDateTime,
) -> Result<ArmCode> {
    let exists: bool = conn
        .query_row_cached(INSTANCE_EXISTS, params![name, id], |r| r.get(0))
        .map_err(|e| store(ARM, e))?;
    if !exists {
        return Ok(ArmCode::NotFound);
    }
    let fire_at = micros(fire_at);
    let armed = conn
        .execute_cached(
            TIMER_INSERT,
            params![
                name,
                id,
                generation,
                step,
                kind,
                token,
                fire_at,
                micros(now)
            ],
        )
        .map_err(|e| store(ARM, e))?
        == 1;
    if armed {
        notify::timer(conn, ARM)?;
        return Ok(ArmCode::Armed(fire_at));
    }
    let stored: Option<i64> = conn
        .query_row_cached(TIMER_FIRE_AT, params![name, id, generation, step], |r| {
            r.get(0)
        })
        .optional()
        .map_err(|e| store(ARM, e))?;
    Ok(stored.map_or(ArmCode::NotFound, ArmCode::Present))
}

/// One fired timer: owner, step, when it was due (microseconds), whether this fire journaled
/// the step.
pub(crate) type Fired = (String, String, String, i64, bool);

const TIMERS_DUE: &str = "SELECT workflow_name, workflow_id, generation, step, kind, fire_at \
     FROM timers WHERE status = 'scheduled' AND fire_at <= ?1 \
     ORDER BY fire_at, workflow_name, workflow_id, generation, step \
     LIMIT max(?2, 0)";

const TIMERS_NEXT_DUE: &str = "SELECT min(fire_at) FROM timers WHERE status = 'scheduled'";

const INSTANCE_WAKE_MET: &str =
    "UPDATE workflows SET wake_after = NULL WHERE workflow_name = ?1 AND workflow_id = ?2";

const SIGNAL_WAITER_DELETE: &str = "DELETE FROM signal_waiters \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step = ?4";

const TIMER_FIRED: &str = "UPDATE timers SET \
         status = 'fired', attempts = attempts + 1, fired_at = ?5, updated_at = ?6 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step = ?4";

/// keiro_timers_fire_due: fires up to `limit` timers due at `clock` (`p_now`, or the store's
/// clock), oldest first, in this one transaction: each fire journals its step (external) and
/// marks the timer fired. A sleep that lands clears the owner's `wake_after` (its deadline is
/// met); a signal timeout lands only if its waiter is still registered (no signal took it
/// first). Returns the instant fired at, the fired timers in fire order, and the earliest
/// `fire_at` still scheduled. No `SKIP LOCKED` or token locks: the writer is alone.
pub(crate) fn timers_fire_due(
    conn: &Connection,
    now: OffsetDateTime,
    p_now: Option<OffsetDateTime>,
    limit: i64,
) -> Result<(OffsetDateTime, Vec<Fired>, Option<i64>)> {
    let clock = p_now.unwrap_or(now);
    let at = micros(clock);
    let batch: Vec<(String, String, Generation, String, String, i64)> = conn
        .prepare_cached(TIMERS_DUE)
        .and_then(|mut s| {
            s.query_map(params![at, limit], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })?
            .collect()
        })
        .map_err(|e| store(FIRE_DUE, e))?;
    let mut fired = Vec::with_capacity(batch.len());
    for (name, id, generation, step, kind, fire_at) in batch {
        let append = |kind: &'static str, payload: &Value| -> Result<bool> {
            let code = journal_append_step(
                conn,
                now,
                AppendTo {
                    name: &name,
                    id: &id,
                    generation: Some(generation),
                    step: &step,
                    kind,
                    payload,
                    owner: None,
                    epoch: None,
                    renew_ms: None,
                },
            )?;
            Ok(matches!(code, AppendCode::Appended(_)))
        };
        let delivered = if kind == "sleep" {
            let delivered = append("sleep", &Value::Null)?;
            if delivered {
                conn.execute_cached(INSTANCE_WAKE_MET, params![name, id])
                    .map_err(|e| store(FIRE_DUE, e))?;
            }
            delivered
        } else {
            let waited = conn
                .execute_cached(SIGNAL_WAITER_DELETE, params![name, id, generation, step])
                .map_err(|e| store(FIRE_DUE, e))?
                > 0;
            waited && append("signal", &json!({"timeout": true}))?
        };
        conn.execute_cached(
            TIMER_FIRED,
            params![name, id, generation, step, at, micros(now)],
        )
        .map_err(|e| store(FIRE_DUE, e))?;
        fired.push((name, id, step, fire_at, delivered));
    }
    let next_due: Option<i64> = conn
        .query_row_cached(TIMERS_NEXT_DUE, [], |r| r.get(0))
        .map_err(|e| store(FIRE_DUE, e))?;
    Ok((clock, fired, next_due))
}

const TIMERS_REQUEUE_STUCK: &str = "UPDATE timers SET status = 'scheduled', updated_at = ?1 \
     WHERE status = 'firing' AND updated_at <= ?2";

/// timers_requeue_stuck (crates/postgres/src/timer.rs): returns timers stuck in `firing` for
/// at least `older_than_ms` to `scheduled`; how many.
pub(crate) fn timers_requeue_stuck(
    conn: &Connection,
    now: OffsetDateTime,
    older_than_ms: i64,
) -> Result<u64> {
    let at = micros(now);
    let requeued = conn
        .execute_cached(
            TIMERS_REQUEUE_STUCK,
            params![at, at.saturating_sub(older_than_ms.saturating_mul(1000))],
        )
        .map_err(|e| store(REQUEUE_STUCK, e))?;
    Ok(u64::try_from(requeued).unwrap_or(u64::MAX))
}

const TIMERS_DUE_COUNT: &str =
    "SELECT count(*) FROM timers WHERE status = 'scheduled' AND fire_at <= ?1";

/// timers_due_count (crates/postgres/src/timer.rs): how many scheduled timers are due at
/// `now`.
pub(crate) fn timers_due_count(conn: &Connection, now: OffsetDateTime) -> Result<u64> {
    let due: i64 = conn
        .query_row_cached(TIMERS_DUE_COUNT, params![micros(now)], |r| r.get(0))
        .map_err(|e| store(DUE_COUNT, e))?;
    Ok(u64::try_from(due).unwrap_or(0))
}
