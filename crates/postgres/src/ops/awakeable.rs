//! `crates/migrations/functions/awakeable.sql`. Awakeables: ids a workflow hands to an outside system, which completes or cancels them.
//!
//! The allocation step and the awakeable row commit together, so an awakeable exists exactly
//! when its allocation is journaled. Settling locks the awakeable row, settles it once, and
//! journals the envelope into the owner's generation in the same transaction, waking it.

use keiro_journal::store::{Append, AppendOutcome, Result};
use keiro_journal::{store::awakeable_step, AwakeableOutcome, AwakeableStatus, Envelope};
use serde_json::Value;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::db::Db;
use crate::ops::journal::{append_outcome, encoded_step, AppendArgs};
use crate::ops::unknown_outcome;
use crate::row::{column, count, malformed};

const CREATE: &str = "creating an awakeable";
pub(crate) const COMPLETE: &str = "completing an awakeable";
pub(crate) const CANCEL: &str = "cancelling an awakeable";
const PENDING: &str = "counting pending awakeables";

const AWAKEABLE_CREATE: &str = "SELECT outcome, recorded, marker \
     FROM keiro_awakeable_create($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";

pub(crate) async fn awakeable_create(db: &Db, append: &Append, id: Uuid) -> Result<AppendOutcome> {
    let args = AppendArgs::new(append, encoded_step(append, CREATE)?);
    let mut params = args.params();
    params.push(&id);
    let row = db.query_one(CREATE, AWAKEABLE_CREATE, &params).await?;
    append_outcome(&row, CREATE, &append.key, append.fence.as_ref())
}

const AWAKEABLE_SETTLE: &str =
    "SELECT outcome, settled_status FROM keiro_awakeable_settle($1, $2, $3, $4, $5)";

/// Settles `id` as `status` (`completed` with `payload`, or `cancelled`), journaling
/// `envelope` into its owner.
async fn awakeable_settle(
    db: &Db,
    operation: &'static str,
    id: Uuid,
    status: AwakeableStatus,
    payload: Option<&Value>,
    envelope: Value,
) -> Result<AwakeableOutcome> {
    let row = db
        .query_one(
            operation,
            AWAKEABLE_SETTLE,
            &[
                &id,
                &status_text(status),
                &payload,
                &awakeable_step(id),
                &envelope,
            ],
        )
        .await?;
    settle_outcome(&row, operation)
}

/// Reads the `outcome, settled_status` columns of `keiro_awakeable_settle`.
pub(crate) fn settle_outcome(row: &Row, operation: &'static str) -> Result<AwakeableOutcome> {
    let outcome: String = column(row, "outcome", operation)?;
    match outcome.as_str() {
        "delivered" => Ok(AwakeableOutcome::Delivered),
        "owner_gone" => Ok(AwakeableOutcome::OwnerGone),
        "not_found" => Ok(AwakeableOutcome::NotFound),
        "already_settled" => {
            let settled: String = column(row, "settled_status", operation)?;
            Ok(AwakeableOutcome::AlreadySettled(parse_status(
                &settled, operation,
            )?))
        }
        other => Err(unknown_outcome(operation, other)),
    }
}

pub(crate) async fn awakeable_complete(
    db: &Db,
    id: Uuid,
    payload: &Value,
) -> Result<AwakeableOutcome> {
    let envelope = Envelope::ok(payload.clone());
    awakeable_settle(
        db,
        COMPLETE,
        id,
        AwakeableStatus::Completed,
        Some(payload),
        envelope,
    )
    .await
}

pub(crate) async fn awakeable_cancel(db: &Db, id: Uuid) -> Result<AwakeableOutcome> {
    awakeable_settle(
        db,
        CANCEL,
        id,
        AwakeableStatus::Cancelled,
        None,
        Envelope::cancelled(),
    )
    .await
}

// Served by `awakeables_pending_idx` (an index-only scan of the pending rows).
const AWAKEABLES_PENDING: &str =
    "SELECT count(*) AS pending FROM awakeables WHERE status = 'pending'";

pub(crate) async fn awakeables_pending(db: &Db) -> Result<u64> {
    let row = db.query_one(PENDING, AWAKEABLES_PENDING, &[]).await?;
    count(&row, "pending", PENDING)
}

/// The text stored in the awakeable's `status` column.
pub(crate) fn status_text(status: AwakeableStatus) -> &'static str {
    match status {
        AwakeableStatus::Pending => "pending",
        AwakeableStatus::Completed => "completed",
        AwakeableStatus::Cancelled => "cancelled",
    }
}

/// Reads a stored awakeable status.
pub(crate) fn parse_status(text: &str, operation: &'static str) -> Result<AwakeableStatus> {
    match text {
        "pending" => Ok(AwakeableStatus::Pending),
        "completed" => Ok(AwakeableStatus::Completed),
        "cancelled" => Ok(AwakeableStatus::Cancelled),
        other => Err(malformed(
            operation,
            format_args!("unknown awakeable status {other:?}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_their_text() {
        for status in [
            AwakeableStatus::Pending,
            AwakeableStatus::Completed,
            AwakeableStatus::Cancelled,
        ] {
            assert_eq!(parse_status(status_text(status), PENDING).unwrap(), status);
        }
        assert!(parse_status("settled", PENDING).is_err());
    }
}
