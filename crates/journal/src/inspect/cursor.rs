//! The list's keyset cursor: where a page ends, as an opaque string the next request hands
//! back.

use std::fmt;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::{FilterError, InstanceSummary, ListOrder};
use crate::store::contract::Result;
use crate::InstanceKey;

/// Where a page ends: the last row's start time and key. The next page starts strictly after
/// it. Serialized as an opaque string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The last row's `created_at`.
    pub created_at: OffsetDateTime,
    /// The last row's key.
    pub key: InstanceKey,
}

/// The version tag inside every cursor, so a later layout can refuse an old one by name.
const CURSOR_VERSION: &str = "v1";

impl Cursor {
    /// The cursor just after `instance`.
    pub fn after(instance: &InstanceSummary) -> Self {
        Self {
            created_at: instance.created_at,
            key: instance.key.clone(),
        }
    }

    /// The opaque text handed to callers: hex of `v1:<unix nanos>:<name>:<id>` (names and ids
    /// never contain `:`).
    pub fn encode(&self) -> String {
        let text = format!(
            "{CURSOR_VERSION}:{}:{}:{}",
            self.created_at.unix_timestamp_nanos(),
            self.key.name,
            self.key.id
        );
        text.bytes().map(|byte| format!("{byte:02x}")).collect()
    }

    /// Reads a cursor handed out by [`encode`](Self::encode).
    ///
    /// # Errors
    ///
    /// [`FilterError::MalformedCursor`] for anything else.
    ///
    /// ```
    /// use keiro_journal::Cursor;
    /// assert!(Cursor::parse("not-a-cursor").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Self, FilterError> {
        let malformed = |reason| FilterError::MalformedCursor { reason };
        if text.len() % 2 != 0 || text.len() > 4 * crate::ID_LEN_MAX {
            return Err(malformed("wrong length"));
        }
        let bytes = (0..text.len())
            .step_by(2)
            .map(|at| {
                text.get(at..at + 2)
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or(malformed("not hexadecimal"))?;
        let text = String::from_utf8(bytes).map_err(|_| malformed("not UTF-8"))?;
        let mut parts = text.splitn(4, ':');
        if parts.next() != Some(CURSOR_VERSION) {
            return Err(malformed("unknown version"));
        }
        let nanos: i128 = parts
            .next()
            .and_then(|nanos| nanos.parse().ok())
            .ok_or(malformed("bad time"))?;
        let created_at =
            OffsetDateTime::from_unix_timestamp_nanos(nanos).map_err(|_| malformed("bad time"))?;
        let (Some(name), Some(id)) = (parts.next(), parts.next()) else {
            return Err(malformed("missing key"));
        };
        let key = InstanceKey::parse(name, id).map_err(|_| malformed("bad key"))?;
        Ok(Self { created_at, key })
    }

    /// Whether a row at `(created_at, key)` comes strictly after this cursor in `order`.
    pub fn precedes(
        &self,
        order: ListOrder,
        created_at: OffsetDateTime,
        key: &InstanceKey,
    ) -> bool {
        let row = (created_at, key);
        let cursor = (self.created_at, &self.key);
        match order {
            ListOrder::NewestFirst => row < cursor,
            ListOrder::OldestFirst => row > cursor,
        }
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

impl Serialize for Cursor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.encode())
    }
}

impl<'de> Deserialize<'de> for Cursor {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}
