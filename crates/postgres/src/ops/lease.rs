//! `crates/migrations/functions/lease.sql`: claims (one, a direct start leased to its caller, or a worker's
//! batch), crash accounting, the hand-back of a run its worker could not open, and resurrection, with the plain statements of discovery,
//! renewal and release beside them; each one statement and one round trip.
//!
//! # Design
//!
//! The database is authoritative for leases: `lease_expires_at` is written and compared with
//! the database clock (`now()`) unless a caller pins `now` (tests). A claim is one conditional
//! `UPDATE` that bumps `lease_epoch`, the fencing token; every write a holder makes afterwards
//! (appends, confirms, parks, crash records, releases) names both owner and epoch and is refused
//! as `LeaseLost` once either changed. How long a holder trusts its lease between those writes
//! is the run driver's business (`keiro-lease` docs); this module only makes each check and the
//! write it guards one atomic statement.

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{
    store::StartRequest, Fence, Instance, InstanceKey, JournalEntry, WorkflowName,
};
use keiro_lease::{
    classify_refusal, Claim, ClaimGate, ClaimOutcome, Crash, CrashOutcome, OpenRefusal,
    RefusalOutcome, ResurrectOutcome, StartClaim, Versions,
};
use serde_json::Value;
use time::OffsetDateTime;
use tokio_postgres::Row;

use crate::db::Db;
use crate::ops::{lease_lost, not_found, span_ms, unknown_outcome};
use crate::row::{self, column, in_batch_order, instance_columns, malformed, StoredEntry};

const RUNNABLE: &str = "discovering runnable instances";
const CLAIM: &str = "claiming an instance";
pub(crate) const START_CLAIMED: &str = "starting an instance leased to its caller";
const RENEW: &str = "renewing a lease";
const RELEASE: &str = "releasing a lease";
const FORCE_RELEASE: &str = "force-releasing a lease";
const RECORD_CRASH: &str = "recording a crash";
const REFUSE_OPEN: &str = "handing back a run its worker cannot open";
const RESURRECT: &str = "resurrecting an instance";
const CLAIM_BATCH: &str = "claiming a batch of instances";

const INSTANCE_CLAIM: &str = concat!(
    "SELECT c.granted, c.clock, ",
    instance_columns!("(c.instance)."),
    ", c.journal_seq, c.journal_step, c.journal_kind, c.journal_payload, c.journal_recorded_at",
    " FROM keiro_instance_claim($1, $2, $3, $4, $5, $6) c"
);

pub(crate) async fn instance_claim(
    db: &Db,
    key: &InstanceKey,
    versions: &Versions,
    owner: &str,
    ttl: Duration,
    now: Option<OffsetDateTime>,
) -> Result<ClaimOutcome> {
    let row = db
        .query_one(
            CLAIM,
            INSTANCE_CLAIM,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &owner,
                &span_ms(ttl),
                &now,
                &versions.as_filter(),
            ],
        )
        .await?;
    let granted: bool = column(&row, "granted", CLAIM)?;
    if !granted {
        let clock: OffsetDateTime = column(&row, "clock", CLAIM)?;
        return Ok(classify_refusal(gate(&row)?, clock).into());
    }
    let instance = row::instance(&row, CLAIM)?;
    let fence = Fence {
        owner: owner.to_owned(),
        epoch: instance.lease_epoch,
    };
    let journal = match claimed_journal(&row, &instance) {
        Ok(journal) => journal,
        Err(malformed) => {
            // Nobody can drive a journal that does not decode; hand the lease back rather than
            // leave the instance blocked until it expires. Best effort: the error is the news.
            let _ = instance_release(db, key, &fence, false).await;
            return Err(malformed);
        }
    };
    Ok(ClaimOutcome::Acquired(Box::new(Claim {
        fence,
        instance,
        journal,
    })))
}

// One statement: the start and the claim commit together (crates/migrations/functions/lease.sql says why
// the row is inserted with its lease rather than claimed after the insert).
const INSTANCE_START_CLAIMED: &str = concat!(
    "SELECT c.created, c.granted, c.clock, ",
    instance_columns!("(c.instance)."),
    ", c.journal_seq, c.journal_step, c.journal_kind, c.journal_payload, c.journal_recorded_at",
    " FROM keiro_instance_start_claimed($1, $2, $3, $4, $5, $6, $7, $8, $9) c"
);

/// A direct start: the instance started (or found) and leased to `owner`.
#[derive(Debug, Clone)]
pub(crate) struct StartClaimed {
    pub(crate) request: StartRequest,
    pub(crate) owner: String,
    pub(crate) ttl: Duration,
    pub(crate) now: Option<OffsetDateTime>,
}

/// One direct start: `keiro_instance_start_claimed`.
pub(crate) async fn instance_start_claimed(db: &Db, start: &StartClaimed) -> Result<StartClaim> {
    let StartClaimed {
        request,
        owner,
        ttl,
        now,
    } = start;
    let parent_name = request.parent.as_ref().map(|p| p.name.as_str());
    let parent_id = request.parent.as_ref().map(|p| p.id.as_str());
    let row = db
        .query_one(
            START_CLAIMED,
            INSTANCE_START_CLAIMED,
            &[
                &request.key.name.as_str(),
                &request.key.id.as_str(),
                &request.input,
                &parent_name,
                &parent_id,
                &request.priority,
                &owner.as_str(),
                &span_ms(*ttl),
                now,
            ],
        )
        .await?;
    start_claim(db, &row, start).await
}

const INSTANCES_START_CLAIMED: &str = concat!(
    "SELECT c.n, c.created, c.granted, c.clock, ",
    instance_columns!("(c.instance)."),
    ", c.journal_seq, c.journal_step, c.journal_kind, c.journal_payload, c.journal_recorded_at",
    " FROM keiro_instances_start_claimed($1, $2, $3, $4, $5, $6, $7, $8, $9) c"
);

/// Direct starts of several callers in one statement (`keiro_instances_start_claimed`): an
/// outcome per start, in the order given.
pub(crate) async fn instances_start_claimed(
    db: &Db,
    batch: &[StartClaimed],
) -> Result<Vec<Option<Result<StartClaim>>>> {
    let names: Vec<&str> = batch.iter().map(|r| r.request.key.name.as_str()).collect();
    let ids: Vec<&str> = batch.iter().map(|r| r.request.key.id.as_str()).collect();
    let inputs: Vec<&serde_json::Value> = batch.iter().map(|r| &r.request.input).collect();
    let parent_names: Vec<Option<&str>> = batch
        .iter()
        .map(|r| r.request.parent.as_ref().map(|p| p.name.as_str()))
        .collect();
    let parent_ids: Vec<Option<&str>> = batch
        .iter()
        .map(|r| r.request.parent.as_ref().map(|p| p.id.as_str()))
        .collect();
    let priorities: Vec<i32> = batch.iter().map(|r| r.request.priority).collect();
    let owners: Vec<&str> = batch.iter().map(|r| r.owner.as_str()).collect();
    let ttls: Vec<i64> = batch.iter().map(|r| span_ms(r.ttl)).collect();
    let nows: Vec<Option<OffsetDateTime>> = batch.iter().map(|r| r.now).collect();
    let rows = db
        .query(
            START_CLAIMED,
            INSTANCES_START_CLAIMED,
            &[
                &names,
                &ids,
                &inputs,
                &parent_names,
                &parent_ids,
                &priorities,
                &owners,
                &ttls,
                &nows,
            ],
        )
        .await?;
    let mut answers = Vec::with_capacity(batch.len());
    for answer in in_batch_order(&rows, batch.len(), START_CLAIMED, "n", |row, i| {
        Some(Ok((row.clone(), i)))
    }) {
        answers.push(match answer {
            Some(Ok((row, i))) => Some(start_claim(db, &row, &batch[i]).await),
            Some(Err(error)) => Some(Err(error)),
            None => None,
        });
    }
    Ok(answers)
}

/// What one row of either start statement says: the claim granted (with the journal to
/// replay), or the refusal classified at the statement's clock.
async fn start_claim(db: &Db, row: &Row, start: &StartClaimed) -> Result<StartClaim> {
    let created: bool = column(row, "created", START_CLAIMED)?;
    let granted: bool = column(row, "granted", START_CLAIMED)?;
    if !granted {
        let clock: OffsetDateTime = column(row, "clock", START_CLAIMED)?;
        return Ok(StartClaim {
            created,
            claim: classify_refusal(gate(row)?, clock).into(),
        });
    }
    let instance = row::instance(row, START_CLAIMED)?;
    let fence = Fence {
        owner: start.owner.clone(),
        epoch: instance.lease_epoch,
    };
    let journal = match claimed_journal(row, &instance) {
        Ok(journal) => journal,
        Err(malformed) => {
            // As for a claim: a journal nobody can drive goes back unleased.
            let _ = instance_release(db, &start.request.key, &fence, false).await;
            return Err(malformed);
        }
    };
    Ok(StartClaim {
        created,
        claim: ClaimOutcome::Acquired(Box::new(Claim {
            fence,
            instance,
            journal,
        })),
    })
}

// The function returns one row per claimed instance: the row after the claim and the current
// generation's journal, so a whole batch of claims costs one round trip.
const INSTANCES_CLAIM_BATCH: &str = concat!(
    "SELECT ",
    instance_columns!("(c.instance)."),
    ", c.journal_seq, c.journal_step, c.journal_kind, c.journal_payload, c.journal_recorded_at",
    " FROM keiro_instances_claim_batch($1, $2, $3, $4, $5, $6) c"
);

pub(crate) async fn instances_claim_batch(
    db: &Db,
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
            CLAIM_BATCH,
            INSTANCES_CLAIM_BATCH,
            &[
                &names,
                &owner,
                &span_ms(ttl),
                &limit,
                &now,
                &versions.as_filter(),
            ],
        )
        .await?;
    claims_of_rows(db, &rows, owner, CLAIM_BATCH).await
}

/// The claims of a batch's rows (each the row after the claim and its journal's arrays), for
/// `owner`. As for a single claim, a row whose journal cannot be read goes back unleased and
/// the others are kept; the error is returned only when no claim is left.
pub(crate) async fn claims_of_rows(
    db: &Db,
    rows: &[Row],
    owner: &str,
    operation: &'static str,
) -> Result<Vec<Claim>> {
    let mut claims = Vec::with_capacity(rows.len());
    let mut malformed = None;
    for row in rows {
        let instance = row::instance(row, operation)?;
        let fence = Fence {
            owner: owner.to_owned(),
            epoch: instance.lease_epoch,
        };
        match claimed_journal(row, &instance) {
            Ok(journal) => claims.push(Claim {
                fence,
                instance,
                journal,
            }),
            Err(error) => {
                let _ = instance_release(db, &instance.key, &fence, false).await;
                malformed.get_or_insert(error);
            }
        }
    }
    match malformed {
        Some(error) if claims.is_empty() => Err(error),
        _ => Ok(claims),
    }
}

/// The refused row's claim gate; `None` when the instance does not exist.
fn gate(row: &Row) -> Result<Option<ClaimGate>> {
    let status: Option<String> = column(row, "status", CLAIM)?;
    let Some(status) = status else {
        return Ok(None);
    };
    Ok(Some(ClaimGate {
        status: row::status(&status, CLAIM)?,
        lease_expires_at: column(row, "lease_expires_at", CLAIM)?,
        next_attempt_at: column(row, "next_attempt_at", CLAIM)?,
    }))
}

/// The journal a granted claim returned as parallel arrays, put in `seq` order.
fn claimed_journal(row: &Row, instance: &Instance) -> Result<Vec<JournalEntry>> {
    let seqs: Option<Vec<i64>> = column(row, "journal_seq", CLAIM)?;
    let steps: Option<Vec<String>> = column(row, "journal_step", CLAIM)?;
    let kinds: Option<Vec<String>> = column(row, "journal_kind", CLAIM)?;
    let payloads: Option<Vec<Value>> = column(row, "journal_payload", CLAIM)?;
    let recorded: Option<Vec<OffsetDateTime>> = column(row, "journal_recorded_at", CLAIM)?;
    // `array_agg` over no rows is NULL: an empty generation.
    let (seqs, steps, kinds, payloads, recorded) = (
        seqs.unwrap_or_default(),
        steps.unwrap_or_default(),
        kinds.unwrap_or_default(),
        payloads.unwrap_or_default(),
        recorded.unwrap_or_default(),
    );
    let len = seqs.len();
    if [steps.len(), kinds.len(), payloads.len(), recorded.len()] != [len; 4] {
        return Err(malformed(
            CLAIM,
            "the claimed journal's columns differ in length",
        ));
    }
    let mut journal = seqs
        .into_iter()
        .zip(steps)
        .zip(kinds)
        .zip(payloads)
        .zip(recorded)
        .map(|((((seq, step_name), kind), payload), recorded_at)| {
            StoredEntry {
                seq,
                generation: instance.generation,
                step_name,
                kind,
                payload,
                recorded_at,
            }
            .decode(CLAIM)
        })
        .collect::<Result<Vec<_>>>()?;
    // The claim functions aggregate the rows in one pass, in index order (by step name), which
    // saves the database a sort per array; the replay needs them in append order.
    journal.sort_unstable_by_key(|entry| entry.seq);
    Ok(journal)
}

const INSTANCE_RECORD_CRASH: &str =
    "SELECT outcome, crash_attempts, retry_at FROM keiro_instance_record_crash($1, $2, $3, $4, $5, $6, $7)";

pub(crate) async fn instance_record_crash(
    db: &Db,
    key: &InstanceKey,
    fence: &Fence,
    crash: &Crash,
) -> Result<CrashOutcome> {
    let row = db
        .query_one(
            RECORD_CRASH,
            INSTANCE_RECORD_CRASH,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &fence.owner,
                &fence.epoch,
                &crash.error,
                &span_ms(crash.retry_delay),
                &crash.max_attempts,
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", RECORD_CRASH)?;
    match outcome.as_str() {
        "retrying" => Ok(CrashOutcome::Retrying {
            attempts: column(&row, "crash_attempts", RECORD_CRASH)?,
            next_attempt_at: column(&row, "retry_at", RECORD_CRASH)?,
        }),
        "failed" => Ok(CrashOutcome::Failed {
            attempts: column(&row, "crash_attempts", RECORD_CRASH)?,
        }),
        "terminal" => Ok(CrashOutcome::AlreadyTerminal),
        "not_found" => Err(not_found(key)),
        "lease_lost" => Err(lease_lost(key, fence)),
        other => Err(unknown_outcome(RECORD_CRASH, other)),
    }
}

const INSTANCE_REFUSE_OPEN: &str =
    "SELECT outcome, refusals, retry_at FROM keiro_instance_refuse_open($1, $2, $3, $4, $5, $6)";

pub(crate) async fn instance_refuse_open(
    db: &Db,
    key: &InstanceKey,
    fence: &Fence,
    refusal: &OpenRefusal,
) -> Result<RefusalOutcome> {
    let row = db
        .query_one(
            REFUSE_OPEN,
            INSTANCE_REFUSE_OPEN,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &fence.owner,
                &fence.epoch,
                &refusal.error,
                &span_ms(refusal.retry_delay),
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", REFUSE_OPEN)?;
    match outcome.as_str() {
        "refused" => Ok(RefusalOutcome::Released {
            refusals: column(&row, "refusals", REFUSE_OPEN)?,
            next_attempt_at: column(&row, "retry_at", REFUSE_OPEN)?,
        }),
        "terminal" => Ok(RefusalOutcome::AlreadyTerminal),
        "not_found" => Err(not_found(key)),
        "lease_lost" => Err(lease_lost(key, fence)),
        other => Err(unknown_outcome(REFUSE_OPEN, other)),
    }
}

const INSTANCE_RESURRECT: &str = "SELECT outcome, row_status FROM keiro_instance_resurrect($1, $2)";

pub(crate) async fn instance_resurrect(db: &Db, key: &InstanceKey) -> Result<ResurrectOutcome> {
    let row = db
        .query_one(
            RESURRECT,
            INSTANCE_RESURRECT,
            &[&key.name.as_str(), &key.id.as_str()],
        )
        .await?;
    let outcome: String = column(&row, "outcome", RESURRECT)?;
    match outcome.as_str() {
        "resurrected" => Ok(ResurrectOutcome::Resurrected),
        "not_failed" => {
            let status: String = column(&row, "row_status", RESURRECT)?;
            Ok(ResurrectOutcome::NotFailed(row::status(
                &status, RESURRECT,
            )?))
        }
        "not_found" => Ok(ResurrectOutcome::NotFound),
        other => Err(unknown_outcome(RESURRECT, other)),
    }
}

/// The discovery statement. Both arms name their status positively so the planner can prove
/// each implies a partial index's predicate and serve it from there, whatever the number of
/// terminal instances: the running arm walks `workflows_running_claim_idx` in claim order and
/// stops at the limit, so a limited discovery over a backlog of any size reads about the rows
/// it returns (one query over both statuses sorted every runnable row first); the due
/// suspended arm reads `workflows_active_idx`. `LIMIT NULL` is no limit.
///
/// Public only so the plan test can `EXPLAIN` the exact statement the store runs.
pub const INSTANCES_RUNNABLE: &str = "SELECT workflow_name, workflow_id FROM (\
     (SELECT priority, created_at, workflow_name, workflow_id FROM workflows \
      WHERE status = 'running' AND (queue IS NULL OR queue_admitted) \
      ORDER BY priority DESC, created_at, workflow_name, workflow_id LIMIT $2) \
     UNION ALL \
     (SELECT priority, created_at, workflow_name, workflow_id FROM workflows \
      WHERE status = 'suspended' AND wake_after IS NOT NULL AND wake_after <= coalesce($1, now()) \
        AND (queue IS NULL OR queue_admitted) \
      ORDER BY priority DESC, created_at, workflow_name, workflow_id LIMIT $2)) AS runnable \
     ORDER BY priority DESC, created_at, workflow_name, workflow_id \
     LIMIT $2";

pub(crate) async fn instances_runnable(
    db: &Db,
    now: Option<OffsetDateTime>,
    limit: Option<i64>,
) -> Result<Vec<InstanceKey>> {
    // A negative limit asks for nothing, not for an SQL error.
    let limit = limit.map(|n| n.max(0));
    let rows = db
        .query(RUNNABLE, INSTANCES_RUNNABLE, &[&now, &limit])
        .await?;
    rows.iter()
        .map(|row| {
            let name: String = column(row, "workflow_name", RUNNABLE)?;
            let id: String = column(row, "workflow_id", RUNNABLE)?;
            InstanceKey::parse(&name, &id)
                .map_err(|e| malformed(RUNNABLE, format_args!("instance key {name:?}/{id:?}: {e}")))
        })
        .collect()
}

// One statement, so telling "not yours" from "not there" costs no second round trip; both
// parts read the same snapshot.
const INSTANCE_LEASE_RENEW: &str = "WITH renewed AS ( \
         UPDATE workflows SET lease_expires_at = now() + $5::bigint * interval '1 millisecond', \
                              updated_at = now() \
         WHERE workflow_name = $1 AND workflow_id = $2 AND lease_owner = $3 AND lease_epoch = $4 \
           AND status IN ('running', 'suspended') \
         RETURNING 1) \
     SELECT EXISTS (SELECT 1 FROM renewed) AS renewed, \
            EXISTS (SELECT 1 FROM workflows WHERE workflow_name = $1 AND workflow_id = $2) AS present";

pub(crate) async fn instance_lease_renew(
    db: &Db,
    key: &InstanceKey,
    fence: &Fence,
    ttl: Duration,
) -> Result<()> {
    let row = db
        .query_one(
            RENEW,
            INSTANCE_LEASE_RENEW,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &fence.owner,
                &fence.epoch,
                &span_ms(ttl),
            ],
        )
        .await?;
    let renewed: bool = column(&row, "renewed", RENEW)?;
    let present: bool = column(&row, "present", RENEW)?;
    match (renewed, present) {
        (true, _) => Ok(()),
        (false, true) => Err(lease_lost(key, fence)),
        (false, false) => Err(not_found(key)),
    }
}

const INSTANCE_RELEASE: &str = "UPDATE workflows SET lease_owner = NULL, lease_expires_at = NULL, \
         attempts = CASE WHEN $5 THEN 0 ELSE attempts END, \
         open_refusals = CASE WHEN $5 THEN 0 ELSE open_refusals END, \
         last_error = CASE WHEN $5 THEN NULL ELSE last_error END, \
         next_attempt_at = CASE WHEN $5 THEN NULL ELSE next_attempt_at END, \
         updated_at = now() \
     WHERE workflow_name = $1 AND workflow_id = $2 AND lease_owner = $3 AND lease_epoch = $4";

pub(crate) async fn instance_release(
    db: &Db,
    key: &InstanceKey,
    fence: &Fence,
    progressed: bool,
) -> Result<bool> {
    let changed = db
        .execute(
            RELEASE,
            INSTANCE_RELEASE,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &fence.owner,
                &fence.epoch,
                &progressed,
            ],
        )
        .await?;
    Ok(changed > 0)
}

// The epoch stays: the old holder's fence no longer matches `lease_owner`, and the next claim
// bumps the epoch past it anyway.
const INSTANCE_LEASE_FORCE_RELEASE: &str = "UPDATE workflows \
     SET lease_owner = NULL, lease_expires_at = NULL, updated_at = now() \
     WHERE workflow_name = $1 AND workflow_id = $2 AND lease_owner IS NOT NULL";

pub(crate) async fn instance_lease_force_release(db: &Db, key: &InstanceKey) -> Result<bool> {
    let changed = db
        .execute(
            FORCE_RELEASE,
            INSTANCE_LEASE_FORCE_RELEASE,
            &[&key.name.as_str(), &key.id.as_str()],
        )
        .await?;
    Ok(changed > 0)
}
