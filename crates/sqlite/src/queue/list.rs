//! The list of queues with what each holds: the plain statements the Postgres store runs from
//! Rust (crates/postgres/src/ops/queue.rs, `QUEUES_LIST`), each figure counted
//! as there.

use std::time::Duration;

use keiro_journal::queue::{DedupPolicy, Fairness, QueueInfo, QueueSpec, Rate};
use keiro_journal::store::Result;
use rusqlite::{params, Connection, Row};
use time::OffsetDateTime;

use crate::error::{malformed, store};
use crate::row::{self, micros};

pub(crate) const LIST: &str = "listing queues";

/// Every queue (or the one named `?2`) with what it holds at `?1`, each figure from the index
/// that serves it; the top keys are read per queue ([`QUEUE_TOP_KEYS`]), in the same read
/// transaction. A run waits while it is unmarked and unleased, and runs while it holds a slot
/// or, on a queue that counts nothing (which marks no run), while it is leased.
const QUEUES_LIST: &str = "SELECT q.name, q.concurrency, q.worker_concurrency, \
         q.key_concurrency, q.rate_limit, q.rate_period_ms, q.key_rate_limit, \
         q.key_rate_period_ms, q.priority, q.fairness, q.dedup, q.release_on_park, q.paused, \
         (SELECT count(*) FROM workflows w WHERE w.queue = q.name AND w.status = 'running' \
             AND w.queue IS NOT NULL AND NOT w.queue_admitted \
             AND NOT coalesce(w.lease_expires_at >= ?1, 0)) AS waiting, \
         (SELECT count(*) FROM workflows w WHERE w.queue = q.name AND w.status = 'running' \
             AND w.queue IS NOT NULL AND NOT w.queue_admitted AND w.next_attempt_at > ?1) \
             AS delayed, \
         (SELECT count(*) FROM workflows w WHERE w.queue = q.name AND w.queue_admitted \
             AND w.status IN ('running', 'suspended')) \
         + (SELECT count(*) FROM workflows w WHERE w.queue = q.name AND w.status = 'running' \
             AND w.queue IS NOT NULL AND NOT w.queue_admitted AND w.lease_expires_at >= ?1) \
             AS running, \
         (SELECT count(*) FROM workflows w WHERE w.queue = q.name \
             AND w.queue_admitted_at > ?1 - coalesce(q.rate_period_ms, 60000) * 1000 \
             AND w.queue_admitted_at IS NOT NULL) AS admitted_recently, \
         (SELECT min(w.created_at) FROM workflows w WHERE w.queue = q.name \
             AND w.status = 'running' AND w.queue IS NOT NULL AND NOT w.queue_admitted \
             AND NOT coalesce(w.lease_expires_at >= ?1, 0) \
             AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= ?1)) \
             AS oldest_waiting \
     FROM keiro_queues q WHERE ?2 IS NULL OR q.name = ?2 ORDER BY q.name";

/// The ten keys of queue `?1` with the most runs waiting, then the most holding slots (`''`
/// for runs with no key), at `?2`, as PostgreSQL orders them: most first, then by key.
const QUEUE_TOP_KEYS: &str = "SELECT coalesce(queue_key, '') AS key, \
         sum(NOT queue_admitted AND NOT coalesce(lease_expires_at >= ?2, 0)) AS waiting, \
         sum(queue_admitted OR coalesce(lease_expires_at >= ?2, 0)) AS running \
     FROM workflows \
     WHERE queue = ?1 AND (status = 'running' OR status = 'suspended') \
       AND (queue_admitted OR status = 'running') \
     GROUP BY 1 ORDER BY 2 DESC, 3 DESC, 1 LIMIT 10";

/// One row of [`QUEUES_LIST`], as stored.
#[derive(Debug)]
struct StoredQueue {
    name: String,
    concurrency: Option<i32>,
    worker_concurrency: Option<i32>,
    key_concurrency: Option<i32>,
    /// Limit and period in milliseconds, each `None` unless both are set.
    rate: (Option<i32>, Option<i64>),
    key_rate: (Option<i32>, Option<i64>),
    priority: bool,
    fairness: String,
    dedup: Option<String>,
    release_on_park: bool,
    paused: bool,
    waiting: i64,
    delayed: i64,
    running: i64,
    admitted_recently: i64,
    oldest_waiting: Option<i64>,
}

impl StoredQueue {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
            name: r.get(0)?,
            concurrency: r.get(1)?,
            worker_concurrency: r.get(2)?,
            key_concurrency: r.get(3)?,
            rate: (r.get(4)?, r.get(5)?),
            key_rate: (r.get(6)?, r.get(7)?),
            priority: r.get(8)?,
            fairness: r.get(9)?,
            dedup: r.get(10)?,
            release_on_park: r.get(11)?,
            paused: r.get(12)?,
            waiting: r.get(13)?,
            delayed: r.get(14)?,
            running: r.get(15)?,
            admitted_recently: r.get(16)?,
            oldest_waiting: r.get(17)?,
        })
    }

    /// The declaration.
    fn spec(&self) -> Result<QueueSpec> {
        let rate = |(limit, period): (Option<i32>, Option<i64>)| -> Result<Option<Rate>> {
            let (Some(limit), Some(ms)) = (limit, period) else {
                return Ok(None);
            };
            let ms = u64::try_from(ms).map_err(|_| malformed(LIST, "a negative period"))?;
            Rate::new(limit, Duration::from_millis(ms))
                .map(Some)
                .map_err(|e| malformed(LIST, e))
        };
        let fairness = &self.fairness;
        Ok(QueueSpec {
            name: self.name.clone(),
            concurrency: self.concurrency,
            worker_concurrency: self.worker_concurrency,
            key_concurrency: self.key_concurrency,
            rate: rate(self.rate)?,
            key_rate: rate(self.key_rate)?,
            priority: self.priority,
            fairness: Fairness::parse(fairness)
                .ok_or_else(|| malformed(LIST, format_args!("fairness {fairness:?}")))?,
            dedup: self
                .dedup
                .as_deref()
                .map(|d| {
                    DedupPolicy::parse(d)
                        .ok_or_else(|| malformed(LIST, format_args!("dedup policy {d:?}")))
                })
                .transpose()?,
            release_on_park: self.release_on_park,
        })
    }
}

/// queues_list (crates/postgres/src/ops/queue.rs): every declared queue, or only `only`, in
/// name order, with what it holds at `now`.
pub(crate) fn queues_list(
    conn: &Connection,
    now: OffsetDateTime,
    only: Option<&str>,
) -> Result<Vec<QueueInfo>> {
    let stored: Vec<StoredQueue> = conn
        .prepare_cached(QUEUES_LIST)
        .and_then(|mut s| {
            s.query_map(params![micros(now), only], StoredQueue::from_row)?
                .collect()
        })
        .map_err(|e| store(LIST, e))?;
    let mut queues = Vec::with_capacity(stored.len());
    for queue in stored {
        let top_keys: Vec<(String, i64, i64)> = conn
            .prepare_cached(QUEUE_TOP_KEYS)
            .and_then(|mut s| {
                s.query_map(params![queue.name, micros(now)], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect()
            })
            .map_err(|e| store(LIST, e))?;
        queues.push(QueueInfo {
            spec: queue.spec()?,
            paused: queue.paused,
            waiting: queue.waiting,
            delayed: queue.delayed,
            running: queue.running,
            admitted_recently: queue.admitted_recently,
            oldest_waiting: row::instant_opt(queue.oldest_waiting, LIST)?,
            top_keys,
        });
    }
    Ok(queues)
}
