//! Values in and out of SQLite's columns: instants as integer microseconds since the Unix epoch
//! (UTC), JSON as its text, and the instance row read back into keiro's types. Anything that
//! does not read as keiro data is `Malformed`, never a panic.

use keiro_journal::store::Result;
use keiro_journal::{
    AwakeableStatus, Event, Generation, Instance, InstanceKey, JournalEntry, Status,
};
use rusqlite::Row;
use serde_json::Value;
use time::OffsetDateTime;

use crate::error::malformed;

/// An instant as stored: microseconds since the Unix epoch, PostgreSQL's precision (finer
/// digits are dropped, as PostgreSQL rounds them away). Saturates at the ends of `i64`,
/// which `time`'s range never reaches.
pub(crate) fn micros(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos().div_euclid(1000)).unwrap_or(i64::MAX)
}

/// A stored instant.
pub(crate) fn instant(micros: i64, operation: &'static str) -> Result<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1000)
        .map_err(|e| malformed(operation, format_args!("instant {micros}: {e}")))
}

/// A nullable stored instant.
pub(crate) fn instant_opt(
    micros: Option<i64>,
    operation: &'static str,
) -> Result<Option<OffsetDateTime>> {
    micros.map(|m| instant(m, operation)).transpose()
}

/// A value as stored.
pub(crate) fn json(value: &Value) -> String {
    value.to_string()
}

/// A stored value.
pub(crate) fn value(text: &str, operation: &'static str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| malformed(operation, format_args!("stored JSON: {e}")))
}

/// An instance row as stored, columns as `INSTANCE_ROW` selects them: what the rules work on.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) generation: Generation,
    pub(crate) status: String,
    pub(crate) input: String,
    pub(crate) output: Option<String>,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) next_attempt_at: Option<i64>,
    pub(crate) lease_owner: Option<String>,
    pub(crate) lease_epoch: i64,
    pub(crate) lease_expires_at: Option<i64>,
    pub(crate) wake_after: Option<i64>,
    pub(crate) parent_name: Option<String>,
    pub(crate) parent_id: Option<String>,
    pub(crate) priority: i32,
    pub(crate) queue: Option<String>,
    pub(crate) queue_key: Option<String>,
    /// Whether the run holds (or, its lease expired, held) a slot of its queue.
    pub(crate) queue_admitted: bool,
    pub(crate) created_at: i64,
    pub(crate) updated_at: i64,
    pub(crate) completed_at: Option<i64>,
    pub(crate) parent_generation: Option<Generation>,
    pub(crate) parent_step: Option<String>,
    /// The version that started (or continued) the run; `None`: unversioned.
    pub(crate) app_version: Option<String>,
    /// Claims handed back unopened since the run last progressed.
    pub(crate) open_refusals: i32,
}

impl Stored {
    /// Reads a row selected with `INSTANCE_ROW`.
    pub(crate) fn from_row(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            name: row.get(0)?,
            id: row.get(1)?,
            generation: row.get(2)?,
            status: row.get(3)?,
            input: row.get(4)?,
            output: row.get(5)?,
            attempts: row.get(6)?,
            last_error: row.get(7)?,
            next_attempt_at: row.get(8)?,
            lease_owner: row.get(9)?,
            lease_epoch: row.get(10)?,
            lease_expires_at: row.get(11)?,
            wake_after: row.get(12)?,
            parent_name: row.get(13)?,
            parent_id: row.get(14)?,
            priority: row.get(15)?,
            queue: row.get(16)?,
            queue_key: row.get(17)?,
            queue_admitted: row.get(18)?,
            created_at: row.get(19)?,
            updated_at: row.get(20)?,
            completed_at: row.get(21)?,
            parent_generation: row.get(22)?,
            parent_step: row.get(23)?,
            app_version: row.get(24)?,
            open_refusals: row.get(25)?,
        })
    }

    /// Whether the row is terminal.
    pub(crate) fn is_terminal(&self) -> bool {
        matches!(self.status.as_str(), "completed" | "failed" | "cancelled")
    }

    /// Whether `owner`/`epoch` hold the lease (`IS NOT DISTINCT FROM` and `=`).
    pub(crate) fn held_by(&self, owner: &str, epoch: i64) -> bool {
        self.lease_owner.as_deref() == Some(owner) && self.lease_epoch == epoch
    }

    /// The row as keiro's [`Instance`].
    pub(crate) fn instance(&self, operation: &'static str) -> Result<Instance> {
        let parent = match (&self.parent_name, &self.parent_id) {
            (Some(name), Some(id)) => Some(key(name, id, operation)?),
            (None, None) => None,
            _ => return Err(malformed(operation, "a parent needs both a name and an id")),
        };
        Ok(Instance {
            key: key(&self.name, &self.id, operation)?,
            generation: self.generation,
            status: status(&self.status, operation)?,
            input: value(&self.input, operation)?,
            output: self
                .output
                .as_deref()
                .map(|o| value(o, operation))
                .transpose()?,
            attempts: self.attempts,
            open_refusals: self.open_refusals,
            last_error: self.last_error.clone(),
            next_attempt_at: instant_opt(self.next_attempt_at, operation)?,
            lease_owner: self.lease_owner.clone(),
            lease_epoch: self.lease_epoch,
            lease_expires_at: instant_opt(self.lease_expires_at, operation)?,
            wake_after: instant_opt(self.wake_after, operation)?,
            parent,
            priority: self.priority,
            queue: self.queue.clone(),
            queue_key: self.queue_key.clone(),
            app_version: self.app_version.clone(),
            created_at: instant(self.created_at, operation)?,
            updated_at: instant(self.updated_at, operation)?,
            completed_at: instant_opt(self.completed_at, operation)?,
        })
    }
}

/// Reads a stored status.
pub(crate) fn status(text: &str, operation: &'static str) -> Result<Status> {
    Status::parse(text).ok_or_else(|| malformed(operation, format_args!("unknown status {text:?}")))
}

/// Reads a stored awakeable status.
pub(crate) fn awakeable_status(text: &str, operation: &'static str) -> Result<AwakeableStatus> {
    match text {
        "pending" => Ok(AwakeableStatus::Pending),
        "completed" => Ok(AwakeableStatus::Completed),
        "cancelled" => Ok(AwakeableStatus::Cancelled),
        other => Err(malformed(
            operation,
            format_args!("unknown awakeable status {other:?}"),
        )),
    }
}

/// Reads a stored key.
pub(crate) fn key(name: &str, id: &str, operation: &'static str) -> Result<InstanceKey> {
    InstanceKey::parse(name, id)
        .map_err(|e| malformed(operation, format_args!("instance key {name:?}/{id:?}: {e}")))
}

/// One journal row's fields, as stored.
pub(crate) type StoredEntry = (i64, Generation, String, String, String, i64);

/// Reads a row of `seq, generation, step_name, kind, payload, recorded_at`.
pub(crate) fn stored_entry(row: &Row<'_>) -> rusqlite::Result<StoredEntry> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

/// Decodes a stored journal row.
pub(crate) fn entry(stored: StoredEntry, operation: &'static str) -> Result<JournalEntry> {
    let (seq, generation, step_name, kind, payload, recorded_at) = stored;
    let event = Event::decode(&step_name, &kind, value(&payload, operation)?)
        .map_err(|e| malformed(operation, e))?;
    Ok(JournalEntry {
        seq,
        generation,
        event,
        recorded_at: instant(recorded_at, operation)?,
    })
}

const INSTANCE_ROW: &str = concat!(
    "SELECT workflow_name, workflow_id, generation, status, ",
    "input, output, attempts, last_error, next_attempt_at, lease_owner, lease_epoch, ",
    "lease_expires_at, wake_after, parent_name, parent_id, priority, queue, queue_key, ",
    "queue_admitted, created_at, updated_at, ",
    "completed_at, parent_generation, parent_step, app_version, open_refusals ",
    "FROM workflows WHERE workflow_name = ?1 AND workflow_id = ?2"
);

/// The instance row, if any. Inside the writer's transaction this is the locked read of the
/// plpgsql rules (`SELECT ... FOR UPDATE`): nobody else can write until the commit.
pub(crate) fn instance_row(
    conn: &rusqlite::Connection,
    name: &str,
    id: &str,
    operation: &'static str,
) -> Result<Option<Stored>> {
    use rusqlite::OptionalExtension;
    conn.prepare_cached(INSTANCE_ROW)
        .and_then(|mut s| s.query_row([name, id], Stored::from_row).optional())
        .map_err(|e| crate::error::store(operation, e))
}

const JOURNAL_GENERATION: &str = "SELECT seq, generation, step_name, kind, payload, recorded_at \
     FROM journal WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 ORDER BY seq";

/// One generation's journal in append order.
pub(crate) fn journal_generation(
    conn: &rusqlite::Connection,
    name: &str,
    id: &str,
    generation: Generation,
    operation: &'static str,
) -> Result<Vec<JournalEntry>> {
    let stored = conn
        .prepare_cached(JOURNAL_GENERATION)
        .and_then(|mut s| {
            s.query_map(rusqlite::params![name, id, generation], stored_entry)?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(|e| crate::error::store(operation, e))?;
    stored.into_iter().map(|e| entry(e, operation)).collect()
}
