//! Events and streams: what a running workflow publishes to its callers before it ends.
//!
//! An **event** is the latest value under a key (`ctx.set_event`); a reader gets the current
//! value, or waits for the first one. A **stream** is an append-only sequence under a key
//! (`ctx.write_stream`), numbered from offset 0 without gaps, that a reader follows from any
//! offset until it is closed (`ctx.close_stream`) or the run ends.
//!
//! Both are written by the run only, each write journaled as a step of its own (kinds
//! [`StepKind::Event`](crate::StepKind::Event) and [`StepKind::Stream`](crate::StepKind::Stream))
//! in the same transaction as the row a reader reads: replay finds the journal entry and writes
//! nothing again, and a write the run went past is never lost. This module holds the plain data
//! of both: the keys' rule, the stream budget, and the records a reader gets.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;

use crate::model::id::ID_LEN_MAX;
use crate::{IdError, Status};

/// The journal step-name prefix of an event's write: `event:<key>#<n>`, the `n`-th write of
/// `key` in the generation.
pub const EVENT_STEP_PREFIX: &str = "event:";

/// The journal step-name prefix of a stream's append (`stream:<key>#<n>`) and close
/// (`stream:<key>#end`).
pub const STREAM_STEP_PREFIX: &str = "stream:";

/// The default of [`StreamBudget::items`]: items one stream may hold.
pub const STREAM_ITEMS_MAX_DEFAULT: u64 = 1_000_000;
/// The default of [`StreamBudget::bytes`]: encoded bytes one stream may hold.
pub const STREAM_BYTES_MAX_DEFAULT: u64 = 256 * 1024 * 1024;
/// The default of [`StreamBudget::generation_items`]: stream items one generation may write.
pub const STREAM_GENERATION_ITEMS_MAX_DEFAULT: u64 = 25_000;
/// The default of [`StreamBudget::generation_bytes`]: encoded stream bytes one generation may
/// write.
pub const STREAM_GENERATION_BYTES_MAX_DEFAULT: u64 = 32 * 1024 * 1024;

/// How much a run may write to its streams. A write past a bound is refused with
/// [`WorkflowError::StreamFull`](crate::WorkflowError::StreamFull) and writes nothing.
///
/// The per-stream bounds count the whole stream (every generation's appends); the
/// per-generation bounds count what one generation appended to all its streams, so a long
/// stream is written across generations (`ctx.continue_as_new`), as a long journal is. Each
/// append is also a journal entry, so the [`JournalBudget`](crate::JournalBudget) applies too.
///
/// ```
/// let budget = keiro_journal::message::StreamBudget { items: 10, ..Default::default() };
/// assert_eq!(budget.items, 10);
/// assert_eq!(budget.generation_items, keiro_journal::message::STREAM_GENERATION_ITEMS_MAX_DEFAULT);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamBudget {
    /// Items one stream may hold. Defaults to [`STREAM_ITEMS_MAX_DEFAULT`].
    pub items: u64,
    /// Encoded bytes one stream may hold. Defaults to [`STREAM_BYTES_MAX_DEFAULT`].
    pub bytes: u64,
    /// Stream items one generation may append. Defaults to
    /// [`STREAM_GENERATION_ITEMS_MAX_DEFAULT`].
    pub generation_items: u64,
    /// Encoded stream bytes one generation may append. Defaults to
    /// [`STREAM_GENERATION_BYTES_MAX_DEFAULT`].
    pub generation_bytes: u64,
}

impl Default for StreamBudget {
    fn default() -> Self {
        Self {
            items: STREAM_ITEMS_MAX_DEFAULT,
            bytes: STREAM_BYTES_MAX_DEFAULT,
            generation_items: STREAM_GENERATION_ITEMS_MAX_DEFAULT,
            generation_bytes: STREAM_GENERATION_BYTES_MAX_DEFAULT,
        }
    }
}

/// Checks an event's or a stream's key: not empty, at most [`ID_LEN_MAX`] bytes, no control
/// character.
///
/// ```
/// use keiro_journal::store::validate_message_key;
/// assert!(validate_message_key("progress").is_ok());
/// assert!(validate_message_key("").is_err());
/// assert!(validate_message_key(&"k".repeat(201)).is_err());
/// ```
///
/// # Errors
///
/// The [`IdError`] naming the broken rule.
pub fn validate_message_key(key: &str) -> Result<(), IdError> {
    const WHAT: &str = "event or stream key";
    if key.is_empty() {
        return Err(IdError::Empty { what: WHAT });
    }
    if key.len() > ID_LEN_MAX {
        return Err(IdError::TooLong {
            what: WHAT,
            len: key.len(),
        });
    }
    if let Some(ch) = key.chars().find(|c| c.is_control()) {
        return Err(IdError::ForbiddenChar {
            what: WHAT,
            value: key.to_owned(),
            ch,
        });
    }
    Ok(())
}

/// The journal step of the `n`-th write (from 1) of `key` under `prefix`.
pub(crate) fn message_step(prefix: &str, key: &str, n: u32) -> String {
    format!("{prefix}{key}#{n}")
}

/// The journal step of a stream's close.
pub(crate) fn stream_close_step(key: &str) -> String {
    format!("{STREAM_STEP_PREFIX}{key}#end")
}

/// An event's current value, as a reader gets it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// The event's key.
    pub key: String,
    /// Its latest value.
    pub value: Value,
    /// How many times it was set (1 for the first value).
    pub version: i64,
    /// When it was last set (the store's clock).
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// What [`InspectStore::event_get`](crate::InspectStore::event_get) read, in one snapshot: the
/// instance's status and the event, if it was set.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRead {
    /// The instance's status: a terminal run will never set an event it has not set.
    pub status: Status,
    /// The event, `None` until first set.
    pub event: Option<EventRecord>,
}

/// One item of a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamItem {
    /// Its offset: 0 for the first item, then one more for each.
    pub offset: u64,
    /// Its value.
    pub value: Value,
}

/// A page of a stream, read in one snapshot with the stream's and the instance's state.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamPage {
    /// The instance's status.
    pub status: Status,
    /// Whether the run closed the stream.
    pub closed: bool,
    /// The items from the offset asked for, in order, at most the limit asked for.
    pub items: Vec<StreamItem>,
}

impl StreamPage {
    /// Whether nothing will follow what was read up to the end of this page: the stream is
    /// closed or the run is terminal (a run that ends ends its streams), and this page was
    /// not cut by its limit.
    pub fn ends(&self, limit: usize) -> bool {
        (self.closed || self.status.is_terminal()) && self.items.len() < limit
    }
}

/// A stream's state, as `keiro show` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamHead {
    /// The stream's key.
    pub key: String,
    /// How many items it holds (its next offset).
    pub items: u64,
    /// Their encoded bytes.
    pub bytes: u64,
    /// Whether the run closed it.
    pub closed: bool,
    /// When it was last written or closed (the store's clock).
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

/// An instance's events and streams ([`InspectStore::instance_messages`](crate::InspectStore::instance_messages)).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Messages {
    /// Its events by key.
    pub events: Vec<EventRecord>,
    /// Its streams by key.
    pub streams: Vec<StreamHead>,
}
