//! Rules of crates/migrations/functions/lease.sql (claims, crash accounting, the hand-back of a
//! run its worker could not open, resurrection), then the
//! one-statement lease operations the Postgres store runs from Rust
//! (crates/postgres/src/lease.rs: discovery, renew, release, force release).
//!
//! Not here: `keiro_instances_start_claimed` (the writer runs each direct start of a batch as
//! its own operation in one shared transaction).

use crate::cached::Cached;
use keiro_journal::store::Result;
use keiro_journal::JournalEntry;
use rusqlite::{params, Connection};
use time::OffsetDateTime;

use crate::child;
use crate::error::store;
use crate::journal::journal_repeatable_name;
use crate::notify;
use crate::row::{self, micros, Stored};

const CLAIM: &str = "claiming an instance";
const START_CLAIMED: &str = "starting an instance claimed";
const CLAIM_BATCH: &str = "claiming a batch of instances";
const RECORD_CRASH: &str = "recording a crash";
const REFUSE_OPEN: &str = "handing back a run its worker cannot open";
const RESURRECT: &str = "resurrecting an instance";
pub(crate) const RUNNABLE: &str = "listing runnable instances";
const RENEW: &str = "renewing a lease";
const RELEASE: &str = "releasing a lease";
const FORCE_RELEASE: &str = "force-releasing a lease";

/// A claim's answer: granted or not, the instant it was judged at, the row (after the claim
/// when granted, as it is otherwise), and the current generation's journal when granted.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub(crate) granted: bool,
    pub(crate) clock: OffsetDateTime,
    pub(crate) instance: Option<Stored>,
    pub(crate) journal: Vec<JournalEntry>,
}

const INSTANCE_CLAIM: &str = "UPDATE workflows SET \
         lease_owner = ?3, lease_epoch = lease_epoch + 1, lease_expires_at = ?4, updated_at = ?5 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 \
       AND status IN ('running', 'suspended') \
       AND (lease_expires_at IS NULL OR lease_expires_at < ?6) \
       AND (next_attempt_at IS NULL OR next_attempt_at <= ?6) \
       AND (queue IS NULL OR (queue_admitted AND lease_expires_at IS NULL)) \
       AND (?7 IS NULL OR coalesce(app_version, '') IN (SELECT value FROM json_each(?7)))";

/// The claim's version filter (`p_versions`) as the rules bind it: `None` for any version,
/// else a JSON array of the versions served (`""` for unversioned runs).
pub(crate) fn versions_filter(versions: Option<&[String]>) -> Option<String> {
    versions.map(|list| serde_json::Value::from(list.to_vec()).to_string())
}

/// keiro_instance_claim: one conditional UPDATE takes the lease (runnable, lease free or
/// expired, backoff gate passed, judged at `p_now` or the store's clock; a run on a queue only
/// while it holds its slot, queue.sql's `queue_admit` being its claim otherwise); a granted claim also
/// returns the row and the current generation's journal. A refused claim returns the row as it
/// is, for the caller to classify at `clock`. Only a run of a version in `versions` (`None`:
/// any) is claimed.
#[allow(clippy::too_many_arguments)] // keiro_instance_claim's parameters, in its order
pub(crate) fn instance_claim(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    owner: &str,
    ttl_ms: i64,
    p_now: Option<OffsetDateTime>,
    versions: Option<&[String]>,
) -> Result<Claimed> {
    let clock = p_now.unwrap_or(now);
    let judged = micros(clock);
    let granted = conn
        .execute_cached(
            INSTANCE_CLAIM,
            params![
                name,
                id,
                owner,
                judged.saturating_add(ttl_ms.saturating_mul(1000)),
                micros(now),
                judged,
                versions_filter(versions)
            ],
        )
        .map_err(|e| store(CLAIM, e))?
        == 1;
    let instance = row::instance_row(conn, name, id, CLAIM)?;
    let journal = match (&instance, granted) {
        (Some(row), true) => row::journal_generation(conn, name, id, row.generation, CLAIM)?,
        _ => Vec::new(),
    };
    Ok(Claimed {
        granted,
        clock,
        instance,
        journal,
    })
}

const INSTANCE_INSERT_CLAIMED: &str = "INSERT INTO workflows \
         (workflow_name, workflow_id, input, parent_name, parent_id, priority, \
          lease_owner, lease_epoch, lease_expires_at, created_at, updated_at, app_version) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, ?8, ?9, ?9, keiro_app_version()) \
     ON CONFLICT (workflow_name, workflow_id) DO NOTHING";

const INSTANCE_CLAIM_DUE: &str = "UPDATE workflows SET \
         lease_owner = ?3, lease_epoch = lease_epoch + 1, lease_expires_at = ?4, updated_at = ?5 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 \
       AND (status = 'running' \
            OR (status = 'suspended' AND wake_after IS NOT NULL AND wake_after <= ?6)) \
       AND (lease_expires_at IS NULL OR lease_expires_at < ?6) \
       AND (next_attempt_at IS NULL OR next_attempt_at <= ?6) \
       AND (queue IS NULL OR (queue_admitted AND lease_expires_at IS NULL))";

/// keiro_instance_start_claimed: direct execution starts an instance already leased to its
/// caller. A new row is inserted with the caller's lease on it (epoch 1); an existing row keeps
/// its input and is claimed only when a worker could claim it now (the discovery predicate:
/// running, or suspended with a due `wake_after`; lease free or expired; gate open; a run on a
/// queue only while it holds its slot). Returns
/// whether the row was created, with the claim's answer as [`instance_claim`]'s. No
/// notification, as in plpgsql.
#[allow(clippy::too_many_arguments)] // keiro_instance_start_claimed's parameters, in its order
pub(crate) fn instance_start_claimed(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    input: &serde_json::Value,
    parent: Option<(&str, &str)>,
    priority: i32,
    owner: &str,
    ttl_ms: i64,
    p_now: Option<OffsetDateTime>,
) -> Result<(bool, Claimed)> {
    let clock = p_now.unwrap_or(now);
    let judged = micros(clock);
    let expires = judged.saturating_add(ttl_ms.saturating_mul(1000));
    let created = conn
        .execute_cached(
            INSTANCE_INSERT_CLAIMED,
            params![
                name,
                id,
                row::json(input),
                parent.map(|p| p.0),
                parent.map(|p| p.1),
                priority,
                owner,
                expires,
                micros(now)
            ],
        )
        .map_err(|e| store(START_CLAIMED, e))?
        == 1;
    // A fresh row has no journal.
    let granted = created
        || conn
            .execute_cached(
                INSTANCE_CLAIM_DUE,
                params![name, id, owner, expires, micros(now), judged],
            )
            .map_err(|e| store(START_CLAIMED, e))?
            == 1;
    let instance = row::instance_row(conn, name, id, START_CLAIMED)?;
    let journal = match (&instance, granted && !created) {
        (Some(row), true) => {
            row::journal_generation(conn, name, id, row.generation, START_CLAIMED)?
        }
        _ => Vec::new(),
    };
    Ok((
        created,
        Claimed {
            granted,
            clock,
            instance,
            journal,
        },
    ))
}

/// The candidates of a batch claim: running rows, and suspended ones with a due `wake_after`,
/// of the given names, lease free or expired, gate open, and on a queue only while holding a
/// slot or free on a queue served (`?5`, a JSON array); highest priority first, then oldest.
/// Served by `workflows_running_claim_idx` and `workflows_active_idx`. No `SKIP LOCKED`:
/// the writer is alone in its transaction, so no row is held by another claimer.
const INSTANCES_CLAIMABLE: &str = "SELECT workflow_name, workflow_id FROM workflows \
     WHERE workflow_name IN (SELECT value FROM json_each(?1)) \
       AND (status = 'running' \
            OR (status = 'suspended' AND wake_after IS NOT NULL AND wake_after <= ?2)) \
       AND (lease_expires_at IS NULL OR lease_expires_at < ?2) \
       AND (next_attempt_at IS NULL OR next_attempt_at <= ?2) \
       AND (queue IS NULL OR (queue_admitted AND lease_expires_at IS NULL) \
            OR (queue_free AND queue IN (SELECT value FROM json_each(?5)))) \
       AND (?4 IS NULL OR coalesce(app_version, '') IN (SELECT value FROM json_each(?4))) \
     ORDER BY priority DESC, created_at, workflow_name, workflow_id \
     LIMIT max(?3, 0)";

const INSTANCE_CLAIM_PICKED: &str = "UPDATE workflows SET \
         lease_owner = ?3, lease_epoch = lease_epoch + 1, lease_expires_at = ?4, updated_at = ?5 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// keiro_instances_claim_batch: claims up to `limit` runnable instances of `names` for
/// `owner`, each with its row after the claim and its current generation's journal, in claim
/// order. Only runs of a version in `versions` (`None`: any) are claimed, and free runs of a
/// queue (0009) only when `queues` names it.
#[allow(clippy::too_many_arguments)] // keiro_instances_claim_batch's parameters, in its order
pub(crate) fn instances_claim_batch(
    conn: &Connection,
    now: OffsetDateTime,
    names: &[&str],
    owner: &str,
    ttl_ms: i64,
    limit: i64,
    p_now: Option<OffsetDateTime>,
    versions: Option<&[String]>,
    queues: &[String],
) -> Result<Vec<(Stored, Vec<JournalEntry>)>> {
    let judged = micros(p_now.unwrap_or(now));
    let names = serde_json::Value::from(names.to_vec()).to_string();
    let queues = serde_json::Value::from(queues.to_vec()).to_string();
    let picked: Vec<(String, String)> = conn
        .prepare_cached(INSTANCES_CLAIMABLE)
        .and_then(|mut s| {
            s.query_map(
                params![names, judged, limit, versions_filter(versions), queues],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?
            .collect()
        })
        .map_err(|e| store(CLAIM_BATCH, e))?;
    let expires = judged.saturating_add(ttl_ms.saturating_mul(1000));
    let mut claimed = Vec::with_capacity(picked.len());
    for (name, id) in picked {
        conn.execute_cached(
            INSTANCE_CLAIM_PICKED,
            params![name, id, owner, expires, micros(now)],
        )
        .map_err(|e| store(CLAIM_BATCH, e))?;
        let row = row::instance_row(conn, &name, &id, CLAIM_BATCH)?
            .ok_or_else(|| crate::error::malformed(CLAIM_BATCH, "a claimed row is missing"))?;
        let journal = row::journal_generation(conn, &name, &id, row.generation, CLAIM_BATCH)?;
        claimed.push((row, journal));
    }
    Ok(claimed)
}

/// keiro_instance_record_crash's outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CrashCode {
    /// Counted; retried at the instant.
    Retrying(i32, OffsetDateTime),
    /// At the ceiling: failed.
    Failed(i32),
    Terminal,
    NotFound,
    LeaseLost,
}

const JOURNAL_INSERT_MARKER: &str = "INSERT INTO journal \
         (workflow_name, workflow_id, generation, step_name, kind, payload, recorded_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

const INSTANCE_CRASH_FAIL: &str = "UPDATE workflows SET \
         attempts = ?3, status = 'failed', last_error = ?4, completed_at = ?5, \
         lease_owner = NULL, lease_expires_at = NULL, updated_at = ?5 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// A crashed run on a queue gives its slot back; it is admitted again after its backoff, like
/// any waiting run.
const INSTANCE_CRASH_RETRY: &str = "UPDATE workflows SET \
         attempts = ?3, last_error = ?4, next_attempt_at = ?5, \
         lease_owner = NULL, lease_expires_at = NULL, queue_admitted = 0, updated_at = ?6 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// keiro_instance_record_crash: counts a crash of the fenced run and releases its lease; at
/// the ceiling it fails the run, journaling the failure in the same transaction, and delivers
/// the failure to a waiting parent. A retried run gives its queue slot back.
#[allow(clippy::too_many_arguments)] // keiro_instance_record_crash's parameters, in its order
pub(crate) fn instance_record_crash(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    owner: &str,
    epoch: i64,
    error: &str,
    retry_delay_ms: i64,
    max_attempts: i32,
) -> Result<CrashCode> {
    let Some(row) = row::instance_row(conn, name, id, RECORD_CRASH)? else {
        return Ok(CrashCode::NotFound);
    };
    if row.is_terminal() {
        return Ok(CrashCode::Terminal);
    }
    if !row.held_by(owner, epoch) {
        return Ok(CrashCode::LeaseLost);
    }
    let at = micros(now);
    let attempts = row.attempts.saturating_add(1);
    if attempts >= max_attempts {
        let step = journal_repeatable_name(
            conn,
            name,
            id,
            row.generation,
            "failed",
            keiro_journal::store::marker_name::FAILED,
        )?;
        let payload = serde_json::Value::String(error.to_owned()).to_string();
        conn.execute_cached(
            JOURNAL_INSERT_MARKER,
            params![name, id, row.generation, step, "failed", payload, at],
        )
        .map_err(|e| store(RECORD_CRASH, e))?;
        conn.execute_cached(INSTANCE_CRASH_FAIL, params![name, id, attempts, error, at])
            .map_err(|e| store(RECORD_CRASH, e))?;
        child::child_deliver(conn, now, name, id)?;
        Ok(CrashCode::Failed(attempts))
    } else {
        let retry_at = at.saturating_add(retry_delay_ms.saturating_mul(1000));
        conn.execute_cached(
            INSTANCE_CRASH_RETRY,
            params![name, id, attempts, error, retry_at, at],
        )
        .map_err(|e| store(RECORD_CRASH, e))?;
        Ok(CrashCode::Retrying(
            attempts,
            row::instant(retry_at, RECORD_CRASH)?,
        ))
    }
}

/// keiro_instance_refuse_open's outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefuseCode {
    /// Released; refusals so far, and the instant the run may be claimed again.
    Refused(i32, OffsetDateTime),
    Terminal,
    NotFound,
    LeaseLost,
}

/// As after a crash, a run on a queue gives its slot back while it waits.
const INSTANCE_REFUSE_OPEN: &str = "UPDATE workflows SET \
         open_refusals = open_refusals + 1, last_error = ?5, next_attempt_at = ?6, \
         lease_owner = NULL, lease_expires_at = NULL, queue_admitted = 0, updated_at = ?7 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 \
       AND status IN ('running', 'suspended') AND lease_owner = ?3 AND lease_epoch = ?4 \
     RETURNING open_refusals";

/// keiro_instance_refuse_open: hands back the lease of a fenced run whose payload the claiming
/// worker could not open, without counting a crash: open_refusals + 1, last_error, the gate
/// `retry_delay_ms` from now, the queue slot given back; attempts stay. One conditional
/// UPDATE; only when it changes nothing is the row read, to say why.
#[allow(clippy::too_many_arguments)] // keiro_instance_refuse_open's parameters, in its order
pub(crate) fn instance_refuse_open(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    owner: &str,
    epoch: i64,
    error: &str,
    retry_delay_ms: i64,
) -> Result<RefuseCode> {
    use rusqlite::OptionalExtension;
    let at = micros(now);
    let retry_at = at.saturating_add(retry_delay_ms.saturating_mul(1000));
    let refusals: Option<i32> = conn
        .prepare_cached(INSTANCE_REFUSE_OPEN)
        .and_then(|mut s| {
            s.query_row(params![name, id, owner, epoch, error, retry_at, at], |r| {
                r.get(0)
            })
            .optional()
        })
        .map_err(|e| store(REFUSE_OPEN, e))?;
    if let Some(refusals) = refusals {
        return Ok(RefuseCode::Refused(
            refusals,
            row::instant(retry_at, REFUSE_OPEN)?,
        ));
    }
    Ok(match row::instance_row(conn, name, id, REFUSE_OPEN)? {
        None => RefuseCode::NotFound,
        Some(row) if row.is_terminal() => RefuseCode::Terminal,
        Some(_) => RefuseCode::LeaseLost,
    })
}

/// keiro_instance_resurrect's outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ResurrectCode {
    Resurrected,
    /// With the row's status.
    NotFailed(String),
    NotFound,
}

/// Back from its end, a run of a queue waits for admission (0009).
const INSTANCE_RESURRECT: &str = "UPDATE workflows SET status = 'running', \
         attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL, \
         lease_owner = NULL, lease_expires_at = NULL, completed_at = NULL, updated_at = ?3, \
         queue_free = 0 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// keiro_instance_resurrect: the operator returns a failed instance to `running`. The failure
/// stays in history and a `resurrected` row is appended beside it. Notifies its wake.
pub(crate) fn instance_resurrect(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
) -> Result<ResurrectCode> {
    let Some(row) = row::instance_row(conn, name, id, RESURRECT)? else {
        return Ok(ResurrectCode::NotFound);
    };
    if row.status != "failed" {
        return Ok(ResurrectCode::NotFailed(row.status));
    }
    let at = micros(now);
    let step = journal_repeatable_name(
        conn,
        name,
        id,
        row.generation,
        "resurrected",
        keiro_journal::store::marker_name::RESURRECTED,
    )?;
    conn.execute_cached(
        JOURNAL_INSERT_MARKER,
        params![name, id, row.generation, step, "resurrected", "null", at],
    )
    .map_err(|e| store(RESURRECT, e))?;
    conn.execute_cached(INSTANCE_RESURRECT, params![name, id, at])
        .map_err(|e| store(RESURRECT, e))?;
    notify::wake(conn, RESURRECT, name, id)?;
    Ok(ResurrectCode::Resurrected)
}

/// A run waiting for admission to its queue is not runnable: `queue_admit` is its claim.
const INSTANCES_RUNNABLE: &str = "SELECT workflow_name, workflow_id FROM workflows \
     WHERE (status = 'running' \
        OR (status = 'suspended' AND wake_after IS NOT NULL AND wake_after <= ?1)) \
       AND (queue IS NULL OR queue_admitted) \
     ORDER BY priority DESC, created_at, workflow_name, workflow_id \
     LIMIT ?2";

/// instances_runnable (crates/postgres/src/lease.rs): exact discovery, `limit` `None` for all
/// (SQLite's `LIMIT -1`).
pub(crate) fn instances_runnable(
    conn: &Connection,
    now: OffsetDateTime,
    limit: Option<i64>,
) -> Result<Vec<(String, String)>> {
    let limit = limit.map_or(-1, |n| n.max(0));
    conn.prepare_cached(INSTANCES_RUNNABLE)
        .and_then(|mut s| {
            s.query_map(params![micros(now), limit], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        })
        .map_err(|e| store(RUNNABLE, e))
}

const INSTANCE_LEASE_RENEW: &str = "UPDATE workflows SET lease_expires_at = ?5, updated_at = ?6 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND lease_owner = ?3 AND lease_epoch = ?4 \
       AND status IN ('running', 'suspended')";

/// instance_lease_renew (crates/postgres/src/lease.rs): `Some(true)` renewed, `Some(false)`
/// the fence no longer matches, `None` no such instance.
pub(crate) fn instance_lease_renew(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    owner: &str,
    epoch: i64,
    ttl_ms: i64,
) -> Result<Option<bool>> {
    let at = micros(now);
    let renewed = conn
        .execute_cached(
            INSTANCE_LEASE_RENEW,
            params![
                name,
                id,
                owner,
                epoch,
                at.saturating_add(ttl_ms.saturating_mul(1000)),
                at
            ],
        )
        .map_err(|e| store(RENEW, e))?
        == 1;
    if renewed {
        return Ok(Some(true));
    }
    Ok(row::instance_row(conn, name, id, RENEW)?.map(|_| false))
}

const INSTANCE_RELEASE: &str = "UPDATE workflows SET lease_owner = NULL, lease_expires_at = NULL, \
         attempts = CASE WHEN ?5 THEN 0 ELSE attempts END, \
         open_refusals = CASE WHEN ?5 THEN 0 ELSE open_refusals END, \
         last_error = CASE WHEN ?5 THEN NULL ELSE last_error END, \
         next_attempt_at = CASE WHEN ?5 THEN NULL ELSE next_attempt_at END, \
         updated_at = ?6 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND lease_owner = ?3 AND lease_epoch = ?4";

/// instance_release (crates/postgres/src/lease.rs): whether the fence still matched.
pub(crate) fn instance_release(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    owner: &str,
    epoch: i64,
    progressed: bool,
) -> Result<bool> {
    let changed = conn
        .execute_cached(
            INSTANCE_RELEASE,
            params![name, id, owner, epoch, progressed, micros(now)],
        )
        .map_err(|e| store(RELEASE, e))?;
    Ok(changed > 0)
}

const INSTANCE_LEASE_FORCE_RELEASE: &str = "UPDATE workflows \
     SET lease_owner = NULL, lease_expires_at = NULL, updated_at = ?3 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND lease_owner IS NOT NULL";

/// instance_lease_force_release (crates/postgres/src/lease.rs): whether a lease was dropped.
pub(crate) fn instance_lease_force_release(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
) -> Result<bool> {
    let changed = conn
        .execute_cached(INSTANCE_LEASE_FORCE_RELEASE, params![name, id, micros(now)])
        .map_err(|e| store(FORCE_RELEASE, e))?;
    Ok(changed > 0)
}
