//! `crates/migrations/functions/queue.sql`: declaring a queue, pausing it, weighting a key,
//! starting a run on a queue and admitting waiting runs (the claim that enforces the limits),
//! with the plain statements that describe the queues beside them.

use std::time::Duration;

use keiro_journal::queue::{
    DebounceRequest, DedupPolicy, Fairness, QueueInfo, QueueRefusal, QueueSpec, QueueStart, Rate,
};
use keiro_journal::store::{Result, StartRequest};
use keiro_journal::{Started, StoreError, WorkflowName};
use keiro_lease::{Claim, ClaimBatch, Versions};
use time::OffsetDateTime;

use crate::db::Db;
use crate::ops::{span_ms, unknown_outcome};
use crate::row::{self, column, instance_columns, malformed};

const DECLARE: &str = "declaring a queue";
const PAUSE: &str = "pausing or resuming a queue";
const WEIGHT: &str = "weighting a queue key";
pub(crate) const START: &str = "starting an instance on a queue";
const ADMIT: &str = "admitting runs of a queue";
const DEBOUNCE: &str = "debouncing a start";
const LIST: &str = "listing queues";

const QUEUE_DECLARE: &str =
    "SELECT keiro_queue_declare($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

pub(crate) async fn queue_declare(db: &Db, spec: &QueueSpec) -> Result<()> {
    let rate = |r: Option<Rate>| (r.map(|r| r.limit()), r.map(|r| r.period_ms()));
    let (rate_limit, rate_period) = rate(spec.rate);
    let (key_rate_limit, key_rate_period) = rate(spec.key_rate);
    db.execute(
        DECLARE,
        QUEUE_DECLARE,
        &[
            &spec.name,
            &spec.concurrency,
            &spec.worker_concurrency,
            &spec.key_concurrency,
            &rate_limit,
            &rate_period,
            &key_rate_limit,
            &key_rate_period,
            &spec.priority,
            &spec.fairness.as_str(),
            &spec.dedup.map(DedupPolicy::as_str),
            &spec.release_on_park,
        ],
    )
    .await?;
    Ok(())
}

const QUEUE_SET_PAUSED: &str = "SELECT keiro_queue_set_paused($1, $2) AS found";

pub(crate) async fn queue_set_paused(db: &Db, queue: &str, paused: bool) -> Result<bool> {
    let row = db
        .query_one(PAUSE, QUEUE_SET_PAUSED, &[&queue, &paused])
        .await?;
    column(&row, "found", PAUSE)
}

const QUEUE_KEY_WEIGHT: &str = "SELECT keiro_queue_key_weight($1, $2, $3) AS found";

pub(crate) async fn queue_key_weight(db: &Db, queue: &str, key: &str, weight: i32) -> Result<bool> {
    let row = db
        .query_one(WEIGHT, QUEUE_KEY_WEIGHT, &[&queue, &key, &weight])
        .await?;
    column(&row, "found", WEIGHT)
}

const QUEUE_START: &str = concat!(
    "SELECT s.outcome, s.created, ",
    instance_columns!("(s.instance)."),
    " FROM keiro_queue_start($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, true) s"
);

/// Starts `request` on its queue; `queue` is `request.queue`, passed apart so the caller has
/// already checked it is there.
pub(crate) async fn queue_start(
    db: &Db,
    request: &StartRequest,
    queue: &QueueStart,
) -> Result<Started> {
    let parent_name = request.parent.as_ref().map(|p| p.name.as_str());
    let parent_id = request.parent.as_ref().map(|p| p.id.as_str());
    let row = db
        .query_one(
            START,
            QUEUE_START,
            &[
                &request.key.name.as_str(),
                &request.key.id.as_str(),
                &request.input,
                &parent_name,
                &parent_id,
                &request.priority,
                &queue.queue,
                &queue.key,
                &queue.dedup_id,
                &queue.not_before,
            ],
        )
        .await?;
    queue_started(&row, &queue.queue)
}

const QUEUES_START: &str = concat!(
    "SELECT s.n, s.outcome, s.created, ",
    instance_columns!("(s.instance)."),
    " FROM keiro_queues_start($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) s"
);

/// A batch of starts some of which are on a queue (`keiro_queues_start`): an outcome per
/// request, in the order given.
pub(crate) async fn queues_start(
    db: &Db,
    requests: &[StartRequest],
) -> Result<Vec<Option<Result<Started>>>> {
    let names: Vec<&str> = requests.iter().map(|r| r.key.name.as_str()).collect();
    let ids: Vec<&str> = requests.iter().map(|r| r.key.id.as_str()).collect();
    let inputs: Vec<&serde_json::Value> = requests.iter().map(|r| &r.input).collect();
    fn parent(r: &StartRequest) -> Option<(&str, &str)> {
        r.parent.as_ref().map(|p| (p.name.as_str(), p.id.as_str()))
    }
    fn queue(r: &StartRequest) -> Option<&QueueStart> {
        r.queue.as_ref()
    }
    let parent_names: Vec<Option<&str>> = requests.iter().map(|r| parent(r).map(|p| p.0)).collect();
    let parent_ids: Vec<Option<&str>> = requests.iter().map(|r| parent(r).map(|p| p.1)).collect();
    let priorities: Vec<i32> = requests.iter().map(|r| r.priority).collect();
    let queues: Vec<Option<&str>> = requests
        .iter()
        .map(|r| queue(r).map(|q| q.queue.as_str()))
        .collect();
    let keys: Vec<Option<&str>> = requests
        .iter()
        .map(|r| queue(r).and_then(|q| q.key.as_deref()))
        .collect();
    let dedup_ids: Vec<Option<&str>> = requests
        .iter()
        .map(|r| queue(r).and_then(|q| q.dedup_id.as_deref()))
        .collect();
    let not_befores: Vec<Option<OffsetDateTime>> = requests
        .iter()
        .map(|r| queue(r).and_then(|q| q.not_before))
        .collect();
    let rows = db
        .query(
            START,
            QUEUES_START,
            &[
                &names,
                &ids,
                &inputs,
                &parent_names,
                &parent_ids,
                &priorities,
                &queues,
                &keys,
                &dedup_ids,
                &not_befores,
            ],
        )
        .await?;
    Ok(row::in_batch_order(
        &rows,
        requests.len(),
        START,
        "n",
        |row, i| {
            let queue = requests[i].queue.as_ref().map_or("", |q| q.queue.as_str());
            Some(queue_started(row, queue))
        },
    ))
}

/// The answer of a `keiro_queue_start` row (`outcome`, `created`, the instance's columns): the
/// start, the holder under `existing`, or the refusal.
pub(crate) fn queue_started(row: &tokio_postgres::Row, queue: &str) -> Result<Started> {
    let outcome: String = column(row, "outcome", START)?;
    let refused = |refusal| StoreError::QueueRefused {
        queue: queue.to_owned(),
        refusal,
    };
    match outcome.as_str() {
        "started" => Ok(Started {
            created: column(row, "created", START)?,
            instance: row::instance(row, START)?,
        }),
        "existing" => Ok(Started {
            created: false,
            instance: row::instance(row, START)?,
        }),
        "duplicate" => Err(refused(QueueRefusal::Duplicate {
            holder: row::instance(row, START)?.key,
        })),
        "unknown" => Err(refused(QueueRefusal::Unknown)),
        "dedup_not_enabled" => Err(refused(QueueRefusal::DedupNotEnabled)),
        "priority_not_enabled" => Err(refused(QueueRefusal::PriorityNotEnabled)),
        other => Err(unknown_outcome(START, other)),
    }
}

const QUEUE_DEBOUNCE: &str = concat!(
    "SELECT d.created, ",
    instance_columns!("(d.instance)."),
    " FROM keiro_queue_debounce($1, $2, $3, $4, $5, $6, $7) d"
);

pub(crate) async fn queue_debounce(db: &Db, request: &DebounceRequest) -> Result<Started> {
    let row = db
        .query_one(
            DEBOUNCE,
            QUEUE_DEBOUNCE,
            &[
                &request.name.as_str(),
                &request.key,
                &request.id.as_str(),
                &request.input,
                &span_ms(request.delay),
                &span_ms(request.max_wait),
                &request.now,
            ],
        )
        .await?;
    Ok(Started {
        created: column(&row, "created", DEBOUNCE)?,
        instance: row::instance(&row, DEBOUNCE)?,
    })
}

const QUEUE_ADMIT: &str = concat!(
    "SELECT ",
    instance_columns!("(c.instance)."),
    ", c.journal_seq, c.journal_step, c.journal_kind, c.journal_payload, c.journal_recorded_at",
    " FROM keiro_queue_admit($1, $2, $3, $4, $5, $6, $7) c"
);

#[allow(clippy::too_many_arguments)] // keiro_queue_admit's parameters, in its order
pub(crate) async fn queue_admit(
    db: &Db,
    queues: &[String],
    names: &[WorkflowName],
    versions: &Versions,
    owner: &str,
    ttl: Duration,
    limit: i64,
    now: Option<OffsetDateTime>,
) -> Result<Vec<Claim>> {
    let names: Vec<&str> = names.iter().map(WorkflowName::as_str).collect();
    let limit = i32::try_from(limit.max(0)).unwrap_or(i32::MAX);
    let rows = db
        .query(
            ADMIT,
            QUEUE_ADMIT,
            &[
                &queues,
                &names,
                &owner,
                &span_ms(ttl),
                &limit,
                &now,
                &versions.as_filter(),
            ],
        )
        .await?;
    crate::ops::lease::claims_of_rows(db, &rows, owner, ADMIT).await
}

const CLAIM_AND_ADMIT: &str = concat!(
    "SELECT c.admitted, ",
    instance_columns!("(c.instance)."),
    ", c.journal_seq, c.journal_step, c.journal_kind, c.journal_payload, c.journal_recorded_at",
    " FROM keiro_instances_claim_and_admit($1, $2, $3, $4, $5, $6, $7) c"
);

/// keiro_instances_claim_and_admit: a worker's claim and its queues' admissions, one round
/// trip and one transaction.
#[allow(clippy::too_many_arguments)] // keiro_instances_claim_and_admit's parameters, in its order
pub(crate) async fn claim_and_admit(
    db: &Db,
    names: &[WorkflowName],
    queues: &[String],
    versions: &Versions,
    owner: &str,
    ttl: Duration,
    limit: i64,
    now: Option<OffsetDateTime>,
) -> Result<ClaimBatch> {
    let names: Vec<&str> = names.iter().map(WorkflowName::as_str).collect();
    let limit = i32::try_from(limit.max(0)).unwrap_or(i32::MAX);
    let rows = db
        .query(
            ADMIT,
            CLAIM_AND_ADMIT,
            &[
                &names,
                &queues,
                &owner,
                &span_ms(ttl),
                &limit,
                &now,
                &versions.as_filter(),
            ],
        )
        .await?;
    let mut claimed = Vec::with_capacity(rows.len());
    let mut admitted = Vec::new();
    for row in rows {
        if column::<bool>(&row, "admitted", ADMIT)? {
            admitted.push(row);
        } else {
            claimed.push(row);
        }
    }
    Ok(ClaimBatch {
        claimed: crate::ops::lease::claims_of_rows(db, &claimed, owner, ADMIT).await?,
        admitted: crate::ops::lease::claims_of_rows(db, &admitted, owner, ADMIT).await?,
    })
}

// Every queue with what it holds now: one statement (one snapshot), each figure from the index
// that serves it; the top keys are those with the most runs waiting, then holding slots. A run
// waits while it is unmarked and unleased, and runs while it holds a slot or, on a queue that
// counts nothing (which marks no run), while it is leased.
const QUEUES_LIST: &str = "SELECT q.name, q.concurrency, q.worker_concurrency, q.key_concurrency, \
         q.rate_limit, q.rate_period_ms, q.key_rate_limit, q.key_rate_period_ms, q.priority, \
         q.fairness, q.dedup, q.release_on_park, q.paused, \
         (SELECT count(*) FROM workflows w WHERE w.queue = q.name AND w.status = 'running' \
             AND NOT w.queue_admitted AND NOT coalesce(w.lease_expires_at >= coalesce($1, now()), \
             false)) AS waiting, \
         (SELECT count(*) FROM workflows w WHERE w.queue = q.name AND w.status = 'running' \
             AND NOT w.queue_admitted AND w.next_attempt_at > coalesce($1, now())) AS delayed, \
         (SELECT count(*) FROM workflows w WHERE w.queue = q.name AND w.queue_admitted \
             AND w.status IN ('running', 'suspended')) \
         + (SELECT count(*) FROM workflows w WHERE w.queue = q.name AND w.status = 'running' \
             AND NOT w.queue_admitted AND w.lease_expires_at >= coalesce($1, now())) AS running, \
         (SELECT count(*) FROM workflows w WHERE w.queue = q.name AND w.queue_admitted_at > \
             coalesce($1, now()) - coalesce(q.rate_period_ms, 60000) * interval '1 millisecond') \
             AS admitted_recently, \
         (SELECT min(w.created_at) FROM workflows w WHERE w.queue = q.name \
             AND w.status = 'running' AND NOT w.queue_admitted \
             AND NOT coalesce(w.lease_expires_at >= coalesce($1, now()), false) \
             AND (w.next_attempt_at IS NULL OR w.next_attempt_at <= coalesce($1, now()))) \
             AS oldest_waiting, \
         k.keys AS top_keys, k.waiting AS top_waiting, k.running AS top_running \
     FROM keiro_queues q \
     CROSS JOIN LATERAL ( \
         SELECT coalesce(array_agg(t.key ORDER BY t.waiting DESC, t.running DESC, t.key), '{}') \
                    AS keys, \
                coalesce(array_agg(t.waiting ORDER BY t.waiting DESC, t.running DESC, t.key), \
                         '{}') AS waiting, \
                coalesce(array_agg(t.running ORDER BY t.waiting DESC, t.running DESC, t.key), \
                         '{}') AS running \
         FROM (SELECT coalesce(w.queue_key, '') AS key, \
                      count(*) FILTER (WHERE NOT w.queue_admitted AND NOT coalesce( \
                          w.lease_expires_at >= coalesce($1, now()), false)) AS waiting, \
                      count(*) FILTER (WHERE w.queue_admitted OR \
                          w.lease_expires_at >= coalesce($1, now())) AS running \
               FROM workflows w \
               WHERE w.queue = q.name AND w.status IN ('running', 'suspended') \
                 AND (w.queue_admitted OR w.status = 'running') \
               GROUP BY 1 ORDER BY 2 DESC, 3 DESC, 1 LIMIT 10) t) k \
     WHERE $2::text IS NULL OR q.name = $2 ORDER BY q.name";

/// Every declared queue (or the one named) with what it holds at `now`.
pub(crate) async fn queues_list(
    db: &Db,
    only: Option<&str>,
    now: Option<OffsetDateTime>,
) -> Result<Vec<QueueInfo>> {
    let rows = db.query(LIST, QUEUES_LIST, &[&now, &only]).await?;
    let mut queues = Vec::with_capacity(rows.len());
    for row in &rows {
        let name: String = column(row, "name", LIST)?;
        let rate = |limit: &str, period: &str| -> Result<Option<Rate>> {
            let limit: Option<i32> = column(row, limit, LIST)?;
            let period: Option<i64> = column(row, period, LIST)?;
            match (limit, period) {
                (Some(limit), Some(ms)) => {
                    let ms = u64::try_from(ms).map_err(|_| malformed(LIST, "a negative period"))?;
                    Rate::new(limit, Duration::from_millis(ms))
                        .map(Some)
                        .map_err(|e| malformed(LIST, e))
                }
                _ => Ok(None),
            }
        };
        let fairness: String = column(row, "fairness", LIST)?;
        let dedup: Option<String> = column(row, "dedup", LIST)?;
        let spec = QueueSpec {
            name: name.clone(),
            concurrency: column(row, "concurrency", LIST)?,
            worker_concurrency: column(row, "worker_concurrency", LIST)?,
            key_concurrency: column(row, "key_concurrency", LIST)?,
            rate: rate("rate_limit", "rate_period_ms")?,
            key_rate: rate("key_rate_limit", "key_rate_period_ms")?,
            priority: column(row, "priority", LIST)?,
            fairness: Fairness::parse(&fairness)
                .ok_or_else(|| malformed(LIST, format_args!("fairness {fairness:?}")))?,
            dedup: dedup
                .map(|d| {
                    DedupPolicy::parse(&d)
                        .ok_or_else(|| malformed(LIST, format_args!("dedup policy {d:?}")))
                })
                .transpose()?,
            release_on_park: column(row, "release_on_park", LIST)?,
        };
        let keys: Vec<String> = column(row, "top_keys", LIST)?;
        let waiting: Vec<i64> = column(row, "top_waiting", LIST)?;
        let running: Vec<i64> = column(row, "top_running", LIST)?;
        let top_keys = keys
            .into_iter()
            .zip(waiting)
            .zip(running)
            .map(|((key, waiting), running)| (key, waiting, running))
            .collect();
        queues.push(QueueInfo {
            spec,
            paused: column(row, "paused", LIST)?,
            waiting: column(row, "waiting", LIST)?,
            delayed: column(row, "delayed", LIST)?,
            running: column(row, "running", LIST)?,
            admitted_recently: column(row, "admitted_recently", LIST)?,
            oldest_waiting: column(row, "oldest_waiting", LIST)?,
            top_keys,
        });
    }
    Ok(queues)
}
