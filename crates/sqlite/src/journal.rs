//! Rules of crates/migrations/functions/journal.sql: the one implementation of the append rules
//! (docs/store-contract.md, `journal_append`) every writer of a journal goes through.
//!
//! Each function here is its plpgsql twin, in the file's order, over the writer's open
//! transaction. Where PostgreSQL locks (`FOR UPDATE` on the instance row, the remote tasks
//! before it), SQLite needs nothing: the writer holds the file's write lock for the whole
//! transaction (`BEGIN IMMEDIATE`), so every read is already what a locked read would see.
//!
//! `keiro_journal_append_batch` has no twin: the writer runs each append of a batch as its own
//! operation in one shared transaction (crate::writer), which is what the plpgsql batch does
//! with its savepoints; nor does `keiro_journal_append`, the
//! plpgsql wrapper kept for statements prepared against it (the store calls
//! [`journal_append_to`], as the Postgres store does). `keiro_journal_delete_with_instances` is
//! the `workflows_delete_journal` trigger of migration 0001.

use crate::cached::Cached;
use keiro_journal::store::Result;
use keiro_journal::{Generation, Marker};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use time::OffsetDateTime;

use crate::error::{malformed, store};
use crate::notify;
use crate::row::{self, micros, Stored};

const APPEND: &str = "appending to the journal";
const DELIVER: &str = "journaling a delivery";
const READ: &str = "counting the deliveries a run read";

/// `keiro_journal_append_to`'s outcome codes, typed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AppendCode {
    /// Written to this generation.
    Appended(Generation),
    /// The step (or the closing marker) was recorded with this value.
    AlreadyPresent(Value),
    /// Another generation, or the step recorded by another kind of call.
    Conflict,
    /// The instance is closed by this marker.
    RefusedTerminal(Marker),
    /// No such instance.
    NotFound,
    /// The fence no longer matches.
    LeaseLost,
}

/// One append's arguments, as `keiro_journal_append_to`'s parameters: the instance, the
/// writer's generation (`None`: the current one), the encoded event, the writer's fence and
/// its renewal in milliseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AppendTo<'a> {
    pub(crate) name: &'a str,
    pub(crate) id: &'a str,
    pub(crate) generation: Option<Generation>,
    pub(crate) step: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) payload: &'a Value,
    pub(crate) owner: Option<&'a str>,
    pub(crate) epoch: Option<i64>,
    pub(crate) renew_ms: Option<i64>,
}

/// What a written closing marker leaves to the rules outside the journal, as plain data. The
/// plpgsql append calls `keiro_remote_tasks_cancel` and `keiro_child_deliver` itself; here
/// the caller carries them out in the same transaction, so this module depends on neither
/// child.rs nor remote.rs (which journal through it): the store's append operation right
/// after the append, tasks first as in plpgsql; the cancel tree (instance.rs) delivers at
/// once and leaves the tasks to its own caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closing {
    /// Cancel the pending and claimed remote tasks of this generation
    /// (`remote_tasks_cancel`): nothing will ever await them.
    pub(crate) cancel_tasks: Option<Generation>,
    /// Deliver the instance's result envelope to the parent awaiting it (`child_deliver`).
    pub(crate) deliver: bool,
}

impl Closing {
    /// Nothing left to do: every step, and every append that wrote nothing.
    pub(crate) const NONE: Self = Self {
        cancel_tasks: None,
        deliver: false,
    };

    /// What writing an event of `kind` on `generation` leaves to do: a `completed` or
    /// `failed` marker delivers to a parent; `cancelled` cancels the generation's remote
    /// tasks and delivers; `continued` cancels them, and the run goes on, so a parent hears
    /// nothing.
    pub(crate) fn of(kind: &str, generation: Generation) -> Self {
        match kind {
            "completed" | "failed" => Self {
                cancel_tasks: None,
                deliver: true,
            },
            "cancelled" => Self {
                cancel_tasks: Some(generation),
                deliver: true,
            },
            "continued" => Self {
                cancel_tasks: Some(generation),
                deliver: false,
            },
            _ => Self::NONE,
        }
    }
}

/// Whether an event of `kind` is a lifecycle marker that closes the run or its generation.
fn is_marker(kind: &str) -> bool {
    matches!(kind, "completed" | "failed" | "cancelled" | "continued")
}

/// The revision suffix `#<digits>` at the end of a stored `remote:`/`child:` step name, as
/// the byte offset where it starts.
fn revision_suffix(stored: &str) -> Option<usize> {
    if !(stored.starts_with("remote:") || stored.starts_with("child:")) {
        return None;
    }
    let digits = stored.len() - stored.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let hash = stored.len().checked_sub(digits + 1)?;
    (digits > 0 && stored.as_bytes()[hash] == b'#').then_some(hash)
}

/// keiro_step_logical: the logical step a stored step name records
/// (`keiro_journal::store::logical_step`): a revised `remote:`/`child:` step `<step>#<n>` reads as
/// `<step>`; every other name as itself.
pub(crate) fn step_logical(stored: &str) -> &str {
    revision_suffix(stored).map_or(stored, |hash| &stored[..hash])
}

/// keiro_step_revision: the revision a stored step name holds (`keiro_journal::store::step_revision`):
/// n for `<step>#<n>`, 0 for the step's own name. Digits past an `i32` saturate (PostgreSQL
/// raises "out of range" there; keiro never writes such a revision).
pub(crate) fn step_revision(stored: &str) -> i32 {
    revision_suffix(stored).map_or(0, |hash| {
        stored[hash + 1..].parse::<i32>().unwrap_or(i32::MAX)
    })
}

const JOURNAL_REPEATABLE_COUNT: &str = "SELECT count(*) FROM journal \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND kind = ?4";

/// keiro_journal_repeatable_name: the step name of the next occurrence of a repeatable event
/// (`failed`, `resurrected`) in one generation: `<base>`, then `<base>/2`, `<base>/3`, ...
pub(crate) fn journal_repeatable_name(
    conn: &Connection,
    name: &str,
    id: &str,
    generation: Generation,
    kind: &str,
    base: &str,
) -> Result<String> {
    let count: i64 = conn
        .query_row_cached(
            JOURNAL_REPEATABLE_COUNT,
            params![name, id, generation, kind],
            |r| r.get(0),
        )
        .map_err(|e| store(APPEND, e))?;
    Ok(if count == 0 {
        base.to_owned()
    } else {
        format!("{base}/{}", count + 1)
    })
}

const JOURNAL_INSERT_NEW: &str = "INSERT INTO journal \
         (workflow_name, workflow_id, generation, step_name, kind, payload, recorded_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
     ON CONFLICT (workflow_name, workflow_id, generation, step_name) DO NOTHING";

const JOURNAL_INSERT: &str = "INSERT INTO journal \
         (workflow_name, workflow_id, generation, step_name, kind, payload, recorded_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

const JOURNAL_RECORDED: &str = "SELECT kind, payload FROM journal \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 AND step_name = ?4";

/// The step's recorded kind and value, if any.
fn recorded(
    conn: &Connection,
    name: &str,
    id: &str,
    generation: Generation,
    step: &str,
) -> Result<Option<(String, Value)>> {
    let found: Option<(String, String)> = conn
        .query_row_cached(JOURNAL_RECORDED, params![name, id, generation, step], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(|e| store(APPEND, e))?;
    found
        .map(|(kind, payload)| Ok((kind, row::value(&payload, APPEND)?)))
        .transpose()
}

/// A step's row change: running, and a fenced writer's lease renewed to `now + renew_ms`.
const INSTANCE_STEP_TOUCH: &str = "UPDATE workflows SET status = 'running', \
         lease_expires_at = coalesce(?3, lease_expires_at), updated_at = ?4 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

const INSTANCE_COMPLETE: &str = "UPDATE workflows SET \
         status = 'completed', output = ?3, completed_at = ?4, \
         lease_owner = NULL, lease_expires_at = NULL, \
         attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL, \
         wake_after = NULL, \
         updated_at = ?4 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

const INSTANCE_FAIL: &str = "UPDATE workflows SET \
         status = 'failed', last_error = ?3, completed_at = ?4, \
         lease_owner = NULL, lease_expires_at = NULL, wake_after = NULL, \
         updated_at = ?4 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

const INSTANCE_CANCEL: &str = "UPDATE workflows SET \
         status = 'cancelled', completed_at = ?3, \
         lease_owner = NULL, lease_expires_at = NULL, wake_after = NULL, \
         updated_at = ?3 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

const INSTANCE_CONTINUE: &str = "UPDATE workflows SET \
         generation = ?3, input = ?4, status = 'running', output = NULL, \
         lease_owner = NULL, lease_expires_at = NULL, \
         attempts = 0, open_refusals = 0, last_error = NULL, next_attempt_at = NULL, \
         wake_after = NULL, \
         parked_on = NULL, app_version = keiro_app_version(), updated_at = ?5 \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// `p_payload #>> '{}'`: a JSON string's text, any other value's JSON, NULL for `null`.
pub(crate) fn json_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}

/// journal_append (`keiro_journal_append_to`): appends one event to the instance and moves its
/// row, checked in the plpgsql order: the generation, the recorded step (a retry adopts the
/// first recorded value), the terminal status, the fence (a stale holder may learn a recorded
/// value, but it may not write), then the write. A written closing marker returns what it
/// leaves to do ([`Closing`]: deliver the instance's result to a waiting parent; for
/// `cancelled` and `continued`, cancel the generation's remote tasks), which the caller
/// carries out; its pending awakeables are cancelled here, by the trigger of migration 0001.
///
/// The fast path, for a step on the current generation of a live row by its holder or
/// unfenced, is the plpgsql one, renewal skip included: a running row's lease is rewritten
/// only when less than three quarters of `renew_ms` are left.
///
/// A step landing on a suspended row, and a `continued` marker, notify the instance's wake
/// (`keiro_notify_wake`); a terminal marker notifies `closed` through migration 0002's trigger.
pub(crate) fn journal_append_to(
    conn: &Connection,
    now: OffsetDateTime,
    append: AppendTo<'_>,
) -> Result<(AppendCode, Closing)> {
    let AppendTo {
        name,
        id,
        generation,
        step,
        kind,
        payload,
        owner,
        epoch,
        renew_ms,
    } = append;
    let at = micros(now);
    let is_marker = is_marker(kind);
    let Some(row) = row::instance_row(conn, name, id, APPEND)? else {
        return Ok((AppendCode::NotFound, Closing::NONE));
    };
    let generation = generation.unwrap_or(row.generation);
    let holder = |row: &Stored| match (owner, epoch) {
        (None, _) => true,
        (Some(owner), Some(epoch)) => row.held_by(owner, epoch),
        (Some(_), None) => false,
    };
    let payload_text = row::json(payload);
    let renewed = match (owner, renew_ms) {
        (Some(_), Some(ms)) => Some(at.saturating_add(ms.saturating_mul(1000))),
        _ => None,
    };

    // The fast path: a step on the current generation of a live row, by its lease holder or
    // unfenced.
    if !is_marker
        && generation == row.generation
        && matches!(row.status.as_str(), "running" | "suspended")
        && holder(&row)
    {
        let inserted = conn
            .execute_cached(
                JOURNAL_INSERT_NEW,
                params![name, id, generation, step, kind, payload_text, at],
            )
            .map_err(|e| store(APPEND, e))?;
        if inserted == 0 {
            // Recorded before: every writer adopts the first recorded value.
            let code = match recorded(conn, name, id, generation, step)? {
                Some((recorded_kind, value)) if recorded_kind == kind => {
                    AppendCode::AlreadyPresent(value)
                }
                _ => AppendCode::Conflict,
            };
            return Ok((code, Closing::NONE));
        }
        let fresh_enough = match (renew_ms, row.lease_expires_at) {
            (Some(ms), Some(expires)) => expires > at.saturating_add(ms.saturating_mul(750)),
            _ => false,
        };
        if row.status == "suspended" || owner.is_none() || !fresh_enough {
            conn.execute_cached(INSTANCE_STEP_TOUCH, params![name, id, renewed, at])
                .map_err(|e| store(APPEND, e))?;
        }
        // A step landing on a parked instance is a wake.
        if row.status == "suspended" {
            notify::wake(conn, APPEND, name, id)?;
        }
        return Ok((AppendCode::Appended(generation), Closing::NONE));
    }

    // Everything else: the full sequence, in its order.

    // A writer on another generation only learns what is recorded there.
    if generation != row.generation {
        let code = match recorded(conn, name, id, generation, step)? {
            Some((_, value)) => AppendCode::AlreadyPresent(value),
            None => AppendCode::Conflict,
        };
        return Ok((code, Closing::NONE));
    }

    // A recorded step is checked before the terminal status, so retrying it stays idempotent
    // after the instance closed.
    if !is_marker {
        if let Some((recorded_kind, value)) = recorded(conn, name, id, generation, step)? {
            let code = if recorded_kind == kind {
                AppendCode::AlreadyPresent(value)
            } else {
                AppendCode::Conflict
            };
            return Ok((code, Closing::NONE));
        }
    }

    // A terminal row never moves again through an append. A repeat of the marker that closed
    // it converges on the recorded value, read from the row because a divergence failure has
    // no journal row.
    if row.is_terminal() {
        if is_marker && kind == row.status {
            let value = match row.status.as_str() {
                "completed" => row
                    .output
                    .as_deref()
                    .map(|o| row::value(o, APPEND))
                    .transpose()?
                    .unwrap_or(Value::Null),
                "failed" => row.last_error.clone().map_or(Value::Null, Value::String),
                _ => Value::Null,
            };
            return Ok((AppendCode::AlreadyPresent(value), Closing::NONE));
        }
        let marker = Marker::parse(&row.status)
            .ok_or_else(|| malformed(APPEND, format_args!("status {:?}", row.status)))?;
        return Ok((AppendCode::RefusedTerminal(marker), Closing::NONE));
    }

    // The fence comes after the idempotency checks.
    if owner.is_some() && !holder(&row) {
        return Ok((AppendCode::LeaseLost, Closing::NONE));
    }

    let step = if kind == "failed" {
        journal_repeatable_name(conn, name, id, generation, kind, step)?
    } else {
        step.to_owned()
    };
    conn.execute_cached(
        JOURNAL_INSERT,
        params![name, id, generation, step, kind, payload_text, at],
    )
    .map_err(|e| store(APPEND, e))?;

    match kind {
        "completed" => {
            conn.execute_cached(INSTANCE_COMPLETE, params![name, id, payload_text, at])
                .map_err(|e| store(APPEND, e))?;
        }
        "failed" => {
            conn.execute_cached(INSTANCE_FAIL, params![name, id, json_text(payload), at])
                .map_err(|e| store(APPEND, e))?;
        }
        "cancelled" => {
            conn.execute_cached(INSTANCE_CANCEL, params![name, id, at])
                .map_err(|e| store(APPEND, e))?;
        }
        "continued" => {
            // The next generation starts runnable, with its own input.
            let next = payload
                .get("next_generation")
                .and_then(Value::as_i64)
                .and_then(|g| Generation::try_from(g).ok())
                .ok_or_else(|| malformed(APPEND, "next_generation must be a 32-bit integer"))?;
            let input = payload.get("input").cloned().unwrap_or(Value::Null);
            conn.execute_cached(
                INSTANCE_CONTINUE,
                params![name, id, next, row::json(&input), at],
            )
            .map_err(|e| store(APPEND, e))?;
            notify::wake(conn, APPEND, name, id)?;
        }
        _ => {
            // Not reached by a well-formed call (a step that passes the checks above takes
            // the fast path); kept so this path alone still implements every rule.
            conn.execute_cached(INSTANCE_STEP_TOUCH, params![name, id, renewed, at])
                .map_err(|e| store(APPEND, e))?;
            if row.status == "suspended" {
                notify::wake(conn, APPEND, name, id)?;
            }
        }
    }
    Ok((
        AppendCode::Appended(generation),
        Closing::of(kind, generation),
    ))
}

/// [`journal_append_to`] for a step, which leaves nothing to do outside the journal: the
/// append of every rule that journals a wake source's value, a spawn or a delivery. A closing
/// marker is refused with nothing written (it goes through [`journal_append_to`], whose caller
/// carries out its [`Closing`]).
pub(crate) fn journal_append_step(
    conn: &Connection,
    now: OffsetDateTime,
    append: AppendTo<'_>,
) -> Result<AppendCode> {
    if is_marker(append.kind) {
        return Err(malformed(
            APPEND,
            format_args!("a {} marker appended as a step", append.kind),
        ));
    }
    Ok(journal_append_to(conn, now, append)?.0)
}

/// `keiro_delivery_append`'s outcomes: the append's, or `backlog` (nothing written) with the
/// generation's unread deliveries and their bytes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DeliveryCode {
    Append(AppendCode),
    Backlog(i64, i64),
}

const DELIVERY_COUNTERS: &str = "SELECT generation, status, deliveries_generation, \
         deliveries, deliveries_bytes, deliveries_read, deliveries_read_bytes, parked_on \
     FROM workflows WHERE workflow_name = ?1 AND workflow_id = ?2";

const DELIVERY_COUNT: &str = "UPDATE workflows SET \
         deliveries_generation = ?3, \
         deliveries = CASE WHEN ?4 THEN coalesce(deliveries, 0) + 1 ELSE 1 END, \
         deliveries_bytes = CASE WHEN ?4 THEN coalesce(deliveries_bytes, 0) + ?5 ELSE ?5 END, \
         deliveries_read = CASE WHEN ?4 THEN deliveries_read END, \
         deliveries_read_bytes = CASE WHEN ?4 THEN deliveries_read_bytes END \
     WHERE workflow_name = ?1 AND workflow_id = ?2";

/// The counters [`delivery_append`] reads from the instance row.
type Counters = (
    Generation,
    String,
    Option<Generation>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

/// delivery_append (`keiro_delivery_append`): a delivery (an unfenced `await` record from
/// outside the run) through the append rules above, bounded: the instance's generation holds
/// at most `unread_max` deliveries, and `unread_bytes_max` bytes of them, that no await has
/// read. A new row past the bound is refused with nothing written, unless it answers a wait
/// the run's last park waits on (`parked_on`). A repeat, another generation and a closed
/// instance get the append rules' own answer. The counters describe `deliveries_generation`;
/// on any other generation they count as empty.
#[allow(clippy::too_many_arguments)] // keiro_delivery_append's parameters, in its order
pub(crate) fn delivery_append(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    generation: Option<Generation>,
    step: &str,
    payload: &Value,
    bytes: i64,
    unread_max: i64,
    unread_bytes_max: i64,
) -> Result<DeliveryCode> {
    let counters: Option<Counters> = conn
        .query_row_cached(DELIVERY_COUNTERS, params![name, id], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
                r.get(7)?,
            ))
        })
        .optional()
        .map_err(|e| store(DELIVER, e))?;
    let Some((
        current,
        status,
        counted_generation,
        count,
        count_bytes,
        read,
        read_bytes,
        parked_on,
    )) = counters
    else {
        return Ok(DeliveryCode::Append(AppendCode::NotFound));
    };
    let counted = counted_generation == Some(current);
    let (unread, unread_bytes) = if counted {
        (
            (count.unwrap_or(0) - read.unwrap_or(0)).max(0),
            (count_bytes.unwrap_or(0) - read_bytes.unwrap_or(0)).max(0),
        )
    } else {
        (0, 0)
    };
    let fresh = generation.unwrap_or(current) == current
        && matches!(status.as_str(), "running" | "suspended")
        && recorded(conn, name, id, current, step)?.is_none();
    let awaited = match parked_on.as_deref() {
        Some(text) => match row::value(text, DELIVER)? {
            Value::Array(steps) => steps.iter().any(|s| s.as_str() == Some(step)),
            _ => false,
        },
        None => false,
    };
    if fresh
        && (unread >= unread_max || unread_bytes.saturating_add(bytes) > unread_bytes_max)
        && !awaited
    {
        return Ok(DeliveryCode::Backlog(unread, unread_bytes));
    }
    let outcome = journal_append_step(
        conn,
        now,
        AppendTo {
            name,
            id,
            generation,
            step,
            kind: "await",
            payload,
            owner: None,
            epoch: None,
            renew_ms: None,
        },
    )?;
    if fresh && matches!(outcome, AppendCode::Appended(_)) {
        conn.execute_cached(DELIVERY_COUNT, params![name, id, current, counted, bytes])
            .map_err(|e| store(DELIVER, e))?;
    }
    Ok(DeliveryCode::Append(outcome))
}

const DELIVERIES_READ: &str = "UPDATE workflows SET \
         deliveries_read = max(coalesce(deliveries_read, 0), ?4), \
         deliveries_read_bytes = max(coalesce(deliveries_read_bytes, 0), ?5) \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 \
       AND deliveries_generation = ?3 \
       AND (deliveries_read IS NOT ?4 OR deliveries_read_bytes IS NOT ?5)";

/// deliveries_read (crates/postgres/src/delivery.rs, one statement): records that the run of
/// the current generation has read `read` deliveries (`read_bytes` bytes) in all. Only the
/// current generation, once a delivery was counted in it; the totals only grow.
pub(crate) fn deliveries_read(
    conn: &Connection,
    name: &str,
    id: &str,
    generation: Generation,
    read: i64,
    read_bytes: i64,
) -> Result<()> {
    conn.execute_cached(
        DELIVERIES_READ,
        params![name, id, generation, read, read_bytes],
    )
    .map_err(|e| store(READ, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logical_steps_and_revisions_read_as_the_journal_crate_reads_them() {
        for stored in [
            "remote:charge",
            "remote:charge#2",
            "remote:charge#12",
            "child:wf/a:result#3",
            "child:wf/a:result",
            "step#2",
            "remote:charge#",
            "remote:charge#x2",
            "remote:#7",
            "#4",
            "",
        ] {
            assert_eq!(
                step_logical(stored),
                keiro_journal::store::logical_step(stored),
                "{stored:?}"
            );
            assert_eq!(
                i64::from(step_revision(stored)),
                i64::from(keiro_journal::store::step_revision(stored)),
                "{stored:?}"
            );
        }
        assert_eq!(step_logical("remote:charge#2"), "remote:charge");
        assert_eq!(step_revision("remote:charge#2"), 2);
        assert_eq!(step_revision("step#2"), 0);
    }

    #[test]
    fn closing_markers_leave_their_deliveries_and_cancellations_to_the_caller() {
        let deliver = Closing {
            cancel_tasks: None,
            deliver: true,
        };
        assert_eq!(Closing::of("completed", 3), deliver);
        assert_eq!(Closing::of("failed", 3), deliver);
        assert_eq!(
            Closing::of("cancelled", 3),
            Closing {
                cancel_tasks: Some(3),
                deliver: true
            }
        );
        assert_eq!(
            Closing::of("continued", 3),
            Closing {
                cancel_tasks: Some(3),
                deliver: false
            }
        );
        for kind in ["step", "await", "child", "remote", "resurrected", "reset"] {
            assert_eq!(Closing::of(kind, 3), Closing::NONE, "{kind}");
            assert!(!is_marker(kind), "{kind}");
        }
    }
}
