//! queue.sql's `keiro_queue_held` and `keiro_queue_admitted_since`: what a queue's limits count,
//! for run admission (the parent module) and remote task claims (`remote::claim`) alike, so a
//! queue that runs and remote steps share keeps one limit.

use keiro_journal::store::Result;
use rusqlite::{params, Connection};

use crate::cached::Cached;
use crate::error::store;

/// Slots held by admitted runs, served by `workflows_queue_slots_idx`.
const RUNS_HELD: &str = "SELECT count(*) FROM workflows INDEXED BY workflows_queue_slots_idx \
     WHERE queue = ?1 AND queue_admitted AND status IN ('running', 'suspended')";

const RUNS_HELD_BY: &str = "SELECT count(*) FROM workflows INDEXED BY workflows_queue_slots_idx \
     WHERE queue = ?1 AND queue_admitted AND status IN ('running', 'suspended') \
       AND lease_owner = ?2";

/// Slots held by one key's runs (`IS`: a NULL key is a key of its own).
const RUNS_KEY_HELD: &str = "SELECT count(*) FROM workflows INDEXED BY workflows_queue_slots_idx \
     WHERE queue = ?1 AND queue_admitted AND status IN ('running', 'suspended') \
       AND queue_key IS ?2";

/// Slots held by claimed tasks whose claim has not expired, served by
/// `remote_tasks_queue_slots_idx`.
const TASKS_HELD: &str =
    "SELECT count(*) FROM remote_tasks INDEXED BY remote_tasks_queue_slots_idx \
     WHERE queue = ?1 AND status = 'running' AND queue IS NOT NULL AND claim_expires_at > ?2";

const TASKS_HELD_BY: &str =
    "SELECT count(*) FROM remote_tasks INDEXED BY remote_tasks_queue_slots_idx \
     WHERE queue = ?1 AND status = 'running' AND queue IS NOT NULL AND claim_expires_at > ?2 \
       AND claimed_by = ?3";

const TASKS_KEY_HELD: &str =
    "SELECT count(*) FROM remote_tasks INDEXED BY remote_tasks_queue_slots_idx \
     WHERE queue = ?1 AND status = 'running' AND queue IS NOT NULL AND claim_expires_at > ?2 \
       AND queue_key IS ?3";

/// First admissions after an instant, served by `workflows_queue_admitted_idx`.
const RUNS_ADMITTED_SINCE: &str =
    "SELECT count(*) FROM workflows INDEXED BY workflows_queue_admitted_idx \
     WHERE queue = ?1 AND queue_admitted_at > ?2 AND queue_admitted_at IS NOT NULL";

const RUNS_KEY_ADMITTED_SINCE: &str =
    "SELECT count(*) FROM workflows INDEXED BY workflows_queue_key_admitted_idx \
     WHERE queue = ?1 AND queue_key IS ?2 AND queue_admitted_at > ?3 \
       AND queue_admitted_at IS NOT NULL";

/// First claims after an instant, served by `remote_tasks_queue_admitted_idx`.
const TASKS_ADMITTED_SINCE: &str =
    "SELECT count(*) FROM remote_tasks INDEXED BY remote_tasks_queue_admitted_idx \
     WHERE queue = ?1 AND queue_admitted_at > ?2 AND queue_admitted_at IS NOT NULL";

const TASKS_KEY_ADMITTED_SINCE: &str =
    "SELECT count(*) FROM remote_tasks INDEXED BY remote_tasks_queue_key_admitted_idx \
     WHERE queue = ?1 AND queue_key IS ?2 AND queue_admitted_at > ?3 \
       AND queue_admitted_at IS NOT NULL";

/// Whose slots or admissions a count takes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Whose<'a> {
    /// Everyone's.
    All,
    /// One run lease owner's or task claimer's.
    Owner(&'a str),
    /// One key's (`None`: the runs and tasks with no key).
    Key(Option<&'a str>),
}

fn count(
    conn: &Connection,
    operation: &'static str,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<i64> {
    conn.query_row_cached(sql, params, |r| r.get(0))
        .map_err(|e| store(operation, e))
}

/// keiro_queue_held: the slots of `queue` held at `now` (stored microseconds) by admitted runs
/// that are not terminal and by claimed tasks whose claim has not expired, of `whose`.
pub(crate) fn queue_held(
    conn: &Connection,
    operation: &'static str,
    queue: &str,
    now: i64,
    whose: Whose<'_>,
) -> Result<i64> {
    Ok(match whose {
        Whose::All => {
            count(conn, operation, RUNS_HELD, params![queue])?
                + count(conn, operation, TASKS_HELD, params![queue, now])?
        }
        Whose::Owner(owner) => {
            count(conn, operation, RUNS_HELD_BY, params![queue, owner])?
                + count(conn, operation, TASKS_HELD_BY, params![queue, now, owner])?
        }
        Whose::Key(key) => {
            count(conn, operation, RUNS_KEY_HELD, params![queue, key])?
                + count(conn, operation, TASKS_KEY_HELD, params![queue, now, key])?
        }
    })
}

/// keiro_queue_admitted_since: the first admissions of runs and first claims of tasks of
/// `queue` after `since` (stored microseconds), everyone's or one key's (`Whose::Owner` counts
/// as everyone's: rates are never per owner).
pub(crate) fn queue_admitted_since(
    conn: &Connection,
    operation: &'static str,
    queue: &str,
    since: i64,
    whose: Whose<'_>,
) -> Result<i64> {
    Ok(match whose {
        Whose::Key(key) => {
            count(
                conn,
                operation,
                RUNS_KEY_ADMITTED_SINCE,
                params![queue, key, since],
            )? + count(
                conn,
                operation,
                TASKS_KEY_ADMITTED_SINCE,
                params![queue, key, since],
            )?
        }
        Whose::All | Whose::Owner(_) => {
            count(conn, operation, RUNS_ADMITTED_SINCE, params![queue, since])?
                + count(conn, operation, TASKS_ADMITTED_SINCE, params![queue, since])?
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each count walks the index made for it, with no scan of its table.
    #[test]
    fn counts_walk_the_slot_and_rate_indexes() {
        let conn = Connection::open_in_memory().expect("opens");
        for (_, _, sql) in crate::open::MIGRATIONS {
            conn.execute_batch(sql).expect("migrates");
        }
        let cases = [
            (RUNS_HELD, "workflows_queue_slots_idx"),
            (RUNS_HELD_BY, "workflows_queue_slots_idx"),
            (RUNS_KEY_HELD, "workflows_queue_slots_idx"),
            (TASKS_HELD, "remote_tasks_queue_slots_idx"),
            (TASKS_HELD_BY, "remote_tasks_queue_slots_idx"),
            (TASKS_KEY_HELD, "remote_tasks_queue_slots_idx"),
            (RUNS_ADMITTED_SINCE, "workflows_queue_admitted_idx"),
            (RUNS_KEY_ADMITTED_SINCE, "workflows_queue_key_admitted_idx"),
            (TASKS_ADMITTED_SINCE, "remote_tasks_queue_admitted_idx"),
            (
                TASKS_KEY_ADMITTED_SINCE,
                "remote_tasks_queue_key_admitted_idx",
            ),
        ];
        for (sql, index) in cases {
            // The parameters left unbound, as the queue module's plan test does.
            let mut explain = conn
                .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
                .expect("plans");
            let mut rows = explain.raw_query();
            let mut details = Vec::new();
            while let Some(row) = rows.next().expect("plans") {
                details.push(row.get::<_, String>(3).expect("a detail"));
            }
            let plan = details.join("\n");
            assert!(plan.contains(index), "{sql}:\n{plan}");
            assert!(!plan.contains("SCAN workflows"), "{sql}:\n{plan}");
            assert!(!plan.contains("SCAN remote_tasks"), "{sql}:\n{plan}");
        }
    }
}
