//! Rules of crates/migrations/functions/instance.sql: start, confirm, park, the divergence failure, the
//! leftovers of a completed run, cancel, requeue, fix-and-replay.
//!
//! Not here: `keiro_instances_start` (the writer runs each start of a batch as its own
//! operation in one shared transaction); `keiro_instance_hold` (transaction steps need
//! PostgreSQL: `Unsupported` on SQLite).

use crate::cached::Cached;
use keiro_journal::store::Result;
use keiro_journal::Generation;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use time::OffsetDateTime;

use crate::child;
use crate::error::{malformed, store};
use crate::journal::{
    journal_append_step, journal_append_to, journal_repeatable_name, step_logical, step_revision,
    AppendCode, AppendTo,
};
use crate::notify;
use crate::queue;
use crate::row::{self, micros, Stored};

const START: &str = "starting an instance";
const CONFIRM: &str = "confirming a lease";
const PARK: &str = "parking an instance";
const FAIL_DIVERGED: &str = "failing a diverged run";
const SETTLE: &str = "settling a completed run's leftovers";
const CANCEL: &str = "cancelling an instance";
const REQUEUE: &str = "requeueing an instance";
const RETRY: &str = "starting a fix of an instance";

const INSTANCE_INSERT: &str = "INSERT INTO workflows \
         (workflow_name, workflow_id, input, parent_name, parent_id, priority, created_at, updated_at, \
          app_version) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, keiro_app_version()) \
     ON CONFLICT (workflow_name, workflow_id) DO NOTHING";

/// keiro_instance_start: creates the row `running`, or returns the existing one untouched.
/// Returns whether it was created, and the row. A created row notifies its wake.
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
        .execute_cached(
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
    if created {
        notify::wake(conn, START, name, id)?;
    }
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
    conn.execute_cached(
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
         attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL, \
         parked_on = CASE WHEN ?3 = generation THEN ?4 ELSE parked_on END, \
         updated_at = ?5 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// `?6`: the park gives the run's queue slot back (queue.sql's park trigger, `queue_park`).
const INSTANCE_PARK_SUSPEND: &str = "UPDATE workflows SET status = 'suspended', wake_after = ?3, \
         lease_owner = NULL, lease_expires_at = NULL, \
         attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL, \
         parked_on = ?4, updated_at = ?5, \
         queue_admitted = CASE WHEN ?6 THEN 0 ELSE queue_admitted END \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// keiro_instance_park: parks a run waiting on `awaited`, releasing its lease and clearing its
/// crash history (it made progress). The awaited steps are checked inside the writer's
/// transaction, which every append also runs in, so a wake that landed before the park keeps
/// the row `running` instead of being masked by `suspended`. A park on the current generation
/// records the deliveries it waits on (`parked_on`). A woken park notifies its wake. A run
/// that suspends while holding a slot of a queue that releases slots on park gives it back
/// ([`queue::queue_park`]).
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
            .query_row_cached(
                JOURNAL_HAS_ANY,
                params![name, id, generation, awaited_json],
                |r| r.get::<_, bool>(0),
            )
            .map_err(|e| store(PARK, e))?;
    let at = micros(now);
    if landed {
        conn.execute_cached(
            INSTANCE_PARK_WOKEN,
            params![name, id, generation, parked_on, at],
        )
        .map_err(|e| store(PARK, e))?;
        notify::wake(conn, PARK, name, id)?;
        Ok(ParkCode::Woken)
    } else {
        // queue.sql's BEFORE trigger on this update, asked first: SQLite's cannot change it.
        let release = queue::queue_park(conn, &row)?;
        conn.execute_cached(
            INSTANCE_PARK_SUSPEND,
            params![name, id, wake_after.map(micros), parked_on, at, release],
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
    conn.execute_cached(
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
        .query_row_cached(INSTANCE_COMPLETED, params![name, id], |r| r.get(0))
        .map_err(|e| store(SETTLE, e))?;
    if !completed {
        return Ok(0);
    }
    let at = micros(now);
    let tasks = conn
        .execute_cached(REMOTE_TASKS_SETTLE, params![name, id, generation, at])
        .map_err(|e| store(SETTLE, e))?;
    let awakeables = conn
        .execute_cached(AWAKEABLES_SETTLE, params![name, id, generation, at])
        .map_err(|e| store(SETTLE, e))?;
    Ok(u64::try_from(tasks + awakeables).unwrap_or(u64::MAX))
}

const INSTANCE_LIVE_CHILDREN: &str = "SELECT workflow_name, workflow_id FROM workflows \
     WHERE parent_name = ?1 AND parent_id = ?2 AND status IN ('running', 'suspended') \
     ORDER BY workflow_name DESC, workflow_id DESC";

/// What cancelling an instance (and its tree) answers: the append's outcome for the instance
/// itself, and each cancelled generation whose remote tasks are left for the caller to cancel
/// (`remote_tasks_cancel`, in remote.rs, which parks through this module), in cancel order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cancelled {
    /// The append's outcome for the instance the cancel was asked for.
    pub(crate) code: AppendCode,
    /// `(name, id, generation)` of every instance the cancel closed.
    pub(crate) tasks: Vec<(String, String, Generation)>,
}

/// The cancel marker of one instance, appended to its current generation, unfenced, and the
/// delivery to its parent the marker asks for ([`Closing`](crate::journal::Closing)); the generation whose remote
/// tasks are left to cancel goes on `tasks`.
fn cancel_one(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    tasks: &mut Vec<(String, String, Generation)>,
) -> Result<AppendCode> {
    let (code, closing) = journal_append_to(
        conn,
        now,
        AppendTo {
            name,
            id,
            generation: None,
            step: keiro_journal::store::marker_name::CANCELLED,
            kind: "cancelled",
            payload: &Value::Null,
            owner: None,
            epoch: None,
            renew_ms: None,
        },
    )?;
    if let Some(generation) = closing.cancel_tasks {
        tasks.push((name.to_owned(), id.to_owned(), generation));
    }
    if closing.deliver {
        child::child_deliver(conn, now, name, id)?;
    }
    Ok(code)
}

/// keiro_instance_cancel_tree: cancels one instance and, when `cascade`, its live
/// descendants, depth first with children in key order, from a worklist. Each cancel marker
/// goes through the append rules; each cancelled instance delivers to its parent at once (a
/// cancelled child's delivery to its now cancelled parent is refused and ignored), and its
/// generation's remote tasks are left to the caller ([`Cancelled`]): nothing here reads them,
/// so cancelling them after the walk, in the same transaction, leaves what the plpgsql walk
/// leaves. A cancelled instance is terminal, so a cycle of parent links ends where it comes
/// back.
pub(crate) fn instance_cancel_tree(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    cascade: bool,
) -> Result<Cancelled> {
    let mut tasks = Vec::new();
    let outcome = cancel_one(conn, now, name, id, &mut tasks)?;
    if !matches!(outcome, AppendCode::Appended(_)) || !cascade {
        return Ok(Cancelled {
            code: outcome,
            tasks,
        });
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
                return Ok(Cancelled {
                    code: outcome,
                    tasks,
                });
            };
            (name, id) = (next_name, next_id);
            if matches!(
                cancel_one(conn, now, &name, &id, &mut tasks)?,
                AppendCode::Appended(_)
            ) {
                break;
            }
        }
    }
}

/// keiro_instance_cancel: appends the cancel marker to the instance's current generation and,
/// when `cascade`, cancels every live descendant, all in this transaction; the caller cancels
/// the remote tasks the answer lists ([`Cancelled`]). PostgreSQL locks the tree's tasks and
/// rows first, deepest first; the writer holds the file's lock instead.
pub(crate) fn instance_cancel(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    cascade: bool,
) -> Result<Cancelled> {
    instance_cancel_tree(conn, now, name, id, cascade)
}

/// keiro_journal_written_by_body: whether the body itself wrote a journal row, as opposed to a
/// wake source delivering it (`keiro_journal::replay::recorded_by_body`, less the remote
/// results that arrive from outside).
pub(crate) fn journal_written_by_body(step: &str, kind: &str) -> bool {
    matches!(kind, "step" | "patch" | "race" | "attempt")
        || (kind == "child" && !step_logical(step).ends_with(":result"))
        || (kind == "awakeable" && step.starts_with("awkid:"))
}

/// keiro_failure_mention: how a run's failure reason names the failed remote step or child
/// stored as `step`.
pub(crate) fn failure_mention(step: &str) -> String {
    let logical = step_logical(step);
    if let Some(remote) = logical.strip_prefix("remote:") {
        return format!("remote step \"{remote}\" failed");
    }
    // substr(logical, 7, length(logical) - 6 - length(':result')), in characters.
    let len = logical.chars().count();
    let pair: String = logical
        .chars()
        .skip(6)
        .take(len.saturating_sub(6 + ":result".len()))
        .collect();
    format!("child workflow {pair} failed")
}

/// jsonb's `?`: an object's key, an array's string element, or the string itself.
fn has_key(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(fields) => fields.contains_key(key),
        Value::Array(items) => items.iter().any(|i| i.as_str() == Some(key)),
        Value::String(text) => text == key,
        _ => false,
    }
}

/// What [`instance_requeue_one`] leaves for the requeue: the steps it reset, and the failed
/// children to requeue next, in the order its records name them.
#[derive(Debug, Default)]
pub(crate) struct RequeuedOne {
    pub(crate) reset_steps: u64,
    pub(crate) children: Vec<(String, String)>,
}

const JOURNAL_OF_GENERATION: &str = "SELECT seq, step_name, kind, payload FROM journal \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 ORDER BY seq";

const JOURNAL_INSERT_DIRECT: &str = "INSERT INTO journal \
         (workflow_name, workflow_id, generation, step_name, kind, payload, recorded_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

const REMOTE_TASK_RESET: &str = "UPDATE remote_tasks SET \
         status = 'pending', attempts = 0, dispatches = 1, available_at = ?5, \
         deadline_at = CASE WHEN redispatch_after_ms IS NULL THEN NULL \
                            ELSE ?5 + redispatch_after_ms * 1000 END, \
         claim = NULL, claimed_by = NULL, claim_expires_at = NULL, \
         last_error = NULL, output = NULL, settled_at = NULL, \
         journal_step = ?6, updated_at = ?5 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND journal_step = ?4";

const CHILD_COMPLETED_OUTPUT: &str = "SELECT output FROM workflows \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND status = 'completed'";

const FIX_COMPLETED_OUTPUT: &str = "SELECT output FROM workflows \
     WHERE workflow_name = ?1 \
       AND workflow_id >= ?2 || '~retry~' AND workflow_id < ?2 || '~retry' || char(127) \
       AND substr(workflow_id, 1, length(?2 || '~retry~')) = ?2 || '~retry~' \
       AND status = 'completed' \
       AND parent_name = ?3 AND parent_id = ?4 AND parent_generation = ?5 \
     ORDER BY completed_at, workflow_id LIMIT 1";

const CHILDREN_RELINK: &str = "UPDATE workflows SET parent_step = ?5, updated_at = ?6 \
     WHERE parent_name = ?1 AND parent_id = ?2 AND parent_generation = ?3 AND parent_step = ?4";

const INSTANCE_REQUEUED: &str = "UPDATE workflows SET status = 'running', \
         attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL, \
         wake_after = NULL, \
         lease_owner = NULL, lease_expires_at = NULL, completed_at = NULL, updated_at = ?3, \
         queue_free = 0 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// keiro_instance_requeue_one: the requeue of one failed instance. It supersedes each current
/// failed remote result and awaited child failure of its current generation that the run did
/// not handle with a `reset` row, resets their tasks, relinks the children, appends
/// `resurrected` and flips the row to `running`; a child success found meanwhile is journaled
/// under the next revision once the row runs. A failure counts as handled when the body itself
/// wrote a journal row after it and the run's last failure reason does not name it. The
/// instance and its failed children to requeue next are added to `visited`, the cycle guard.
/// Notifies the instance's wake, and `remote` when a remote task was reset (so claimable).
pub(crate) fn instance_requeue_one(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    visited: &mut Vec<String>,
) -> Result<RequeuedOne> {
    let mut done = RequeuedOne::default();
    let row = row::instance_row(conn, name, id, REQUEUE)?
        .ok_or_else(|| malformed(REQUEUE, "the requeued row is missing"))?;
    let generation = row.generation;
    visited.push(format!("{name}/{id}"));
    let at = micros(now);

    // The loop's rows are read once, before the first reset row is inserted.
    let rows: Vec<(i64, String, String, String)> = conn
        .prepare_cached(JOURNAL_OF_GENERATION)
        .and_then(|mut s| {
            s.query_map(params![name, id, generation], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect()
        })
        .map_err(|e| store(REQUEUE, e))?;
    let rows = rows
        .into_iter()
        .map(|(seq, step, kind, payload)| Ok((seq, step, kind, row::value(&payload, REQUEUE)?)))
        .collect::<Result<Vec<_>>>()?;
    // The reason the run failed with last: it names the failure the body did not handle.
    let reason = rows
        .iter()
        .rev()
        .find(|(_, _, kind, _)| kind == "failed")
        .and_then(|(_, _, _, payload)| crate::journal::json_text(payload))
        .unwrap_or_default();
    let records: Vec<(String, String)> = rows
        .iter()
        .filter(|(seq, step, kind, payload)| {
            let failure = (kind == "remote" && has_key(payload, "error"))
                || (kind == "child"
                    && has_key(payload, "failed")
                    && step_logical(step).starts_with("child:")
                    && step_logical(step).ends_with(":result"));
            let reset = format!("__workflow_step_reset__:{step}");
            let superseded = rows.iter().any(|(_, s, _, _)| *s == reset);
            let went_on = rows
                .iter()
                .any(|(later, s, k, _)| later > seq && journal_written_by_body(s, k));
            let handled = went_on && !reason.contains(&failure_mention(step));
            failure && !superseded && !handled
        })
        .map(|(_, step, kind, _)| (step.clone(), kind.clone()))
        .collect();

    let mut deliveries: Vec<(String, Value)> = Vec::new();
    let mut notify_remote = false;
    for (step, kind) in records {
        let logical = step_logical(&step).to_owned();
        let next = format!("{logical}#{}", i64::from(step_revision(&step)) + 1);
        // The instance is failed, so the append rules would refuse the row: it is written
        // directly.
        let reset = serde_json::json!({ "step": logical, "superseded": step });
        conn.execute_cached(
            JOURNAL_INSERT_DIRECT,
            params![
                name,
                id,
                generation,
                format!("__workflow_step_reset__:{step}"),
                "reset",
                row::json(&reset),
                at
            ],
        )
        .map_err(|e| store(REQUEUE, e))?;
        done.reset_steps += 1;

        if kind == "remote" {
            notify_remote |= conn
                .execute_cached(
                    REMOTE_TASK_RESET,
                    params![name, id, generation, step, at, next],
                )
                .map_err(|e| store(REQUEUE, e))?
                > 0;
            continue;
        }

        // `child:<name>/<id>:result`; names and ids contain neither `/` nor `:`.
        let pair = logical
            .strip_prefix("child:")
            .and_then(|p| p.strip_suffix(":result"))
            .unwrap_or_default();
        let (child_name, child_id) = pair.split_once('/').unwrap_or((pair, ""));

        // A success is already there: the child itself completed, or a fix of it did.
        let mut output: Option<Option<String>> = conn
            .query_row_cached(CHILD_COMPLETED_OUTPUT, params![child_name, child_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|e| store(REQUEUE, e))?;
        if output.is_none() {
            output = conn
                .query_row_cached(
                    FIX_COMPLETED_OUTPUT,
                    params![child_name, child_id, name, id, generation],
                    |r| r.get(0),
                )
                .optional()
                .map_err(|e| store(REQUEUE, e))?;
        }
        if let Some(output) = output {
            let value = output
                .as_deref()
                .map(|o| row::value(o, REQUEUE))
                .transpose()?
                .unwrap_or(Value::Null);
            deliveries.push((next, value));
            continue;
        }

        // No success yet: the child and its fixes now deliver to the next revision.
        conn.execute_cached(
            CHILDREN_RELINK,
            params![name, id, generation, step, next, at],
        )
        .map_err(|e| store(REQUEUE, e))?;
        let child = row::instance_row(conn, child_name, child_id, REQUEUE)?;
        let key = format!("{child_name}/{child_id}");
        if child.is_some_and(|c| c.status == "failed") && !visited.contains(&key) {
            done.children
                .push((child_name.to_owned(), child_id.to_owned()));
            visited.push(key);
        }
    }

    // As `keiro_instance_resurrect`: the failure stays in history.
    let resurrected = journal_repeatable_name(
        conn,
        name,
        id,
        generation,
        "resurrected",
        keiro_journal::store::marker_name::RESURRECTED,
    )?;
    conn.execute_cached(
        JOURNAL_INSERT_DIRECT,
        params![name, id, generation, resurrected, "resurrected", "null", at],
    )
    .map_err(|e| store(REQUEUE, e))?;
    conn.execute_cached(INSTANCE_REQUEUED, params![name, id, at])
        .map_err(|e| store(REQUEUE, e))?;
    notify::wake(conn, REQUEUE, name, id)?;

    // The buffered successes, through the append rules now that the row is running.
    for (step, value) in deliveries {
        journal_append_step(
            conn,
            now,
            AppendTo {
                name,
                id,
                generation: Some(generation),
                step: &step,
                kind: "child",
                payload: &serde_json::json!({ "ok": value }),
                owner: None,
                epoch: None,
                renew_ms: None,
            },
        )?;
    }
    if notify_remote {
        notify::remote(conn, REQUEUE)?;
    }
    Ok(done)
}

/// `keiro_instance_requeue`'s outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RequeueCode {
    /// The steps reset, and the children requeued, each before its own.
    Requeued(u64, Vec<(String, String)>),
    /// With the row's status.
    NotFailed(String),
    NotFound,
}

/// keiro_instance_requeue: the operator's retry of a failed instance and of its failed
/// children ([`instance_requeue_one`] for each, from a worklist, depth first, each instance's
/// children in the order its records name them), in one transaction. PostgreSQL first locks
/// the failed tasks and the linked tree deepest first, then re-reads the row; the writer holds
/// the file's lock instead, so the row read here is final.
pub(crate) fn instance_requeue(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
) -> Result<RequeueCode> {
    let Some(row) = row::instance_row(conn, name, id, REQUEUE)? else {
        return Ok(RequeueCode::NotFound);
    };
    if row.status != "failed" {
        return Ok(RequeueCode::NotFailed(row.status));
    }
    let mut reset_steps = 0;
    let mut children = Vec::new();
    let mut visited = Vec::new();
    let mut todo: Vec<(String, String)> = Vec::new();
    let (mut next_name, mut next_id) = (name.to_owned(), id.to_owned());
    loop {
        let one = instance_requeue_one(conn, now, &next_name, &next_id, &mut visited)?;
        reset_steps += one.reset_steps;
        todo.extend(one.children.into_iter().rev());
        let Some((name, id)) = todo.pop() else {
            break;
        };
        children.push((name.clone(), id.clone()));
        (next_name, next_id) = (name, id);
    }
    Ok(RequeueCode::Requeued(reset_steps, children))
}

/// `keiro_instance_retry_with_input`'s outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryCode {
    Started,
    Exists,
    OriginNotFound,
}

const RETRY_INSERT: &str = "INSERT INTO workflows \
         (workflow_name, workflow_id, input, parent_name, parent_id, parent_generation, \
          parent_step, priority, created_at, updated_at, app_version) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, keiro_app_version()) \
     ON CONFLICT (workflow_name, workflow_id) DO NOTHING";

/// keiro_instance_retry_with_input: fix-and-replay. Creates `retry` `running` with `input`,
/// the origin's priority and the origin's parent link, so its success also lands where a
/// parent awaits the origin (and `child_deliver` delivers only that success). A created row
/// notifies its wake.
pub(crate) fn instance_retry_with_input(
    conn: &Connection,
    now: OffsetDateTime,
    origin: (&str, &str),
    retry: (&str, &str),
    input: &Value,
) -> Result<RetryCode> {
    let Some(origin) = row::instance_row(conn, origin.0, origin.1, RETRY)? else {
        return Ok(RetryCode::OriginNotFound);
    };
    let created = conn
        .execute_cached(
            RETRY_INSERT,
            params![
                retry.0,
                retry.1,
                row::json(input),
                origin.parent_name,
                origin.parent_id,
                origin.parent_generation,
                origin.parent_step,
                origin.priority,
                micros(now)
            ],
        )
        .map_err(|e| store(RETRY, e))?;
    if created == 1 {
        notify::wake(conn, RETRY, retry.0, retry.1)?;
    }
    Ok(if created == 1 {
        RetryCode::Started
    } else {
        RetryCode::Exists
    })
}
