//! An instance's stored payloads, as an operator's re-encryption reads and rewrites them
//! (`keiro reencrypt`, `Keiro::reencrypt`): every payload column of every row the instance owns,
//! each with where it is.
//!
//! A rewrite changes how a payload is stored, never what it says: the facade rewrites a value
//! sealed with an old key as the same value sealed with the current one. So it is the one
//! update of a journal row: the journal's history (which steps, in which order, with which
//! values) is unchanged. Each rewrite applies only while the stored value is still the one
//! read, so a payload a run or another operator changed meanwhile is left alone (and counted
//! as not rewritten).

use std::fmt;

use serde_json::Value;

use crate::model::store_error::Error;
use crate::InstanceKey;

/// `Result` with the store's error.
type Result<T, E = Error> = std::result::Result<T, E>;

/// Where one of an instance's payloads is stored. Exhaustive: every store matches on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadPlace {
    /// The instance row's input.
    Input,
    /// The instance row's output.
    Output,
    /// The payload of the journal row with this sequence number.
    Journal {
        /// The row's global sequence number.
        seq: i64,
    },
    /// The payload of an awakeable the instance owns.
    Awakeable {
        /// The awakeable's id, as text.
        id: String,
    },
    /// A remote task's input.
    TaskInput {
        /// The task's step id.
        step_id: String,
    },
    /// A remote task's output.
    TaskOutput {
        /// The task's step id.
        step_id: String,
    },
    /// An event's current value.
    Event {
        /// The event's key.
        key: String,
    },
    /// A stream item.
    StreamItem {
        /// The stream's key.
        key: String,
        /// The item's offset.
        offset: i64,
    },
    /// An update's request.
    UpdateRequest {
        /// The update id.
        id: String,
    },
    /// An update's answer (`{"ok": reply}`, `{"rejected": ..}` or `{"status": ..}`).
    UpdateReply {
        /// The update id.
        id: String,
    },
}

/// One stored payload of an instance.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredPayload {
    /// Where it is.
    pub place: PayloadPlace,
    /// The value as stored.
    pub value: Value,
}

/// A payload to rewrite: at `place`, `old` (as read) becomes `new`.
#[derive(Debug, Clone, PartialEq)]
pub struct PayloadRewrite {
    /// Where.
    pub place: PayloadPlace,
    /// The value read; the rewrite applies only while it is still stored.
    pub old: Value,
    /// The value to store.
    pub new: Value,
}

/// Reading and rewriting an instance's stored payloads (plain statements in both stores).
#[async_trait::async_trait]
pub trait PayloadStore: Send + Sync + fmt::Debug + 'static {
    /// Every payload `key` owns, in every table: the instance row's input and output, its
    /// journal (every generation), its awakeables, remote tasks, events, stream items and
    /// updates. Empty for an unknown instance. Null payloads (an output not written yet) are
    /// left out.
    async fn payloads_read(&self, key: &InstanceKey) -> Result<Vec<StoredPayload>>;

    /// Applies `rewrites` to `key`'s payloads in one transaction, each only while its place
    /// still holds its `old` value; returns how many were applied.
    async fn payloads_rewrite(&self, key: &InstanceKey, rewrites: &[PayloadRewrite])
        -> Result<u64>;
}
