//! Rules of sql/functions/remote.sql: so far the cancellation of a closed generation's live
//! tasks, which the `cancelled` and `continued` markers need. Everything else of remote.sql
//! (arm, claim, heartbeat, reports, expiry, redispatch, park with dispatches) is not here yet.

use keiro_journal::store::Result;
use rusqlite::{params, Connection};
use time::OffsetDateTime;

use crate::error::store;
use crate::row::micros;

const CANCEL: &str = "cancelling remote tasks";

const REMOTE_TASKS_CANCEL: &str = "UPDATE remote_tasks SET \
         status = 'cancelled', claim = NULL, claimed_by = NULL, claim_expires_at = NULL, \
         settled_at = ?4, updated_at = ?4 \
     WHERE workflow_name = ?1 AND workflow_id = ?2 AND generation = ?3 \
       AND status IN ('pending', 'running')";

/// keiro_remote_tasks_cancel: cancels the pending and claimed tasks of one generation; how
/// many.
pub(crate) fn remote_tasks_cancel(
    conn: &Connection,
    now: OffsetDateTime,
    name: &str,
    id: &str,
    generation: i32,
) -> Result<u64> {
    let cancelled = conn
        .execute(
            REMOTE_TASKS_CANCEL,
            params![name, id, generation, micros(now)],
        )
        .map_err(|e| store(CANCEL, e))?;
    Ok(u64::try_from(cancelled).unwrap_or(u64::MAX))
}
