//! Rules of crates/migrations/functions/remote.sql: so far what a run needs to dispatch remote steps and park
//! (`keiro_remote_error_envelope`, `keiro_remote_deliver`, `keiro_remote_arm`,
//! `keiro_remote_claims_expire` for an arm whose deadline passed, `keiro_instance_park_dispatch`
//! with its `_locked` half), the operator's `keiro_remote_redispatch_pending`, and the
//! cancellation of a closed generation's live tasks, which the `cancelled` and `continued`
//! markers need.
//!
//! The worker side is in `claim.rs` (`keiro_remote_tasks_claim`, with its part for tasks on a
//! queue) and `worker.rs` (`keiro_remote_task_heartbeat`, `keiro_remote_task_complete`,
//! `keiro_remote_tasks_complete`, `keiro_remote_task_fail`, in the file's order), so no file
//! passes 800 lines.
//!
//! Not here: the batched `keiro_instances_park_dispatch`
//! (the writer runs each park of a batch as its own operation in one shared transaction). No
//! `synchronous_commit = off` either: every commit of this store is durable.
//!
//! Where PostgreSQL locks tasks before their owner (`FOR UPDATE`, `FOR KEY SHARE`), SQLite
//! needs nothing: the writer holds the file's write lock for the whole transaction.

use crate::cached::Cached;
use keiro_journal::store::Result;
use keiro_journal::Generation;
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::error::store;
use crate::instance::{self, ParkCode};
use crate::journal::{journal_append_step, AppendCode, AppendTo};
use crate::notify;
use crate::row::{self, micros};

mod claim;
mod worker;

pub(crate) use claim::{remote_tasks_claim, Claimed};
pub(crate) use worker::{
    remote_task_complete, remote_task_fail, remote_task_heartbeat, remote_tasks_complete,
    HeartbeatCode, ReportCode,
};

const ARM: &str = "arming a remote step";
const EXPIRE: &str = "counting expired claims";
const CANCEL: &str = "cancelling remote tasks";
const REDISPATCH: &str = "redispatching pending remote tasks";

/// The columns of a task row the rules here read.
#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub(crate) step_id: String,
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) generation: Generation,
    pub(crate) journal_step: String,
    pub(crate) status: String,
    pub(crate) attempts: i32,
    pub(crate) max_attempts: i32,
    pub(crate) dispatches: i32,
    pub(crate) redispatch_max: i32,
    pub(crate) redispatch_after_ms: Option<i64>,
    pub(crate) deadline_at: Option<i64>,
    pub(crate) claim: Option<String>,
    pub(crate) claimed_by: Option<String>,
    pub(crate) claim_expires_at: Option<i64>,
    pub(crate) output: Option<String>,
    pub(crate) last_error: Option<String>,
}

const TASK_COLUMNS: &str = "step_id, workflow_name, workflow_id, generation, journal_step, \
     status, attempts, max_attempts, dispatches, redispatch_max, redispatch_after_ms, \
     deadline_at, claimed_by, claim_expires_at, output, last_error, claim";

impl Task {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            step_id: r.get(0)?,
            name: r.get(1)?,
            id: r.get(2)?,
            generation: r.get(3)?,
            journal_step: r.get(4)?,
            status: r.get(5)?,
            attempts: r.get(6)?,
            max_attempts: r.get(7)?,
            dispatches: r.get(8)?,
            redispatch_max: r.get(9)?,
            redispatch_after_ms: r.get(10)?,
            deadline_at: r.get(11)?,
            claimed_by: r.get(12)?,
            claim_expires_at: r.get(13)?,
            output: r.get(14)?,
            last_error: r.get(15)?,
            claim: r.get(16)?,
        })
    }
}

/// The task `step_id`, if any.
pub(crate) fn task(
    conn: &Connection,
    step_id: &str,
    operation: &'static str,
) -> Result<Option<Task>> {
    conn.prepare_cached(&format!(
        "SELECT {TASK_COLUMNS} FROM remote_tasks WHERE step_id = ?1"
    ))
    .and_then(|mut s| s.query_row([step_id], Task::from_row).optional())
    .map_err(|e| store(operation, e))
}

/// keiro_remote_error_envelope: the envelope a failed task's result is journaled as, its last
/// error with its attempts.
pub(crate) fn remote_error_envelope(task: &Task, operation: &'static str) -> Result<Value> {
    let mut error = match task.last_error.as_deref() {
        Some(stored) => row::value(stored, operation)?,
        None => json!({}),
    };
    match &mut error {
        Value::Object(fields) => {
            fields.insert("attempts".to_owned(), json!(task.attempts));
        }
        // jsonb's `||` of a non-object and an object makes an array of both.
        other => *other = json!([other.clone(), { "attempts": task.attempts }]),
    }
    Ok(json!({ "error": error }))
}

/// `keiro_remote_deliver`'s outcomes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DeliverCode {
    /// Appended, or the same step was already recorded: the journaled envelope.
    Delivered(Value),
    /// Terminal, another generation, deleted.
    OwnerGone,
}

/// keiro_remote_deliver: journals a settled task's result envelope into its owner's generation
/// under the task's journal step (unfenced, through the append rules).
pub(crate) fn remote_deliver(
    conn: &Connection,
    now: OffsetDateTime,
    task: &Task,
    envelope: &Value,
) -> Result<DeliverCode> {
    let code = journal_append_step(
        conn,
        now,
        AppendTo {
            name: &task.name,
            id: &task.id,
            generation: Some(task.generation),
            step: &task.journal_step,
            kind: "remote",
            payload: envelope,
            owner: None,
            epoch: None,
            renew_ms: None,
        },
    )?;
    Ok(match code {
        AppendCode::Appended(_) => DeliverCode::Delivered(envelope.clone()),
        AppendCode::AlreadyPresent(recorded) => DeliverCode::Delivered(recorded),
        _ => DeliverCode::OwnerGone,
    })
}

/// One arm's arguments, as `keiro_remote_arm`'s parameters (spans in milliseconds).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arm<'a> {
    pub(crate) step_id: &'a str,
    pub(crate) name: &'a str,
    pub(crate) id: &'a str,
    pub(crate) generation: Generation,
    pub(crate) step: &'a str,
    pub(crate) journal_step: &'a str,
    pub(crate) group: &'a str,
    pub(crate) input: &'a Value,
    pub(crate) priority: i32,
    pub(crate) traceparent: Option<&'a str>,
    pub(crate) max_attempts: i32,
    pub(crate) backoff_initial_ms: i64,
    pub(crate) backoff_max_ms: i64,
    pub(crate) backoff_jitter: bool,
    pub(crate) redispatch_after_ms: Option<i64>,
    pub(crate) redispatch_max: i32,
    pub(crate) owner: Option<&'a str>,
    pub(crate) epoch: Option<i64>,
    pub(crate) queue: Option<&'a str>,
    pub(crate) queue_key: Option<&'a str>,
}

/// `keiro_remote_arm`'s outcomes; deadlines in stored microseconds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ArmCode {
    Dispatched(Option<i64>),
    Waiting(Option<i64>),
    Redispatched(Option<i64>),
    /// The journaled envelope.
    Settled(Value),
    /// Declared lost by this arm; the journaled envelope.
    Lost(Value),
    NotFound,
    LeaseLost,
    /// The arm names an undeclared queue: nothing is written.
    UnknownQueue(String),
}

const TASK_INSERT: &str = "INSERT INTO remote_tasks \
         (step_id, workflow_name, workflow_id, generation, step, journal_step, grp, input, \
          priority, traceparent, max_attempts, backoff_initial_ms, backoff_max_ms, \
          backoff_jitter, redispatch_after_ms, redispatch_max, deadline_at, available_at, \
          created_at, updated_at, queue, queue_key) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, max(?11, 1), ?12, ?13, ?14, ?15, \
             max(?16, 1), ?17, ?18, ?18, ?18, ?19, ?20)";

const QUEUE_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM keiro_queues WHERE name = ?1)";

const TASK_REDISPATCH: &str = "UPDATE remote_tasks SET \
         status = 'pending', claim = NULL, claimed_by = NULL, claim_expires_at = NULL, \
         available_at = ?2, dispatches = dispatches + 1, deadline_at = ?3, updated_at = ?2 \
     WHERE step_id = ?1";

const TASK_LOST: &str = "UPDATE remote_tasks SET \
         status = 'failed', settled_at = ?2, \
         claim = NULL, claimed_by = NULL, claim_expires_at = NULL, \
         last_error = ?3, updated_at = ?2 \
     WHERE step_id = ?1";

const JOURNAL_PAYLOAD: &str = "SELECT payload FROM journal \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step_name = ?4";

/// `at + ms`, in stored microseconds; `None` for no span.
fn after(at: i64, ms: Option<i64>) -> Option<i64> {
    ms.map(|ms| at.saturating_add(ms.saturating_mul(1000)))
}

/// keiro_remote_arm: writes the task of a remote step once, or learns its state: its result,
/// its redispatch (or loss) when its deadline passed, or that it still waits. A passed
/// deadline first counts an expired claim the task still holds (as the claimers' sweep does):
/// at the task's limit the step fails as crashed. A cancelled task is left as it is. A stale
/// fence or a missing owner writes nothing; an owner that is terminal or on another
/// generation gets `waiting` with no deadline (the park that follows sees it). A dispatch and
/// a redispatch notify `remote` (the task became claimable). A task on a queue records it and
/// its key; an undeclared queue writes nothing, whatever the task's state.
pub(crate) fn remote_arm(conn: &Connection, now: OffsetDateTime, arm: Arm<'_>) -> Result<ArmCode> {
    if let Some(queue) = arm.queue {
        let declared: bool = conn
            .query_row_cached(QUEUE_EXISTS, [queue], |r| r.get(0))
            .map_err(|e| store(ARM, e))?;
        if !declared {
            return Ok(ArmCode::UnknownQueue(queue.to_owned()));
        }
    }
    let existing = task(conn, arm.step_id, ARM)?;
    let Some(owner) = row::instance_row(conn, arm.name, arm.id, ARM)? else {
        return Ok(ArmCode::NotFound);
    };
    if let Some(expected) = arm.owner {
        if owner.lease_owner.as_deref() != Some(expected) || Some(owner.lease_epoch) != arm.epoch {
            return Ok(ArmCode::LeaseLost);
        }
    }
    if owner.is_terminal() || arm.generation != owner.generation {
        return Ok(ArmCode::Waiting(None));
    }
    let at = micros(now);

    let Some(existing) = existing else {
        let deadline = after(at, arm.redispatch_after_ms);
        conn.execute_cached(
            TASK_INSERT,
            params![
                arm.step_id,
                arm.name,
                arm.id,
                arm.generation,
                arm.step,
                arm.journal_step,
                arm.group,
                row::json(arm.input),
                arm.priority,
                arm.traceparent,
                arm.max_attempts,
                arm.backoff_initial_ms,
                arm.backoff_max_ms,
                arm.backoff_jitter,
                arm.redispatch_after_ms,
                arm.redispatch_max,
                deadline,
                at,
                arm.queue,
                arm.queue_key
            ],
        )
        .map_err(|e| store(ARM, e))?;
        notify::remote(conn, ARM)?;
        return Ok(ArmCode::Dispatched(deadline));
    };

    if existing.status == "cancelled" {
        // Only a cancelled owner or a generation left behind cancels a task, and both were
        // answered above; no result will ever come.
        return Ok(ArmCode::Waiting(None));
    }

    if matches!(existing.status.as_str(), "completed" | "failed") {
        let settled: Option<String> = conn
            .query_row_cached(
                JOURNAL_PAYLOAD,
                params![
                    existing.name,
                    existing.id,
                    existing.generation,
                    existing.journal_step
                ],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| store(ARM, e))?;
        if let Some(settled) = settled {
            return Ok(ArmCode::Settled(row::value(&settled, ARM)?));
        }
        // Settled while its owner was failed (an operator has requeued it since): the result
        // waited in the task and is journaled now.
        let envelope = if existing.status == "completed" {
            let output = existing
                .output
                .as_deref()
                .map(|o| row::value(o, ARM))
                .transpose()?
                .unwrap_or(Value::Null);
            json!({ "ok": output })
        } else {
            remote_error_envelope(&existing, ARM)?
        };
        return Ok(match remote_deliver(conn, now, &existing, &envelope)? {
            DeliverCode::Delivered(value) => ArmCode::Settled(value),
            DeliverCode::OwnerGone => ArmCode::Waiting(None),
        });
    }

    if existing.deadline_at.is_some_and(|d| d <= at) {
        if existing.status == "running" && existing.claim_expires_at.is_some_and(|e| e <= at) {
            // The redispatch below would drop this claim unseen by any sweep.
            for (_, code) in
                remote_claims_expire(conn, now, std::slice::from_ref(&existing.step_id))?
            {
                match code {
                    ExpireCode::Delivered(value) => return Ok(ArmCode::Settled(value)),
                    ExpireCode::OwnerGone => return Ok(ArmCode::Waiting(None)),
                    ExpireCode::Pending => {}
                }
            }
        }
        if existing.dispatches < existing.redispatch_max {
            let deadline = after(at, existing.redispatch_after_ms);
            conn.execute_cached(TASK_REDISPATCH, params![arm.step_id, at, deadline])
                .map_err(|e| store(ARM, e))?;
            notify::remote(conn, ARM)?;
            return Ok(ArmCode::Redispatched(deadline));
        }
        let error = json!({
            "message": format!("no result after {} dispatch(es)", existing.dispatches),
            "code": "remote_step_lost",
            "retryable": true,
        });
        conn.execute_cached(TASK_LOST, params![arm.step_id, at, row::json(&error)])
            .map_err(|e| store(ARM, e))?;
        let lost = task(conn, arm.step_id, ARM)?
            .ok_or_else(|| crate::error::malformed(ARM, "the lost task is missing"))?;
        let envelope = remote_error_envelope(&lost, ARM)?;
        return Ok(match remote_deliver(conn, now, &lost, &envelope)? {
            DeliverCode::Delivered(value) => ArmCode::Lost(value),
            DeliverCode::OwnerGone => ArmCode::Waiting(None),
        });
    }

    Ok(ArmCode::Waiting(existing.deadline_at))
}

/// `keiro_remote_claims_expire`'s outcome for one task counted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ExpireCode {
    /// Attempts left: pending again.
    Pending,
    /// Failed at its limit, its error envelope journaled.
    Delivered(Value),
    /// Failed at its limit, but its owner refused the envelope.
    OwnerGone,
}

const TASK_EXPIRE: &str = "UPDATE remote_tasks SET \
         status = CASE WHEN attempts + 1 >= max_attempts THEN 'failed' ELSE 'pending' END, \
         attempts = attempts + 1, last_error = ?3, \
         settled_at = CASE WHEN attempts + 1 >= max_attempts THEN ?2 END, \
         claim = NULL, claimed_by = NULL, claim_expires_at = NULL, updated_at = ?2 \
     WHERE step_id = ?1";

/// keiro_remote_claims_expire: counts the expired claims of the given tasks as failed
/// attempts: each becomes `pending` again with attempts left, or `failed` at its limit with
/// its error envelope journaled into its owner (in owner key order). A task whose claim is not
/// expired or that holds none is left alone. One outcome per task counted.
pub(crate) fn remote_claims_expire(
    conn: &Connection,
    now: OffsetDateTime,
    step_ids: &[String],
) -> Result<Vec<(String, ExpireCode)>> {
    let at = micros(now);
    let mut counted = Vec::new();
    for step_id in step_ids {
        let Some(task) = task(conn, step_id, EXPIRE)? else {
            continue;
        };
        if task.status != "running" || task.claim_expires_at.is_none_or(|e| e > at) {
            continue;
        }
        let error = json!({
            "message": format!(
                "the claim of {} expired without a report (attempt {} of {})",
                task.claimed_by.as_deref().unwrap_or_default(),
                task.attempts.saturating_add(1),
                task.max_attempts
            ),
            "code": "remote_step_crashed",
            "retryable": true,
        });
        conn.execute_cached(TASK_EXPIRE, params![step_id, at, row::json(&error)])
            .map_err(|e| store(EXPIRE, e))?;
        if let Some(task) = self::task(conn, step_id, EXPIRE)? {
            counted.push(task);
        }
    }
    counted.sort_by(|a, b| (&a.name, &a.id, &a.step_id).cmp(&(&b.name, &b.id, &b.step_id)));
    let mut outcomes = Vec::with_capacity(counted.len());
    for task in counted {
        let code = if task.status == "failed" {
            let envelope = remote_error_envelope(&task, EXPIRE)?;
            match remote_deliver(conn, now, &task, &envelope)? {
                DeliverCode::Delivered(value) => ExpireCode::Delivered(value),
                DeliverCode::OwnerGone => ExpireCode::OwnerGone,
            }
        } else {
            ExpireCode::Pending
        };
        outcomes.push((task.step_id, code));
    }
    Ok(outcomes)
}

const INSTANCE_GENERATION: &str =
    "SELECT generation FROM workflows WHERE workflow_name = ?1 AND workflow_id = ?2";

const TASKS_REDISPATCH: &str = "UPDATE remote_tasks SET \
         status = 'pending', claim = NULL, claimed_by = NULL, claim_expires_at = NULL, \
         available_at = ?4, dispatches = dispatches + 1, \
         deadline_at = CASE WHEN redispatch_after_ms IS NULL THEN NULL \
                            ELSE ?4 + redispatch_after_ms * 1000 END, \
         updated_at = ?4 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 \
       AND status IN ('pending', 'running')";

/// keiro_remote_redispatch_pending: dispatches every pending or claimed task of the
/// instance's current generation again (claim dropped, available now, dispatches + 1),
/// whatever its deadline and redispatch_max (an operator's decision); how many, or `None`
/// for a missing instance. Notifies `remote` when a task was redispatched.
pub(crate) fn remote_redispatch_pending(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
) -> Result<Option<u64>> {
    let generation: Option<Generation> = conn
        .query_row_cached(INSTANCE_GENERATION, params![name, id], |r| r.get(0))
        .optional()
        .map_err(|e| store(REDISPATCH, e))?;
    let Some(generation) = generation else {
        return Ok(None);
    };
    let redispatched = conn
        .execute_cached(TASKS_REDISPATCH, params![name, id, generation, micros(now)])
        .map_err(|e| store(REDISPATCH, e))?;
    if redispatched > 0 {
        notify::remote(conn, REDISPATCH)?;
    }
    Ok(Some(u64::try_from(redispatched).unwrap_or(u64::MAX)))
}

const REMOTE_TASKS_CANCEL: &str = "UPDATE remote_tasks SET \
         status = 'cancelled', claim = NULL, claimed_by = NULL, claim_expires_at = NULL, \
         settled_at = ?4, updated_at = ?4 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 \
       AND status IN ('pending', 'running')";

/// keiro_remote_tasks_cancel: cancels the pending and claimed tasks of one generation; how
/// many.
pub(crate) fn remote_tasks_cancel(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    generation: i32,
) -> Result<u64> {
    let cancelled = conn
        .execute_cached(
            REMOTE_TASKS_CANCEL,
            params![name, id, generation, micros(now)],
        )
        .map_err(|e| store(CANCEL, e))?;
    Ok(u64::try_from(cancelled).unwrap_or(u64::MAX))
}

/// `keiro_instance_park_dispatch`'s outcome: the park's, or the first arm's refusal, with the
/// outcome of every arm made before the park.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ParkDispatchCode {
    Parked(ParkCode, Vec<ArmCode>),
    /// An arm answered `not_found` or `lease_lost`; the operation stops there.
    Refused(ArmCode),
}

/// keiro_instance_park_dispatch: arms remote steps and parks the run, in this one
/// transaction. PostgreSQL locks the existing tasks first, in step id order; the writer holds
/// the file's lock instead, so this is its `_locked` half.
#[allow(clippy::too_many_arguments)] // keiro_instance_park_dispatch's parameters, grouped
pub(crate) fn instance_park_dispatch(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    generation: Generation,
    fence: Option<(&str, i64)>,
    awaited: &[String],
    wake_after: Option<OffsetDateTime>,
    arms: &[Arm<'_>],
) -> Result<ParkDispatchCode> {
    instance_park_dispatch_locked(
        conn, now, name, id, generation, fence, awaited, wake_after, arms,
    )
}

/// keiro_instance_park_dispatch_locked: each arm in order (a `not_found` or `lease_lost` ends
/// the call before the park), then the park, its wake time moved to the earliest deadline an
/// arm returned.
#[allow(clippy::too_many_arguments)] // keiro_instance_park_dispatch_locked's parameters
pub(crate) fn instance_park_dispatch_locked(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    generation: Generation,
    fence: Option<(&str, i64)>,
    awaited: &[String],
    wake_after: Option<OffsetDateTime>,
    arms: &[Arm<'_>],
) -> Result<ParkDispatchCode> {
    let mut wake = wake_after.map(micros);
    let mut outcomes = Vec::with_capacity(arms.len());
    for arm in arms {
        let code = remote_arm(conn, now, *arm)?;
        let deadline = match &code {
            // A refusal fails the operation, whose savepoint undoes the arms before it.
            ArmCode::NotFound | ArmCode::LeaseLost | ArmCode::UnknownQueue(_) => {
                return Ok(ParkDispatchCode::Refused(code))
            }
            ArmCode::Dispatched(d) | ArmCode::Waiting(d) | ArmCode::Redispatched(d) => *d,
            ArmCode::Settled(_) | ArmCode::Lost(_) => None,
        };
        // LEAST ignores NULLs: a park without a wake time gets the deadline.
        wake = match (wake, deadline) {
            (Some(w), Some(d)) => Some(w.min(d)),
            (w, d) => w.or(d),
        };
        outcomes.push(code);
    }
    let wake = wake.map(|w| row::instant(w, ARM)).transpose()?;
    let park = instance::instance_park(conn, now, name, id, generation, fence, awaited, wake)?;
    Ok(ParkDispatchCode::Parked(park, outcomes))
}
