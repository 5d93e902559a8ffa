//! Rules of sql/functions/child.sql: so far the delivery of a finished child's result into
//! its parent. Not here yet: `keiro_child_spawn`.

use keiro_journal::store::Result;
use rusqlite::Connection;
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::journal::{journal_append_to, AppendTo};
use crate::row::{self, Stored};

const DELIVER: &str = "delivering a child's result";

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
    journal_append_to(
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
