//! Rules of crates/migrations/functions/signal.sql: the wait, the send (buffered while nobody waits, for a
//! TTL) and its delivery half (the offer), and the return of the signals a race's losing waits
//! took, and signal-with-start; then the Postgres store's one-statement withdraw
//! (crates/postgres/src/signal.rs).
//!
//! `keiro_signal_lock` has no twin: it orders a wait and a send on one token, and the writer
//! already runs every operation alone in its transaction, holding the file's write lock. The
//! two-argument `keiro_signal_send` (kept for statements prepared by older builds) has none
//! either: the store always passes the TTL.

use crate::cached::Cached;
use keiro_journal::store::Result;
use keiro_journal::Generation;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::error::store;
use crate::journal::{journal_append_step, AppendCode, AppendTo};
use crate::row::{self, micros};

const WAIT: &str = "waiting for a signal";
const SEND: &str = "sending a signal";
const RETURN: &str = "giving signals back to their tokens";
const WITHDRAW: &str = "withdrawing a signal wait";

/// `keiro_signal_wait`'s outcomes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WaitCode {
    /// The journaled envelope (just now, or before).
    Delivered(Value),
    Waiting,
    NotFound,
    LeaseLost,
}

const INSTANCE_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM workflows WHERE workflow_name = ?1 AND workflow_id = ?2)";

const JOURNAL_PAYLOAD: &str = "SELECT payload FROM journal \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step_name = ?4";

const WAITER_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM signal_waiters \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step = ?4)";

const WAITER_DELETE: &str = "DELETE FROM signal_waiters \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step = ?4";

const WAITER_INSERT: &str = "INSERT INTO signal_waiters \
         (token, workflow_name, workflow_id, generation, step, created_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

const BUFFER_EXPIRE: &str = "DELETE FROM signal_buffer WHERE token = ?1 AND expires_at <= ?2";

const BUFFER_OLDEST: &str =
    "SELECT seq, payload FROM signal_buffer WHERE token = ?1 ORDER BY seq LIMIT 1";

const BUFFER_DELETE: &str = "DELETE FROM signal_buffer WHERE seq = ?1";

const BUFFER_INSERT: &str = "INSERT INTO signal_buffer (token, payload, created_at, expires_at) \
     VALUES (?1, ?2, ?3, ?4)";

/// `now + ttl_ms`, in stored microseconds.
fn expiry(now: OffsetDateTime, ttl_ms: i64) -> i64 {
    micros(now).saturating_add(ttl_ms.saturating_mul(1000))
}

/// keiro_signal_wait: deletes the token's expired signals, then either finds the step already
/// journaled, consumes the oldest live buffered signal (journaled at once, fenced by the run's
/// lease; the wait's own waiter row goes with it), or registers the waiter (once). The buffer
/// is consulted even when the waiter is registered: a signal buffered beside its waiter goes
/// to it on the re-drive.
#[allow(clippy::too_many_arguments)] // keiro_signal_wait's parameters, in its order
pub(crate) fn signal_wait(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    generation: Generation,
    step: &str,
    token: &str,
    fence: Option<(&str, i64)>,
) -> Result<WaitCode> {
    let exists: bool = conn
        .query_row_cached(INSTANCE_EXISTS, params![name, id], |r| r.get(0))
        .map_err(|e| store(WAIT, e))?;
    if !exists {
        return Ok(WaitCode::NotFound);
    }
    let recorded: Option<String> = conn
        .query_row_cached(JOURNAL_PAYLOAD, params![name, id, generation, step], |r| {
            r.get(0)
        })
        .optional()
        .map_err(|e| store(WAIT, e))?;
    if let Some(recorded) = recorded {
        return Ok(WaitCode::Delivered(row::value(&recorded, WAIT)?));
    }
    let waiting: bool = conn
        .query_row_cached(WAITER_EXISTS, params![name, id, generation, step], |r| {
            r.get(0)
        })
        .map_err(|e| store(WAIT, e))?;

    conn.execute_cached(BUFFER_EXPIRE, params![token, micros(now)])
        .map_err(|e| store(WAIT, e))?;
    let oldest: Option<(i64, String)> = conn
        .query_row_cached(BUFFER_OLDEST, params![token], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(|e| store(WAIT, e))?;
    if let Some((seq, payload)) = oldest {
        let envelope = json!({ "ok": row::value(&payload, WAIT)? });
        let code = journal_append_step(
            conn,
            now,
            AppendTo {
                name,
                id,
                generation: Some(generation),
                step,
                kind: "signal",
                payload: &envelope,
                owner: fence.map(|f| f.0),
                epoch: fence.map(|f| f.1),
                renew_ms: None,
            },
        )?;
        return Ok(match code {
            AppendCode::Appended(_) => {
                conn.execute_cached(BUFFER_DELETE, params![seq])
                    .map_err(|e| store(WAIT, e))?;
                if waiting {
                    conn.execute_cached(WAITER_DELETE, params![name, id, generation, step])
                        .map_err(|e| store(WAIT, e))?;
                }
                WaitCode::Delivered(envelope)
            }
            // Unreachable (the step was checked above); if it were, the recorded value is
            // the answer and the signal stays buffered.
            AppendCode::AlreadyPresent(recorded) => WaitCode::Delivered(recorded),
            AppendCode::LeaseLost => WaitCode::LeaseLost,
            AppendCode::NotFound => WaitCode::NotFound,
            // Terminal, or another generation: the signal stays for a waiter that can take it.
            AppendCode::RefusedTerminal(_) | AppendCode::Conflict => WaitCode::Waiting,
        });
    }

    if !waiting {
        conn.execute_cached(
            WAITER_INSERT,
            params![token, name, id, generation, step, micros(now)],
        )
        .map_err(|e| store(WAIT, e))?;
    }
    Ok(WaitCode::Waiting)
}

const WAITERS_OF: &str = "SELECT workflow_name, workflow_id, generation, step \
     FROM signal_waiters WHERE token = ?1 ORDER BY seq";

/// keiro_signal_offer: offers `payload` to the token's waiters oldest first; each waiter
/// offered is removed, and the first whose owner takes the step (appended, waking it)
/// receives it. Waiters that cannot take it (terminal, another generation, already answered,
/// gone) are dropped. The waiter that took it, if any.
pub(crate) fn signal_offer(
    conn: &Connection,
    now: OffsetDateTime,
    token: &str,
    payload: &Value,
) -> Result<Option<(String, String)>> {
    let envelope = json!({ "ok": payload });
    let waiters: Vec<(String, String, Generation, String)> = conn
        .prepare_cached(WAITERS_OF)
        .and_then(|mut s| {
            s.query_map(params![token], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect()
        })
        .map_err(|e| store(SEND, e))?;
    for (name, id, generation, step) in waiters {
        let removed = conn
            .execute_cached(WAITER_DELETE, params![name, id, generation, step])
            .map_err(|e| store(SEND, e))?;
        if removed == 0 {
            continue;
        }
        let code = journal_append_step(
            conn,
            now,
            AppendTo {
                name: &name,
                id: &id,
                generation: Some(generation),
                step: &step,
                kind: "signal",
                payload: &envelope,
                owner: None,
                epoch: None,
                renew_ms: None,
            },
        )?;
        if matches!(code, AppendCode::Appended(_)) {
            return Ok(Some((name, id)));
        }
    }
    Ok(None)
}

const BUFFER_SWEEP: &str = "DELETE FROM signal_buffer WHERE seq IN ( \
     SELECT seq FROM signal_buffer WHERE expires_at <= ?1 ORDER BY expires_at LIMIT 16)";

/// keiro_signal_send: deletes the token's expired signals, then offers the signal to the
/// token's waiters ([`signal_offer`]); with no taker it is buffered until `ttl_ms` from now.
/// Last, a sweep deletes up to 16 expired signals of any token. The waiter that took it, or
/// `None` when it was buffered.
pub(crate) fn signal_send(
    conn: &Connection,
    now: OffsetDateTime,
    token: &str,
    payload: &Value,
    ttl_ms: i64,
) -> Result<Option<(String, String)>> {
    let at = micros(now);
    conn.execute_cached(BUFFER_EXPIRE, params![token, at])
        .map_err(|e| store(SEND, e))?;
    let to = signal_offer(conn, now, token, payload)?;
    if to.is_none() {
        conn.execute_cached(
            BUFFER_INSERT,
            params![token, row::json(payload), at, expiry(now, ttl_ms)],
        )
        .map_err(|e| store(SEND, e))?;
    }
    conn.execute_cached(BUFFER_SWEEP, params![at])
        .map_err(|e| store(SEND, e))?;
    Ok(to)
}

/// keiro_signal_with_start: starts instance `name`/`id` with `input` when it does not exist
/// (the first value: whether this call did), then sends the signal as `signal_send` does (the
/// second: the instance that received it, `None` when buffered), in the writer's transaction.
#[allow(clippy::too_many_arguments)] // keiro_signal_with_start's parameters, in its order
pub(crate) fn signal_with_start(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    input: &Value,
    priority: i32,
    token: &str,
    payload: &Value,
    ttl_ms: i64,
) -> Result<(bool, Option<(String, String)>)> {
    let (started, _) = crate::instance::instance_start(conn, now, name, id, input, None, priority)?;
    let to = signal_send(conn, now, token, payload, ttl_ms)?;
    Ok((started, to))
}

const BUFFER_OF: &str = "SELECT payload, created_at, expires_at FROM signal_buffer \
     WHERE token = ?1 ORDER BY seq";

const BUFFER_CLEAR: &str = "DELETE FROM signal_buffer WHERE token = ?1";

/// keiro_signal_return: a `select` race's decision (as `keiro_journal_append_to` takes it)
/// and the signals its losing waits took, in one transaction: the decision is appended, and
/// only when it was, each signal goes back to its token (tokens in the order they first
/// appear): offered to the token's waiters, else buffered ahead of every signal buffered for
/// the token, for `ttl_ms` from now, in the order given. The head is made by taking the
/// token's buffered signals out and buffering them again after the returned ones, so `seq`
/// keeps giving the order.
pub(crate) fn signal_return(
    conn: &Connection,
    now: OffsetDateTime,
    decision: AppendTo<'_>,
    signals: &[(String, Value)],
    ttl_ms: i64,
) -> Result<AppendCode> {
    let outcome = journal_append_step(conn, now, decision)?;
    if !matches!(outcome, AppendCode::Appended(_)) {
        return Ok(outcome);
    }
    let at = micros(now);
    let mut tokens: Vec<&str> = Vec::new();
    for (token, _) in signals {
        if !tokens.contains(&token.as_str()) {
            tokens.push(token);
        }
    }
    for token in tokens {
        conn.execute_cached(BUFFER_EXPIRE, params![token, at])
            .map_err(|e| store(RETURN, e))?;
        let mut untaken: Vec<&Value> = Vec::new();
        for (_, payload) in signals.iter().filter(|(t, _)| t == token) {
            if signal_offer(conn, now, token, payload)?.is_none() {
                untaken.push(payload);
            }
        }
        if untaken.is_empty() {
            continue;
        }
        let old: Vec<(String, i64, i64)> = conn
            .prepare_cached(BUFFER_OF)
            .and_then(|mut s| {
                s.query_map(params![token], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect()
            })
            .map_err(|e| store(RETURN, e))?;
        conn.execute_cached(BUFFER_CLEAR, params![token])
            .map_err(|e| store(RETURN, e))?;
        for payload in untaken {
            conn.execute_cached(
                BUFFER_INSERT,
                params![token, row::json(payload), at, expiry(now, ttl_ms)],
            )
            .map_err(|e| store(RETURN, e))?;
        }
        for (payload, created_at, expires_at) in old {
            conn.execute_cached(
                BUFFER_INSERT,
                params![token, payload, created_at, expires_at],
            )
            .map_err(|e| store(RETURN, e))?;
        }
    }
    Ok(outcome)
}

/// signal_withdraw (crates/postgres/src/signal.rs, one statement): removes the waiter of
/// `step`, a wait that lost a `select` race; whether there was one. A signal already
/// delivered to it stays journaled.
pub(crate) fn signal_withdraw(
    conn: &Connection,
    name: &str,
    id: &str,
    generation: Generation,
    step: &str,
) -> Result<bool> {
    let removed = conn
        .execute_cached(WAITER_DELETE, params![name, id, generation, step])
        .map_err(|e| store(WITHDRAW, e))?;
    Ok(removed > 0)
}
