//! [`SqliteStore`]'s events and streams (`JournalStore::event_set`, `stream_write`,
//! `stream_close` and `InspectStore::event_get`, `stream_read`, `instance_messages`), over the
//! rules of the crate's `message` module.

use keiro_journal::message::{EventRead, Messages, StreamPage};
use keiro_journal::store::{
    encoded_len, Append, AppendOutcome, Result, StreamOutcome, StreamWrite,
};
use keiro_journal::InstanceKey;

use crate::message::{self, Bounds, StreamCode};
use crate::storable;

use super::journal::{append_outcome, append_to, encoded_step};
use super::SqliteStore;

const EVENT_SET: &str = "setting an event";
const STREAM_WRITE: &str = "writing to a stream";
const STREAM_CLOSE: &str = "closing a stream";
const EVENT_GET: &str = "reading an event";
const STREAM_READ: &str = "reading a stream";
const MESSAGES: &str = "listing an instance's events and streams";

/// The most events, and the most streams, `instance_messages` lists.
const MESSAGES_LIMIT: i64 = 1000;

impl SqliteStore {
    /// Journals the event step `append` and sets event `key` to its value, in one
    /// transaction (`JournalStore::event_set`).
    ///
    /// # Errors
    ///
    /// As `journal_append`; `ValueRefused` for a key or value holding a NUL.
    pub async fn event_set(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        let encoded = encoded_step(append, EVENT_SET)?;
        storable::append(EVENT_SET, append)?;
        storable::text(EVENT_SET, "event key", key)?;
        let (append, key) = (append.clone(), key.to_owned());
        self.inner
            .writer
            .write(EVENT_SET, move |conn, now| {
                let code = message::event_set(conn, now, append_to(&append, &encoded), &key)?;
                append_outcome(code, &append.key, append.fence.as_ref())
            })
            .await
    }

    /// Journals the stream step `append` and adds its value to stream `write.key` at its next
    /// offset, in one transaction, unless the stream is closed or full
    /// (`JournalStore::stream_write`).
    ///
    /// # Errors
    ///
    /// As `journal_append`; `ValueRefused` for a key or value holding a NUL.
    pub async fn stream_write(
        &self,
        append: &Append,
        write: &StreamWrite,
    ) -> Result<StreamOutcome> {
        let encoded = encoded_step(append, STREAM_WRITE)?;
        storable::append(STREAM_WRITE, append)?;
        storable::text(STREAM_WRITE, "stream key", &write.key)?;
        let bounds = Bounds {
            len: i64::try_from(encoded_len(&encoded.payload)).unwrap_or(i64::MAX),
            items_max: i64::try_from(write.items_max).unwrap_or(i64::MAX),
            bytes_max: i64::try_from(write.bytes_max).unwrap_or(i64::MAX),
        };
        let (append, key) = (append.clone(), write.key.clone());
        self.inner
            .writer
            .write(STREAM_WRITE, move |conn, now| {
                let to = append_to(&append, &encoded);
                match message::stream_write(conn, now, to, &key, bounds)? {
                    StreamCode::Closed => Ok(StreamOutcome::Closed),
                    StreamCode::Full(items, bytes) => Ok(StreamOutcome::Full {
                        items: u64::try_from(items).unwrap_or(0),
                        bytes: u64::try_from(bytes).unwrap_or(0),
                    }),
                    StreamCode::Append(code) => {
                        append_outcome(code, &append.key, append.fence.as_ref())
                            .map(StreamOutcome::Append)
                    }
                }
            })
            .await
    }

    /// Journals the close step `append` and marks stream `key` closed, in one transaction
    /// (`JournalStore::stream_close`).
    ///
    /// # Errors
    ///
    /// As `journal_append`; `ValueRefused` for a key holding a NUL.
    pub async fn stream_close(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        let encoded = encoded_step(append, STREAM_CLOSE)?;
        storable::append(STREAM_CLOSE, append)?;
        storable::text(STREAM_CLOSE, "stream key", key)?;
        let (append, key) = (append.clone(), key.to_owned());
        self.inner
            .writer
            .write(STREAM_CLOSE, move |conn, now| {
                let code = message::stream_close(conn, now, append_to(&append, &encoded), &key)?;
                append_outcome(code, &append.key, append.fence.as_ref())
            })
            .await
    }

    /// Event `event` of `key` with the instance's status; `None` for an unknown instance
    /// (`InspectStore::event_get`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn event_get(&self, key: &InstanceKey, event: &str) -> Result<Option<EventRead>> {
        let (key, event) = (key.clone(), event.to_owned());
        self.read(EVENT_GET, move |conn, _| {
            message::event_get(conn, key.name.as_str(), key.id.as_str(), &event)
        })
        .await
    }

    /// A page of stream `stream` of `key` from offset `from`; `None` for an unknown instance
    /// (`InspectStore::stream_read`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn stream_read(
        &self,
        key: &InstanceKey,
        stream: &str,
        from: u64,
        limit: u32,
    ) -> Result<Option<StreamPage>> {
        let (key, stream) = (key.clone(), stream.to_owned());
        let from = i64::try_from(from).unwrap_or(i64::MAX);
        self.read(STREAM_READ, move |conn, _| {
            message::stream_read(
                conn,
                key.name.as_str(),
                key.id.as_str(),
                &stream,
                from,
                i64::from(limit),
            )
        })
        .await
    }

    /// The events and streams of `key` (`InspectStore::instance_messages`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instance_messages(&self, key: &InstanceKey) -> Result<Messages> {
        let key = key.clone();
        self.read(MESSAGES, move |conn, _| {
            message::instance_messages(conn, key.name.as_str(), key.id.as_str(), MESSAGES_LIMIT)
        })
        .await
    }
}
