//! Rules of crates/migrations/functions/awakeable.sql: create, settle (complete or cancel). The trigger that
//! cancels a closed generation's pending awakeables (`keiro_awakeables_settle_closed`) is
//! `journal_marker_settles_awakeables` in migration 0001. Then the Postgres store's
//! one-statement count of pending awakeables (crates/postgres/src/awakeable.rs).

use crate::cached::Cached;
use keiro_journal::store::Result;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use time::OffsetDateTime;

use crate::error::store;
use crate::journal::{journal_append_step, AppendCode, AppendTo};
use crate::row::{self, micros};

const CREATE: &str = "creating an awakeable";
const SETTLE: &str = "settling an awakeable";
const PENDING: &str = "counting pending awakeables";

const AWAKEABLE_INSERT: &str = "INSERT INTO awakeables \
         (id, workflow_name, workflow_id, generation, created_at) \
     VALUES (?1, ?2, ?3, ?4, ?5)";

/// keiro_awakeable_create: applies the allocation step's append and, only when it was
/// appended, registers the pending awakeable `awakeable` (hyphenated) for the generation
/// written to. A replayed allocation registers nothing. A reused id violates the primary key
/// and fails the operation, its append undone with it.
pub(crate) fn awakeable_create(
    conn: &Connection,
    now: OffsetDateTime,
    append: AppendTo<'_>,
    awakeable: &str,
) -> Result<AppendCode> {
    let outcome = journal_append_step(conn, now, append)?;
    if let AppendCode::Appended(generation) = outcome {
        conn.execute_cached(
            AWAKEABLE_INSERT,
            params![awakeable, append.name, append.id, generation, micros(now)],
        )
        .map_err(|e| store(CREATE, e))?;
    }
    Ok(outcome)
}

/// `keiro_awakeable_settle`'s outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SettleCode {
    Delivered,
    /// Settled, but the owner refused the step.
    OwnerGone,
    /// With the status it was settled as.
    AlreadySettled(String),
    NotFound,
}

const AWAKEABLE_ROW: &str =
    "SELECT workflow_name, workflow_id, generation, status FROM awakeables WHERE id = ?1";

const AWAKEABLE_SETTLE: &str =
    "UPDATE awakeables SET status = ?2, payload = ?3, settled_at = ?4 WHERE id = ?1";

/// keiro_awakeable_settle: settles a pending awakeable as `status` with `payload` and
/// journals `envelope` under `step` into its owner's generation (unfenced). The awakeable
/// stays settled whether or not the owner takes the step: its value has nowhere else to go.
pub(crate) fn awakeable_settle(
    conn: &Connection,
    now: OffsetDateTime,
    awakeable: &str,
    status: &str,
    payload: Option<&Value>,
    step: &str,
    envelope: &Value,
) -> Result<SettleCode> {
    let found: Option<(String, String, i32, String)> = conn
        .query_row_cached(AWAKEABLE_ROW, params![awakeable], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .optional()
        .map_err(|e| store(SETTLE, e))?;
    let Some((name, id, generation, settled)) = found else {
        return Ok(SettleCode::NotFound);
    };
    if settled != "pending" {
        return Ok(SettleCode::AlreadySettled(settled));
    }
    conn.execute_cached(
        AWAKEABLE_SETTLE,
        params![awakeable, status, payload.map(row::json), micros(now)],
    )
    .map_err(|e| store(SETTLE, e))?;
    let outcome = journal_append_step(
        conn,
        now,
        AppendTo {
            name: &name,
            id: &id,
            generation: Some(generation),
            step,
            kind: "awakeable",
            payload: envelope,
            owner: None,
            epoch: None,
            renew_ms: None,
        },
    )?;
    Ok(match outcome {
        AppendCode::Appended(_) | AppendCode::AlreadyPresent(_) => SettleCode::Delivered,
        _ => SettleCode::OwnerGone,
    })
}

const AWAKEABLES_PENDING: &str = "SELECT count(*) FROM awakeables WHERE status = 'pending'";

/// awakeables_pending (crates/postgres/src/awakeable.rs): how many awakeables are pending.
pub(crate) fn awakeables_pending(conn: &Connection) -> Result<u64> {
    let pending: i64 = conn
        .query_row_cached(AWAKEABLES_PENDING, [], |r| r.get(0))
        .map_err(|e| store(PENDING, e))?;
    Ok(u64::try_from(pending).unwrap_or(0))
}
