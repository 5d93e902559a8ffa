//! Marking an instance as awaited, so it notifies when it closes (migration 0016).
//!
//! Only marked instances notify: a NOTIFY on every completion serializes completions on the
//! WAL flush (0016's header has the figures). A result waiter marks its instance once, when its
//! first wait starts; the mark and a close serialize on the row lock, so either the close sees
//! the mark and notifies, or the mark sees the close and the waiter reads at once.

use keiro_journal::store::Result;
use keiro_journal::InstanceKey;

use crate::PgStore;

const MARK_AWAITED: &str = "marking an instance awaited";

// Only a live row is marked: after waiting for a closing transaction's row lock, the UPDATE
// re-checks the status on the row that transaction left, so "no row" means closed (or gone).
// `awaited` is not indexed, so the new row version can be HOT.
//
// A runnable (`running`) row is announced again on the wake channel: the mark holds the row
// lock until it commits, and a worker whose claim (`FOR UPDATE SKIP LOCKED`) came in that
// moment, woken by the start's own notification, skipped the row and will not look again until
// its poll. Awaited starts stalled a full poll interval that way (seen 2 in 10 at a 10 s poll).
// Parked rows are woken by their own sources, so only running ones are announced.
const INSTANCE_MARK_AWAITED: &str = "WITH marked AS ( \
         UPDATE workflows SET awaited = true \
         WHERE workflow_name = $1 AND workflow_id = $2 AND status IN ('running', 'suspended') \
         RETURNING status) \
     SELECT count(*) AS marked, \
            count(CASE WHEN status = 'running' THEN keiro_notify_wake($1, $2)::text END) AS announced \
     FROM marked";

/// Marks `key` awaited. `false` when it is no longer live (closed, or never started): nothing
/// will notify, and the waiter should read the row now.
pub(crate) async fn instance_mark_awaited(store: &PgStore, key: &InstanceKey) -> Result<bool> {
    let row = store
        .query_one(
            MARK_AWAITED,
            INSTANCE_MARK_AWAITED,
            &[&key.name.as_str(), &key.id.as_str()],
        )
        .await?;
    Ok(crate::row::count(&row, "marked", MARK_AWAITED)? > 0)
}
