//! queue.sql's declaration half: declaring a queue (and turning its free runs into waiting
//! ones when it starts to count), pausing and resuming it, and weighting a key.

use keiro_journal::queue::{DedupPolicy, QueueSpec, Rate};
use keiro_journal::store::Result;
use rusqlite::{params, Connection};
use time::OffsetDateTime;

use super::limits;
use crate::cached::Cached;
use crate::error::store;
use crate::notify;
use crate::row::micros;

const DECLARE: &str = "declaring a queue";
const PAUSE: &str = "pausing or resuming a queue";
const WEIGHT: &str = "weighting a queue key";

const QUEUE_DECLARE: &str = "INSERT INTO keiro_queues \
         (name, concurrency, worker_concurrency, key_concurrency, rate_limit, rate_period_ms, \
          key_rate_limit, key_rate_period_ms, priority, fairness, dedup, release_on_park, \
          created_at, updated_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?13) \
     ON CONFLICT (name) DO UPDATE SET \
         concurrency = excluded.concurrency, \
         worker_concurrency = excluded.worker_concurrency, \
         key_concurrency = excluded.key_concurrency, \
         rate_limit = excluded.rate_limit, \
         rate_period_ms = excluded.rate_period_ms, \
         key_rate_limit = excluded.key_rate_limit, \
         key_rate_period_ms = excluded.key_rate_period_ms, \
         priority = excluded.priority, \
         fairness = excluded.fairness, \
         dedup = excluded.dedup, \
         release_on_park = excluded.release_on_park, \
         updated_at = excluded.updated_at \
     WHERE keiro_queues.concurrency IS NOT excluded.concurrency \
        OR keiro_queues.worker_concurrency IS NOT excluded.worker_concurrency \
        OR keiro_queues.key_concurrency IS NOT excluded.key_concurrency \
        OR keiro_queues.rate_limit IS NOT excluded.rate_limit \
        OR keiro_queues.rate_period_ms IS NOT excluded.rate_period_ms \
        OR keiro_queues.key_rate_limit IS NOT excluded.key_rate_limit \
        OR keiro_queues.key_rate_period_ms IS NOT excluded.key_rate_period_ms \
        OR keiro_queues.priority IS NOT excluded.priority \
        OR keiro_queues.fairness IS NOT excluded.fairness \
        OR keiro_queues.dedup IS NOT excluded.dedup \
        OR keiro_queues.release_on_park IS NOT excluded.release_on_park";

/// keiro_queue_declare: records a queue's limits, or replaces them; a paused queue stays
/// paused, and weighted fairness keeps its virtual time and the keys' passes and weights. The
/// row is left untouched (its `updated_at` too) when nothing changed. A queue that counted
/// nothing and now counts something marks the runs it leased as holding slots, so the new
/// limits count them. `spec` carries the function's parameters, in its order.
pub(crate) fn queue_declare(
    conn: &Connection,
    now: OffsetDateTime,
    spec: &QueueSpec,
) -> Result<()> {
    let before = limits(conn, &spec.name, DECLARE)?;
    let rate = |r: Option<Rate>| (r.map(|r| r.limit()), r.map(|r| r.period_ms()));
    let (rate_limit, rate_period) = rate(spec.rate);
    let (key_rate_limit, key_rate_period) = rate(spec.key_rate);
    conn.execute_cached(
        QUEUE_DECLARE,
        params![
            spec.name,
            spec.concurrency,
            spec.worker_concurrency,
            spec.key_concurrency,
            rate_limit,
            rate_period,
            key_rate_limit,
            key_rate_period,
            spec.priority,
            spec.fairness.as_str(),
            spec.dedup.map(DedupPolicy::as_str),
            spec.release_on_park,
            micros(now)
        ],
    )
    .map_err(|e| store(DECLARE, e))?;
    let after = limits(conn, &spec.name, DECLARE)?;
    if before.is_some_and(|b| b.counts_nothing()) && after.is_some_and(|a| !a.counts_nothing()) {
        // Free runs first (0009): they wait from now on, and those leased hold slots.
        queue_unfree(conn, now, &spec.name, true, DECLARE)?;
        conn.execute_cached(QUEUE_MARK_LEASED, params![spec.name, micros(now)])
            .map_err(|e| store(DECLARE, e))?;
    }
    Ok(())
}

/// The live free runs of a queue (0009) become waiting ones; with `?3`, one leased at `?2`
/// holds a slot. Found through the list by queue.
const QUEUE_UNFREE: &str = "UPDATE workflows INDEXED BY workflows_list_queue_idx SET \
         queue_free = 0, \
         queue_admitted = ?3 AND status = 'running' AND coalesce(lease_expires_at >= ?2, 0), \
         queue_admitted_at = CASE \
             WHEN ?3 AND status = 'running' AND coalesce(lease_expires_at >= ?2, 0) \
                 THEN coalesce(queue_admitted_at, ?2) \
             ELSE queue_admitted_at END, \
         updated_at = ?2 \
     WHERE queue = ?1 AND queue IS NOT NULL AND queue_free \
       AND status IN ('running', 'suspended')";

/// keiro_queue_unfree: turns the live free runs of queue `name` into waiting ones; a run leased
/// now is marked as holding a slot when `mark_leased` (the queue is about to count slots).
fn queue_unfree(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    mark_leased: bool,
    operation: &'static str,
) -> Result<()> {
    conn.execute_cached(QUEUE_UNFREE, params![name, micros(now), mark_leased])
        .map_err(|e| store(operation, e))?;
    Ok(())
}

/// The runs a queue that counted nothing leased without marking them: they hold slots once
/// it counts something.
const QUEUE_MARK_LEASED: &str = "UPDATE workflows SET queue_admitted = 1, \
         queue_admitted_at = coalesce(queue_admitted_at, ?2), updated_at = ?2 \
     WHERE queue = ?1 AND status = 'running' AND NOT queue_admitted \
       AND lease_expires_at >= ?2";

const QUEUE_SET_PAUSED: &str =
    "UPDATE keiro_queues SET paused = ?2, updated_at = ?3 WHERE name = ?1";

/// keiro_queue_set_paused: pauses or resumes admission (runs holding a slot go on). Returns
/// whether the queue exists. A resumed queue wakes the workers serving it.
pub(crate) fn queue_set_paused(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    paused: bool,
) -> Result<bool> {
    let before = limits(conn, name, PAUSE)?;
    let found = conn
        .execute_cached(QUEUE_SET_PAUSED, params![name, paused, micros(now)])
        .map_err(|e| store(PAUSE, e))?
        == 1;
    if found && paused && before.is_some_and(|b| b.free()) {
        // Its free runs wait from now on (0009); a resumed queue's waiting runs are admitted
        // as a queue that counts nothing admits them.
        queue_unfree(conn, now, name, false, PAUSE)?;
    }
    if found && !paused {
        // Resumed: workers serving the queue look now rather than at their next poll.
        notify::queue(conn, PAUSE, name)?;
    }
    Ok(found)
}

const QUEUE_EXISTS: &str = "SELECT EXISTS (SELECT 1 FROM keiro_queues WHERE name = ?1)";

const QUEUE_KEY_WEIGHT: &str = "INSERT INTO keiro_queue_keys (queue, key, weight) \
     VALUES (?1, ?2, ?3) \
     ON CONFLICT (queue, key) DO UPDATE SET weight = excluded.weight";

/// keiro_queue_key_weight: sets a key's weight under weighted fairness. Returns whether the
/// queue exists.
pub(crate) fn queue_key_weight(
    conn: &Connection,
    queue: &str,
    key: &str,
    weight: i32,
) -> Result<bool> {
    let exists: bool = conn
        .query_row_cached(QUEUE_EXISTS, [queue], |r| r.get(0))
        .map_err(|e| store(WEIGHT, e))?;
    if !exists {
        return Ok(false);
    }
    conn.execute_cached(QUEUE_KEY_WEIGHT, params![queue, key, weight])
        .map_err(|e| store(WEIGHT, e))?;
    Ok(true)
}
