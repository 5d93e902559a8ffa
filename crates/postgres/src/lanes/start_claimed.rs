//! The direct start lane (`LeaseStore::instance_start_claimed`): the row created, or found and
//! claimed, leased to its caller, in one statement; concurrent direct starts of one process
//! share a transaction, as one call of `keiro_instances_start_claimed` (`ops::lease`). The
//! lane takes its slots from the append lane's ([`Lanes::instance_start_claimed`](super::Lanes::instance_start_claimed)).

use keiro_journal::store::Result;
use keiro_lease::StartClaim;

use super::lane::Batched;
use crate::db::Db;
use crate::ops::lease::{self as op, StartClaimed};

impl Batched for StartClaimed {
    type Output = StartClaim;

    const OPERATION: &'static str = op::START_CLAIMED;

    const NAME: &'static str = "instance_start_claimed";

    async fn send_many(db: &Db, batch: &[Self]) -> Result<Vec<Option<Result<StartClaim>>>> {
        op::instances_start_claimed(db, batch).await
    }

    async fn send_one(db: &Db, request: &Self) -> Result<StartClaim> {
        op::instance_start_claimed(db, request).await
    }
}
