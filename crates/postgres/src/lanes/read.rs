//! The read lane: the instance rows that concurrent callers read (result waiters above all,
//! each reading its run's row when it starts waiting and again when the run closes), one
//! statement for the lot (`ops::instance::instances_get`); a read alone is the plain `SELECT`.

use keiro_journal::store::Result;
use keiro_journal::{Instance, InstanceKey};

use super::lane::Batched;
use crate::db::Db;
use crate::ops::instance::{self as op, GET};

/// One caller's read of an instance row.
pub(super) struct ReadRequest(pub(super) InstanceKey);

impl Batched for ReadRequest {
    type Output = Option<Instance>;

    const OPERATION: &'static str = GET;

    const NAME: &'static str = "instance_get";

    async fn send_many(db: &Db, batch: &[Self]) -> Result<Vec<Option<Result<Self::Output>>>> {
        let keys: Vec<&InstanceKey> = batch.iter().map(|request| &request.0).collect();
        op::instances_get(db, &keys).await
    }

    async fn send_one(db: &Db, request: &Self) -> Result<Self::Output> {
        op::instance_get(db, &request.0).await
    }
}
