//! The park lane: parks that dispatch remote steps, from runs parking at about the same moment,
//! share one transaction.
//!
//! A worker busy with remote steps parks a run on every one of them, and a transaction per park
//! (its round trip, its commit, its statement's set-up) costs about as much as the park's own
//! work. The lane sends the parks that arrive while earlier batches are in flight as one call
//! of `keiro_instances_park_dispatch` (`ops::remote`), which runs each exactly as
//! `keiro_instance_park_dispatch` would; a park that arrives alone takes that single
//! statement, so an idle worker waits for nothing.

use std::sync::Arc;

use keiro_journal::store::Result;
use keiro_journal::{store::Park, store::ParkOutcome, store::RemoteArm, store::RemoteArmOutcome};

use super::lane::{Batched, Lane};
use crate::db::Db;
use crate::ops::remote::{self as op, PARK_BATCH};

/// One park with the remote steps it dispatches.
pub(super) struct ParkRequest {
    park: Park,
    arms: Vec<RemoteArm>,
}

impl Batched for ParkRequest {
    type Output = (ParkOutcome, Vec<RemoteArmOutcome>);

    const OPERATION: &'static str = PARK_BATCH;

    const NAME: &'static str = "instance_park_dispatch";

    /// A park sent alone holds the slot to its end.
    const ALONE_GIVES_SLOT_BACK: bool = false;

    async fn send_many(db: &Db, batch: &[Self]) -> Result<Vec<Option<Result<Self::Output>>>> {
        let parks: Vec<(&Park, &[RemoteArm])> = batch
            .iter()
            .map(|request| (&request.park, request.arms.as_slice()))
            .collect();
        op::instances_park_dispatch(db, &parks).await
    }

    async fn send_one(db: &Db, request: &Self) -> Result<Self::Output> {
        op::instance_park_dispatch(db, &request.park, &request.arms).await
    }
}

/// [`JournalStore::instance_park_dispatch`](keiro_journal::JournalStore::instance_park_dispatch)
/// through the park lane.
pub(super) async fn instance_park_dispatch(
    lane: &Lane<ParkRequest>,
    db: &Arc<Db>,
    park: &Park,
    arms: &[RemoteArm],
) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
    let request = ParkRequest {
        park: park.clone(),
        arms: arms.to_vec(),
    };
    lane.call(db, request).await
}
