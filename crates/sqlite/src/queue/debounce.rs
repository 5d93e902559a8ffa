//! queue.sql's `keiro_queue_debounce`: one run per burst of calls with a key.

use keiro_journal::store::Result;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use time::OffsetDateTime;

use crate::cached::Cached;
use crate::error::{malformed, store};
use crate::notify;
use crate::row::{self, micros, Stored};

const DEBOUNCE: &str = "debouncing a start";

/// The pending run of a debounce key pushed back, served by `workflows_debounce_idx`.
const DEBOUNCE_PUSH: &str = "UPDATE workflows INDEXED BY workflows_debounce_idx SET \
         input = ?3, next_attempt_at = min(?4, created_at + ?5), updated_at = ?6 \
     WHERE workflow_name = ?1 AND debounce_key = ?2 AND debounce_key IS NOT NULL \
       AND lease_epoch = 0 AND status = 'running' \
     RETURNING workflow_id";

const DEBOUNCE_INSERT: &str = "INSERT INTO workflows \
         (workflow_name, workflow_id, input, debounce_key, next_attempt_at, created_at, \
          updated_at, app_version) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, keiro_app_version()) \
     ON CONFLICT DO NOTHING";

/// keiro_queue_debounce: one run per burst of calls with the same key. While the key's pending
/// run was never claimed (`lease_epoch = 0`, running), a call replaces its input and moves its
/// start gate to `now + delay`, never past its first call + `max_wait`; otherwise it starts run
/// `id` gated at `now + min(delay, max_wait)` (first call at `now`, kept in created_at) and
/// notifies its wake. Returns whether this call created the run, and the run. The writer runs
/// one call at a time, so the plpgsql loop's second turn (a concurrent insert) cannot happen;
/// the id taken by another start answers that run, as there.
#[allow(clippy::too_many_arguments)] // keiro_queue_debounce's parameters, in its order
pub(crate) fn queue_debounce(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    key: &str,
    id: &str,
    input: &Value,
    delay_ms: i64,
    max_wait_ms: i64,
    p_now: Option<OffsetDateTime>,
) -> Result<(bool, Stored)> {
    let v_now = micros(p_now.unwrap_or(now));
    let input = row::json(input);
    let pushed: Option<String> = conn
        .query_row_cached(
            DEBOUNCE_PUSH,
            params![
                name,
                key,
                input,
                v_now.saturating_add(delay_ms.saturating_mul(1000)),
                max_wait_ms.saturating_mul(1000),
                micros(now)
            ],
            |r| r.get(0),
        )
        .optional()
        .map_err(|e| store(DEBOUNCE, e))?;
    let (created, id) = match pushed {
        Some(pending) => (false, pending),
        None => {
            let gate = v_now.saturating_add(delay_ms.min(max_wait_ms).saturating_mul(1000));
            let created = conn
                .execute_cached(
                    DEBOUNCE_INSERT,
                    params![name, id, input, key, gate, v_now, micros(now)],
                )
                .map_err(|e| store(DEBOUNCE, e))?
                == 1;
            if created {
                notify::wake(conn, DEBOUNCE, name, id)?;
            }
            (created, id.to_owned())
        }
    };
    let row = row::instance_row(conn, name, &id, DEBOUNCE)?
        .ok_or_else(|| malformed(DEBOUNCE, "the debounced run is missing"))?;
    Ok((created, row))
}
