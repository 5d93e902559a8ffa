//! `crates/migrations/functions/message.sql`: events and streams, what a running workflow
//! publishes to its callers.
//!
//! The writes (`keiro_event_set`, `keiro_stream_write`, `keiro_stream_close`) are append-shaped:
//! the run's fenced journal step, and only when it was appended the row readers read, in one
//! transaction that notifies the instance's readers at commit. The reads
//! (`keiro_event_get`, `keiro_stream_read`, `keiro_instance_messages`) each read one snapshot.

use keiro_journal::message::{
    EventRead, EventRecord, Messages, StreamHead, StreamItem, StreamPage,
};
use keiro_journal::store::{
    encoded_len, Append, AppendOutcome, Result, StreamOutcome, StreamWrite,
};
use keiro_journal::InstanceKey;
use serde_json::Value;
use time::OffsetDateTime;

use tokio_postgres::Row;

use crate::db::Db;
use crate::ops::journal::{append_outcome, encoded_step, AppendArgs};
use crate::ops::span_ms;
use crate::row::{self, column, count, in_batch_order, malformed};

const EVENT_SET: &str = "setting an event";
const STREAM_WRITE: &str = "writing to a stream";
const STREAM_CLOSE: &str = "closing a stream";
const EVENT_GET: &str = "reading an event";
const STREAM_READ: &str = "reading a stream";
const MESSAGES: &str = "listing an instance's events and streams";
const WATCH: &str = "marking an instance watched";

const KEIRO_EVENT_SET: &str = "SELECT outcome, recorded, marker \
     FROM keiro_event_set($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// `keiro_event_set`: the event step `append`, and the event's new value.
pub(crate) async fn event_set(db: &Db, append: &Append, key: &str) -> Result<AppendOutcome> {
    let args = AppendArgs::new(append, encoded_step(append, EVENT_SET)?);
    let mut params = args.params();
    params.push(&key);
    let row = db.query_one(EVENT_SET, KEIRO_EVENT_SET, &params).await?;
    append_outcome(&row, EVENT_SET, &append.key, append.fence.as_ref())
}

const KEIRO_STREAM_WRITE: &str = "SELECT outcome, recorded, marker, stream_items, stream_bytes \
     FROM keiro_stream_write($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";

/// `keiro_stream_write`: the stream step `append`, and the item at the stream's next offset.
pub(crate) async fn stream_write(
    db: &Db,
    append: &Append,
    write: &StreamWrite,
) -> Result<StreamOutcome> {
    let encoded = encoded_step(append, STREAM_WRITE)?;
    let len = i64::try_from(encoded_len(&encoded.payload)).unwrap_or(i64::MAX);
    let items_max = i64::try_from(write.items_max).unwrap_or(i64::MAX);
    let bytes_max = i64::try_from(write.bytes_max).unwrap_or(i64::MAX);
    let args = AppendArgs::new(append, encoded);
    let mut params = args.params();
    params.push(&write.key);
    params.push(&len);
    params.push(&items_max);
    params.push(&bytes_max);
    let row = db
        .query_one(STREAM_WRITE, KEIRO_STREAM_WRITE, &params)
        .await?;
    stream_outcome(&row, STREAM_WRITE, append)
}

/// Reads a stream write's `outcome, recorded, marker, stream_items, stream_bytes`.
fn stream_outcome(row: &Row, operation: &'static str, append: &Append) -> Result<StreamOutcome> {
    let outcome: String = column(row, "outcome", operation)?;
    match outcome.as_str() {
        "stream_closed" => Ok(StreamOutcome::Closed),
        "stream_full" => Ok(StreamOutcome::Full {
            items: count(row, "stream_items", operation)?,
            bytes: count(row, "stream_bytes", operation)?,
        }),
        _ => append_outcome(row, operation, &append.key, append.fence.as_ref())
            .map(StreamOutcome::Append),
    }
}

/// A write of an event or a stream, as the message lane carries it: which of
/// `keiro_event_set`, `keiro_stream_write` and `keiro_stream_close` runs it, with its own
/// arguments after the append's.
#[derive(Debug, Clone)]
pub(crate) enum MessageWrite {
    /// `keiro_event_set` of this event key.
    Event(String),
    /// `keiro_stream_write` with these bounds.
    Stream(StreamWrite),
    /// `keiro_stream_close` of this stream key.
    Close(String),
}

impl MessageWrite {
    /// The event's or the stream's key.
    fn key(&self) -> &str {
        match self {
            Self::Event(key) | Self::Close(key) => key,
            Self::Stream(write) => &write.key,
        }
    }

    /// The `p_ops` value of `keiro_messages_write`.
    fn op(&self) -> &'static str {
        match self {
            Self::Event(_) => "event",
            Self::Stream(_) => "stream",
            Self::Close(_) => "close",
        }
    }

    /// The operation, for errors.
    pub(crate) fn operation(&self) -> &'static str {
        match self {
            Self::Event(_) => EVENT_SET,
            Self::Stream(_) => STREAM_WRITE,
            Self::Close(_) => STREAM_CLOSE,
        }
    }
}

/// One write alone: its own function. An event's or a close's outcome is an
/// [`StreamOutcome::Append`].
pub(crate) async fn message_write(
    db: &Db,
    append: &Append,
    write: &MessageWrite,
) -> Result<StreamOutcome> {
    match write {
        MessageWrite::Event(key) => event_set(db, append, key).await.map(StreamOutcome::Append),
        MessageWrite::Stream(write) => stream_write(db, append, write).await,
        MessageWrite::Close(key) => stream_close(db, append, key)
            .await
            .map(StreamOutcome::Append),
    }
}

/// The operation of a batch of message writes, for errors.
pub(crate) const MESSAGES_WRITE: &str = "writing events and streams";

const KEIRO_MESSAGES_WRITE: &str =
    "SELECT n, outcome, recorded, marker, stream_items, stream_bytes \
     FROM keiro_messages_write($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";

/// Writes of several runs in one statement and one transaction: `keiro_messages_write`,
/// answered request by request in the order given; `None` for a request whose instance row
/// another transaction held (sent alone by the caller).
pub(crate) async fn messages_write(
    db: &Db,
    writes: &[(&Append, &MessageWrite)],
) -> Result<Vec<Option<Result<StreamOutcome>>>> {
    let mut encoded = Vec::with_capacity(writes.len());
    for (append, write) in writes {
        encoded.push(encoded_step(append, write.operation())?);
    }
    let ops: Vec<&str> = writes.iter().map(|(_, w)| w.op()).collect();
    let names: Vec<&str> = writes.iter().map(|(a, _)| a.key.name.as_str()).collect();
    let ids: Vec<&str> = writes.iter().map(|(a, _)| a.key.id.as_str()).collect();
    let generations: Vec<Option<i32>> = writes.iter().map(|(a, _)| a.generation).collect();
    let steps: Vec<&str> = encoded.iter().map(|e| e.step_name.as_str()).collect();
    let kinds: Vec<&str> = encoded.iter().map(|e| e.kind).collect();
    let payloads: Vec<&Value> = encoded.iter().map(|e| &e.payload).collect();
    let owners: Vec<Option<&str>> = writes
        .iter()
        .map(|(a, _)| a.fence.as_ref().map(|f| f.owner.as_str()))
        .collect();
    let epochs: Vec<Option<i64>> = writes
        .iter()
        .map(|(a, _)| a.fence.as_ref().map(|f| f.epoch))
        .collect();
    let renew_ms: Vec<Option<i64>> = writes.iter().map(|(a, _)| a.renew.map(span_ms)).collect();
    let keys: Vec<&str> = writes.iter().map(|(_, w)| w.key()).collect();
    let bound = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let stream = |f: fn(&StreamWrite) -> u64| -> Vec<Option<i64>> {
        writes
            .iter()
            .map(|(_, w)| match w {
                MessageWrite::Stream(s) => Some(bound(f(s))),
                _ => None,
            })
            .collect()
    };
    let items_max = stream(|s| s.items_max);
    let bytes_max = stream(|s| s.bytes_max);
    let lens: Vec<Option<i64>> = writes
        .iter()
        .zip(&encoded)
        .map(|((_, w), e)| {
            matches!(w, MessageWrite::Stream(_))
                .then(|| i64::try_from(encoded_len(&e.payload)).unwrap_or(i64::MAX))
        })
        .collect();
    let rows = db
        .query(
            MESSAGES_WRITE,
            KEIRO_MESSAGES_WRITE,
            &[
                &ops,
                &names,
                &ids,
                &generations,
                &steps,
                &kinds,
                &payloads,
                &owners,
                &epochs,
                &renew_ms,
                &keys,
                &lens,
                &items_max,
                &bytes_max,
            ],
        )
        .await?;
    Ok(in_batch_order(
        &rows,
        writes.len(),
        MESSAGES_WRITE,
        "n",
        |row, i| match column::<String>(row, "outcome", MESSAGES_WRITE) {
            Ok(outcome) if outcome == "busy" => None,
            _ => Some(stream_outcome(row, writes[i].1.operation(), writes[i].0)),
        },
    ))
}

const KEIRO_STREAM_CLOSE: &str = "SELECT outcome, recorded, marker \
     FROM keiro_stream_close($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

/// `keiro_stream_close`: the close step `append`, and the stream marked closed.
pub(crate) async fn stream_close(db: &Db, append: &Append, key: &str) -> Result<AppendOutcome> {
    let args = AppendArgs::new(append, encoded_step(append, STREAM_CLOSE)?);
    let mut params = args.params();
    params.push(&key);
    let row = db
        .query_one(STREAM_CLOSE, KEIRO_STREAM_CLOSE, &params)
        .await?;
    append_outcome(&row, STREAM_CLOSE, &append.key, append.fence.as_ref())
}

const KEIRO_EVENT_GET: &str =
    "SELECT status, value, version, updated_at FROM keiro_event_get($1, $2, $3)";

/// `keiro_event_get`: the instance's status and the event; `None` for an unknown instance.
pub(crate) async fn event_get(
    db: &Db,
    key: &InstanceKey,
    event: &str,
) -> Result<Option<EventRead>> {
    let rows = db
        .query(
            EVENT_GET,
            KEIRO_EVENT_GET,
            &[&key.name.as_str(), &key.id.as_str(), &event],
        )
        .await?;
    let Some(found) = rows.first() else {
        return Ok(None);
    };
    let status: String = column(found, "status", EVENT_GET)?;
    let value: Option<Value> = column(found, "value", EVENT_GET)?;
    let event = match value {
        None => None,
        Some(value) => Some(EventRecord {
            key: event.to_owned(),
            value,
            version: column(found, "version", EVENT_GET)?,
            updated_at: column(found, "updated_at", EVENT_GET)?,
        }),
    };
    Ok(Some(EventRead {
        status: row::status(&status, EVENT_GET)?,
        event,
    }))
}

const KEIRO_STREAM_READ: &str =
    "SELECT status, closed, stream_offset, value FROM keiro_stream_read($1, $2, $3, $4, $5)";

/// `keiro_stream_read`: a page of the stream from `from`; `None` for an unknown instance.
pub(crate) async fn stream_read(
    db: &Db,
    key: &InstanceKey,
    stream: &str,
    from: u64,
    limit: u32,
) -> Result<Option<StreamPage>> {
    let from = i64::try_from(from).unwrap_or(i64::MAX);
    let limit = i32::try_from(limit).unwrap_or(i32::MAX);
    let rows = db
        .query(
            STREAM_READ,
            KEIRO_STREAM_READ,
            &[&key.name.as_str(), &key.id.as_str(), &stream, &from, &limit],
        )
        .await?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let status: String = column(first, "status", STREAM_READ)?;
    let mut page = StreamPage {
        status: row::status(&status, STREAM_READ)?,
        closed: column(first, "closed", STREAM_READ)?,
        items: Vec::with_capacity(rows.len()),
    };
    for found in &rows {
        let offset: Option<i64> = column(found, "stream_offset", STREAM_READ)?;
        let Some(offset) = offset else { continue };
        let offset = u64::try_from(offset)
            .map_err(|_| malformed(STREAM_READ, format_args!("negative offset {offset}")))?;
        page.items.push(StreamItem {
            offset,
            value: column(found, "value", STREAM_READ)?,
        });
    }
    Ok(Some(page))
}

const KEIRO_INSTANCE_MESSAGES: &str = "SELECT kind, key, value, version, items, bytes, closed, \
     updated_at FROM keiro_instance_messages($1, $2, $3)";

/// `keiro_instance_messages`: the events and streams of `key`, at most `limit` of each.
pub(crate) async fn instance_messages(db: &Db, key: &InstanceKey, limit: u32) -> Result<Messages> {
    let limit = i32::try_from(limit).unwrap_or(i32::MAX);
    let rows = db
        .query(
            MESSAGES,
            KEIRO_INSTANCE_MESSAGES,
            &[&key.name.as_str(), &key.id.as_str(), &limit],
        )
        .await?;
    let mut messages = Messages::default();
    for found in &rows {
        let kind: String = column(found, "kind", MESSAGES)?;
        let name: String = column(found, "key", MESSAGES)?;
        let updated_at: OffsetDateTime = column(found, "updated_at", MESSAGES)?;
        if kind == "event" {
            messages.events.push(EventRecord {
                key: name,
                value: column(found, "value", MESSAGES)?,
                version: column(found, "version", MESSAGES)?,
                updated_at,
            });
        } else {
            messages.streams.push(StreamHead {
                key: name,
                items: count(found, "items", MESSAGES)?,
                bytes: count(found, "bytes", MESSAGES)?,
                closed: column(found, "closed", MESSAGES)?,
                updated_at,
            });
        }
    }
    Ok(messages)
}

// Marks an instance watched (its writes notify `msg:`) and awaited (its close notifies
// `done:`), for a reader that was not woken in its own process. Neither column is indexed, so
// the new row version can be HOT.
const INSTANCE_WATCH: &str = "WITH marked AS ( \
         UPDATE workflows SET watched = true, awaited = true \
         WHERE workflow_name = $1 AND workflow_id = $2 \
           AND status IN ('running', 'suspended') AND NOT (watched AND awaited) \
         RETURNING 1) \
     SELECT (SELECT count(*) FROM marked) > 0 \
         OR EXISTS (SELECT 1 FROM workflows \
                    WHERE workflow_name = $1 AND workflow_id = $2 \
                      AND status IN ('running', 'suspended')) AS live";

/// Marks `key` watched and awaited; `false` when it is not live (closed, or not started):
/// nothing it does will notify then.
pub(crate) async fn instance_watch(db: &Db, key: &InstanceKey) -> Result<bool> {
    let row = db
        .query_one(
            WATCH,
            INSTANCE_WATCH,
            &[&key.name.as_str(), &key.id.as_str()],
        )
        .await?;
    column(&row, "live", WATCH)
}
