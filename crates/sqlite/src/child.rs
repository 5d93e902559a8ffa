//! Rules of crates/migrations/functions/child.sql: the spawn, and the delivery of a finished child's result
//! into the generation of its parent that awaits it.

use crate::cached::Cached;
use keiro_journal::store::Result;
use rusqlite::{params, Connection};
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::error::{malformed, store};
use crate::journal::{journal_append_step, AppendCode, AppendTo};
use crate::notify;
use crate::row::{self, micros, Stored};

const DELIVER: &str = "delivering a child's result";
const SPAWN: &str = "spawning a child";

/// keiro_child_envelope: the result envelope of a terminal instance row, as its parent
/// journals it.
pub(crate) fn child_envelope(child: &Stored) -> Result<Value> {
    Ok(match child.status.as_str() {
        "completed" => json!({
            "ok": child.output.as_deref().map(|o| row::value(o, DELIVER)).transpose()?
                .unwrap_or(Value::Null)
        }),
        "failed" => json!({ "failed": child.last_error.clone().unwrap_or_default() }),
        "cancelled" => json!({ "cancelled": true }),
        // plpgsql's CASE gives NULL: not reached, the caller just made the row terminal.
        _ => Value::Null,
    })
}

/// keiro_child_deliver: the child-delivery rule. `name`/`id` is a row this transaction just
/// made terminal; if it is linked to a parent, its result envelope is journaled into the
/// parent's spawning generation under the awaited step, waking the parent. A parent that
/// refuses (terminal, on another generation, gone) is ignored: nobody waits any more. A fix
/// (an id containing `~retry~`) delivers only when it completes.
pub(crate) fn child_deliver(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
) -> Result<()> {
    let Some(child) = row::instance_row(conn, name, id, DELIVER)? else {
        return Ok(());
    };
    let (Some(parent_name), Some(parent_id), Some(parent_step)) =
        (&child.parent_name, &child.parent_id, &child.parent_step)
    else {
        return Ok(());
    };
    if child.status != "completed" && child.id.contains("~retry~") {
        return Ok(());
    }
    let envelope = child_envelope(&child)?;
    journal_append_step(
        conn,
        now,
        AppendTo {
            name: parent_name,
            id: parent_id,
            generation: child.parent_generation,
            step: parent_step,
            kind: "child",
            payload: &envelope,
            owner: None,
            epoch: None,
            renew_ms: None,
        },
    )?;
    Ok(())
}

const CHILD_INSERT: &str = "INSERT INTO workflows \
         (workflow_name, workflow_id, input, parent_name, parent_id, parent_generation, \
          parent_step, priority, created_at, updated_at, app_version) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, ?8, ?8, keiro_app_version()) \
     ON CONFLICT (workflow_name, workflow_id) DO NOTHING";

const CHILD_LINK: &str = "UPDATE workflows SET \
         parent_name = ?3, parent_id = ?4, parent_generation = ?5, parent_step = ?6, \
         updated_at = ?7 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

const SPAWN_ROW_REWRITE: &str = "UPDATE journal SET payload = ?5 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step_name = ?4";

/// The child a spawn creates or finds: its key, its input, the parent step awaiting it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Spawned<'a> {
    pub(crate) name: &'a str,
    pub(crate) id: &'a str,
    pub(crate) input: &'a Value,
    pub(crate) await_step: &'a str,
}

/// keiro_child_spawn: applies the parent's spawn-step append and, only when it was appended,
/// creates the child `running` (generation 0, priority 0), linked to the parent's generation
/// and awaited step. When an instance with the child's key exists:
/// - finished: its result envelope is journaled into the spawner at once (and it adopts the
///   spawner if it has no parent);
/// - running with no parent, or linked to the spawner itself (an earlier generation): the link
///   moves to this spawn;
/// - running for another parent: the spawn is refused. The spawn row, written above in this
///   transaction, gets `"taken": {"name", "id"}` (that parent), `{"taken": ...}` is journaled
///   under the awaited step too, and the outcome is already_present with the stored value.
///
/// PostgreSQL loops when a concurrent deletion frees the key between its insert and its read;
/// here nothing runs between the two. A created child notifies its wake.
pub(crate) fn child_spawn(
    conn: &Connection,
    now: OffsetDateTime,
    append: AppendTo<'_>,
    child: Spawned<'_>,
) -> Result<AppendCode> {
    let outcome = journal_append_step(conn, now, append)?;
    let AppendCode::Appended(generation) = outcome else {
        return Ok(outcome);
    };
    let (name, id) = (append.name, append.id);
    let at = micros(now);
    let created = conn
        .execute_cached(
            CHILD_INSERT,
            params![
                child.name,
                child.id,
                row::json(child.input),
                name,
                id,
                generation,
                child.await_step,
                at
            ],
        )
        .map_err(|e| store(SPAWN, e))?
        == 1;
    if created {
        notify::wake(conn, SPAWN, child.name, child.id)?;
        return Ok(outcome);
    }
    let existing = row::instance_row(conn, child.name, child.id, SPAWN)?
        .ok_or_else(|| malformed(SPAWN, "the conflicting child row is missing"))?;
    let link = || {
        conn.execute_cached(
            CHILD_LINK,
            params![
                child.name,
                child.id,
                name,
                id,
                generation,
                child.await_step,
                at
            ],
        )
        .map_err(|e| store(SPAWN, e))
    };
    let result = |payload: &Value| {
        journal_append_step(
            conn,
            now,
            AppendTo {
                name,
                id,
                generation: Some(generation),
                step: child.await_step,
                kind: "child",
                payload,
                owner: None,
                epoch: None,
                renew_ms: None,
            },
        )
    };

    if existing.is_terminal() {
        if existing.parent_name.is_none() {
            link()?;
        }
        result(&child_envelope(&existing)?)?;
        return Ok(outcome);
    }

    let spawner =
        existing.parent_name.as_deref() == Some(name) && existing.parent_id.as_deref() == Some(id);
    if existing.parent_name.is_none() || spawner {
        link()?;
        return Ok(outcome);
    }

    // Rewriting the spawn row is no history rewrite: nobody has seen it before this commits.
    let taken = json!({ "name": existing.parent_name, "id": existing.parent_id });
    let recorded = match append.payload {
        Value::Object(fields) => {
            let mut fields = fields.clone();
            fields.insert("taken".to_owned(), taken.clone());
            Value::Object(fields)
        }
        other => other.clone(),
    };
    conn.execute_cached(
        SPAWN_ROW_REWRITE,
        params![name, id, generation, append.step, row::json(&recorded)],
    )
    .map_err(|e| store(SPAWN, e))?;
    result(&json!({ "taken": taken }))?;
    Ok(AppendCode::AlreadyPresent(recorded))
}
