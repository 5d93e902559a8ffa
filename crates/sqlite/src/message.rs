//! Rules of crates/migrations/functions/message.sql: events and streams, what a running
//! workflow publishes to its callers (migration 0005 holds their tables).
//!
//! Each write is the run's own fenced journal step, applied by the append rules, and only
//! when it was appended the row a reader reads, in the writer's transaction: a replayed write
//! (already present) and a stale holder (lease lost) write nothing. Each write announces
//! `msg:<name>/<id>` in the notification table (a `wake` row named `msg:<name>`, which the
//! store's `notify` module routes to the readers of that instance, never to the loops: the
//! CHECK of migration 0002 allows no other kind, and no workflow name holds a `:`). The reads
//! are single statements, so each reads one snapshot.

use crate::cached::Cached;
use keiro_journal::message::{
    EventRead, EventRecord, Messages, StreamHead, StreamItem, StreamPage,
};
use keiro_journal::store::Result;
use rusqlite::{params, Connection, OptionalExtension};
use time::OffsetDateTime;

use crate::error::{malformed, store};
use crate::journal::{journal_append_step, AppendCode, AppendTo};
use crate::notify;
use crate::row::{self, micros};

const EVENT_SET: &str = "setting an event";
const STREAM_WRITE: &str = "writing to a stream";
const STREAM_CLOSE: &str = "closing a stream";
const EVENT_GET: &str = "reading an event";
const STREAM_READ: &str = "reading a stream";
const MESSAGES: &str = "listing an instance's events and streams";

const EVENT_UPSERT: &str = "INSERT INTO workflow_events \
         (workflow_name, workflow_id, key, value, updated_at) VALUES (?1, ?2, ?3, ?4, ?5) \
     ON CONFLICT (workflow_name, workflow_id, key) DO UPDATE \
         SET value = excluded.value, version = version + 1, updated_at = excluded.updated_at";

/// keiro_event_set: journals an event's write and, only when it was appended, makes its value
/// the event's current one (its version one more).
pub(crate) fn event_set(
    conn: &Connection,
    now: OffsetDateTime,
    append: AppendTo<'_>,
    key: &str,
) -> Result<AppendCode> {
    let outcome = journal_append_step(conn, now, append)?;
    if let AppendCode::Appended(_) = outcome {
        conn.execute_cached(
            EVENT_UPSERT,
            params![
                append.name,
                append.id,
                key,
                row::json(append.payload),
                micros(now)
            ],
        )
        .map_err(|e| store(EVENT_SET, e))?;
        notify::message(conn, EVENT_SET, append.name, append.id)?;
    }
    Ok(outcome)
}

/// `keiro_stream_write`'s outcomes: the append's, or a refusal with nothing written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StreamCode {
    Append(AppendCode),
    Closed,
    /// The stream's items and bytes.
    Full(i64, i64),
}

const STEP_JOURNALED: &str = "SELECT 1 FROM journal \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step_name = ?4";

const HEAD: &str = "SELECT next_offset, bytes, closed FROM workflow_stream_heads \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND key = ?3";

const HEAD_ADVANCE: &str = "INSERT INTO workflow_stream_heads \
         (workflow_name, workflow_id, key, next_offset, bytes, updated_at) \
     VALUES (?1, ?2, ?3, 1, ?4, ?5) \
     ON CONFLICT (workflow_name, workflow_id, key) DO UPDATE \
         SET next_offset = next_offset + 1, bytes = bytes + excluded.bytes, \
             updated_at = excluded.updated_at \
     RETURNING next_offset";

const ITEM_INSERT: &str = "INSERT INTO workflow_streams \
         (workflow_name, workflow_id, key, stream_offset, value, written_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

/// The limits of one stream write, as `keiro_stream_write` takes them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// The item's encoded length.
    pub(crate) len: i64,
    pub(crate) items_max: i64,
    pub(crate) bytes_max: i64,
}

/// keiro_stream_write: a step not journaled yet is first checked against the stream's state
/// (closed, or full for `bounds`), then the append rules run, and only when the step was
/// appended the item is added at the stream's next offset. The writer holds the file's write
/// lock, so the check and the write see one state, and offsets are dense. (The instance is
/// not marked awaited as on PostgreSQL: every terminal transition announces `closed` here.)
pub(crate) fn stream_write(
    conn: &Connection,
    now: OffsetDateTime,
    append: AppendTo<'_>,
    key: &str,
    bounds: Bounds,
) -> Result<StreamCode> {
    let journaled = conn
        .query_row_cached(
            STEP_JOURNALED,
            params![append.name, append.id, append.generation, append.step],
            |_| Ok(()),
        )
        .optional()
        .map_err(|e| store(STREAM_WRITE, e))?
        .is_some();
    if !journaled {
        let head: Option<(i64, i64, bool)> = conn
            .query_row_cached(HEAD, params![append.name, append.id, key], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
            .map_err(|e| store(STREAM_WRITE, e))?;
        let (items, bytes, closed) = head.unwrap_or((0, 0, false));
        if closed {
            return Ok(StreamCode::Closed);
        }
        if items + 1 > bounds.items_max || bytes.saturating_add(bounds.len) > bounds.bytes_max {
            return Ok(StreamCode::Full(items, bytes));
        }
    }
    let outcome = journal_append_step(conn, now, append)?;
    if let AppendCode::Appended(_) = outcome {
        let next: i64 = conn
            .query_row_cached(
                HEAD_ADVANCE,
                params![append.name, append.id, key, bounds.len, micros(now)],
                |r| r.get(0),
            )
            .map_err(|e| store(STREAM_WRITE, e))?;
        conn.execute_cached(
            ITEM_INSERT,
            params![
                append.name,
                append.id,
                key,
                next - 1,
                row::json(append.payload),
                micros(now)
            ],
        )
        .map_err(|e| store(STREAM_WRITE, e))?;
        notify::message(conn, STREAM_WRITE, append.name, append.id)?;
    }
    Ok(StreamCode::Append(outcome))
}

const HEAD_CLOSE: &str = "INSERT INTO workflow_stream_heads \
         (workflow_name, workflow_id, key, closed, updated_at) VALUES (?1, ?2, ?3, 1, ?4) \
     ON CONFLICT (workflow_name, workflow_id, key) DO UPDATE \
         SET closed = 1, updated_at = excluded.updated_at";

/// keiro_stream_close: journals a stream's close and, only when it was appended, marks the
/// stream closed (an empty one when it was never written).
pub(crate) fn stream_close(
    conn: &Connection,
    now: OffsetDateTime,
    append: AppendTo<'_>,
    key: &str,
) -> Result<AppendCode> {
    let outcome = journal_append_step(conn, now, append)?;
    if let AppendCode::Appended(_) = outcome {
        conn.execute_cached(
            HEAD_CLOSE,
            params![append.name, append.id, key, micros(now)],
        )
        .map_err(|e| store(STREAM_CLOSE, e))?;
        notify::message(conn, STREAM_CLOSE, append.name, append.id)?;
    }
    Ok(outcome)
}

const EVENT_GET_SQL: &str = "SELECT w.status, e.value, e.version, e.updated_at \
     FROM workflows w \
     LEFT JOIN workflow_events e \
       ON e.workflow_name = w.workflow_name AND e.workflow_id = w.workflow_id AND e.key = ?3 \
     WHERE w.workflow_name = ?1 AND w.workflow_id = ?2";

/// keiro_event_get: the instance's status and event `event`, in one statement; `None` for an
/// unknown instance.
pub(crate) fn event_get(
    conn: &Connection,
    name: &str,
    id: &str,
    event: &str,
) -> Result<Option<EventRead>> {
    type Found = (String, Option<String>, Option<i64>, Option<i64>);
    let found: Option<Found> = conn
        .query_row_cached(EVENT_GET_SQL, params![name, id, event], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()
        .map_err(|e| store(EVENT_GET, e))?;
    let Some((status, value, version, updated_at)) = found else {
        return Ok(None);
    };
    let event = match (value, version, updated_at) {
        (Some(value), Some(version), Some(updated_at)) => Some(EventRecord {
            key: event.to_owned(),
            value: row::value(&value, EVENT_GET)?,
            version,
            updated_at: row::instant(updated_at, EVENT_GET)?,
        }),
        _ => None,
    };
    Ok(Some(EventRead {
        status: row::status(&status, EVENT_GET)?,
        event,
    }))
}

const STREAM_READ_SQL: &str = "SELECT w.status, coalesce(h.closed, 0), s.stream_offset, s.value \
     FROM workflows w \
     LEFT JOIN workflow_stream_heads h \
       ON h.workflow_name = w.workflow_name AND h.workflow_id = w.workflow_id AND h.key = ?3 \
     LEFT JOIN (SELECT x.stream_offset, x.value FROM workflow_streams x \
                WHERE x.workflow_name = ?1 AND x.workflow_id = ?2 AND x.key = ?3 \
                  AND x.stream_offset >= ?4 \
                ORDER BY x.stream_offset LIMIT ?5) s ON 1 \
     WHERE w.workflow_name = ?1 AND w.workflow_id = ?2 \
     ORDER BY s.stream_offset";

/// keiro_stream_read: up to `limit` items of stream `stream` from offset `from`, with the
/// instance's status and whether the stream is closed, in one statement; `None` for an
/// unknown instance.
pub(crate) fn stream_read(
    conn: &Connection,
    name: &str,
    id: &str,
    stream: &str,
    from: i64,
    limit: i64,
) -> Result<Option<StreamPage>> {
    type Found = (String, bool, Option<i64>, Option<String>);
    let mut statement = conn
        .prepare_cached(STREAM_READ_SQL)
        .map_err(|e| store(STREAM_READ, e))?;
    let rows: Vec<Found> = statement
        .query_map(params![name, id, stream, from, limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .and_then(Iterator::collect)
        .map_err(|e| store(STREAM_READ, e))?;
    let Some((status, closed, _, _)) = rows.first() else {
        return Ok(None);
    };
    let mut page = StreamPage {
        status: row::status(status, STREAM_READ)?,
        closed: *closed,
        items: Vec::with_capacity(rows.len()),
    };
    for (_, _, offset, value) in &rows {
        let (Some(offset), Some(value)) = (offset, value) else {
            continue;
        };
        let offset = u64::try_from(*offset)
            .map_err(|_| malformed(STREAM_READ, format_args!("negative offset {offset}")))?;
        page.items.push(StreamItem {
            offset,
            value: row::value(value, STREAM_READ)?,
        });
    }
    Ok(Some(page))
}

const EVENTS_LIST: &str = "SELECT key, value, version, updated_at FROM workflow_events \
     WHERE workflow_name = ?1 AND workflow_id = ?2 ORDER BY key LIMIT ?3";

const STREAMS_LIST: &str = "SELECT key, next_offset, bytes, closed, updated_at \
     FROM workflow_stream_heads \
     WHERE workflow_name = ?1 AND workflow_id = ?2 ORDER BY key LIMIT ?3";

/// keiro_instance_messages: the events and the streams of an instance, by key, at most
/// `limit` of each (read in one read transaction by the caller).
pub(crate) fn instance_messages(
    conn: &Connection,
    name: &str,
    id: &str,
    limit: i64,
) -> Result<Messages> {
    let sqlite = |e| store(MESSAGES, e);
    let mut statement = conn.prepare_cached(EVENTS_LIST).map_err(sqlite)?;
    let events: Vec<(String, String, i64, i64)> = statement
        .query_map(params![name, id, limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .and_then(Iterator::collect)
        .map_err(sqlite)?;
    let mut statement = conn.prepare_cached(STREAMS_LIST).map_err(sqlite)?;
    let streams: Vec<(String, i64, i64, bool, i64)> = statement
        .query_map(params![name, id, limit], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .and_then(Iterator::collect)
        .map_err(sqlite)?;
    let count = |n: i64| {
        u64::try_from(n).map_err(|_| malformed(MESSAGES, format_args!("negative count {n}")))
    };
    let mut messages = Messages::default();
    for (key, value, version, updated_at) in events {
        messages.events.push(EventRecord {
            key,
            value: row::value(&value, MESSAGES)?,
            version,
            updated_at: row::instant(updated_at, MESSAGES)?,
        });
    }
    for (key, items, bytes, closed, updated_at) in streams {
        messages.streams.push(StreamHead {
            key,
            items: count(items)?,
            bytes: count(bytes)?,
            closed,
            updated_at: row::instant(updated_at, MESSAGES)?,
        });
    }
    Ok(messages)
}
