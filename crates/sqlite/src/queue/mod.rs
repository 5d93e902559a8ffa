//! Rules of crates/migrations/functions/queue.sql, in its order: declaring a queue, pausing
//! it, weighting a key, starting a run on a queue, admitting waiting runs (the claim that
//! enforces the limits), and the park trigger's rule (a parked run gives its slot back). Declaring,
//! pausing and weighting are in `declare.rs`; the list of queues the Postgres store reads with
//! plain statements is in `list.rs`.
//!
//! queue.sql's other trigger, `workflows_queue_slot_freed` (a freed slot wakes the workers), is
//! a trigger here too, in migration 0003. The park rule cannot be one: PostgreSQL's is a BEFORE
//! trigger that changes the row being written, which a SQLite trigger cannot do, so
//! [`queue_park`] is asked by `instance_park` (the one statement that suspends a run, which
//! every park goes through, with or without dispatches) and the park's own update carries the
//! change.
//!
//! Where PostgreSQL locks the queue row (`FOR UPDATE`) and skips locked runs (`SKIP LOCKED`),
//! SQLite needs nothing: the writer holds the file's write lock for the whole transaction, so
//! every admission counts what every earlier one wrote. Each count and each pick is otherwise
//! queue.sql's, in its order.

use std::collections::BTreeMap;

use keiro_journal::queue::{DedupPolicy, Fairness};
use keiro_journal::store::Result;
use keiro_journal::JournalEntry;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use time::OffsetDateTime;

use crate::cached::Cached;
use crate::error::{malformed, store};
use crate::notify;
use crate::row::{self, micros, Stored};

mod debounce;
mod declare;
mod held;
mod keys;
mod list;

pub(crate) use debounce::queue_debounce;
pub(crate) use declare::{queue_declare, queue_key_weight, queue_set_paused};
pub(crate) use held::{queue_admitted_since, queue_held, Whose};
pub(crate) use keys::{waiting_keys, KeyScan};
pub(crate) use list::{queues_list, LIST};

const START: &str = "starting an instance on a queue";
const ADMIT: &str = "admitting runs of a queue";
const PARK: &str = "parking an instance";

/// keiro_queue_start's outcomes. Nothing is written unless the outcome is `Started` with
/// `created`.
#[derive(Debug, Clone)]
pub(crate) enum QueueStartCode {
    /// Started: whether the row is new (an existing key keeps its row), and the row.
    Started(bool, Stored),
    /// The dedup id is held and the queue returns the holder.
    Existing(Stored),
    /// The dedup id is held and the queue refuses: the holder.
    Duplicate(Stored),
    /// No such queue.
    Unknown,
    DedupNotEnabled,
    PriorityNotEnabled,
}

const QUEUE_START_OPTIONS: &str = "SELECT dedup, priority FROM keiro_queues WHERE name = ?1";

/// `ON CONFLICT DO NOTHING` with no target, as in plpgsql: it yields to a row holding the key
/// or to a live run holding the dedup id (`workflows_queue_dedup_idx`).
const QUEUE_INSERT: &str = "INSERT INTO workflows \
         (workflow_name, workflow_id, input, parent_name, parent_id, priority, queue, queue_key, \
          dedup_id, next_attempt_at, created_at, updated_at, app_version, queue_free) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11, keiro_app_version(), ?12) \
     ON CONFLICT DO NOTHING";

/// The live run holding a dedup id, served by `workflows_queue_dedup_idx`.
const DEDUP_HOLDER: &str =
    "SELECT workflow_name, workflow_id FROM workflows INDEXED BY workflows_queue_dedup_idx \
     WHERE queue = ?1 AND dedup_id = ?2 AND dedup_id IS NOT NULL \
       AND status IN ('running', 'suspended')";

/// keiro_queue_start: starts a run on a queue, as `keiro_instance_start` does (idempotent by
/// key; a created row notifies its wake), after the queue's checks: it must exist, take dedup
/// ids if one is given and order by priority if one is given. A live run holding the dedup id
/// answers by the queue's policy. plpgsql starts again when neither the key nor the dedup id
/// explains a refused insert (a concurrent holder ended between its statements); nothing runs
/// between these, so that cannot happen here and is answered as `Malformed`.
#[allow(clippy::too_many_arguments)] // keiro_queue_start's parameters, in its order
pub(crate) fn queue_start(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    input: &Value,
    parent: Option<(&str, &str)>,
    priority: i32,
    queue: &str,
    key: Option<&str>,
    dedup_id: Option<&str>,
    not_before: Option<OffsetDateTime>,
) -> Result<QueueStartCode> {
    let options: Option<(Option<String>, bool)> = conn
        .query_row_cached(QUEUE_START_OPTIONS, [queue], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(|e| store(START, e))?;
    let Some((dedup, ordered)) = options else {
        return Ok(QueueStartCode::Unknown);
    };
    if dedup_id.is_some() && dedup.is_none() {
        return Ok(QueueStartCode::DedupNotEnabled);
    }
    if priority != 0 && !ordered {
        return Ok(QueueStartCode::PriorityNotEnabled);
    }
    // A queue that counts nothing and is not paused starts its runs free (0009).
    let free = limits(conn, queue, START)?.is_some_and(|q| q.free());
    let created = conn
        .execute_cached(
            QUEUE_INSERT,
            params![
                name,
                id,
                row::json(input),
                parent.map(|p| p.0),
                parent.map(|p| p.1),
                priority,
                queue,
                key,
                dedup_id,
                not_before.map(micros),
                micros(now),
                free
            ],
        )
        .map_err(|e| store(START, e))?
        == 1;
    if created {
        notify::wake(conn, START, name, id)?;
    }
    if let Some(row) = row::instance_row(conn, name, id, START)? {
        return Ok(QueueStartCode::Started(created, row));
    }
    let holder: Option<(String, String)> = conn
        .query_row_cached(DEDUP_HOLDER, params![queue, dedup_id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(|e| store(START, e))?;
    let holder = match holder {
        Some((name, id)) => row::instance_row(conn, &name, &id, START)?,
        None => None,
    };
    let Some(holder) = holder else {
        return Err(malformed(
            START,
            "the start was refused by neither its key nor its dedup id",
        ));
    };
    Ok(
        match DedupPolicy::parse(dedup.as_deref().unwrap_or_default()) {
            Some(DedupPolicy::Refuse) => QueueStartCode::Duplicate(holder),
            _ => QueueStartCode::Existing(holder),
        },
    )
}

/// What admission (and a remote task claim) reads of a queue row.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub(crate) concurrency: Option<i64>,
    pub(crate) worker_concurrency: Option<i64>,
    pub(crate) key_concurrency: Option<i64>,
    pub(crate) rate_limit: Option<i64>,
    pub(crate) rate_period_ms: Option<i64>,
    pub(crate) key_rate_limit: Option<i64>,
    pub(crate) key_rate_period_ms: Option<i64>,
    pub(crate) weighted: bool,
    pub(crate) paused: bool,
    pub(crate) vtime: f64,
}

impl Limits {
    /// Whether a per-key rule (key concurrency, key rate, weighted fairness) applies.
    pub(crate) fn keyed(&self) -> bool {
        self.key_concurrency.is_some() || self.key_rate_limit.is_some() || self.weighted
    }

    /// keiro_queue_counts_nothing: no limit of any kind, first in first out. Such a queue keeps
    /// no admission state: its runs are claimed as runs without a queue are (free, 0009) or
    /// leased as an ordinary claim leases a run, never marked admitted.
    pub(crate) fn counts_nothing(&self) -> bool {
        self.concurrency.is_none()
            && self.worker_concurrency.is_none()
            && self.key_concurrency.is_none()
            && self.rate_limit.is_none()
            && self.key_rate_limit.is_none()
            && !self.weighted
    }

    /// keiro_queue_free: whether a run started on the queue now starts free (0009): it counts
    /// nothing and is not paused, so a worker serving it claims the run as it claims a run
    /// without a queue.
    pub(crate) fn free(&self) -> bool {
        !self.paused && self.counts_nothing()
    }
}

/// The limits of queue `name`, which the caller read as declared in this transaction.
pub(crate) fn queue_limits(
    conn: &Connection,
    name: &str,
    operation: &'static str,
) -> Result<Limits> {
    limits(conn, name, operation)?
        .ok_or_else(|| malformed(operation, format_args!("the queue {name:?} is missing")))
}

/// The limits of queue `name`, if it is declared.
pub(super) fn limits(
    conn: &Connection,
    name: &str,
    operation: &'static str,
) -> Result<Option<Limits>> {
    conn.query_row_cached(QUEUE_LIMITS, [name], |r| {
        Ok(Limits {
            concurrency: r.get(0)?,
            worker_concurrency: r.get(1)?,
            key_concurrency: r.get(2)?,
            rate_limit: r.get(3)?,
            rate_period_ms: r.get(4)?,
            key_rate_limit: r.get(5)?,
            key_rate_period_ms: r.get(6)?,
            weighted: r.get::<_, String>(7)? == Fairness::Weighted.as_str(),
            paused: r.get(8)?,
            vtime: r.get(9)?,
        })
    })
    .optional()
    .map_err(|e| store(operation, e))
}

/// The room on `queue` at `now` (stored microseconds) within `left`: less the slots held
/// fleet-wide and by `owner` (a run's lease owner, a task's claimer), and the first admissions
/// inside the rate window; runs and remote tasks alike.
pub(crate) fn queue_room(
    conn: &Connection,
    queue: &str,
    q: &Limits,
    owner: &str,
    now: i64,
    left: i64,
    operation: &'static str,
) -> Result<i64> {
    let mut room = left;
    if let Some(concurrency) = q.concurrency {
        room = room.min(concurrency - queue_held(conn, operation, queue, now, Whose::All)?);
    }
    if let Some(concurrency) = q.worker_concurrency {
        let held = queue_held(conn, operation, queue, now, Whose::Owner(owner))?;
        room = room.min(concurrency - held);
    }
    if let (Some(limit), Some(period)) = (q.rate_limit, q.rate_period_ms) {
        let since = now.saturating_sub(period.saturating_mul(1000));
        room = room.min(limit - queue_admitted_since(conn, operation, queue, since, Whose::All)?);
    }
    Ok(room)
}

/// The room of `key` on `queue` at `now` (stored microseconds) within `room`: less its slots
/// held under key concurrency, and its first admissions inside the key rate's window.
pub(crate) fn key_room(
    conn: &Connection,
    queue: &str,
    q: &Limits,
    key: Option<&str>,
    now: i64,
    room: i64,
    operation: &'static str,
) -> Result<i64> {
    let mut key_room = room;
    if let Some(limit) = q.key_concurrency {
        key_room = key_room.min(limit - queue_held(conn, operation, queue, now, Whose::Key(key))?);
    }
    if let (Some(limit), Some(period)) = (q.key_rate_limit, q.key_rate_period_ms) {
        let since = now.saturating_sub(period.saturating_mul(1000));
        let admitted = queue_admitted_since(conn, operation, queue, since, Whose::Key(key))?;
        key_room = key_room.min(limit - admitted);
    }
    Ok(key_room)
}

/// A key's pass under weighted fairness (or the queue's virtual time if later) and its weight.
pub(crate) fn key_state(
    conn: &Connection,
    queue: &str,
    q: &Limits,
    key: Option<&str>,
    operation: &'static str,
) -> Result<(f64, i64)> {
    let state: Option<(f64, i64)> = conn
        .query_row_cached(KEY_STATE, [queue, key.unwrap_or_default()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(|e| store(operation, e))?;
    let (pass, weight) = state.unwrap_or((0.0, 1));
    Ok((pass.max(q.vtime), weight))
}

/// Under weighted fairness, moves the picked keys' passes to their latest finish time and the
/// queue's virtual time to the start of the last pick if later: `picks` are each pick's key,
/// virtual finish time and key weight.
pub(crate) fn passes_advance(
    conn: &Connection,
    queue: &str,
    q: &Limits,
    picks: &[(Option<&str>, f64, i64)],
    operation: &'static str,
) -> Result<()> {
    let mut passes: BTreeMap<Option<&str>, f64> = BTreeMap::new();
    for (key, finish, _) in picks {
        let pass = passes.entry(*key).or_insert(*finish);
        *pass = pass.max(*finish);
    }
    for (key, pass) in passes {
        conn.execute_cached(KEY_PASS, params![queue, key.unwrap_or_default(), pass])
            .map_err(|e| store(operation, e))?;
    }
    // The queue's virtual time: the start of the last pick (start-time fair queuing), so a
    // key that starts waiting later joins level with the keys just served, not ahead of
    // them with a run of admissions of its own.
    let start = picks
        .iter()
        .map(|(_, finish, weight)| finish - 1.0 / *weight as f64)
        .reduce(f64::max);
    if let Some(start) = start.filter(|start| *start > q.vtime) {
        conn.execute_cached(QUEUE_VTIME, params![queue, start])
            .map_err(|e| store(operation, e))?;
    }
    Ok(())
}

const QUEUES_SERVED: &str = "SELECT name FROM keiro_queues \
     WHERE name IN (SELECT value FROM json_each(?1)) AND NOT paused ORDER BY name";

const QUEUE_LIMITS: &str = "SELECT concurrency, worker_concurrency, key_concurrency, rate_limit, \
         rate_period_ms, key_rate_limit, key_rate_period_ms, fairness, paused, vtime \
     FROM keiro_queues WHERE name = ?1";

/// Slots whose lease expired go back: the row waits again, its epoch moved on.
const QUEUE_UNADMIT_EXPIRED: &str =
    "UPDATE workflows INDEXED BY workflows_queue_slots_idx SET queue_admitted = 0, \
         lease_owner = NULL, lease_expires_at = NULL, lease_epoch = lease_epoch + 1, \
         updated_at = ?3 \
     WHERE queue = ?1 AND queue_admitted AND status IN ('running', 'suspended') \
       AND lease_expires_at < ?2";

/// The waiting runs of a queue with no per-key rule, in admission order, served by
/// `workflows_queue_waiting_idx`.
const QUEUE_WAITING: &str = "SELECT workflow_name, workflow_id, priority, created_at \
     FROM workflows INDEXED BY workflows_queue_waiting_idx \
     WHERE queue = ?1 AND status = 'running' AND queue IS NOT NULL AND NOT queue_admitted \
       AND NOT queue_free \
       AND workflow_name IN (SELECT value FROM json_each(?2)) \
       AND (lease_expires_at IS NULL OR lease_expires_at < ?3) \
       AND (next_attempt_at IS NULL OR next_attempt_at <= ?3) \
       AND (?5 IS NULL OR coalesce(app_version, '') IN (SELECT value FROM json_each(?5))) \
     ORDER BY priority DESC, created_at, workflow_name, workflow_id \
     LIMIT ?4";

/// Whether a run of a queue waits for admission, served by `workflows_queue_waiting_idx`.
const QUEUE_ANY_WAITING: &str =
    "SELECT EXISTS (SELECT 1 FROM workflows INDEXED BY workflows_queue_waiting_idx \
     WHERE queue = ?1 AND status = 'running' AND queue IS NOT NULL AND NOT queue_admitted \
       AND NOT queue_free)";

/// Whether a run of `queue` waits for admission.
fn queue_has_waiting(conn: &Connection, queue: &str) -> Result<bool> {
    conn.query_row_cached(QUEUE_ANY_WAITING, [queue], |r| r.get(0))
        .map_err(|e| store(ADMIT, e))
}

/// The skip scan of the keys with runs waiting (`workflows_queue_key_waiting_idx`): the first
/// key, then the next after one.
const KEY_FIRST: &str =
    "SELECT queue_key FROM workflows INDEXED BY workflows_queue_key_waiting_idx \
     WHERE queue = ?1 AND status = 'running' AND queue IS NOT NULL AND NOT queue_admitted \
       AND NOT queue_free AND queue_key IS NOT NULL \
     ORDER BY queue_key LIMIT 1";

const KEY_NEXT: &str =
    "SELECT queue_key FROM workflows INDEXED BY workflows_queue_key_waiting_idx \
     WHERE queue = ?1 AND status = 'running' AND queue IS NOT NULL AND NOT queue_admitted \
       AND NOT queue_free AND queue_key > ?2 \
     ORDER BY queue_key LIMIT 1";

const KEY_NONE_WAITING: &str =
    "SELECT EXISTS (SELECT 1 FROM workflows INDEXED BY workflows_queue_key_waiting_idx \
     WHERE queue = ?1 AND status = 'running' AND queue IS NOT NULL AND NOT queue_admitted \
       AND NOT queue_free AND queue_key IS NULL)";

/// The skip scan of the keys with runs waiting.
const KEY_SCAN: KeyScan = KeyScan {
    first: KEY_FIRST,
    next: KEY_NEXT,
    none_waiting: KEY_NONE_WAITING,
};

const KEY_STATE: &str = "SELECT pass, weight FROM keiro_queue_keys WHERE queue = ?1 AND key = ?2";

/// One key's waiting runs, in admission order.
const KEY_WAITING: &str = "SELECT workflow_name, workflow_id, priority, created_at \
     FROM workflows INDEXED BY workflows_queue_key_waiting_idx \
     WHERE queue = ?1 AND status = 'running' AND queue IS NOT NULL AND NOT queue_admitted \
       AND NOT queue_free AND queue_key IS ?2 \
       AND workflow_name IN (SELECT value FROM json_each(?3)) \
       AND (lease_expires_at IS NULL OR lease_expires_at < ?4) \
       AND (next_attempt_at IS NULL OR next_attempt_at <= ?4) \
       AND (?6 IS NULL OR coalesce(app_version, '') IN (SELECT value FROM json_each(?6))) \
     ORDER BY priority DESC, created_at, workflow_name, workflow_id \
     LIMIT ?5";

const KEY_PASS: &str = "INSERT INTO keiro_queue_keys (queue, key, pass) VALUES (?1, ?2, ?3) \
     ON CONFLICT (queue, key) DO UPDATE SET pass = excluded.pass";

const QUEUE_VTIME: &str = "UPDATE keiro_queues SET vtime = ?2 WHERE name = ?1";

/// Leases a pick and, unless its queue counts nothing (`?7`), marks it admitted.
const QUEUE_ADMIT_PICKED: &str = "UPDATE workflows SET \
         lease_owner = ?3, lease_epoch = lease_epoch + 1, lease_expires_at = ?4, \
         queue_admitted = CASE WHEN ?7 THEN queue_admitted ELSE 1 END, \
         queue_admitted_at = CASE WHEN ?7 THEN queue_admitted_at \
                                  ELSE coalesce(queue_admitted_at, ?5) END, \
         updated_at = ?6 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// A waiting run a queue may admit, with what orders it.
#[derive(Debug, Clone)]
struct Candidate {
    name: String,
    id: String,
    priority: i32,
    created_at: i64,
    /// Its key (`None`: the run has none), and under fairness its virtual finish time and its
    /// key's weight.
    key: Option<String>,
    finish: f64,
    weight: i64,
}

/// The waiting runs `sql` selects with `params`, in its order.
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
                    name: r.get(0)?,
                    id: r.get(1)?,
                    priority: r.get(2)?,
                    created_at: r.get(3)?,
                    key: key.map(str::to_owned),
                    finish: 0.0,
                    weight: 1,
                })
            })?
            .collect()
        })
        .map_err(|e| store(ADMIT, e))
}

/// The per-key path of admission: each key with runs waiting gets up to its own room (key
/// concurrency and key rate), its candidates ranked by virtual finish time (its pass, or the
/// queue's virtual time if later, plus n / weight for its n-th pick); the picks are ordered by
/// priority, then by finish time under weighted fairness, then by age, up to `room`. Under
/// weighted fairness the picked keys' passes become their latest finish time, and the queue's
/// virtual time the start of the last pick if later.
fn keyed_picks(
    conn: &Connection,
    queue: &str,
    q: &Limits,
    names: &str,
    versions: Option<&str>,
    now: i64,
    room: i64,
) -> Result<Vec<Candidate>> {
    let mut candidates = Vec::new();
    for key in waiting_keys(conn, queue, KEY_SCAN, ADMIT)? {
        let key = key.as_deref();
        let key_room = key_room(conn, queue, q, key, now, room, ADMIT)?;
        if key_room <= 0 {
            continue;
        }
        let (pass, weight) = key_state(conn, queue, q, key, ADMIT)?;
        let mut picks = waiting(
            conn,
            KEY_WAITING,
            params![queue, key, names, now, key_room, versions],
            key,
        )?;
        for (n, pick) in picks.iter_mut().enumerate() {
            // row_number() over the key's candidates in their order, from 1.
            pick.finish = pass + (n as f64 + 1.0) / weight as f64;
            pick.weight = weight;
        }
        candidates.append(&mut picks);
    }
    let weighted = q.weighted;
    candidates.sort_by(|a, b| {
        let finish = |c: &Candidate| if weighted { c.finish } else { 0.0 };
        b.priority
            .cmp(&a.priority)
            .then(finish(a).total_cmp(&finish(b)))
            .then(a.created_at.cmp(&b.created_at))
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| a.id.cmp(&b.id))
    });
    candidates.truncate(usize::try_from(room).unwrap_or(usize::MAX));
    if weighted {
        let picks: Vec<_> = candidates
            .iter()
            .map(|c| (c.key.as_deref(), c.finish, c.weight))
            .collect();
        passes_advance(conn, queue, q, &picks, ADMIT)?;
    }
    Ok(candidates)
}

/// keiro_queue_admit: admits and claims up to `limit` waiting runs of the queues `queues` whose
/// workflow name is in `names`, for `owner` until `now + ttl` (`p_now`, or the store's clock),
/// each with its row after the claim and its current generation's journal (as
/// `instances_claim_batch` returns them). Queues are served in name order, paused ones
/// skipped. For each queue: slots whose lease expired go back (the row waits again, its epoch
/// moved on); the room is the batch's remaining limit less the slots held (fleet-wide, and this
/// owner's) and the first admissions inside the rate window; the waiting runs (running, not
/// admitted, lease free, gate open) are picked up to the room, oldest first (highest priority
/// first), or by key ([`keyed_picks`]) when the queue has a per-key limit or weighted fairness;
/// the picks are leased and, unless the queue counts nothing, marked admitted (the first
/// admission's time kept), and come back in claim order (priority, age) within their queue.
/// Only runs of a version in `versions` (`None`: any) are admitted.
#[allow(clippy::too_many_arguments)] // keiro_queue_admit's parameters, in its order
pub(crate) fn queue_admit(
    conn: &Connection,
    now: OffsetDateTime,
    queues: &[String],
    names: &[&str],
    owner: &str,
    ttl_ms: i64,
    limit: i64,
    p_now: Option<OffsetDateTime>,
    versions: Option<&[String]>,
) -> Result<Vec<(Stored, Vec<JournalEntry>)>> {
    let versions = crate::lease::versions_filter(versions);
    let v_now = micros(p_now.unwrap_or(now));
    let at = micros(now);
    let expires = v_now.saturating_add(ttl_ms.saturating_mul(1000));
    let mut left = limit.max(0);
    let served: Vec<String> = conn
        .prepare_cached(QUEUES_SERVED)
        .and_then(|mut s| {
            s.query_map([Value::from(queues.to_vec()).to_string()], |r| r.get(0))?
                .collect()
        })
        .map_err(|e| store(ADMIT, e))?;
    let names = Value::from(names.to_vec()).to_string();
    let mut claimed: Vec<(String, String)> = Vec::new();
    for queue in served {
        if left <= 0 {
            break;
        }
        let q = queue_limits(conn, &queue, ADMIT)?;
        if q.paused {
            continue;
        }
        let light = q.counts_nothing();
        // A queue that counts nothing starts its runs free, and the ordinary claim takes them
        // (0009): only a run back from its end, or started while the queue was paused, waits
        // here. One probe of the waiting index says whether any does.
        if light && !queue_has_waiting(conn, &queue)? {
            continue;
        }

        conn.execute_cached(QUEUE_UNADMIT_EXPIRED, params![queue, v_now, at])
            .map_err(|e| store(ADMIT, e))?;

        let room = queue_room(conn, &queue, &q, owner, v_now, left, ADMIT)?;
        if room <= 0 {
            continue;
        }

        let mut picks = if q.keyed() {
            keyed_picks(conn, &queue, &q, &names, versions.as_deref(), v_now, room)?
        } else {
            waiting(
                conn,
                QUEUE_WAITING,
                params![queue, names, v_now, room, versions],
                None,
            )?
        };
        for pick in &picks {
            conn.execute_cached(
                QUEUE_ADMIT_PICKED,
                params![pick.name, pick.id, owner, expires, v_now, at, light],
            )
            .map_err(|e| store(ADMIT, e))?;
        }
        // The queue's batch in claim order.
        picks.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(a.created_at.cmp(&b.created_at))
                .then_with(|| a.name.cmp(&b.name))
                .then_with(|| a.id.cmp(&b.id))
        });
        left -= i64::try_from(picks.len()).unwrap_or(i64::MAX);
        claimed.extend(picks.into_iter().map(|p| (p.name, p.id)));
    }

    // The rows after the claims, and their journals.
    let mut answer = Vec::with_capacity(claimed.len());
    for (name, id) in claimed {
        let row = row::instance_row(conn, &name, &id, ADMIT)?
            .ok_or_else(|| malformed(ADMIT, "an admitted row is missing"))?;
        let journal = row::journal_generation(conn, &name, &id, row.generation, ADMIT)?;
        answer.push((row, journal));
    }
    Ok(answer)
}

/// The claimed and the admitted of [`instances_claim_and_admit`], each with its journal.
pub(crate) type ClaimedAndAdmitted = (
    Vec<(Stored, Vec<JournalEntry>)>,
    Vec<(Stored, Vec<JournalEntry>)>,
);

/// keiro_instances_claim_and_admit: a worker's claim in one transaction: up to `limit` runs as
/// `instances_claim_batch` claims them, free runs of `queues` among them, then, with the room
/// left and when `queues` names any, waiting runs of those queues as [`queue_admit`] admits
/// them.
#[allow(clippy::too_many_arguments)] // keiro_instances_claim_and_admit's parameters, in its order
pub(crate) fn instances_claim_and_admit(
    conn: &Connection,
    now: OffsetDateTime,
    names: &[&str],
    queues: &[String],
    owner: &str,
    ttl_ms: i64,
    limit: i64,
    p_now: Option<OffsetDateTime>,
    versions: Option<&[String]>,
) -> Result<ClaimedAndAdmitted> {
    let claimed = crate::lease::instances_claim_batch(
        conn, now, names, owner, ttl_ms, limit, p_now, versions, queues,
    )?;
    let room = limit.saturating_sub(i64::try_from(claimed.len()).unwrap_or(i64::MAX));
    let admitted = if room > 0 && !queues.is_empty() {
        queue_admit(
            conn, now, queues, names, owner, ttl_ms, room, p_now, versions,
        )?
    } else {
        Vec::new()
    };
    Ok((claimed, admitted))
}

const QUEUE_RELEASE_ON_PARK: &str = "SELECT release_on_park FROM keiro_queues WHERE name = ?1";

/// keiro_queue_status's park half (the trigger `workflows_queue_status`; its terminal half is
/// the trigger `workflows_queue_ended` of migration 0003): whether the park of `row` gives its
/// slot back, which the park's own update then carries (`queue_admitted = 0`). It does when the
/// run holds a slot, is going from `running` to `suspended` and its queue releases slots on
/// park; it is admitted again once it is woken. A run on no queue costs one test.
pub(crate) fn queue_park(conn: &Connection, row: &Stored) -> Result<bool> {
    let Some(queue) = row.queue.as_deref() else {
        return Ok(false);
    };
    if !row.queue_admitted || row.status == "suspended" {
        return Ok(false);
    }
    let release: Option<bool> = conn
        .query_row_cached(QUEUE_RELEASE_ON_PARK, [queue], |r| r.get(0))
        .optional()
        .map_err(|e| store(PARK, e))?;
    Ok(release.unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite's plan of `sql`, one detail per line (the parameters left unbound).
    fn plan(conn: &Connection, sql: &str) -> String {
        let mut explain = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("plans");
        let mut rows = explain.raw_query();
        let mut details = Vec::new();
        while let Some(row) = rows.next().expect("plans") {
            details.push(row.get::<_, String>(3).expect("a detail"));
        }
        details.join("\n")
    }

    /// Each statement of admission (and of a start's dedup check) walks the index 0003 made
    /// for it (named with `INDEXED BY`: with the list's queue index beside them the planner
    /// may pick either, and only these stop at the rows the statement counts): no scan of the
    /// table, and no sort where the index gives the order. The partial
    /// indexes apply only when a statement repeats their predicate, which these do.
    #[test]
    fn admission_walks_the_queue_indexes() {
        let conn = Connection::open_in_memory().expect("opens");
        for (_, _, sql) in crate::open::MIGRATIONS {
            conn.execute_batch(sql).expect("migrates");
        }
        let cases = [
            (QUEUE_UNADMIT_EXPIRED, "workflows_queue_slots_idx"),
            (QUEUE_WAITING, "workflows_queue_waiting_idx"),
            (KEY_FIRST, "workflows_queue_key_waiting_idx"),
            (KEY_NEXT, "workflows_queue_key_waiting_idx"),
            (KEY_NONE_WAITING, "workflows_queue_key_waiting_idx"),
            (KEY_WAITING, "workflows_queue_key_waiting_idx"),
            (DEDUP_HOLDER, "workflows_queue_dedup_idx"),
        ];
        for (sql, index) in cases {
            let plan = plan(&conn, sql);
            assert!(plan.contains(index), "{sql}:\n{plan}");
            assert!(!plan.contains("SCAN workflows"), "{sql}:\n{plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{sql}:\n{plan}");
        }
    }
}
