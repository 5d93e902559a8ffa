//! Rules of sql/functions/instance.sql: start, confirm, park, the divergence failure.
//!
//! Not here: `keiro_instances_start` (the writer runs each start of a batch as its own
//! operation in one shared transaction); `keiro_instance_hold` (transaction steps need
//! PostgreSQL: `Unsupported` on SQLite). Not here yet: `keiro_journal_written_by_body`,
//! `keiro_failure_mention`, `keiro_instance_requeue_one`, `keiro_instance_requeue`,
//! `keiro_instance_retry_with_input`.

use keiro_journal::store::Result;
use keiro_journal::Generation;
use rusqlite::{params, Connection};
use serde_json::Value;
use time::OffsetDateTime;

use crate::child;
use crate::error::store;
use crate::journal::{journal_append_to, AppendCode, AppendTo};
use crate::row::{self, micros, Stored};

const START: &str = "starting an instance";
const CONFIRM: &str = "confirming a lease";
const PARK: &str = "parking an instance";
const FAIL_DIVERGED: &str = "failing a diverged run";
const SETTLE: &str = "settling a completed run's leftovers";
const CANCEL: &str = "cancelling an instance";

const INSTANCE_INSERT: &str = "INSERT INTO workflows \
         (workflow_name, workflow_id, input, parent_name, parent_id, priority, created_at, updated_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) \
     ON CONFLICT (workflow_name, workflow_id) DO NOTHING";

/// keiro_instance_start: creates the row `running`, or returns the existing one untouched.
/// Returns whether it was created, and the row.
///
/// Not yet: the wake notification of a created row (`keiro_notify_wake`).
pub(crate) fn instance_start(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    input: &Value,
    parent: Option<(&str, &str)>,
    priority: i32,
) -> Result<(bool, Stored)> {
    let created = conn
        .execute(
            INSTANCE_INSERT,
            params![
                name,
                id,
                row::json(input),
                parent.map(|p| p.0),
                parent.map(|p| p.1),
                priority,
                micros(now)
            ],
        )
        .map_err(|e| store(START, e))?
        == 1;
    let row = row::instance_row(conn, name, id, START)?
        .ok_or_else(|| crate::error::malformed(START, "the started row is missing"))?;
    Ok((created, row))
}

/// keiro_instance_confirm's outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ConfirmCode {
    /// Renewed; the row's status.
    Confirmed(String),
    /// Terminal; answered without a lease check.
    Terminal(String),
    NotFound,
    LeaseLost,
}

const INSTANCE_RENEW: &str = "UPDATE workflows SET lease_expires_at = ?3, updated_at = ?4 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// keiro_instance_confirm: renews a fenced run's lease and reports the status. A terminal row
/// answers without a lease check, so a run learns it is over even after the terminal write
/// cleared its lease.
pub(crate) fn instance_confirm(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    owner: &str,
    epoch: i64,
    ttl_ms: i64,
) -> Result<ConfirmCode> {
    let Some(row) = row::instance_row(conn, name, id, CONFIRM)? else {
        return Ok(ConfirmCode::NotFound);
    };
    if row.is_terminal() {
        return Ok(ConfirmCode::Terminal(row.status));
    }
    if !row.held_by(owner, epoch) {
        return Ok(ConfirmCode::LeaseLost);
    }
    let at = micros(now);
    conn.execute(
        INSTANCE_RENEW,
        params![name, id, at.saturating_add(ttl_ms.saturating_mul(1000)), at],
    )
    .map_err(|e| store(CONFIRM, e))?;
    Ok(ConfirmCode::Confirmed(row.status))
}

/// keiro_instance_park's outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParkCode {
    Suspended,
    Woken,
    /// With the row's status.
    Terminal(String),
    NotFound,
    LeaseLost,
}

const JOURNAL_HAS_ANY: &str = "SELECT EXISTS (SELECT 1 FROM journal \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 \
       AND step_name IN (SELECT value FROM json_each(?4)))";

const INSTANCE_PARK_WOKEN: &str = "UPDATE workflows SET status = 'running', \
         lease_owner = NULL, lease_expires_at = NULL, \
         attempts = 0, last_error = NULL, next_attempt_at = NULL, \
         parked_on = CASE WHEN ?3 = generation THEN ?4 ELSE parked_on END, \
         updated_at = ?5 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

const INSTANCE_PARK_SUSPEND: &str = "UPDATE workflows SET status = 'suspended', wake_after = ?3, \
         lease_owner = NULL, lease_expires_at = NULL, \
         attempts = 0, last_error = NULL, next_attempt_at = NULL, \
         parked_on = ?4, updated_at = ?5 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// keiro_instance_park: parks a run waiting on `awaited`, releasing its lease and clearing its
/// crash history (it made progress). The awaited steps are checked inside the writer's
/// transaction, which every append also runs in, so a wake that landed before the park keeps
/// the row `running` instead of being masked by `suspended`. A park on the current generation
/// records the deliveries it waits on (`parked_on`).
///
/// Not yet: the wake notification of a woken park (`keiro_notify_wake`).
#[allow(clippy::too_many_arguments)] // keiro_instance_park's parameters, in its order
pub(crate) fn instance_park(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    generation: Generation,
    fence: Option<(&str, i64)>,
    awaited: &[String],
    wake_after: Option<OffsetDateTime>,
) -> Result<ParkCode> {
    // The deliveries this park waits on; NULL when none.
    let parked_on: Vec<&String> = awaited.iter().filter(|a| a.starts_with("await:")).collect();
    let parked_on = (!parked_on.is_empty()).then(|| {
        Value::from(
            parked_on
                .iter()
                .map(|a| Value::String((*a).clone()))
                .collect::<Vec<_>>(),
        )
        .to_string()
    });
    let Some(row) = row::instance_row(conn, name, id, PARK)? else {
        return Ok(ParkCode::NotFound);
    };
    if row.is_terminal() {
        return Ok(ParkCode::Terminal(row.status));
    }
    if let Some((owner, epoch)) = fence {
        if !row.held_by(owner, epoch) {
            return Ok(ParkCode::LeaseLost);
        }
    }
    let awaited_json = Value::from(awaited.to_vec()).to_string();
    let landed = generation != row.generation
        || conn
            .query_row(
                JOURNAL_HAS_ANY,
                params![name, id, generation, awaited_json],
                |r| r.get::<_, bool>(0),
            )
            .map_err(|e| store(PARK, e))?;
    let at = micros(now);
    if landed {
        conn.execute(
            INSTANCE_PARK_WOKEN,
            params![name, id, generation, parked_on, at],
        )
        .map_err(|e| store(PARK, e))?;
        Ok(ParkCode::Woken)
    } else {
        conn.execute(
            INSTANCE_PARK_SUSPEND,
            params![name, id, wake_after.map(micros), parked_on, at],
        )
        .map_err(|e| store(PARK, e))?;
        Ok(ParkCode::Suspended)
    }
}

/// keiro_instance_fail_diverged's outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailDivergedCode {
    Failed,
    Terminal,
    NotFound,
    LeaseLost,
}

const INSTANCE_FAIL_DIVERGED: &str = "UPDATE workflows SET \
         status = 'failed', last_error = ?3, completed_at = ?4, \
         lease_owner = NULL, lease_expires_at = NULL, updated_at = ?4 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// keiro_instance_fail_diverged: fails a run whose code no longer matches its journal,
/// without a journal row, so the very same journal can resume once fixed code is deployed and
/// an operator resurrects it. The failure is delivered to a waiting parent like any other.
pub(crate) fn instance_fail_diverged(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    fence: Option<(&str, i64)>,
    reason: &str,
) -> Result<FailDivergedCode> {
    let Some(row) = row::instance_row(conn, name, id, FAIL_DIVERGED)? else {
        return Ok(FailDivergedCode::NotFound);
    };
    if row.is_terminal() {
        return Ok(FailDivergedCode::Terminal);
    }
    if let Some((owner, epoch)) = fence {
        if !row.held_by(owner, epoch) {
            return Ok(FailDivergedCode::LeaseLost);
        }
    }
    conn.execute(
        INSTANCE_FAIL_DIVERGED,
        params![name, id, reason, micros(now)],
    )
    .map_err(|e| store(FAIL_DIVERGED, e))?;
    child::child_deliver(conn, now, name, id)?;
    Ok(FailDivergedCode::Failed)
}

const INSTANCE_COMPLETED: &str = "SELECT EXISTS (SELECT 1 FROM workflows \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND status = 'completed')";

const REMOTE_TASKS_SETTLE: &str = "UPDATE remote_tasks SET \
         status = 'cancelled', claim = NULL, claimed_by = NULL, claim_expires_at = NULL, \
         settled_at = ?4, updated_at = ?4 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 \
       AND status IN ('pending', 'running')";

const AWAKEABLES_SETTLE: &str = "UPDATE awakeables SET status = 'cancelled', settled_at = ?4 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND status = 'pending'";

/// keiro_instance_settle_leftovers: cancels the live remote tasks and pending awakeables of a
/// completed run's generation (the losing branch of a race, an awakeable never awaited), which
/// nothing would ever read. Does nothing unless the instance is completed. Returns how many it
/// settled.
pub(crate) fn instance_settle_leftovers(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    generation: Generation,
) -> Result<u64> {
    let completed: bool = conn
        .query_row(INSTANCE_COMPLETED, params![name, id], |r| r.get(0))
        .map_err(|e| store(SETTLE, e))?;
    if !completed {
        return Ok(0);
    }
    let at = micros(now);
    let tasks = conn
        .execute(REMOTE_TASKS_SETTLE, params![name, id, generation, at])
        .map_err(|e| store(SETTLE, e))?;
    let awakeables = conn
        .execute(AWAKEABLES_SETTLE, params![name, id, generation, at])
        .map_err(|e| store(SETTLE, e))?;
    Ok(u64::try_from(tasks + awakeables).unwrap_or(u64::MAX))
}

const INSTANCE_LIVE_CHILDREN: &str = "SELECT workflow_name, workflow_id FROM workflows \
     WHERE parent_name = ?1 AND parent_id = ?2 AND status IN ('running', 'suspended') \
     ORDER BY workflow_name DESC, workflow_id DESC";

/// The cancel marker of one instance, appended to its current generation, unfenced.
fn cancel_one(conn: &Connection, now: OffsetDateTime, name: &str, id: &str) -> Result<AppendCode> {
    journal_append_to(
        conn,
        now,
        AppendTo {
            name,
            id,
            generation: None,
            step: keiro_journal::marker_name::CANCELLED,
            kind: "cancelled",
            payload: &Value::Null,
            owner: None,
            epoch: None,
            renew_ms: None,
        },
    )
}

/// keiro_instance_cancel_tree: cancels one instance and, when `cascade`, its live
/// descendants, depth first with children in key order, from a worklist. Each cancel marker
/// goes through the append rules, which cancel the instance's remote tasks; each cancelled
/// child's own delivery to its (now cancelled) parent is refused and ignored. A cancelled
/// instance is terminal, so a cycle of parent links ends where it comes back. Returns the
/// append's outcome for the instance itself.
pub(crate) fn instance_cancel_tree(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    cascade: bool,
) -> Result<AppendCode> {
    let outcome = cancel_one(conn, now, name, id)?;
    if !matches!(outcome, AppendCode::Appended(_)) || !cascade {
        return Ok(outcome);
    }
    let mut todo: Vec<(String, String)> = Vec::new();
    let (mut name, mut id) = (name.to_owned(), id.to_owned());
    loop {
        // `name`/`id` was just cancelled. Its live children go on the worklist last key
        // first, so they come off it in key order.
        let children: Vec<(String, String)> = conn
            .prepare_cached(INSTANCE_LIVE_CHILDREN)
            .and_then(|mut s| {
                s.query_map(params![name, id], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect()
            })
            .map_err(|e| store(CANCEL, e))?;
        todo.extend(children);
        loop {
            let Some((next_name, next_id)) = todo.pop() else {
                return Ok(outcome);
            };
            (name, id) = (next_name, next_id);
            if matches!(cancel_one(conn, now, &name, &id)?, AppendCode::Appended(_)) {
                break;
            }
        }
    }
}

/// keiro_instance_cancel: appends the cancel marker to the instance's current generation and,
/// when `cascade`, cancels every live descendant, all in this transaction. PostgreSQL locks the
/// tree's tasks and rows first, deepest first; the writer holds the file's lock instead.
pub(crate) fn instance_cancel(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    cascade: bool,
) -> Result<AppendCode> {
    instance_cancel_tree(conn, now, name, id, cascade)
}
