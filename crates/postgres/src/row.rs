//! Reading rows back into keiro's types. Anything that does not read as keiro data is
//! [`StoreError::Malformed`], never a panic.

use std::fmt;

use keiro_journal::{Event, Generation, Instance, InstanceKey, JournalEntry, Status, StoreError};
use serde_json::Value;
use time::OffsetDateTime;
use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

/// The instance row's columns as `SELECT` expressions, each read back by its bare name. The
/// list is spelled out, never `*`, so a column added by a later migration cannot change the
/// result type of a statement a running process has already prepared.
// One column per line reads better than rustfmt's one token per line.
#[rustfmt::skip]
macro_rules! instance_columns {
    ($source:literal) => {
        concat!(
            $source, "workflow_name, ",
            $source, "workflow_id, ",
            $source, "generation, ",
            $source, "status, ",
            $source, "input, ",
            $source, "output, ",
            $source, "attempts, ",
            $source, "open_refusals, ",
            $source, "last_error, ",
            $source, "next_attempt_at, ",
            $source, "lease_owner, ",
            $source, "lease_epoch, ",
            $source, "lease_expires_at, ",
            $source, "wake_after, ",
            $source, "parent_name, ",
            $source, "parent_id, ",
            $source, "priority, ",
            $source, "queue, ",
            $source, "queue_key, ",
            $source, "app_version, ",
            $source, "created_at, ",
            $source, "updated_at, ",
            $source, "completed_at"
        )
    };
}
pub(crate) use instance_columns;

/// A store error for data keiro cannot read.
pub(crate) fn malformed(operation: &'static str, detail: impl fmt::Display) -> StoreError {
    StoreError::Malformed {
        operation,
        detail: detail.to_string(),
    }
}

/// Reads column `name`.
pub(crate) fn column<'a, T: FromSql<'a>>(
    row: &'a Row,
    name: &str,
    operation: &'static str,
) -> Result<T, StoreError> {
    row.try_get(name)
        .map_err(|e| malformed(operation, format_args!("column {name}: {e}")))
}

/// Reads a `count(*)` column, which is never negative.
pub(crate) fn count(row: &Row, name: &str, operation: &'static str) -> Result<u64, StoreError> {
    let n: i64 = column(row, name, operation)?;
    u64::try_from(n).map_err(|_| malformed(operation, format_args!("negative count {n}")))
}

/// Reads a stored status.
pub(crate) fn status(text: &str, operation: &'static str) -> Result<Status, StoreError> {
    Status::parse(text).ok_or_else(|| malformed(operation, format_args!("unknown status {text:?}")))
}

/// Reads a stored key.
pub(crate) fn key(
    name: &str,
    id: &str,
    operation: &'static str,
) -> Result<InstanceKey, StoreError> {
    InstanceKey::parse(name, id)
        .map_err(|e| malformed(operation, format_args!("instance key {name:?}/{id:?}: {e}")))
}

/// Reads an instance row selected with [`instance_columns!`].
pub(crate) fn instance(row: &Row, operation: &'static str) -> Result<Instance, StoreError> {
    let name: String = column(row, "workflow_name", operation)?;
    let id: String = column(row, "workflow_id", operation)?;
    let parent_name: Option<String> = column(row, "parent_name", operation)?;
    let parent_id: Option<String> = column(row, "parent_id", operation)?;
    let parent = match (parent_name, parent_id) {
        (Some(name), Some(id)) => Some(key(&name, &id, operation)?),
        (None, None) => None,
        _ => return Err(malformed(operation, "a parent needs both a name and an id")),
    };
    let status_text: String = column(row, "status", operation)?;
    Ok(Instance {
        key: key(&name, &id, operation)?,
        generation: column(row, "generation", operation)?,
        status: status(&status_text, operation)?,
        input: column(row, "input", operation)?,
        output: column(row, "output", operation)?,
        attempts: column(row, "attempts", operation)?,
        open_refusals: column(row, "open_refusals", operation)?,
        last_error: column(row, "last_error", operation)?,
        next_attempt_at: column(row, "next_attempt_at", operation)?,
        lease_owner: column(row, "lease_owner", operation)?,
        lease_epoch: column(row, "lease_epoch", operation)?,
        lease_expires_at: column(row, "lease_expires_at", operation)?,
        wake_after: column(row, "wake_after", operation)?,
        parent,
        priority: column(row, "priority", operation)?,
        queue: column(row, "queue", operation)?,
        queue_key: column(row, "queue_key", operation)?,
        app_version: column(row, "app_version", operation)?,
        created_at: column(row, "created_at", operation)?,
        updated_at: column(row, "updated_at", operation)?,
        completed_at: column(row, "completed_at", operation)?,
    })
}

/// One stored journal row's fields.
pub(crate) struct StoredEntry {
    pub(crate) seq: i64,
    pub(crate) generation: Generation,
    pub(crate) step_name: String,
    pub(crate) kind: String,
    pub(crate) payload: Value,
    pub(crate) recorded_at: OffsetDateTime,
}

impl StoredEntry {
    /// Reads a row of `seq, generation, step_name, kind, payload, recorded_at`.
    pub(crate) fn from_row(row: &Row, operation: &'static str) -> Result<Self, StoreError> {
        Ok(Self {
            seq: column(row, "seq", operation)?,
            generation: column(row, "generation", operation)?,
            step_name: column(row, "step_name", operation)?,
            kind: column(row, "kind", operation)?,
            payload: column(row, "payload", operation)?,
            recorded_at: column(row, "recorded_at", operation)?,
        })
    }

    /// Decodes the event; the step name of a repeatable marker (`__workflow_failed__/2`) is
    /// ignored by the decoder.
    pub(crate) fn decode(self, operation: &'static str) -> Result<JournalEntry, StoreError> {
        let event = Event::decode(&self.step_name, &self.kind, self.payload)
            .map_err(|e| malformed(operation, e))?;
        Ok(JournalEntry {
            seq: self.seq,
            generation: self.generation,
            event,
            recorded_at: self.recorded_at,
        })
    }
}

/// Decodes journal rows selected as `seq, generation, step_name, kind, payload, recorded_at`.
pub(crate) fn entries(
    rows: &[Row],
    operation: &'static str,
) -> Result<Vec<JournalEntry>, StoreError> {
    rows.iter()
        .map(|row| StoredEntry::from_row(row, operation)?.decode(operation))
        .collect()
}

/// A 1-based array position, as the batch functions number their requests.
pub(crate) fn position(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Places the outcome rows of a batch function (each naming its request's 1-based position in
/// `n_column`) in the batch's order; `outcome` reads one row (`None`: the request is to be
/// sent alone), and a request with no row gets a malformed-data error.
pub(crate) fn in_batch_order<O>(
    rows: &[Row],
    len: usize,
    operation: &'static str,
    n_column: &str,
    mut outcome: impl FnMut(&Row, usize) -> Option<Result<O, StoreError>>,
) -> Vec<Option<Result<O, StoreError>>> {
    let mut outcomes: Vec<Option<Option<Result<O, StoreError>>>> = (0..len).map(|_| None).collect();
    for row in rows {
        let at = column::<i32>(row, n_column, operation)
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|n| n.checked_sub(1))
            .filter(|&i| i < len);
        if let Some(i) = at {
            outcomes[i] = Some(outcome(row, i));
        }
    }
    outcomes
        .into_iter()
        .map(|o| {
            o.unwrap_or_else(|| {
                Some(Err(malformed(
                    operation,
                    "no outcome for this request of the batch",
                )))
            })
        })
        .collect()
}
