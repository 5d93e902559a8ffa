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

/// A payload place's key column that is text: its column, and whether the stores that have a
/// UUID type keep it as one (PostgreSQL's `awakeables.id`; SQLite keeps it as text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TextKey {
    /// The column.
    pub column: &'static str,
    /// Whether the column is a UUID where the store has that type (compared as text).
    pub uuid: bool,
}

/// Where the payloads of one [`PayloadPlace`] kind live, the same in every store: the table,
/// the payload column, and the key columns that pick one row among the instance's rows (the
/// instance's own `workflow_name` and `workflow_id` pick the rest). A store builds its read and
/// its rewrite of every place from [`PAYLOAD_PLACES`], so a new place is stated once, there.
///
/// ```
/// use keiro_journal::store::PAYLOAD_PLACES;
/// let journal = PAYLOAD_PLACES.iter().find(|p| p.name == "journal").expect("listed");
/// assert_eq!((journal.table, journal.column, journal.number_key), ("journal", "payload", Some("seq")));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadColumn {
    /// The place's name, as a store's read reports it (`"input"`, `"journal"`, ...).
    pub name: &'static str,
    /// The table.
    pub table: &'static str,
    /// The payload column (JSON: jsonb on PostgreSQL, text on SQLite).
    pub column: &'static str,
    /// The key column that is text, if the place has one.
    pub text_key: Option<TextKey>,
    /// The key column that is a number (a 64-bit integer), if the place has one; it comes after
    /// the text key in a rewrite's parameters.
    pub number_key: Option<&'static str>,
    /// Whether the column may be null (a null payload is not read: an output not written yet).
    pub nullable: bool,
}

const fn place(
    name: &'static str,
    table: &'static str,
    column: &'static str,
    text_key: Option<TextKey>,
    number_key: Option<&'static str>,
    nullable: bool,
) -> PayloadColumn {
    PayloadColumn {
        name,
        table,
        column,
        text_key,
        number_key,
        nullable,
    }
}

const fn text(column: &'static str) -> Option<TextKey> {
    Some(TextKey {
        column,
        uuid: false,
    })
}

/// Every place an instance's payloads are stored, one entry per [`PayloadPlace`] kind, in the
/// order a store reads them.
pub const PAYLOAD_PLACES: &[PayloadColumn] = &[
    place("input", "workflows", "input", None, None, false),
    place("output", "workflows", "output", None, None, true),
    place("journal", "journal", "payload", None, Some("seq"), false),
    place(
        "awakeable",
        "awakeables",
        "payload",
        Some(TextKey {
            column: "id",
            uuid: true,
        }),
        None,
        true,
    ),
    place(
        "task_input",
        "remote_tasks",
        "input",
        text("step_id"),
        None,
        false,
    ),
    place(
        "task_output",
        "remote_tasks",
        "output",
        text("step_id"),
        None,
        true,
    ),
    place(
        "event",
        "workflow_events",
        "value",
        text("key"),
        None,
        false,
    ),
    place(
        "stream",
        "workflow_streams",
        "value",
        text("key"),
        Some("stream_offset"),
        false,
    ),
    place(
        "update_request",
        "workflow_updates",
        "request",
        text("update_id"),
        None,
        false,
    ),
    place(
        "update_reply",
        "workflow_updates",
        "reply",
        text("update_id"),
        None,
        true,
    ),
];

impl PayloadPlace {
    /// The place of one row a store read, from the place's [`PayloadColumn::name`] and its
    /// keys (the text key, the number key).
    ///
    /// # Errors
    ///
    /// [`Error::Malformed`] for `operation` when the name is not a place's or a key the place
    /// needs is missing.
    ///
    /// ```
    /// use keiro_journal::store::PayloadPlace;
    /// let place = PayloadPlace::from_row("stream", Some("st".into()), Some(3), "reading")?;
    /// assert_eq!(place, PayloadPlace::StreamItem { key: "st".into(), offset: 3 });
    /// assert!(PayloadPlace::from_row("journal", None, None, "reading").is_err());
    /// # Ok::<(), keiro_journal::StoreError>(())
    /// ```
    pub fn from_row(
        name: &str,
        text: Option<String>,
        number: Option<i64>,
        operation: &'static str,
    ) -> Result<Self> {
        let malformed = |detail: String| Error::Malformed { operation, detail };
        let missing = || malformed(format!("payload place {name:?} without its key"));
        let text = || text.clone().ok_or_else(missing);
        let number = || number.ok_or_else(missing);
        Ok(match name {
            "input" => Self::Input,
            "output" => Self::Output,
            "journal" => Self::Journal { seq: number()? },
            "awakeable" => Self::Awakeable { id: text()? },
            "task_input" => Self::TaskInput { step_id: text()? },
            "task_output" => Self::TaskOutput { step_id: text()? },
            "event" => Self::Event { key: text()? },
            "stream" => Self::StreamItem {
                key: text()?,
                offset: number()?,
            },
            "update_request" => Self::UpdateRequest { id: text()? },
            "update_reply" => Self::UpdateReply { id: text()? },
            other => return Err(malformed(format!("unknown payload place {other:?}"))),
        })
    }

    /// The place's name in [`PAYLOAD_PLACES`].
    pub fn name(&self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::Output => "output",
            Self::Journal { .. } => "journal",
            Self::Awakeable { .. } => "awakeable",
            Self::TaskInput { .. } => "task_input",
            Self::TaskOutput { .. } => "task_output",
            Self::Event { .. } => "event",
            Self::StreamItem { .. } => "stream",
            Self::UpdateRequest { .. } => "update_request",
            Self::UpdateReply { .. } => "update_reply",
        }
    }

    /// Where this place is: its entry of [`PAYLOAD_PLACES`].
    ///
    /// ```
    /// use keiro_journal::store::PayloadPlace;
    /// assert_eq!(PayloadPlace::Output.column().table, "workflows");
    /// ```
    pub fn column(&self) -> &'static PayloadColumn {
        let name = self.name();
        PAYLOAD_PLACES
            .iter()
            .find(|place| place.name == name)
            .expect(
                "every payload place's name is listed in PAYLOAD_PLACES (a unit test checks it)",
            )
    }

    /// The place's keys: its text key, then its number key, as its [`PayloadColumn`] names them.
    pub fn keys(&self) -> (Option<&str>, Option<i64>) {
        match self {
            Self::Input | Self::Output => (None, None),
            Self::Journal { seq } => (None, Some(*seq)),
            Self::Awakeable { id } | Self::UpdateRequest { id } | Self::UpdateReply { id } => {
                (Some(id), None)
            }
            Self::TaskInput { step_id } | Self::TaskOutput { step_id } => (Some(step_id), None),
            Self::Event { key } => (Some(key), None),
            Self::StreamItem { key, offset } => (Some(key), Some(*offset)),
        }
    }
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// A row of each place, as a store's read would report it.
    fn sample(column: &PayloadColumn) -> PayloadPlace {
        let text = column.text_key.map(|_| "k".to_owned());
        let number = column.number_key.map(|_| 7);
        PayloadPlace::from_row(column.name, text, number, "test").expect("a listed place reads")
    }

    #[test]
    fn the_table_names_each_place_once() {
        let names: HashSet<&str> = PAYLOAD_PLACES.iter().map(|p| p.name).collect();
        assert_eq!(names.len(), PAYLOAD_PLACES.len(), "a name listed twice");
        let columns: HashSet<(&str, &str)> =
            PAYLOAD_PLACES.iter().map(|p| (p.table, p.column)).collect();
        assert_eq!(columns.len(), PAYLOAD_PLACES.len(), "a column listed twice");
        for column in PAYLOAD_PLACES {
            let place = sample(column);
            assert_eq!(place.name(), column.name);
            assert_eq!(
                place.column(),
                column,
                "{} maps back to its entry",
                column.name
            );
            let (text, number) = place.keys();
            assert_eq!(text.is_some(), column.text_key.is_some(), "{}", column.name);
            assert_eq!(
                number.is_some(),
                column.number_key.is_some(),
                "{}",
                column.name
            );
        }
    }

    #[test]
    fn every_place_kind_is_in_the_table() {
        // One of each variant: a new variant without an entry fails here (and `column` panics).
        let every = [
            PayloadPlace::Input,
            PayloadPlace::Output,
            PayloadPlace::Journal { seq: 1 },
            PayloadPlace::Awakeable { id: "a".into() },
            PayloadPlace::TaskInput {
                step_id: "s".into(),
            },
            PayloadPlace::TaskOutput {
                step_id: "s".into(),
            },
            PayloadPlace::Event { key: "e".into() },
            PayloadPlace::StreamItem {
                key: "st".into(),
                offset: 0,
            },
            PayloadPlace::UpdateRequest { id: "u".into() },
            PayloadPlace::UpdateReply { id: "u".into() },
        ];
        assert_eq!(every.len(), PAYLOAD_PLACES.len());
        let named: HashSet<&str> = every.iter().map(PayloadPlace::name).collect();
        assert_eq!(named.len(), every.len());
        for place in &every {
            let (text, number) = place.keys();
            let read =
                PayloadPlace::from_row(place.name(), text.map(str::to_owned), number, "test")
                    .expect("reads back");
            assert_eq!(&read, place);
        }
    }

    #[test]
    fn an_unknown_place_or_a_missing_key_is_malformed() {
        for (name, text, number) in [
            ("nowhere", None, None),
            ("journal", None, None),
            ("event", None, Some(1)),
            ("stream", Some("k".to_owned()), None),
        ] {
            let error = PayloadPlace::from_row(name, text, number, "test").unwrap_err();
            assert!(
                matches!(error, Error::Malformed { .. }),
                "{name}: {error:?}"
            );
        }
    }
}
