//! An instance's stored payloads, the twin of crates/postgres/src/payloads.rs (plain SQL there
//! too): every payload column of every row the instance owns, and their rewrite, each place
//! only while it still holds the value read (compared as JSON values, since SQLite keeps text
//! whose spelling a trigger may choose). The rule is keiro-journal's `payloads` module, and so
//! is the list of places (`PAYLOAD_PLACES`) both statements are built from.

use std::sync::OnceLock;

use keiro_journal::store::Result;
use keiro_journal::store::{PayloadPlace, PayloadRewrite, StoredPayload, PAYLOAD_PLACES};
use rusqlite::types::Value as SqlValue;
use rusqlite::{params_from_iter, Connection, OptionalExtension};

use crate::error::store;
use crate::row::{json, value};

const READ: &str = "reading an instance's payloads";
const REWRITE: &str = "rewriting an instance's payloads";

/// Every payload of instance (?1, ?2), as Postgres's read reads it: one `SELECT` per place of
/// keiro-journal's `PAYLOAD_PLACES`, joined by `UNION ALL`. Built once from that table (names
/// only, never a value), which is why it is not a `const`.
fn payloads_read_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let parts: Vec<String> = PAYLOAD_PLACES
            .iter()
            .map(|place| {
                let text = place.text_key.map_or("NULL", |key| key.column);
                let number = place.number_key.unwrap_or("NULL");
                let present = if place.nullable {
                    format!(" AND {} IS NOT NULL", place.column)
                } else {
                    String::new()
                };
                format!(
                    "SELECT '{}', {text}, {number}, {} FROM {} \
                     WHERE workflow_name = ?1 AND workflow_id = ?2{present}",
                    place.name, place.column, place.table
                )
            })
            .collect();
        parts.join(" UNION ALL ")
    })
}

/// Every payload of `(name, id)`.
pub(crate) fn payloads_read(conn: &Connection, name: &str, id: &str) -> Result<Vec<StoredPayload>> {
    let mut statement = conn
        .prepare_cached(payloads_read_sql())
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
            place: PayloadPlace::from_row(&kind, k, n, READ)?,
            value: value(&text, READ)?,
        });
    }
    Ok(payloads)
}

/// A place's table, column and key condition (`?3` its text key, then its number), from its
/// entry of `PAYLOAD_PLACES`.
fn target(place: &PayloadPlace) -> (&'static str, &'static str, String, Vec<SqlValue>) {
    let column = place.column();
    let (text, number) = place.keys();
    let mut keyed = String::new();
    let mut keys = Vec::new();
    if let (Some(key), Some(text)) = (column.text_key, text) {
        keys.push(SqlValue::Text(text.to_owned()));
        keyed.push_str(&format!(" AND {} = ?{}", key.column, keys.len() + 2));
    }
    if let (Some(key), Some(number)) = (column.number_key, number) {
        keys.push(SqlValue::Integer(number));
        keyed.push_str(&format!(" AND {key} = ?{}", keys.len() + 2));
    }
    (column.table, column.column, keyed, keys)
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
        // The table and column names are constants of `PAYLOAD_PLACES`, never input.
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
