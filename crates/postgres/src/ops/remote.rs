//! `crates/migrations/functions/remote.sql`: remote steps: arming a task (the workflow side), the
//! task-table transport (claim, heartbeat, report), redispatch, and the park that dispatches
//! (one run's, or several runs' in one statement); with the plain statements that list an
//! instance's tasks and make an asynchronous report durable beside them. (The operator's
//! requeue and fix-and-replay are in `instance.sql`.)
//!
//! # Design
//!
//! A remote task is a row of `remote_tasks` keyed by its stable step id. Every operation is
//! one call of a `keiro_*` function, so one round trip and one transaction (the parks of
//! several runs that dispatch at the same moment share one: `keiro_instances_park_arms`):
//!
//! - arming locks the task row (when it exists), then the owner's row `FOR KEY SHARE` (so a
//!   cancellation committing meanwhile cannot miss the task), and writes the task once; a
//!   re-arm only learns its state, and redispatches or loses it when its deadline passed;
//! - a claim counts each expired claim of its groups as a failed attempt (the task is
//!   `pending` again, or failed as `remote_step_crashed` at its limit, journaled into the
//!   owner), then takes available pending tasks `FOR UPDATE SKIP LOCKED` in priority-then-age
//!   order, so concurrent workers split the backlog and never wait for each other; a task on a
//!   queue is taken only within its queue's limits, counted under the queue row's lock with
//!   the runs of that queue (`keiro_remote_tasks_claim_queued`);
//! - a report locks the task row, settles it and journals the result into the owner through
//!   the shared append rules (task row before instance row), which flip a parked owner to
//!   `running` and notify it;
//! - the requeue locks the failed tasks and the linked instance tree before the instance
//!   itself, supersedes failed results with `reset` rows (history is never rewritten) and
//!   returns the run, and its failed children, to `running`;
//! - cancelling a run, or continuing it as new, cancels the pending and claimed tasks of the
//!   generation it closes, in the same transaction: a cancelled task is never claimed again,
//!   its heartbeats answer `cancelled` and its reports are refused.
//!
//! A task that became claimable notifies `remote` on the wake channel (see `listen`).

use std::time::Duration;

use keiro_journal::queue::QueueRefusal;
use keiro_journal::store::Result;
use keiro_journal::{
    store::Park, store::ParkOutcome, store::RemoteArm, store::RemoteArmOutcome, Backoff,
    InstanceKey, StoreError,
};
use keiro_remote::{
    ClaimRequest, ClaimedTask, HeartbeatOutcome, RemoteTask, ReportOutcome, TaskFailure, TaskStatus,
};
use serde_json::Value;
use time::OffsetDateTime;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::db::Db;
use crate::ops::instance::park_outcome;
use crate::ops::{lease_lost, not_found, span_ms, unknown_outcome};
use crate::row::{self, column, in_batch_order, malformed, position};

const ARM: &str = "arming a remote step";
const CLAIM: &str = "claiming remote tasks";
const HEARTBEAT: &str = "heartbeating a remote task";
const COMPLETE: &str = "completing a remote task";
const FAIL: &str = "failing a remote task";
const PARK_DISPATCH: &str = "parking a run with its remote dispatches";
pub(crate) const PARK_BATCH: &str = "parking runs with their remote dispatches";
const REDISPATCH: &str = "redispatching remote tasks";
const TASKS: &str = "reading remote tasks";
const FLUSH: &str = "flushing asynchronous commits";

/// A count or limit for an `integer` column; larger values mean "no limit" anyway.
fn int(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Reads an `integer` column that is never negative.
fn natural(row: &Row, name: &str, operation: &'static str) -> Result<u32> {
    let n: i32 = column(row, name, operation)?;
    u32::try_from(n).map_err(|_| malformed(operation, format_args!("negative {name} {n}")))
}

/// Reads a `bigint` column of milliseconds.
fn millis(row: &Row, name: &str, operation: &'static str) -> Result<Duration> {
    let ms: i64 = column(row, name, operation)?;
    u64::try_from(ms)
        .map(Duration::from_millis)
        .map_err(|_| malformed(operation, format_args!("negative {name} {ms}")))
}

/// Reads the owner columns.
fn owner(row: &Row, operation: &'static str) -> Result<InstanceKey> {
    let name: String = column(row, "workflow_name", operation)?;
    let id: String = column(row, "workflow_id", operation)?;
    row::key(&name, &id, operation)
}

const REMOTE_TASK_ARM: &str = "SELECT outcome, deadline, settled FROM keiro_remote_task_arm(\
     $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)";

/// [`JournalStore::remote_arm`](keiro_journal::JournalStore::remote_arm).
pub(crate) async fn remote_arm(db: &Db, arm: &RemoteArm) -> Result<RemoteArmOutcome> {
    let owner = arm.fence.as_ref().map(|f| f.owner.as_str());
    let epoch = arm.fence.as_ref().map(|f| f.epoch);
    let row = db
        .query_one(
            ARM,
            REMOTE_TASK_ARM,
            &[
                &arm.step_id,
                &arm.key.name.as_str(),
                &arm.key.id.as_str(),
                &arm.generation,
                &arm.step,
                &arm.journal_step,
                &arm.group,
                &arm.input,
                &arm.priority,
                &arm.traceparent,
                &int(arm.max_attempts),
                &span_ms(arm.backoff.initial),
                &span_ms(arm.backoff.max),
                &arm.backoff.jitter,
                &arm.redispatch_after.map(span_ms),
                &int(arm.redispatch_max),
                &owner,
                &epoch,
                &arm.queue,
                &arm.queue_key,
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", ARM)?;
    let deadline: Option<OffsetDateTime> = column(&row, "deadline", ARM)?;
    let settled: Option<Value> = column(&row, "settled", ARM)?;
    arm_outcome(&outcome, deadline, settled, arm)
}

/// Reads one arm's outcome code (with its deadline and settled value).
fn arm_outcome(
    outcome: &str,
    deadline: Option<OffsetDateTime>,
    settled: Option<Value>,
    arm: &RemoteArm,
) -> Result<RemoteArmOutcome> {
    let settled = |lost| RemoteArmOutcome::Settled {
        value: settled.unwrap_or(Value::Null),
        lost,
    };
    match outcome {
        "dispatched" => Ok(RemoteArmOutcome::Dispatched { deadline }),
        "waiting" => Ok(RemoteArmOutcome::Waiting { deadline }),
        "redispatched" => Ok(RemoteArmOutcome::Redispatched { deadline }),
        "settled" => Ok(settled(false)),
        "lost" => Ok(settled(true)),
        "not_found" => Err(not_found(&arm.key)),
        "lease_lost" => match &arm.fence {
            Some(fence) => Err(lease_lost(&arm.key, fence)),
            None => Err(unknown_outcome(ARM, "lease_lost without a fence")),
        },
        "unknown_queue" => Err(unknown_queue(arm)),
        other => Err(unknown_outcome(ARM, other)),
    }
}

/// The refusal of an arm on an undeclared queue.
fn unknown_queue(arm: &RemoteArm) -> StoreError {
    match &arm.queue {
        Some(queue) => StoreError::QueueRefused {
            queue: queue.clone(),
            refusal: QueueRefusal::Unknown,
        },
        None => unknown_outcome(ARM, "unknown_queue without a queue"),
    }
}

// The columns are spelled out (never `*`), so a column added by a later migration cannot change
// the result type of a statement a running process has already prepared.
const TASKS_CLAIM: &str = "SELECT step_id, claim, workflow_name, workflow_id, generation, step, \
     grp, input, priority, traceparent, attempts, max_attempts, backoff_initial_ms, \
     backoff_max_ms, backoff_jitter, dispatches, available_at \
     FROM keiro_remote_tasks_claim($1, $2, $3, $4)";

pub(crate) async fn tasks_claim(db: &Db, request: &ClaimRequest) -> Result<Vec<ClaimedTask>> {
    if request.groups.is_empty() || request.limit == 0 {
        return Ok(Vec::new());
    }
    let rows = db
        .query(
            CLAIM,
            TASKS_CLAIM,
            &[
                &request.groups,
                &request.worker,
                &int(request.limit),
                &span_ms(request.claim_ttl),
            ],
        )
        .await?;
    rows.iter().map(claimed_task).collect()
}

fn claimed_task(row: &Row) -> Result<ClaimedTask> {
    let claim: Option<Uuid> = column(row, "claim", CLAIM)?;
    Ok(ClaimedTask {
        step_id: column(row, "step_id", CLAIM)?,
        claim: claim.ok_or_else(|| malformed(CLAIM, "a claimed task has no claim"))?,
        key: owner(row, CLAIM)?,
        generation: column(row, "generation", CLAIM)?,
        step: column(row, "step", CLAIM)?,
        group: column(row, "grp", CLAIM)?,
        input: column(row, "input", CLAIM)?,
        priority: column(row, "priority", CLAIM)?,
        traceparent: column(row, "traceparent", CLAIM)?,
        attempt: natural(row, "attempts", CLAIM)?.saturating_add(1),
        max_attempts: natural(row, "max_attempts", CLAIM)?,
        backoff: Backoff {
            initial: millis(row, "backoff_initial_ms", CLAIM)?,
            max: millis(row, "backoff_max_ms", CLAIM)?,
            jitter: column(row, "backoff_jitter", CLAIM)?,
        },
        dispatches: natural(row, "dispatches", CLAIM)?,
        available_at: column(row, "available_at", CLAIM)?,
    })
}

const TASK_HEARTBEAT: &str = "SELECT outcome FROM keiro_remote_task_heartbeat($1, $2, $3)";

pub(crate) async fn task_heartbeat(
    db: &Db,
    step_id: &str,
    claim: Uuid,
    ttl: Duration,
) -> Result<HeartbeatOutcome> {
    let row = db
        .query_one(
            HEARTBEAT,
            TASK_HEARTBEAT,
            &[&step_id, &claim, &span_ms(ttl)],
        )
        .await?;
    let outcome: String = column(&row, "outcome", HEARTBEAT)?;
    match outcome.as_str() {
        "extended" => Ok(HeartbeatOutcome::Extended),
        "lost" => Ok(HeartbeatOutcome::Lost),
        "cancelled" => Ok(HeartbeatOutcome::Cancelled),
        other => Err(unknown_outcome(HEARTBEAT, other)),
    }
}

/// Reads the outcome of a report.
fn report(row: &Row, operation: &'static str) -> Result<ReportOutcome> {
    let outcome: String = column(row, "outcome", operation)?;
    match outcome.as_str() {
        "delivered" => Ok(ReportOutcome::Delivered),
        "owner_gone" => Ok(ReportOutcome::OwnerGone),
        "already_settled" => Ok(ReportOutcome::AlreadySettled),
        "stale" => Ok(ReportOutcome::Stale),
        "not_found" => Ok(ReportOutcome::NotFound),
        "cancelled" => Ok(ReportOutcome::Cancelled),
        "retrying" => {
            let at: Option<OffsetDateTime> = column(row, "retry_at", operation)?;
            at.map(|at| ReportOutcome::Retrying { at })
                .ok_or_else(|| malformed(operation, "a retry without its time"))
        }
        other => Err(unknown_outcome(operation, other)),
    }
}

const TASK_COMPLETE: &str = "SELECT outcome FROM keiro_remote_task_complete($1, $2)";

pub(crate) async fn task_complete(db: &Db, step_id: &str, output: &Value) -> Result<ReportOutcome> {
    let row = db
        .query_one(COMPLETE, TASK_COMPLETE, &[&step_id, output])
        .await?;
    report(&row, COMPLETE)
}

const TASKS_COMPLETE: &str = "SELECT step_id, outcome FROM keiro_remote_tasks_complete($1, $2)";

pub(crate) async fn tasks_complete(
    db: &Db,
    reports: &[(String, Value)],
) -> Result<Vec<ReportOutcome>> {
    let step_ids: Vec<&str> = reports.iter().map(|(id, _)| id.as_str()).collect();
    let outputs: Vec<&Value> = reports.iter().map(|(_, output)| output).collect();
    let rows = db
        .query(COMPLETE, TASKS_COMPLETE, &[&step_ids, &outputs])
        .await?;
    // The function journals in its own (lock) order; answer in the caller's.
    let mut by_id = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
        let step_id: String = column(row, "step_id", COMPLETE)?;
        by_id.insert(step_id, report(row, COMPLETE)?);
    }
    step_ids
        .iter()
        .map(|id| {
            by_id
                .get(*id)
                .copied()
                .ok_or_else(|| malformed(COMPLETE, "a report without its outcome"))
        })
        .collect()
}

const TASK_FAIL: &str =
    "SELECT outcome, retry_at FROM keiro_remote_task_fail($1, $2, $3, $4, $5, $6)";

pub(crate) async fn task_fail(
    db: &Db,
    step_id: &str,
    claim: Uuid,
    failure: &TaskFailure,
    retry_delay: Duration,
) -> Result<ReportOutcome> {
    let row = db
        .query_one(
            FAIL,
            TASK_FAIL,
            &[
                &step_id,
                &claim,
                &failure.message,
                &failure.code,
                &failure.retryable,
                &span_ms(retry_delay),
            ],
        )
        .await?;
    report(&row, FAIL)
}

const REDISPATCH_PENDING: &str =
    "SELECT outcome, redispatched FROM keiro_remote_redispatch_pending($1, $2)";

pub(crate) async fn remote_redispatch_pending(db: &Db, key: &InstanceKey) -> Result<Option<u64>> {
    let row = db
        .query_one(
            REDISPATCH,
            REDISPATCH_PENDING,
            &[&key.name.as_str(), &key.id.as_str()],
        )
        .await?;
    let outcome: String = column(&row, "outcome", REDISPATCH)?;
    match outcome.as_str() {
        "redispatched" => Ok(Some(row::count(&row, "redispatched", REDISPATCH)?)),
        "not_found" => Ok(None),
        other => Err(unknown_outcome(REDISPATCH, other)),
    }
}

// Statement parameters are spelled out like the other operations'; the arrays carry one
// element per deferred arm.
const INSTANCE_PARK_ARMS: &str = "SELECT p.outcome, p.row_status, p.arm_outcomes, \
     p.arm_deadlines, p.arm_settled \
     FROM keiro_instance_park_arms($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
     $14, $15, $16, $17, $18, $19, $20, $21, $22) p";

/// The task columns of a list of arms, one array per column, as the park statements take them.
#[derive(Default)]
pub(crate) struct ArmColumns<'a> {
    step_ids: Vec<&'a str>,
    steps: Vec<&'a str>,
    journal_steps: Vec<&'a str>,
    groups: Vec<&'a str>,
    inputs: Vec<&'a Value>,
    priorities: Vec<i32>,
    traceparents: Vec<Option<&'a str>>,
    max_attempts: Vec<i32>,
    backoff_initial: Vec<i64>,
    backoff_max: Vec<i64>,
    backoff_jitter: Vec<bool>,
    redispatch_after: Vec<Option<i64>>,
    redispatch_max: Vec<i32>,
    queues: Vec<Option<&'a str>>,
    queue_keys: Vec<Option<&'a str>>,
}

impl<'a> ArmColumns<'a> {
    pub(crate) fn push(&mut self, arm: &'a RemoteArm) {
        self.step_ids.push(&arm.step_id);
        self.steps.push(&arm.step);
        self.journal_steps.push(&arm.journal_step);
        self.groups.push(&arm.group);
        self.inputs.push(&arm.input);
        self.priorities.push(arm.priority);
        self.traceparents.push(arm.traceparent.as_deref());
        self.max_attempts.push(int(arm.max_attempts));
        self.backoff_initial.push(span_ms(arm.backoff.initial));
        self.backoff_max.push(span_ms(arm.backoff.max));
        self.backoff_jitter.push(arm.backoff.jitter);
        self.redispatch_after
            .push(arm.redispatch_after.map(span_ms));
        self.redispatch_max.push(int(arm.redispatch_max));
        self.queues.push(arm.queue.as_deref());
        self.queue_keys.push(arm.queue_key.as_deref());
    }

    /// The arrays, in the order both park statements take them.
    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 15] {
        [
            &self.step_ids,
            &self.steps,
            &self.journal_steps,
            &self.groups,
            &self.inputs,
            &self.priorities,
            &self.traceparents,
            &self.max_attempts,
            &self.backoff_initial,
            &self.backoff_max,
            &self.backoff_jitter,
            &self.redispatch_after,
            &self.redispatch_max,
            &self.queues,
            &self.queue_keys,
        ]
    }
}

/// [`JournalStore::instance_park_dispatch`](keiro_journal::JournalStore::instance_park_dispatch)
/// in one transaction of its own: the arms, then the park.
pub(crate) async fn instance_park_dispatch(
    db: &Db,
    park: &Park,
    arms: &[RemoteArm],
) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
    let key = &park.key;
    let owner = park.fence.as_ref().map(|f| f.owner.as_str());
    let epoch = park.fence.as_ref().map(|f| f.epoch);
    let mut columns = ArmColumns::default();
    arms.iter().for_each(|arm| columns.push(arm));
    let (name, id) = (key.name.as_str(), key.id.as_str());
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &name,
        &id,
        &park.generation,
        &owner,
        &epoch,
        &park.awaited,
        &park.wake_after,
    ];
    params.extend(columns.params());
    let row = db
        .query_one(PARK_DISPATCH, INSTANCE_PARK_ARMS, &params)
        .await?;
    park_dispatch_outcome(&row, park, arms)
}

/// Reads one park-with-dispatches row (`outcome`, `row_status` and the three arm arrays).
pub(crate) fn park_dispatch_outcome(
    row: &Row,
    park: &Park,
    arms: &[RemoteArm],
) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
    let codes: Vec<String> = column(row, "arm_outcomes", PARK_DISPATCH)?;
    let outcome: String = column(row, "outcome", PARK_DISPATCH)?;
    if outcome == "unknown_queue" {
        // Nothing was armed; `arm_outcomes` marks the arms on an undeclared queue.
        let refused = codes.iter().position(|code| code == "unknown_queue");
        return Err(match refused.and_then(|i| arms.get(i)) {
            Some(arm) => unknown_queue(arm),
            None => malformed(PARK_DISPATCH, "unknown_queue names no arm"),
        });
    }
    let park_outcome = park_outcome(row, park, PARK_DISPATCH)?;
    let deadlines: Vec<Option<OffsetDateTime>> = column(row, "arm_deadlines", PARK_DISPATCH)?;
    let settled: Vec<Option<Value>> = column(row, "arm_settled", PARK_DISPATCH)?;
    if codes.len() != arms.len() || deadlines.len() != arms.len() || settled.len() != arms.len() {
        return Err(malformed(PARK_DISPATCH, "one outcome per arm"));
    }
    let outcomes = arms
        .iter()
        .zip(codes.iter().zip(deadlines.into_iter().zip(settled)))
        .map(|(arm, (code, (deadline, settled)))| arm_outcome(code, deadline, settled, arm))
        .collect::<Result<Vec<_>>>()?;
    Ok((park_outcome, outcomes))
}

const INSTANCES_PARK_ARMS: &str = "SELECT p.park, p.outcome, p.row_status, \
     p.arm_outcomes, p.arm_deadlines, p.arm_settled \
     FROM keiro_instances_park_arms($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
     $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26) p";

/// Parks with their remote dispatches of several runs in one statement
/// (`keiro_instances_park_arms`): an outcome per park, in the order given. An error here
/// means the statement failed, so nothing of it was written; a refusal of one park (not found,
/// lease lost) is that park's outcome.
pub(crate) async fn instances_park_dispatch(
    db: &Db,
    batch: &[(&Park, &[RemoteArm])],
) -> Result<Vec<Option<Result<(ParkOutcome, Vec<RemoteArmOutcome>)>>>> {
    let mut names = Vec::with_capacity(batch.len());
    let mut ids = Vec::with_capacity(batch.len());
    let mut generations = Vec::with_capacity(batch.len());
    let mut owners = Vec::with_capacity(batch.len());
    let mut epochs = Vec::with_capacity(batch.len());
    let mut wake_after = Vec::with_capacity(batch.len());
    let (mut awaited_from, mut awaited_to, mut awaited) = (Vec::new(), Vec::new(), Vec::new());
    let (mut arms_from, mut arms_to, mut arms) = (Vec::new(), Vec::new(), ArmColumns::default());
    let mut arm_count = 0;
    for (park, park_arms) in batch {
        names.push(park.key.name.as_str());
        ids.push(park.key.id.as_str());
        generations.push(park.generation);
        owners.push(park.fence.as_ref().map(|f| f.owner.as_str()));
        epochs.push(park.fence.as_ref().map(|f| f.epoch));
        wake_after.push(park.wake_after);
        // 1-based inclusive slices; an empty one ends before it starts.
        awaited_from.push(position(awaited.len() + 1));
        awaited.extend(park.awaited.iter().map(String::as_str));
        awaited_to.push(position(awaited.len()));
        arms_from.push(position(arm_count + 1));
        park_arms.iter().for_each(|arm| arms.push(arm));
        arm_count += park_arms.len();
        arms_to.push(position(arm_count));
    }
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &names,
        &ids,
        &generations,
        &owners,
        &epochs,
        &wake_after,
        &awaited_from,
        &awaited_to,
        &awaited,
        &arms_from,
        &arms_to,
    ];
    params.extend(arms.params());
    let rows = db.query(PARK_BATCH, INSTANCES_PARK_ARMS, &params).await?;
    // From here on the batch has committed: a row that cannot be read is that park's error,
    // never a reason to park again.
    Ok(in_batch_order(
        &rows,
        batch.len(),
        PARK_BATCH,
        "park",
        |row, i| Some(park_dispatch_outcome(row, batch[i].0, batch[i].1)),
    ))
}

// Served by `remote_tasks_owner_idx` (its (name, id) prefix).
const REMOTE_TASKS: &str = "SELECT step_id, workflow_name, workflow_id, generation, step, \
     journal_step, grp, status, attempts, max_attempts, dispatches, claimed_by, last_error, \
     output, traceparent FROM remote_tasks \
     WHERE workflow_name = $1 AND workflow_id = $2 ORDER BY created_at, step_id";

pub(crate) async fn remote_tasks(db: &Db, key: &InstanceKey) -> Result<Vec<RemoteTask>> {
    let rows = db
        .query(TASKS, REMOTE_TASKS, &[&key.name.as_str(), &key.id.as_str()])
        .await?;
    rows.iter().map(remote_task).collect()
}

fn remote_task(row: &Row) -> Result<RemoteTask> {
    let status: String = column(row, "status", TASKS)?;
    Ok(RemoteTask {
        step_id: column(row, "step_id", TASKS)?,
        key: owner(row, TASKS)?,
        generation: column(row, "generation", TASKS)?,
        step: column(row, "step", TASKS)?,
        journal_step: column(row, "journal_step", TASKS)?,
        group: column(row, "grp", TASKS)?,
        status: TaskStatus::parse(&status).ok_or_else(|| {
            malformed(TASKS, format_args!("unknown remote task status {status:?}"))
        })?,
        attempts: natural(row, "attempts", TASKS)?,
        max_attempts: natural(row, "max_attempts", TASKS)?,
        dispatches: natural(row, "dispatches", TASKS)?,
        claimed_by: column(row, "claimed_by", TASKS)?,
        last_error: column(row, "last_error", TASKS)?,
        output: column(row, "output", TASKS)?,
        traceparent: column(row, "traceparent", TASKS)?,
    })
}

// A commit waits for its flush only when its transaction wrote WAL before the commit record
// (a transaction id alone is not enough), so the barrier rewrites one row: the task whose
// settled result is about to be handed over. Under the session's default
// `synchronous_commit = on` its commit returns once WAL is on disk up to it, and so up to every
// earlier commit, the report's included. It runs only on this rare path.
const FLUSH_BARRIER: &str = "UPDATE remote_tasks SET step_id = step_id WHERE step_id = $1";

/// Returns once every commit visible to this session is flushed to disk, by a synchronous
/// rewrite of task `step_id`.
///
/// The remote path commits its arms, claims, reports and parks with `synchronous_commit = off`.
/// Such a commit is visible to every session at once, but written to disk only by the WAL
/// writer, within `wal_writer_delay` (or by the next synchronous commit, since WAL is flushed
/// in order). A value read from it is therefore safe to act on only after a flush:
///
/// - a run woken by a report reads it in its claim, and the claim commits synchronously, which
///   flushes the report first: safe;
/// - an arm that finds its task already settled hands the result straight to the body, which
///   may act on it (send the email) before anything else commits: if PostgreSQL then crashed,
///   the report would be gone, the handler would run again, and the journal could end with
///   another value than the one acted on. So this runs first: one tiny transaction that
///   commits synchronously, which flushes every WAL record before it, the report's included.
pub(crate) async fn flushed(db: &Db, step_id: &str) -> Result<()> {
    db.execute(FLUSH, FLUSH_BARRIER, &[&step_id]).await?;
    Ok(())
}
