//! Rules of crates/migrations/functions/remote.sql, the claim: `keiro_remote_tasks_claim` and
//! its part for tasks on a queue, `keiro_remote_tasks_claim_queued` (see the parent module for
//! the rest of the file). A queued task is claimed within its queue's limits, counted with the
//! runs of that queue by the queue module's rules (`queue_room`, `key_room`, the passes), so a
//! queue that runs and remote steps share keeps one limit.

use keiro_journal::store::Result;
use keiro_journal::Generation;
use rusqlite::{params, Connection};
use serde_json::Value;
use time::OffsetDateTime;

use super::remote_claims_expire;
use crate::cached::Cached;
use crate::error::store;
use crate::queue::{key_room, key_state, passes_advance, queue_limits, queue_room};
use crate::queue::{waiting_keys, KeyScan};
use crate::row::micros;

const CLAIM: &str = "claiming remote tasks";

/// A claimed task's columns, as `TASK_CLAIMED` reads them.
pub(crate) type Claimed = (
    String,
    String,
    String,
    String,
    Generation,
    String,
    String,
    String,
    i32,
    Option<String>,
    i64,
    i64,
    i64,
    i64,
    bool,
    i64,
    i64,
);

const TASKS_EXPIRED: &str = "SELECT step_id FROM remote_tasks \
     WHERE status = 'running' AND claim_expires_at <= ?1 \
       AND grp IN (SELECT value FROM json_each(?2)) ORDER BY step_id";

/// Tasks on no queue, served by `remote_tasks_pending_idx`.
const TASKS_CLAIMABLE: &str = "SELECT step_id FROM remote_tasks \
     WHERE grp IN (SELECT value FROM json_each(?1)) AND status = 'pending' AND queue IS NULL \
       AND available_at <= ?2 \
     ORDER BY priority DESC, available_at, created_at, rowid LIMIT max(?3, 0)";

const TASK_CLAIM: &str = "UPDATE remote_tasks SET status = 'running', claim = ?2, \
         claimed_by = ?3, claim_expires_at = ?4, \
         queue_admitted_at = CASE WHEN queue IS NULL THEN NULL \
                                  ELSE coalesce(queue_admitted_at, ?5) END, \
         updated_at = ?5 \
     WHERE step_id = ?1";

const TASK_CLAIMED: &str = "SELECT step_id, claim, workflow_name, workflow_id, generation, \
     step, grp, input, priority, traceparent, attempts, max_attempts, backoff_initial_ms, \
     backoff_max_ms, backoff_jitter, dispatches, available_at \
     FROM remote_tasks WHERE step_id = ?1";

/// keiro_remote_tasks_claim: counts the groups' expired claims as failed attempts
/// ([`remote_claims_expire`]), then claims up to `limit` available pending tasks of the
/// groups, each with a new claim id: first the tasks on a queue that the queues' limits admit
/// ([`remote_tasks_claim_queued`]), then with what is left the tasks on no queue, highest
/// priority first, then oldest. The claimed rows: the queued ones, then the others, each part
/// in claim order. No `SKIP LOCKED`: the writer is alone.
pub(crate) fn remote_tasks_claim(
    conn: &Connection,
    now: OffsetDateTime,
    groups: &[String],
    worker: &str,
    limit: i64,
    ttl_ms: i64,
) -> Result<Vec<Claimed>> {
    let at = micros(now);
    let groups = Value::from(groups.to_vec()).to_string();
    let expired: Vec<String> = conn
        .prepare_cached(TASKS_EXPIRED)
        .and_then(|mut s| s.query_map(params![at, groups], |r| r.get(0))?.collect())
        .map_err(|e| store(CLAIM, e))?;
    if !expired.is_empty() {
        remote_claims_expire(conn, now, &expired)?;
    }
    let mut picked = remote_tasks_claim_queued(conn, at, &groups, worker, limit)?;
    let left = limit.saturating_sub(i64::try_from(picked.len()).unwrap_or(i64::MAX));
    let plain: Vec<String> = conn
        .prepare_cached(TASKS_CLAIMABLE)
        .and_then(|mut s| {
            s.query_map(params![groups, at, left], |r| r.get(0))?
                .collect()
        })
        .map_err(|e| store(CLAIM, e))?;
    picked.extend(plain);
    let expires = at.saturating_add(ttl_ms.saturating_mul(1000));
    let mut claimed = Vec::with_capacity(picked.len());
    for step_id in picked {
        let claim = uuid::Uuid::new_v4().hyphenated().to_string();
        conn.execute_cached(TASK_CLAIM, params![step_id, claim, worker, expires, at])
            .map_err(|e| store(CLAIM, e))?;
        let row = conn
            .query_row_cached(TASK_CLAIMED, params![step_id], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                    r.get(8)?,
                    r.get(9)?,
                    r.get(10)?,
                    r.get(11)?,
                    r.get(12)?,
                    r.get(13)?,
                    r.get(14)?,
                    r.get(15)?,
                    r.get(16)?,
                ))
            })
            .map_err(|e| store(CLAIM, e))?;
        claimed.push(row);
    }
    Ok(claimed)
}

/// The declared, unpaused queues with tasks of the groups waiting, by name, served by
/// `remote_tasks_queue_waiting_idx` (one probe per declared queue).
const QUEUES_WAITING: &str = "SELECT name FROM keiro_queues q WHERE NOT paused AND EXISTS ( \
         SELECT 1 FROM remote_tasks t INDEXED BY remote_tasks_queue_waiting_idx \
         WHERE t.queue = q.name AND t.grp IN (SELECT value FROM json_each(?1)) \
           AND t.status = 'pending' AND t.queue IS NOT NULL AND t.available_at <= ?2) \
     ORDER BY name";

/// One group's waiting tasks of a queue, in claim order.
const GROUP_WAITING: &str = "SELECT step_id, priority, available_at, created_at \
     FROM remote_tasks INDEXED BY remote_tasks_queue_waiting_idx \
     WHERE queue = ?1 AND grp = ?2 AND status = 'pending' AND queue IS NOT NULL \
       AND available_at <= ?3 \
     ORDER BY priority DESC, available_at, created_at LIMIT ?4";

/// The walk of the keys with tasks waiting (`remote_tasks_queue_key_waiting_idx`).
const KEY_FIRST: &str =
    "SELECT queue_key FROM remote_tasks INDEXED BY remote_tasks_queue_key_waiting_idx \
     WHERE queue = ?1 AND status = 'pending' AND queue IS NOT NULL AND queue_key IS NOT NULL \
     ORDER BY queue_key LIMIT 1";

const KEY_NEXT: &str =
    "SELECT queue_key FROM remote_tasks INDEXED BY remote_tasks_queue_key_waiting_idx \
     WHERE queue = ?1 AND status = 'pending' AND queue IS NOT NULL AND queue_key > ?2 \
     ORDER BY queue_key LIMIT 1";

const KEY_NONE_WAITING: &str =
    "SELECT EXISTS (SELECT 1 FROM remote_tasks INDEXED BY remote_tasks_queue_key_waiting_idx \
     WHERE queue = ?1 AND status = 'pending' AND queue IS NOT NULL AND queue_key IS NULL)";

/// The skip scan of the keys with tasks waiting.
const KEY_SCAN: KeyScan = KeyScan {
    first: KEY_FIRST,
    next: KEY_NEXT,
    none_waiting: KEY_NONE_WAITING,
};

/// One key's and group's waiting tasks, in claim order (`IS`: a NULL key is a key of its own).
const KEY_WAITING: &str = "SELECT step_id, priority, available_at, created_at \
     FROM remote_tasks INDEXED BY remote_tasks_queue_key_waiting_idx \
     WHERE queue = ?1 AND queue_key IS ?2 AND grp = ?3 AND status = 'pending' \
       AND queue IS NOT NULL AND available_at <= ?4 \
     ORDER BY priority DESC, available_at, created_at LIMIT ?5";

/// A waiting task a queue may admit, with what orders it.
#[derive(Debug, Clone)]
struct Candidate {
    step_id: String,
    priority: i32,
    available_at: i64,
    created_at: i64,
    /// Its key, and under fairness its virtual finish time and its key's weight.
    key: Option<String>,
    finish: f64,
    weight: i64,
}

/// Claim order: priority, then (under weighted fairness) finish time, then available, then age.
fn claim_order(weighted: bool) -> impl Fn(&Candidate, &Candidate) -> std::cmp::Ordering {
    move |a, b| {
        let finish = |c: &Candidate| if weighted { c.finish } else { 0.0 };
        b.priority
            .cmp(&a.priority)
            .then(finish(a).total_cmp(&finish(b)))
            .then(a.available_at.cmp(&b.available_at))
            .then(a.created_at.cmp(&b.created_at))
            .then_with(|| a.step_id.cmp(&b.step_id))
    }
}

/// The waiting tasks `sql` selects with `params`, in its order.
fn waiting(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    key: Option<&str>,
) -> Result<Vec<Candidate>> {
    conn.prepare_cached(sql)
        .and_then(|mut s| {
            s.query_map(params, |r| {
                Ok(Candidate {
                    step_id: r.get(0)?,
                    priority: r.get(1)?,
                    available_at: r.get(2)?,
                    created_at: r.get(3)?,
                    key: key.map(str::to_owned),
                    finish: 0.0,
                    weight: 1,
                })
            })?
            .collect()
        })
        .map_err(|e| store(CLAIM, e))
}

/// keiro_remote_tasks_claim_queued: up to `limit` waiting tasks of the groups (`groups`, a JSON
/// array) admitted within their queues' limits at `at`, to be claimed by `worker`: queues with
/// tasks of the groups waiting in name order, paused ones skipped; per queue the room (the
/// remaining limit, less the slots held by runs and tasks fleet-wide and this worker's, and
/// the first admissions and claims inside the rate window); with no per-key rule the first
/// tasks of each group up to the room, then the first of them all; otherwise each key with
/// tasks waiting gets up to its own room, the picks ordered by priority, then by virtual finish
/// time under weighted fairness (the keys' passes, shared with the queue's runs), then by claim
/// order, and the passes move on. The picked step ids, in claim order per queue.
fn remote_tasks_claim_queued(
    conn: &Connection,
    at: i64,
    groups: &str,
    worker: &str,
    limit: i64,
) -> Result<Vec<String>> {
    let mut left = limit.max(0);
    let queues: Vec<String> = conn
        .prepare_cached(QUEUES_WAITING)
        .and_then(|mut s| s.query_map(params![groups, at], |r| r.get(0))?.collect())
        .map_err(|e| store(CLAIM, e))?;
    let wanted: Vec<String> = serde_json::from_str::<Vec<String>>(groups)
        .map(|mut g| {
            g.sort();
            g.dedup();
            g
        })
        .unwrap_or_default();
    let mut claimed = Vec::new();
    for queue in queues {
        if left <= 0 {
            break;
        }
        let q = queue_limits(conn, &queue, CLAIM)?;
        if q.paused {
            continue;
        }
        let room = queue_room(conn, &queue, &q, worker, at, left, CLAIM)?;
        if room <= 0 {
            continue;
        }
        let mut candidates = Vec::new();
        if q.keyed() {
            for key in waiting_keys(conn, &queue, KEY_SCAN, CLAIM)? {
                let key = key.as_deref();
                let key_room = key_room(conn, &queue, &q, key, at, room, CLAIM)?;
                if key_room <= 0 {
                    continue;
                }
                let (pass, weight) = key_state(conn, &queue, &q, key, CLAIM)?;
                let mut picks = Vec::new();
                for grp in &wanted {
                    let params = params![queue, key, grp, at, key_room];
                    picks.append(&mut waiting(conn, KEY_WAITING, params, key)?);
                }
                picks.sort_by(claim_order(false));
                picks.truncate(usize::try_from(key_room).unwrap_or(usize::MAX));
                for (n, pick) in picks.iter_mut().enumerate() {
                    // row_number() over the key's candidates in claim order, from 1.
                    pick.finish = pass + (n as f64 + 1.0) / weight as f64;
                    pick.weight = weight;
                }
                candidates.append(&mut picks);
            }
        } else {
            for grp in &wanted {
                let params = params![queue, grp, at, room];
                candidates.append(&mut waiting(conn, GROUP_WAITING, params, None)?);
            }
        }
        candidates.sort_by(claim_order(q.weighted));
        candidates.truncate(usize::try_from(room).unwrap_or(usize::MAX));
        if q.weighted {
            let picks: Vec<_> = candidates
                .iter()
                .map(|c| (c.key.as_deref(), c.finish, c.weight))
                .collect();
            passes_advance(conn, &queue, &q, &picks, CLAIM)?;
        }
        // The queue's batch in claim order.
        candidates.sort_by(claim_order(false));
        left -= i64::try_from(candidates.len()).unwrap_or(i64::MAX);
        claimed.extend(candidates.into_iter().map(|c| c.step_id));
    }
    Ok(claimed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each statement of the queued claim walks the index 0004 made for it, with no scan of
    /// the task table and no sort where the index gives the order.
    #[test]
    fn queued_claims_walk_the_queue_indexes() {
        let conn = Connection::open_in_memory().expect("opens");
        for (_, _, sql) in crate::open::MIGRATIONS {
            conn.execute_batch(sql).expect("migrates");
        }
        let cases = [
            (QUEUES_WAITING, "remote_tasks_queue_waiting_idx"),
            (GROUP_WAITING, "remote_tasks_queue_waiting_idx"),
            (KEY_FIRST, "remote_tasks_queue_key_waiting_idx"),
            (KEY_NEXT, "remote_tasks_queue_key_waiting_idx"),
            (KEY_NONE_WAITING, "remote_tasks_queue_key_waiting_idx"),
            (KEY_WAITING, "remote_tasks_queue_key_waiting_idx"),
            (TASKS_CLAIMABLE, "remote_tasks_pending_idx"),
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
            assert!(!plan.contains("SCAN remote_tasks"), "{sql}:\n{plan}");
        }
    }
}
