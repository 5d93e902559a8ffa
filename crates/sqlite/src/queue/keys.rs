//! The skip scan of the keys with work waiting on a queue, for run admission (the parent
//! module) and remote task claims (`remote::claim`) alike: each side names the three
//! statements over its own per-key waiting index.

use keiro_journal::store::Result;
use rusqlite::{Connection, OptionalExtension};

use crate::cached::Cached;
use crate::error::store;

/// The statements of one skip scan: the first key waiting (`?1` the queue), the next after
/// one (`?2`), and whether anything waits with no key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyScan {
    pub(crate) first: &'static str,
    pub(crate) next: &'static str,
    pub(crate) none_waiting: &'static str,
}

/// Every key with work waiting on `queue`, ascending, then `None` when work with no key waits.
pub(crate) fn waiting_keys(
    conn: &Connection,
    queue: &str,
    scan: KeyScan,
    operation: &'static str,
) -> Result<Vec<Option<String>>> {
    let next = |sql: &str, after: Option<&str>| -> Result<Option<String>> {
        let answer = match after {
            None => conn.query_row_cached(sql, [queue], |r| r.get(0)),
            Some(after) => conn.query_row_cached(sql, [queue, after], |r| r.get(0)),
        };
        answer.optional().map_err(|e| store(operation, e))
    };
    let mut keys = Vec::new();
    let mut key = next(scan.first, None)?;
    while let Some(found) = key {
        key = next(scan.next, Some(&found))?;
        keys.push(Some(found));
    }
    let none: bool = conn
        .query_row_cached(scan.none_waiting, [queue], |r| r.get(0))
        .map_err(|e| store(operation, e))?;
    if none {
        keys.push(None);
    }
    Ok(keys)
}
