//! An instance's stored payloads, the twin of crates/postgres/src/payloads.rs (plain SQL there
//! too): every payload column of every row the instance owns, and their rewrite, each place
//! only while it still holds the value read (compared as JSON values, since SQLite keeps text
//! whose spelling a trigger may choose). The rule is keiro-journal's `payloads` module.

use keiro_journal::store::Result;
use keiro_journal::store::{PayloadPlace, PayloadRewrite, StoredPayload};
use keiro_journal::StoreError;
use rusqlite::types::Value as SqlValue;
use rusqlite::{params_from_iter, Connection, OptionalExtension};

use crate::error::store;
use crate::row::{json, value};

const READ: &str = "reading an instance's payloads";
const REWRITE: &str = "rewriting an instance's payloads";

/// Every payload of instance (?1, ?2), as Postgres's `PAYLOADS_READ` reads it.
const PAYLOADS_READ: &str = "\
    SELECT 'input', NULL, NULL, input FROM workflows \
     WHERE workflow_name = ?1 AND workflow_id = ?2 \
    UNION ALL SELECT 'output', NULL, NULL, output FROM workflows \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND output IS NOT NULL \
    UNION ALL SELECT 'journal', NULL, seq, payload FROM journal \
     WHERE workflow_name = ?1 AND workflow_id = ?2 \
    UNION ALL SELECT 'awakeable', id, NULL, payload FROM awakeables \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND payload IS NOT NULL \
    UNION ALL SELECT 'task_input', step_id, NULL, input FROM remote_tasks \
     WHERE workflow_name = ?1 AND workflow_id = ?2 \
    UNION ALL SELECT 'task_output', step_id, NULL, output FROM remote_tasks \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND output IS NOT NULL \
    UNION ALL SELECT 'event', key, NULL, value FROM workflow_events \
     WHERE workflow_name = ?1 AND workflow_id = ?2 \
    UNION ALL SELECT 'stream', key, stream_offset, value FROM workflow_streams \
     WHERE workflow_name = ?1 AND workflow_id = ?2 \
    UNION ALL SELECT 'update_request', update_id, NULL, request FROM workflow_updates \
     WHERE workflow_name = ?1 AND workflow_id = ?2 \
    UNION ALL SELECT 'update_reply', update_id, NULL, reply FROM workflow_updates \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND reply IS NOT NULL";

/// A read row's place.
fn place(kind: &str, k: Option<String>, n: Option<i64>) -> Result<PayloadPlace> {
    let malformed = || StoreError::Malformed {
        operation: READ,
        detail: format!("payload place {kind:?} without its key"),
    };
    let text = || k.clone().ok_or_else(malformed);
    Ok(match kind {
        "input" => PayloadPlace::Input,
        "output" => PayloadPlace::Output,
        "journal" => PayloadPlace::Journal {
            seq: n.ok_or_else(malformed)?,
        },
        "awakeable" => PayloadPlace::Awakeable { id: text()? },
        "task_input" => PayloadPlace::TaskInput { step_id: text()? },
        "task_output" => PayloadPlace::TaskOutput { step_id: text()? },
        "event" => PayloadPlace::Event { key: text()? },
        "stream" => PayloadPlace::StreamItem {
            key: text()?,
            offset: n.ok_or_else(malformed)?,
        },
        "update_request" => PayloadPlace::UpdateRequest { id: text()? },
        "update_reply" => PayloadPlace::UpdateReply { id: text()? },
        other => {
            return Err(StoreError::Malformed {
                operation: READ,
                detail: format!("unknown payload place {other:?}"),
            })
        }
    })
}

/// Every payload of `(name, id)`.
pub(crate) fn payloads_read(conn: &Connection, name: &str, id: &str) -> Result<Vec<StoredPayload>> {
    let mut statement = conn
        .prepare_cached(PAYLOADS_READ)
        .map_err(|e| store(READ, e))?;
    let rows = statement
        .query_map([name, id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, Option<String>>(1)?,
                row.get::<_, Option<i64>>(2)?,
                row.get::<_, String>(3)?,
            ))
        })
        .map_err(|e| store(READ, e))?;
    let mut payloads = Vec::new();
    for row in rows {
        let (kind, k, n, text) = row.map_err(|e| store(READ, e))?;
        payloads.push(StoredPayload {
            place: place(&kind, k, n)?,
            value: value(&text, READ)?,
        });
    }
    Ok(payloads)
}

/// A place's table, column and key condition (`?3` its text key, then its number).
fn target(place: &PayloadPlace) -> (&'static str, &'static str, &'static str, Vec<SqlValue>) {
    let text = |t: &str| SqlValue::Text(t.to_owned());
    match place {
        PayloadPlace::Input => ("workflows", "input", "", vec![]),
        PayloadPlace::Output => ("workflows", "output", "", vec![]),
        PayloadPlace::Journal { seq } => (
            "journal",
            "payload",
            " AND seq = ?3",
            vec![SqlValue::Integer(*seq)],
        ),
        PayloadPlace::Awakeable { id } => ("awakeables", "payload", " AND id = ?3", vec![text(id)]),
        PayloadPlace::TaskInput { step_id } => (
            "remote_tasks",
            "input",
            " AND step_id = ?3",
            vec![text(step_id)],
        ),
        PayloadPlace::TaskOutput { step_id } => (
            "remote_tasks",
            "output",
            " AND step_id = ?3",
            vec![text(step_id)],
        ),
        PayloadPlace::Event { key } => {
            ("workflow_events", "value", " AND key = ?3", vec![text(key)])
        }
        PayloadPlace::StreamItem { key, offset } => (
            "workflow_streams",
            "value",
            " AND key = ?3 AND stream_offset = ?4",
            vec![text(key), SqlValue::Integer(*offset)],
        ),
        PayloadPlace::UpdateRequest { id } => (
            "workflow_updates",
            "request",
            " AND update_id = ?3",
            vec![text(id)],
        ),
        PayloadPlace::UpdateReply { id } => (
            "workflow_updates",
            "reply",
            " AND update_id = ?3",
            vec![text(id)],
        ),
    }
}

/// Applies `rewrites` to `(name, id)`'s payloads (the caller's transaction); how many applied.
pub(crate) fn payloads_rewrite(
    conn: &Connection,
    name: &str,
    id: &str,
    rewrites: &[PayloadRewrite],
) -> Result<u64> {
    let mut applied = 0;
    for rewrite in rewrites {
        let (table, column, keyed, keys) = target(&rewrite.place);
        let mut params = vec![
            SqlValue::Text(name.to_owned()),
            SqlValue::Text(id.to_owned()),
        ];
        params.extend(keys);
        // The table and column names are constants of `target`, never input.
        let select = format!(
            "SELECT {column} FROM {table} WHERE workflow_name = ?1 AND workflow_id = ?2{keyed}"
        );
        let stored: Option<Option<String>> = conn
            .prepare_cached(&select)
            .and_then(|mut s| {
                s.query_row(params_from_iter(params.iter()), |r| r.get(0))
                    .optional()
            })
            .map_err(|e| store(REWRITE, e))?;
        let Some(Some(text)) = stored else { continue };
        if value(&text, REWRITE)? != rewrite.old {
            continue;
        }
        let update = format!(
            "UPDATE {table} SET {column} = ?{} WHERE workflow_name = ?1 AND workflow_id = ?2{keyed}",
            params.len() + 1
        );
        params.push(SqlValue::Text(json(&rewrite.new)));
        let n = conn
            .prepare_cached(&update)
            .and_then(|mut s| s.execute(params_from_iter(params.iter())))
            .map_err(|e| store(REWRITE, e))?;
        applied += u64::try_from(n).unwrap_or(0);
    }
    Ok(applied)
}
