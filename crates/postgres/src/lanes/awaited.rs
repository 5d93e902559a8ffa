//! The awaited lane: result waiters marking their runs awaited (so that a run's close
//! notifies them), one statement for the waiters that start at about the same moment
//! (`ops::instance::instances_mark_awaited`); a mark alone is `INSTANCE_MARK_AWAITED`. A row
//! another transaction holds is left out of the batch and marked alone after it.

use keiro_journal::store::Result;
use keiro_journal::InstanceKey;

use super::lane::Batched;
use crate::db::Db;
use crate::ops::instance::{self as op, MARK_AWAITED};

/// One waiter's mark of its instance.
pub(super) struct MarkRequest(pub(super) InstanceKey);

impl Batched for MarkRequest {
    /// `true` marked; `false` the instance is no longer live (closed, or never started).
    type Output = bool;

    const OPERATION: &'static str = MARK_AWAITED;

    const NAME: &'static str = "instance_mark_awaited";

    async fn send_many(db: &Db, batch: &[Self]) -> Result<Vec<Option<Result<Self::Output>>>> {
        let keys: Vec<&InstanceKey> = batch.iter().map(|request| &request.0).collect();
        op::instances_mark_awaited(db, &keys).await
    }

    async fn send_one(db: &Db, request: &Self) -> Result<Self::Output> {
        op::instance_mark_awaited(db, &request.0).await
    }
}
