//! Rules of crates/migrations/functions/attribute.sql: search attributes (migration 0008 holds
//! their table).
//!
//! A start writes its attributes with the instance it creates (the store's start operations
//! call [`attributes_put`] in the writer's transaction when the start created the row); a
//! body's set is its fenced journal step, applied by the append rules, and only when it was
//! appended the attribute rows, so a replayed set writes nothing and the latest set of a name
//! wins. Each row keeps the tagged value and the same value in its kind's column.

use crate::cached::Cached;
use keiro_journal::attribute::{AttrValue, Attributes};
use keiro_journal::store::Result;
use rusqlite::{params, Connection};
use time::OffsetDateTime;

use crate::error::store;
use crate::journal::{journal_append_step, AppendCode, AppendTo};
use crate::row::micros;

const ATTRIBUTES_PUT: &str = "setting search attributes";

const ATTRIBUTE_UPSERT: &str = "INSERT INTO workflow_attributes \
         (workflow_name, workflow_id, attr, kind, value, text_value, num_value, time_value, \
          updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
     ON CONFLICT (workflow_name, workflow_id, attr) DO UPDATE \
         SET kind = excluded.kind, value = excluded.value, text_value = excluded.text_value, \
             num_value = excluded.num_value, time_value = excluded.time_value, \
             updated_at = excluded.updated_at";

/// keiro_attributes_put: sets each of `attributes` on the instance, replacing an earlier value
/// of the name.
pub(crate) fn attributes_put(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    attributes: &Attributes,
) -> Result<()> {
    for (attr, value) in attributes.iter() {
        let tagged = serde_json::to_string(value)
            .map_err(|e| crate::error::malformed(ATTRIBUTES_PUT, format_args!("{attr}: {e}")))?;
        conn.execute_cached(
            ATTRIBUTE_UPSERT,
            params![
                name,
                id,
                attr,
                value.kind(),
                tagged,
                value.text_key(),
                value.number_key(),
                value.time_key().map(micros),
                micros(now)
            ],
        )
        .map_err(|e| store(ATTRIBUTES_PUT, e))?;
    }
    Ok(())
}

/// `keiro_attributes_set`'s outcomes: the append's, or a refusal with nothing written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AttributesCode {
    Append(AppendCode),
    /// The names the instance would carry.
    TooMany(i64),
}

const STEP_JOURNALED: &str = "SELECT 1 FROM journal \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step_name = ?4";

const ATTRIBUTE_NAMES: &str =
    "SELECT attr FROM workflow_attributes WHERE workflow_name = ?1 AND workflow_id = ?2";

/// keiro_attributes_set: journals a body's set of attributes and sets them on the instance. A
/// step not journaled yet is first checked against the names the instance carries: more than
/// `max` answers `TooMany` with nothing written. A step already journaled goes to the append
/// rules.
pub(crate) fn attributes_set(
    conn: &Connection,
    now: OffsetDateTime,
    append: AppendTo<'_>,
    attributes: &Attributes,
    max: usize,
) -> Result<AttributesCode> {
    let journaled = conn
        .prepare_cached(STEP_JOURNALED)
        .and_then(|mut s| {
            s.exists(params![
                append.name,
                append.id,
                append.generation,
                append.step
            ])
        })
        .map_err(|e| store(ATTRIBUTES_PUT, e))?;
    if !journaled {
        let mut names: std::collections::BTreeSet<String> = conn
            .prepare_cached(ATTRIBUTE_NAMES)
            .and_then(|mut s| {
                s.query_map(params![append.name, append.id], |row| row.get(0))?
                    .collect()
            })
            .map_err(|e| store(ATTRIBUTES_PUT, e))?;
        names.extend(attributes.iter().map(|(name, _)| name.to_owned()));
        if names.len() > max {
            return Ok(AttributesCode::TooMany(
                i64::try_from(names.len()).unwrap_or(i64::MAX),
            ));
        }
    }
    let outcome = journal_append_step(conn, now, append)?;
    if let AppendCode::Appended(_) = outcome {
        attributes_put(conn, now, append.name, append.id, attributes)?;
    }
    Ok(AttributesCode::Append(outcome))
}

/// One stored attribute's tagged value.
pub(crate) fn stored_value(text: &str, operation: &'static str) -> Result<AttrValue> {
    serde_json::from_str(text)
        .map_err(|e| crate::error::malformed(operation, format_args!("attribute: {e}")))
}
