//! Retention of crates/postgres/src/retention.rs (plain SQL there too): one batch of expired
//! terminal instances deleted with everything they own, and the dry run's count. The rule is
//! keiro-journal's `retention` module.
//!
//! A batch is one operation of the writer, so one transaction, and it is alone in the file:
//! SQLite lets one writer at a time hold the write lock, across processes too. That makes the
//! Postgres batch's row locks unneeded here: no run, report or operator can change a candidate,
//! its parent or a wake-source row between the candidates query and the delete, so every
//! candidate goes (Postgres skips those another transaction holds). The "at most one batch at
//! a time" rule follows from the same lock; the `locked_out` answer of a second batch of the
//! same store is the store's (see `store/retention.rs`).
//!
//! A batch runs in rounds, as on Postgres: a round deletes up to the room left of the
//! candidates (expired, under an expired parent or none, no child left), oldest terminal
//! first; a round that deleted a child may have made its parent a candidate, so the next round
//! looks again while there is room. A tree thus goes leaves first, in one batch when it fits.

use keiro_journal::store::Result;
use keiro_journal::GcBatch;
use rusqlite::{params, Connection};
use time::OffsetDateTime;

use crate::error::store;
use crate::row::micros;

const GC: &str = "deleting expired instances";
const GC_ELIGIBLE: &str = "counting expired instances";

// `w` expired against ?1 (the cutoff), and its parent, if there is one, too (the parent probe
// is served by the primary key).
macro_rules! expired_under_expired_parent {
    () => {
        "w.status NOT IN ('running', 'suspended') AND w.completed_at < ?1 \
         AND NOT EXISTS (SELECT 1 FROM workflows p \
             WHERE p.workflow_name = w.parent_name AND p.workflow_id = w.parent_id \
             AND NOT (p.status NOT IN ('running', 'suspended') \
                      AND coalesce(p.completed_at < ?1, 0)))"
    };
}

/// The candidates of one round (`?1` the cutoff, `?2` the room), oldest terminal first
/// (workflows_terminal_idx); the child probe is served by workflows_list_parent_idx.
const INSTANCES_GC_CANDIDATES: &str = concat!(
    "SELECT w.workflow_name, w.workflow_id, w.parent_name IS NOT NULL FROM workflows w WHERE ",
    expired_under_expired_parent!(),
    " AND NOT EXISTS (SELECT 1 FROM workflows c \
         WHERE c.parent_name = w.workflow_name AND c.parent_id = w.workflow_id) \
     ORDER BY w.completed_at, w.workflow_name, w.workflow_id LIMIT ?2"
);

// Every table an instance owns, each delete served by the owner's index of its table. The
// journal goes first so it is counted (the workflows trigger then finds nothing), the instance
// row last (the foreign keys' cascades likewise find nothing).
const DELETE_JOURNAL: &str = "DELETE FROM journal WHERE workflow_name = ?1 AND workflow_id = ?2";
const DELETE_TIMERS: &str = "DELETE FROM timers WHERE workflow_name = ?1 AND workflow_id = ?2";
const DELETE_AWAKEABLES: &str =
    "DELETE FROM awakeables WHERE workflow_name = ?1 AND workflow_id = ?2";
const DELETE_SIGNAL_WAITERS: &str =
    "DELETE FROM signal_waiters WHERE workflow_name = ?1 AND workflow_id = ?2";
const DELETE_REMOTE_TASKS: &str =
    "DELETE FROM remote_tasks WHERE workflow_name = ?1 AND workflow_id = ?2";
const DELETE_INSTANCE: &str = "DELETE FROM workflows WHERE workflow_name = ?1 \
     AND workflow_id = ?2 AND status NOT IN ('running', 'suspended')";

/// Rows deleted by one statement, as a count.
fn deleted(conn: &Connection, sql: &str, name: &str, id: &str) -> Result<u64> {
    let n = conn
        .prepare_cached(sql)
        .and_then(|mut s| s.execute(params![name, id]))
        .map_err(|e| store(GC, e))?;
    Ok(u64::try_from(n).unwrap_or(u64::MAX))
}

/// Deletes one instance and everything it owns, counting each table.
fn instance_delete(conn: &Connection, name: &str, id: &str) -> Result<GcBatch> {
    Ok(GcBatch {
        journal: deleted(conn, DELETE_JOURNAL, name, id)?,
        timers: deleted(conn, DELETE_TIMERS, name, id)?,
        awakeables: deleted(conn, DELETE_AWAKEABLES, name, id)?,
        signal_waiters: deleted(conn, DELETE_SIGNAL_WAITERS, name, id)?,
        remote_tasks: deleted(conn, DELETE_REMOTE_TASKS, name, id)?,
        instances: deleted(conn, DELETE_INSTANCE, name, id)?,
        locked_out: false,
    })
}

/// instances_gc: deletes up to `batch` expired instances (terminal before `cutoff`) with what
/// they own, in rounds (see the module docs). Runs in the writer's transaction.
pub(crate) fn instances_gc(
    conn: &Connection,
    cutoff: OffsetDateTime,
    batch: u32,
) -> Result<GcBatch> {
    let cutoff = micros(cutoff);
    let mut total = GcBatch::default();
    let mut room = i64::from(batch);
    while room > 0 {
        let candidates: Vec<(String, String, bool)> = conn
            .prepare_cached(INSTANCES_GC_CANDIDATES)
            .and_then(|mut s| {
                s.query_map(params![cutoff, room], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect()
            })
            .map_err(|e| store(GC, e))?;
        let mut round = GcBatch::default();
        let mut deleted_a_child = false;
        for (name, id, has_parent) in &candidates {
            let one = instance_delete(conn, name, id)?;
            deleted_a_child |= *has_parent && one.instances > 0;
            round += one;
        }
        total += round;
        room = room.saturating_sub(i64::try_from(round.instances).unwrap_or(i64::MAX));
        if !deleted_a_child || round.instances == 0 {
            break;
        }
    }
    Ok(total)
}

// What a collection deletes, batch after batch: every instance the candidates query would take
// once its descendants are gone, i.e. expired under an expired parent with nothing unexpired
// below it. `held` walks up from each unexpired child through its ancestors (UNION: each once,
// so it ends).
const INSTANCES_GC_ELIGIBLE: &str = concat!(
    "WITH RECURSIVE held (name, id) AS (\
         SELECT c.parent_name, c.parent_id FROM workflows c \
         WHERE c.parent_name IS NOT NULL \
           AND NOT (c.status NOT IN ('running', 'suspended') \
                    AND coalesce(c.completed_at < ?1, 0)) \
         UNION \
         SELECT a.parent_name, a.parent_id FROM held h \
         JOIN workflows a ON a.workflow_name = h.name AND a.workflow_id = h.id \
         WHERE a.parent_name IS NOT NULL) \
     SELECT count(*) FROM workflows w WHERE ",
    expired_under_expired_parent!(),
    " AND NOT EXISTS (SELECT 1 FROM held h \
         WHERE h.name = w.workflow_name AND h.id = w.workflow_id)"
);

/// instances_gc_eligible: how many instances a collection at `cutoff` would delete now.
pub(crate) fn instances_gc_eligible(conn: &Connection, cutoff: OffsetDateTime) -> Result<u64> {
    let n: i64 = conn
        .query_row(INSTANCES_GC_ELIGIBLE, params![micros(cutoff)], |r| r.get(0))
        .map_err(|e| store(GC_ELIGIBLE, e))?;
    Ok(u64::try_from(n).unwrap_or(0))
}
