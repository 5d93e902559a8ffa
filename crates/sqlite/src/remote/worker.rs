//! Rules of crates/migrations/functions/remote.sql, the worker side: heartbeat, reports (the
//! claim is in `claim.rs`; see the parent module for the rest of the file).

use crate::cached::Cached;
use keiro_journal::store::Result;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};
use time::OffsetDateTime;

use super::{remote_deliver, remote_error_envelope, task, DeliverCode, Task};
use crate::error::store;
use crate::row::{self, micros};

const HEARTBEAT: &str = "extending a remote task's claim";
const COMPLETE: &str = "completing a remote task";
const FAIL: &str = "failing a remote task";

/// keiro_remote_task_heartbeat's outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeartbeatCode {
    Extended,
    Cancelled,
    Lost,
}

const TASK_HEARTBEAT: &str = "UPDATE remote_tasks SET claim_expires_at = ?3, updated_at = ?4 \
     WHERE step_id = ?1 AND status = 'running' AND claim = ?2";

const TASK_STATUS: &str = "SELECT status FROM remote_tasks WHERE step_id = ?1";

/// keiro_remote_task_heartbeat: extends the claim `claim` of a running task to now +
/// `ttl_ms`; `cancelled` for a cancelled task whatever the claim, `lost` otherwise.
pub(crate) fn remote_task_heartbeat(
    conn: &Connection,
    now: OffsetDateTime,
    step_id: &str,
    claim: &str,
    ttl_ms: i64,
) -> Result<HeartbeatCode> {
    let at = micros(now);
    let extended = conn
        .execute_cached(
            TASK_HEARTBEAT,
            params![
                step_id,
                claim,
                at.saturating_add(ttl_ms.saturating_mul(1000)),
                at
            ],
        )
        .map_err(|e| store(HEARTBEAT, e))?;
    if extended > 0 {
        return Ok(HeartbeatCode::Extended);
    }
    let status: Option<String> = conn
        .query_row_cached(TASK_STATUS, params![step_id], |r| r.get(0))
        .optional()
        .map_err(|e| store(HEARTBEAT, e))?;
    Ok(if status.as_deref() == Some("cancelled") {
        HeartbeatCode::Cancelled
    } else {
        HeartbeatCode::Lost
    })
}

/// The outcomes of a report (`keiro_remote_task_complete`, `keiro_remote_task_fail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReportCode {
    Delivered,
    OwnerGone,
    /// Pending again at this instant (microseconds).
    Retrying(i64),
    AlreadySettled,
    Cancelled,
    Stale,
    NotFound,
}

impl From<DeliverCode> for ReportCode {
    fn from(code: DeliverCode) -> Self {
        match code {
            DeliverCode::Delivered(_) => Self::Delivered,
            DeliverCode::OwnerGone => Self::OwnerGone,
        }
    }
}

const TASK_COMPLETE: &str = "UPDATE remote_tasks SET \
         status = 'completed', output = ?2, settled_at = ?3, \
         claim = NULL, claimed_by = NULL, claim_expires_at = NULL, updated_at = ?3 \
     WHERE step_id = ?1";

/// keiro_remote_task_complete: settles the task `completed` with the handler's output,
/// whoever reports it (the first result wins), and journals `{"ok": output}` into the owner.
/// A cancelled task refuses the report (nothing journaled).
pub(crate) fn remote_task_complete(
    conn: &Connection,
    now: OffsetDateTime,
    step_id: &str,
    output: &Value,
) -> Result<ReportCode> {
    let Some(task) = task(conn, step_id, COMPLETE)? else {
        return Ok(ReportCode::NotFound);
    };
    match task.status.as_str() {
        "cancelled" => return Ok(ReportCode::Cancelled),
        "completed" | "failed" => return Ok(ReportCode::AlreadySettled),
        _ => {}
    }
    conn.execute_cached(
        TASK_COMPLETE,
        params![step_id, row::json(output), micros(now)],
    )
    .map_err(|e| store(COMPLETE, e))?;
    let task = self::task(conn, step_id, COMPLETE)?
        .ok_or_else(|| crate::error::malformed(COMPLETE, "the completed task is missing"))?;
    Ok(remote_deliver(conn, now, &task, &json!({ "ok": output }))?.into())
}

/// keiro_remote_tasks_complete: [`remote_task_complete`] for a batch of reports, in one
/// transaction: every unsettled task settles with its first report's output, then each
/// result is journaled in the order of its owner's key. One outcome per report, in the
/// caller's order; a repeated step id's later reports find it settled.
pub(crate) fn remote_tasks_complete(
    conn: &Connection,
    now: OffsetDateTime,
    reports: &[(String, Value)],
) -> Result<Vec<ReportCode>> {
    let at = micros(now);
    let mut settled: Vec<Task> = Vec::new();
    for (step_id, output) in reports {
        if settled.iter().any(|t| t.step_id == *step_id) {
            continue;
        }
        let Some(task) = task(conn, step_id, COMPLETE)? else {
            continue;
        };
        if !matches!(task.status.as_str(), "pending" | "running") {
            continue;
        }
        conn.execute_cached(TASK_COMPLETE, params![step_id, row::json(output), at])
            .map_err(|e| store(COMPLETE, e))?;
        if let Some(task) = self::task(conn, step_id, COMPLETE)? {
            settled.push(task);
        }
    }
    settled.sort_by(|a, b| (&a.name, &a.id, &a.step_id).cmp(&(&b.name, &b.id, &b.step_id)));
    let mut delivered: Vec<(String, Option<ReportCode>)> = Vec::with_capacity(settled.len());
    for task in &settled {
        let output = task
            .output
            .as_deref()
            .map(|o| row::value(o, COMPLETE))
            .transpose()?
            .unwrap_or(Value::Null);
        let code = remote_deliver(conn, now, task, &json!({ "ok": output }))?.into();
        delivered.push((task.step_id.clone(), Some(code)));
    }
    let mut outcomes = Vec::with_capacity(reports.len());
    for (step_id, _) in reports {
        let first = delivered
            .iter_mut()
            .find(|(settled, code)| settled == step_id && code.is_some())
            .and_then(|(_, code)| code.take());
        let code = match first {
            Some(code) => code,
            None => {
                let status: Option<String> = conn
                    .query_row_cached(TASK_STATUS, params![step_id], |r| r.get(0))
                    .optional()
                    .map_err(|e| store(COMPLETE, e))?;
                match status.as_deref() {
                    None => ReportCode::NotFound,
                    Some("cancelled") => ReportCode::Cancelled,
                    Some(_) => ReportCode::AlreadySettled,
                }
            }
        };
        outcomes.push(code);
    }
    Ok(outcomes)
}

const TASK_RETRY: &str = "UPDATE remote_tasks SET \
         status = 'pending', attempts = attempts + 1, last_error = ?2, \
         claim = NULL, claimed_by = NULL, claim_expires_at = NULL, \
         available_at = ?3, \
         deadline_at = CASE WHEN redispatch_after_ms IS NULL THEN NULL \
                            ELSE ?3 + redispatch_after_ms * 1000 END, \
         updated_at = ?4 \
     WHERE step_id = ?1";

const TASK_FAIL: &str = "UPDATE remote_tasks SET \
         status = 'failed', attempts = attempts + 1, last_error = ?2, settled_at = ?3, \
         claim = NULL, claimed_by = NULL, claim_expires_at = NULL, updated_at = ?3 \
     WHERE step_id = ?1";

/// keiro_remote_task_fail: counts a failed attempt of the current claim. With attempts left
/// and a retryable failure the task is pending again at `now + retry_delay_ms`; otherwise it
/// is failed and its error envelope is journaled into the owner. A report of an older claim
/// is stale; a cancelled task refuses the report, whatever its claim.
#[allow(clippy::too_many_arguments)] // keiro_remote_task_fail's parameters, in its order
pub(crate) fn remote_task_fail(
    conn: &Connection,
    now: OffsetDateTime,
    step_id: &str,
    claim: &str,
    message: &str,
    code: Option<&str>,
    retryable: bool,
    retry_delay_ms: i64,
) -> Result<ReportCode> {
    let error = json!({ "message": message, "code": code, "retryable": retryable });
    let Some(task) = task(conn, step_id, FAIL)? else {
        return Ok(ReportCode::NotFound);
    };
    match task.status.as_str() {
        "cancelled" => return Ok(ReportCode::Cancelled),
        "completed" | "failed" => return Ok(ReportCode::AlreadySettled),
        _ => {}
    }
    if task.status != "running" || task.claim.as_deref() != Some(claim) {
        return Ok(ReportCode::Stale);
    }
    let at = micros(now);
    if retryable && task.attempts.saturating_add(1) < task.max_attempts {
        let retry_at = at.saturating_add(retry_delay_ms.saturating_mul(1000));
        conn.execute_cached(
            TASK_RETRY,
            params![step_id, row::json(&error), retry_at, at],
        )
        .map_err(|e| store(FAIL, e))?;
        return Ok(ReportCode::Retrying(retry_at));
    }
    conn.execute_cached(TASK_FAIL, params![step_id, row::json(&error), at])
        .map_err(|e| store(FAIL, e))?;
    let task = self::task(conn, step_id, FAIL)?
        .ok_or_else(|| crate::error::malformed(FAIL, "the failed task is missing"))?;
    let envelope = remote_error_envelope(&task, FAIL)?;
    Ok(remote_deliver(conn, now, &task, &envelope)?.into())
}
