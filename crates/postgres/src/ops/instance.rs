//! `crates/migrations/functions/instance.sql`: start (one, or several callers' in one statement), confirm,
//! park, the divergence failure, the settling of a completed run's leftovers, cancellation,
//! and the operator's requeue and fix-and-replay; with the plain reads and writes of the
//! instance row beside them. (A transaction step's hold of its row, `keiro_instance_hold`, is
//! called from inside the user's transaction: `transaction_step`.)

use std::time::Duration;

use keiro_journal::store::{AppendOutcome, Park, ParkOutcome, Result};
use keiro_journal::{store::StartRequest, Fence, Instance, InstanceKey, Started, Status};
use keiro_remote::{RequeueOutcome, RetryOutcome};
use serde_json::Value;
use tokio_postgres::Row;

use crate::db::Db;
use crate::ops::journal::append_outcome;
use crate::ops::{lease_lost, not_found, span_ms, unknown_outcome};
use crate::row::{self, column, in_batch_order, instance_columns, malformed};

const CONFIRM: &str = "confirming a lease";
pub(crate) const START: &str = "starting an instance";
pub(crate) const GET: &str = "reading an instance";
const PARK: &str = "parking an instance";
const FAIL_DIVERGED: &str = "failing a diverged instance";
const SETTLE_LEFTOVERS: &str = "settling a completed run's leftovers";
pub(crate) const CANCEL: &str = "cancelling an instance";
const REQUEUE: &str = "requeueing an instance";
const RETRY: &str = "starting a fix-and-replay";
pub(crate) const MARK_AWAITED: &str = "marking an instance awaited";

pub(crate) const INSTANCE_START: &str = concat!(
    "SELECT s.created, ",
    instance_columns!("(s.instance)."),
    " FROM keiro_instance_start($1, $2, $3, $4, $5, $6) s"
);

/// One start: `keiro_instance_start`.
pub(crate) async fn instance_start(db: &Db, request: &StartRequest) -> Result<Started> {
    if !request.attributes.is_empty() {
        return crate::ops::attribute::instance_start_attributed(db, request).await;
    }
    if let Some(queue) = &request.queue {
        return crate::ops::queue::queue_start(db, request, queue).await;
    }
    let parent_name = request.parent.as_ref().map(|p| p.name.as_str());
    let parent_id = request.parent.as_ref().map(|p| p.id.as_str());
    let row = db
        .query_one(
            START,
            INSTANCE_START,
            &[
                &request.key.name.as_str(),
                &request.key.id.as_str(),
                &request.input,
                &parent_name,
                &parent_id,
                &request.priority,
            ],
        )
        .await?;
    Ok(Started {
        created: column(&row, "created", START)?,
        instance: row::instance(&row, START)?,
    })
}

const INSTANCES_START: &str = concat!(
    "SELECT s.n, s.created, ",
    instance_columns!("(s.instance)."),
    " FROM keiro_instances_start($1, $2, $3, $4, $5, $6) s"
);

/// Starts of several callers in one statement (`keiro_instances_start`, or
/// `keiro_queues_start` when some are on a queue): an outcome per request, in the order given.
/// A batch with a start that has attributes is left alone whole (each `None`, so sent alone).
pub(crate) async fn instances_start(
    db: &Db,
    requests: &[StartRequest],
) -> Result<Vec<Option<Result<Started>>>> {
    if requests.iter().any(|r| !r.attributes.is_empty()) {
        return Ok(requests.iter().map(|_| None).collect());
    }
    if requests.iter().any(|r| r.queue.is_some()) {
        return crate::ops::queue::queues_start(db, requests).await;
    }
    let names: Vec<&str> = requests.iter().map(|r| r.key.name.as_str()).collect();
    let ids: Vec<&str> = requests.iter().map(|r| r.key.id.as_str()).collect();
    let inputs: Vec<&Value> = requests.iter().map(|r| &r.input).collect();
    let parent_names: Vec<Option<&str>> = requests
        .iter()
        .map(|r| r.parent.as_ref().map(|p| p.name.as_str()))
        .collect();
    let parent_ids: Vec<Option<&str>> = requests
        .iter()
        .map(|r| r.parent.as_ref().map(|p| p.id.as_str()))
        .collect();
    let priorities: Vec<i32> = requests.iter().map(|r| r.priority).collect();
    let rows = db
        .query(
            START,
            INSTANCES_START,
            &[
                &names,
                &ids,
                &inputs,
                &parent_names,
                &parent_ids,
                &priorities,
            ],
        )
        .await?;
    Ok(in_batch_order(
        &rows,
        requests.len(),
        START,
        "n",
        |row, _| {
            Some(row::instance(row, START).and_then(|instance| {
                Ok(Started {
                    created: column(row, "created", START)?,
                    instance,
                })
            }))
        },
    ))
}

const INSTANCE_CONFIRM: &str =
    "SELECT outcome, row_status FROM keiro_instance_confirm($1, $2, $3, $4, $5)";

pub(crate) async fn instance_confirm(
    db: &Db,
    key: &InstanceKey,
    fence: &Fence,
    ttl: Duration,
) -> Result<Status> {
    let row = db
        .query_one(
            CONFIRM,
            INSTANCE_CONFIRM,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &fence.owner,
                &fence.epoch,
                &span_ms(ttl),
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", CONFIRM)?;
    match outcome.as_str() {
        "confirmed" | "terminal" => {
            let status: String = column(&row, "row_status", CONFIRM)?;
            row::status(&status, CONFIRM)
        }
        "not_found" => Err(not_found(key)),
        "lease_lost" => Err(lease_lost(key, fence)),
        other => Err(unknown_outcome(CONFIRM, other)),
    }
}

/// A park commits without waiting for its flush (`synchronous_commit` is read at commit, so
/// setting it anywhere in the statement applies): nobody is told a park is durable, and WAL is
/// flushed in order, so the wake that follows a park (a synchronous append, or a report whose
/// run then appends) flushes it first. A crash that drops an unflushed park leaves the run
/// `running` under its old lease, which expires and re-drives it: nothing is lost, and a busy
/// database does not wait for one flush per parked run.
const INSTANCE_PARK: &str = "SELECT p.outcome, p.row_status \
     FROM keiro_instance_park($1, $2, $3, $4, $5, $6, $7) p, \
          set_config('synchronous_commit', 'off', true)";

pub(crate) async fn instance_park(db: &Db, park: &Park) -> Result<ParkOutcome> {
    let key = &park.key;
    let owner = park.fence.as_ref().map(|f| f.owner.as_str());
    let epoch = park.fence.as_ref().map(|f| f.epoch);
    let row = db
        .query_one(
            PARK,
            INSTANCE_PARK,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &park.generation,
                &owner,
                &epoch,
                &park.awaited,
                &park.wake_after,
            ],
        )
        .await?;
    park_outcome(&row, park, PARK)
}

/// Reads a park's outcome (`outcome`, `row_status`), for `instance_park` and the park that
/// carries remote dispatches.
pub(crate) fn park_outcome(row: &Row, park: &Park, operation: &'static str) -> Result<ParkOutcome> {
    let key = &park.key;
    let outcome: String = column(row, "outcome", operation)?;
    match outcome.as_str() {
        "suspended" => Ok(ParkOutcome::Suspended),
        "woken" => Ok(ParkOutcome::WokenBeforePark),
        "terminal" => {
            let status: String = column(row, "row_status", operation)?;
            Ok(ParkOutcome::Terminal(row::status(&status, operation)?))
        }
        "not_found" => Err(not_found(key)),
        "lease_lost" => match &park.fence {
            Some(fence) => Err(lease_lost(key, fence)),
            None => Err(unknown_outcome(operation, "lease_lost without a fence")),
        },
        other => Err(unknown_outcome(operation, other)),
    }
}

const INSTANCE_FAIL_DIVERGED: &str =
    "SELECT outcome FROM keiro_instance_fail_diverged($1, $2, $3, $4, $5)";

pub(crate) async fn instance_fail_diverged(
    db: &Db,
    key: &InstanceKey,
    fence: Option<&Fence>,
    reason: &str,
) -> Result<bool> {
    let owner = fence.map(|f| f.owner.as_str());
    let epoch = fence.map(|f| f.epoch);
    let row = db
        .query_one(
            FAIL_DIVERGED,
            INSTANCE_FAIL_DIVERGED,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &owner,
                &epoch,
                &reason,
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", FAIL_DIVERGED)?;
    match (outcome.as_str(), fence) {
        ("failed", _) => Ok(true),
        ("terminal", _) => Ok(false),
        ("not_found", _) => Err(not_found(key)),
        ("lease_lost", Some(fence)) => Err(lease_lost(key, fence)),
        (other, _) => Err(unknown_outcome(FAIL_DIVERGED, other)),
    }
}

const INSTANCE_SETTLE_LEFTOVERS: &str =
    "SELECT keiro_instance_settle_leftovers($1, $2, $3) AS settled";

pub(crate) async fn instance_settle_leftovers(
    db: &Db,
    key: &InstanceKey,
    generation: i32,
) -> Result<u64> {
    let row = db
        .query_one(
            SETTLE_LEFTOVERS,
            INSTANCE_SETTLE_LEFTOVERS,
            &[&key.name.as_str(), &key.id.as_str(), &generation],
        )
        .await?;
    let settled: i64 = column(&row, "settled", SETTLE_LEFTOVERS)?;
    Ok(u64::try_from(settled).unwrap_or(0))
}

const INSTANCE_CANCEL: &str =
    "SELECT outcome, recorded, marker FROM keiro_instance_cancel($1, $2, $3)";

pub(crate) async fn instance_cancel(
    db: &Db,
    key: &InstanceKey,
    cascade: bool,
) -> Result<AppendOutcome> {
    let row = db
        .query_one(
            CANCEL,
            INSTANCE_CANCEL,
            &[&key.name.as_str(), &key.id.as_str(), &cascade],
        )
        .await?;
    append_outcome(&row, CANCEL, key, None)
}

const INSTANCE_REQUEUE: &str = "SELECT outcome, row_status, reset_steps, child_names, child_ids \
     FROM keiro_instance_requeue($1, $2)";

pub(crate) async fn instance_requeue(db: &Db, key: &InstanceKey) -> Result<RequeueOutcome> {
    let row = db
        .query_one(
            REQUEUE,
            INSTANCE_REQUEUE,
            &[&key.name.as_str(), &key.id.as_str()],
        )
        .await?;
    let outcome: String = column(&row, "outcome", REQUEUE)?;
    match outcome.as_str() {
        "requeued" => {
            let names: Option<Vec<String>> = column(&row, "child_names", REQUEUE)?;
            let ids: Option<Vec<String>> = column(&row, "child_ids", REQUEUE)?;
            let (names, ids) = (names.unwrap_or_default(), ids.unwrap_or_default());
            if names.len() != ids.len() {
                return Err(malformed(
                    REQUEUE,
                    "the requeued children's columns differ in length",
                ));
            }
            let children = names
                .iter()
                .zip(&ids)
                .map(|(name, id)| row::key(name, id, REQUEUE))
                .collect::<Result<Vec<_>>>()?;
            Ok(RequeueOutcome::Requeued {
                reset_steps: row::count(&row, "reset_steps", REQUEUE)?,
                children,
            })
        }
        "not_failed" => {
            let status: String = column(&row, "row_status", REQUEUE)?;
            Ok(RequeueOutcome::NotFailed(row::status(&status, REQUEUE)?))
        }
        "not_found" => Ok(RequeueOutcome::NotFound),
        other => Err(unknown_outcome(REQUEUE, other)),
    }
}

const RETRY_WITH_INPUT: &str =
    "SELECT outcome FROM keiro_instance_retry_with_input($1, $2, $3, $4, $5)";

pub(crate) async fn instance_retry_with_input(
    db: &Db,
    origin: &InstanceKey,
    retry: &InstanceKey,
    input: &Value,
) -> Result<RetryOutcome> {
    let row = db
        .query_one(
            RETRY,
            RETRY_WITH_INPUT,
            &[
                &origin.name.as_str(),
                &origin.id.as_str(),
                &retry.name.as_str(),
                &retry.id.as_str(),
                input,
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", RETRY)?;
    match outcome.as_str() {
        "started" => Ok(RetryOutcome::Started(retry.clone())),
        "exists" => Ok(RetryOutcome::Exists(retry.clone())),
        "origin_not_found" => Ok(RetryOutcome::OriginNotFound),
        other => Err(unknown_outcome(RETRY, other)),
    }
}

const INSTANCE_GET: &str = concat!(
    "SELECT ",
    instance_columns!(""),
    " FROM workflows WHERE workflow_name = $1 AND workflow_id = $2"
);

pub(crate) async fn instance_get(db: &Db, key: &InstanceKey) -> Result<Option<Instance>> {
    let rows = db
        .query(GET, INSTANCE_GET, &[&key.name.as_str(), &key.id.as_str()])
        .await?;
    rows.first().map(|row| row::instance(row, GET)).transpose()
}

const INSTANCES_GET: &str = concat!(
    "SELECT r.n::int AS n, w.workflow_name IS NOT NULL AS found, ",
    instance_columns!("w."),
    " FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS r(name, id, n) ",
    "LEFT JOIN workflows w ON w.workflow_name = r.name AND w.workflow_id = r.id"
);

/// The rows of several callers' instances in one statement: an answer per key, in the order
/// given (`None` for an instance that does not exist).
pub(crate) async fn instances_get(
    db: &Db,
    keys: &[&InstanceKey],
) -> Result<Vec<Option<Result<Option<Instance>>>>> {
    let (names, ids) = key_arrays(keys);
    let rows = db.query(GET, INSTANCES_GET, &[&names, &ids]).await?;
    Ok(in_batch_order(&rows, keys.len(), GET, "n", |row, _| {
        Some(match column::<bool>(row, "found", GET) {
            Ok(true) => row::instance(row, GET).map(Some),
            Ok(false) => Ok(None),
            Err(error) => Err(error),
        })
    }))
}

/// The names and the ids of `keys`, as the arrays a batch statement takes.
fn key_arrays<'a>(keys: &[&'a InstanceKey]) -> (Vec<&'a str>, Vec<&'a str>) {
    keys.iter()
        .map(|key| (key.name.as_str(), key.id.as_str()))
        .unzip()
}

// Marks an instance awaited, so it notifies when it closes: only marked instances notify, since
// a NOTIFY on every completion serializes completions on the WAL flush. A result waiter marks
// its instance once, when its first wait starts; the mark and a close serialize on the row
// lock, so either the close sees the mark and notifies, or the mark sees the close and the
// waiter reads at once.
//
// Only a live row is marked: after waiting for a closing transaction's row lock, the UPDATE
// re-checks the status on the row that transaction left, so "no row" means closed (or gone).
// `awaited` is not indexed, so the new row version can be HOT.
//
// A runnable (`running`) row is announced again on the wake channel: the mark holds the row
// lock until it commits, and a worker whose claim (`FOR UPDATE SKIP LOCKED`) came in that
// moment, woken by the start's own notification, skipped the row and would not look again
// until its poll. Parked rows are woken by their own sources, so only running ones are
// announced.
const INSTANCE_MARK_AWAITED: &str = "WITH marked AS ( \
         UPDATE workflows SET awaited = true \
         WHERE workflow_name = $1 AND workflow_id = $2 AND status IN ('running', 'suspended') \
         RETURNING status) \
     SELECT count(*) AS marked, \
            count(CASE WHEN status = 'running' THEN keiro_notify_wake($1, $2)::text END) AS announced \
     FROM marked";

/// Marks `key` awaited. `false` when it is no longer live (closed, or never started): nothing
/// will notify, and the waiter should read the row now.
pub(crate) async fn instance_mark_awaited(db: &Db, key: &InstanceKey) -> Result<bool> {
    let row = db
        .query_one(
            MARK_AWAITED,
            INSTANCE_MARK_AWAITED,
            &[&key.name.as_str(), &key.id.as_str()],
        )
        .await?;
    Ok(row::count(&row, "marked", MARK_AWAITED)? > 0)
}

// Several waiters' marks in one statement, each as `INSTANCE_MARK_AWAITED` would make it. Rows
// another transaction holds are skipped (so the batch never waits for a lock, and never
// deadlocks, whatever order it meets rows in): such a request answers `held` and is sent alone
// afterwards, where it waits for the lock as a lone mark does. `gone` is a row that is not
// live (closed, or never started). The runnable rows marked are announced again, as a lone
// mark announces its own.
const INSTANCES_MARK_AWAITED: &str = "WITH r AS ( \
         SELECT name, id, n::int AS n \
         FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS r(name, id, n)), \
     locked AS ( \
         SELECT w.workflow_name, w.workflow_id FROM workflows w \
         WHERE (w.workflow_name, w.workflow_id) IN (SELECT name, id FROM r) \
           AND w.status IN ('running', 'suspended') \
         FOR UPDATE SKIP LOCKED), \
     marked AS ( \
         UPDATE workflows w SET awaited = true FROM locked l \
         WHERE w.workflow_name = l.workflow_name AND w.workflow_id = l.workflow_id \
           AND w.status IN ('running', 'suspended') \
         RETURNING w.workflow_name, w.workflow_id, w.status) \
     SELECT r.n, \
            CASE WHEN m.workflow_id IS NOT NULL THEN 'marked' \
                 WHEN EXISTS (SELECT 1 FROM workflows w \
                              WHERE w.workflow_name = r.name AND w.workflow_id = r.id \
                                AND w.status IN ('running', 'suspended')) THEN 'held' \
                 ELSE 'gone' END AS outcome, \
            CASE WHEN m.status = 'running' \
                 THEN keiro_notify_wake(m.workflow_name, m.workflow_id)::text END AS announced \
     FROM r LEFT JOIN marked m ON m.workflow_name = r.name AND m.workflow_id = r.id";

/// Marks several waiters' instances awaited in one statement: an answer per key, in the order
/// given (`true` marked, `false` no longer live), `None` for a row another transaction held,
/// which the caller sends alone.
pub(crate) async fn instances_mark_awaited(
    db: &Db,
    keys: &[&InstanceKey],
) -> Result<Vec<Option<Result<bool>>>> {
    let (names, ids) = key_arrays(keys);
    let rows = db
        .query(MARK_AWAITED, INSTANCES_MARK_AWAITED, &[&names, &ids])
        .await?;
    Ok(in_batch_order(
        &rows,
        keys.len(),
        MARK_AWAITED,
        "n",
        |row, _| match column::<String>(row, "outcome", MARK_AWAITED) {
            Ok(outcome) => match outcome.as_str() {
                "marked" => Some(Ok(true)),
                "gone" => Some(Ok(false)),
                "held" => None,
                other => Some(Err(unknown_outcome(MARK_AWAITED, other))),
            },
            Err(error) => Some(Err(error)),
        },
    ))
}
