//! Rules of crates/migrations/functions/update.sql: updates, a caller's request into a running
//! run that the run answers once (migration 0006 holds their table and the trigger that settles
//! a finished run's unanswered updates).
//!
//! The send writes the update and sends it on the instance's token for the update name through
//! the signal rules (`signal::signal_send`: to the waiting run, else buffered), in the writer's
//! transaction; the answer is the run's fenced journal step, and only when it was appended the
//! row's answer, announced as `msg:<name>/<id>` (the notification the message readers hear).
//! `keiro_signal_lock` has no twin here (signal.rs says why): the writer is alone in its
//! transaction.

use crate::cached::Cached;
use keiro_journal::store::Result;
use keiro_journal::update::{update_state, UpdateRead, UpdateRecord, UpdateState};
use keiro_journal::Status;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::error::{malformed, store};
use crate::journal::{journal_append_step, AppendCode, AppendTo};
use crate::row::{self, micros};
use crate::{instance, notify, signal};

const SEND: &str = "sending an update";
const ANSWER: &str = "answering an update";
const GET: &str = "reading an update";

/// `keiro_update_send`'s outcomes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum SendCode {
    Sent,
    /// The update already under the id, in this state.
    Exists(UpdateState),
    Conflict,
    NotFound,
    Terminal(Status),
}

/// `keiro_update_send`'s arguments past the connection and the clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Send<'a> {
    pub(crate) name: &'a str,
    pub(crate) id: &'a str,
    pub(crate) update_id: &'a str,
    pub(crate) update_name: &'a str,
    pub(crate) request: &'a Value,
    pub(crate) token: &'a str,
    pub(crate) ttl_ms: i64,
    /// The input and priority of a start, for update-with-start.
    pub(crate) start: Option<(&'a Value, i32)>,
}

const STATUS: &str = "SELECT status FROM workflows WHERE workflow_name = ?1 AND workflow_id = ?2";

const UPDATE_ROW: &str = "SELECT update_name, request, state, reply FROM workflow_updates \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND update_id = ?3";

const UPDATE_INSERT: &str = "INSERT INTO workflow_updates \
         (workflow_name, workflow_id, update_id, update_name, request, requested_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

const INSTANCE_MARK: &str = "UPDATE workflows SET has_updates = 1 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND NOT has_updates";

/// One update's stored columns: name, request, state, reply.
type StoredUpdate = (String, String, String, Option<String>);

fn stored_update(
    conn: &Connection,
    operation: &'static str,
    name: &str,
    id: &str,
    update_id: &str,
) -> Result<Option<StoredUpdate>> {
    conn.query_row_cached(UPDATE_ROW, params![name, id, update_id], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
    })
    .optional()
    .map_err(|e| store(operation, e))
}

fn state_of(state: &str, reply: Option<&str>, operation: &'static str) -> Result<UpdateState> {
    let reply = reply.map(|r| row::value(r, operation)).transpose()?;
    update_state(state, reply)
        .ok_or_else(|| malformed(operation, format_args!("update state {state:?}")))
}

/// keiro_update_send: starts the instance when `send.start` asks and it does not exist; then
/// answers the update already under the id (the same name and request: its state; else a
/// conflict), refuses an unknown or terminal instance, or writes the update `requested`
/// (marking the instance `has_updates`, the terminal trigger's condition) and sends it on its
/// token. Returns the outcome and whether this call started the instance.
pub(crate) fn update_send(
    conn: &Connection,
    now: OffsetDateTime,
    send: Send<'_>,
) -> Result<(SendCode, bool)> {
    let mut started = false;
    if let Some((input, priority)) = send.start {
        started = instance::instance_start(conn, now, send.name, send.id, input, None, priority)?.0;
    }
    let status: Option<String> = conn
        .query_row_cached(STATUS, params![send.name, send.id], |r| r.get(0))
        .optional()
        .map_err(|e| store(SEND, e))?;
    let Some(status) = status else {
        return Ok((SendCode::NotFound, started));
    };
    if let Some((name, request, state, reply)) =
        stored_update(conn, SEND, send.name, send.id, send.update_id)?
    {
        if name != send.update_name || row::value(&request, SEND)? != *send.request {
            return Ok((SendCode::Conflict, started));
        }
        let state = state_of(&state, reply.as_deref(), SEND)?;
        return Ok((SendCode::Exists(state), started));
    }
    let status = row::status(&status, SEND)?;
    if status.is_terminal() {
        return Ok((SendCode::Terminal(status), started));
    }
    conn.execute_cached(
        UPDATE_INSERT,
        params![
            send.name,
            send.id,
            send.update_id,
            send.update_name,
            row::json(send.request),
            micros(now)
        ],
    )
    .map_err(|e| store(SEND, e))?;
    conn.execute_cached(INSTANCE_MARK, params![send.name, send.id])
        .map_err(|e| store(SEND, e))?;
    let offered = json!({
        "id": send.update_id,
        "name": send.update_name,
        "request": send.request,
    });
    signal::signal_send(conn, now, send.token, &offered, send.ttl_ms)?;
    Ok((SendCode::Sent, started))
}

/// `keiro_update_answer`'s outcomes: the append's, or a refusal with nothing written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AnswerCode {
    Append(AppendCode),
    Unknown,
    Answered,
}

const STEP_JOURNALED: &str = "SELECT 1 FROM journal \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step_name = ?4";

const UPDATE_SETTLE: &str = "UPDATE workflow_updates \
     SET state = ?4, reply = ?5, settled_at = ?6 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND update_id = ?3 AND state = 'requested'";

/// keiro_update_answer: a step not journaled yet is first checked against the update (none of
/// that name under that id: unknown; no longer `requested`: answered), then the append rules
/// run, and only when the step was appended the update is settled `replied` (`rejected` when
/// `rejected`) with the step's value, and its callers are told.
pub(crate) fn update_answer(
    conn: &Connection,
    now: OffsetDateTime,
    append: AppendTo<'_>,
    update_id: &str,
    update_name: &str,
    rejected: bool,
) -> Result<AnswerCode> {
    let journaled = conn
        .query_row_cached(
            STEP_JOURNALED,
            params![append.name, append.id, append.generation, append.step],
            |_| Ok(()),
        )
        .optional()
        .map_err(|e| store(ANSWER, e))?
        .is_some();
    if !journaled {
        match stored_update(conn, ANSWER, append.name, append.id, update_id)? {
            Some((name, _, _, _)) if name != update_name => return Ok(AnswerCode::Unknown),
            None => return Ok(AnswerCode::Unknown),
            Some((_, _, state, _)) if state != "requested" => return Ok(AnswerCode::Answered),
            Some(_) => {}
        }
    }
    let outcome = journal_append_step(conn, now, append)?;
    if let AppendCode::Appended(_) = outcome {
        let state = if rejected { "rejected" } else { "replied" };
        conn.execute_cached(
            UPDATE_SETTLE,
            params![
                append.name,
                append.id,
                update_id,
                state,
                row::json(append.payload),
                micros(now)
            ],
        )
        .map_err(|e| store(ANSWER, e))?;
        notify::message(conn, ANSWER, append.name, append.id)?;
    }
    Ok(AnswerCode::Append(outcome))
}

const UPDATE_GET: &str = "SELECT w.status, u.update_name, u.state, u.reply \
     FROM workflows w \
     LEFT JOIN workflow_updates u \
       ON u.workflow_name = w.workflow_name AND u.workflow_id = w.workflow_id \
      AND u.update_id = ?3 \
     WHERE w.workflow_name = ?1 AND w.workflow_id = ?2";

/// keiro_update_get: the instance's status and update `update_id`, in one statement; `None`
/// for an unknown instance.
pub(crate) fn update_get(
    conn: &Connection,
    name: &str,
    id: &str,
    update_id: &str,
) -> Result<Option<UpdateRead>> {
    type Found = (String, Option<String>, Option<String>, Option<String>);
    let found: Option<Found> = conn
        .query_row_cached(UPDATE_GET, params![name, id, update_id], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()
        .map_err(|e| store(GET, e))?;
    let Some((status, update_name, state, reply)) = found else {
        return Ok(None);
    };
    let update = match (update_name, state) {
        (Some(update_name), Some(state)) => {
            Some((update_name, state_of(&state, reply.as_deref(), GET)?))
        }
        _ => None,
    };
    Ok(Some(UpdateRead {
        status: row::status(&status, GET)?,
        update,
    }))
}

const UPDATES: &str = "listing an instance's updates";

const INSTANCE_UPDATES: &str = "SELECT update_id, update_name, request, state, reply, \
         requested_at, settled_at \
     FROM workflow_updates WHERE workflow_name = ?1 AND workflow_id = ?2 \
     ORDER BY requested_at, update_id LIMIT ?3";

/// The Postgres store's plain statement of the same name: the updates of instance
/// `name`/`id`, oldest first, at most `limit`.
pub(crate) fn instance_updates(
    conn: &Connection,
    name: &str,
    id: &str,
    limit: i64,
) -> Result<Vec<UpdateRecord>> {
    type Found = (
        String,
        String,
        String,
        String,
        Option<String>,
        i64,
        Option<i64>,
    );
    let mut statement = conn
        .prepare_cached(INSTANCE_UPDATES)
        .map_err(|e| store(UPDATES, e))?;
    let rows: Vec<Found> = statement
        .query_map(params![name, id, limit], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        })
        .and_then(Iterator::collect)
        .map_err(|e| store(UPDATES, e))?;
    rows.into_iter()
        .map(
            |(id, name, request, state, reply, requested_at, settled_at)| {
                Ok(UpdateRecord {
                    id,
                    name,
                    request: row::value(&request, UPDATES)?,
                    state: state_of(&state, reply.as_deref(), UPDATES)?,
                    requested_at: row::instant(requested_at, UPDATES)?,
                    settled_at: row::instant_opt(settled_at, UPDATES)?,
                })
            },
        )
        .collect()
}
