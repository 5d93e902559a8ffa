//! Parks that dispatch remote steps, from runs parking at about the same moment, share one
//! transaction.
//!
//! A worker busy with remote steps parks a run on every one of them, and a transaction per park
//! (its round trip, its commit, its statement's set-up) cost about as much as the park's own
//! work. The park lane (see `batch`) sends the parks that arrive while earlier batches are in
//! flight as one call of `keiro_instances_park_dispatch` (migration 0007), which runs each
//! exactly as `keiro_instance_park_dispatch` would; a park that arrives alone takes that single
//! statement, so an idle worker waits for nothing. A batch that fails as a whole (a lost
//! connection, a deadlock the server broke) rolled back entirely and is retried park by park,
//! so every caller gets the answer a call of its own would have given.

use keiro_journal::store::Result;
use keiro_journal::{Park, ParkOutcome, RemoteArm, RemoteArmOutcome};
use tokio_postgres::types::ToSql;

use crate::batch::{in_batch_order, position, Batched, SlotHold};
use crate::remote::{instance_park_dispatch, park_dispatch_outcome, ArmColumns};
use crate::PgStore;

const PARK_BATCH: &str = "parking runs with their remote dispatches";

/// One park with the remote steps it dispatches.
pub(crate) struct ParkRequest {
    park: Park,
    arms: Vec<RemoteArm>,
}

impl Batched for ParkRequest {
    type Output = (ParkOutcome, Vec<RemoteArmOutcome>);

    const OPERATION: &'static str = PARK_BATCH;

    const NAME: &'static str = "instance_park_dispatch";

    async fn send_many(
        store: &PgStore,
        batch: &[Self],
        slot: Option<&SlotHold>,
    ) -> Result<Vec<Option<Result<Self::Output>>>> {
        parks_dispatch(store, batch, slot).await
    }

    /// Holds the slot to the end, as every lane does.
    async fn send_one(
        store: &PgStore,
        request: &Self,
        _slot: Option<&SlotHold>,
    ) -> Result<Self::Output> {
        instance_park_dispatch(store, &request.park, &request.arms).await
    }
}

/// [`JournalStore::instance_park_dispatch`](keiro_journal::JournalStore::instance_park_dispatch)
/// through the store's park lane.
pub(crate) async fn park_dispatch(
    store: &PgStore,
    park: &Park,
    arms: &[RemoteArm],
) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
    let request = ParkRequest {
        park: park.clone(),
        arms: arms.to_vec(),
    };
    store.lanes().parks.call(store, request).await
}

const INSTANCES_PARK_DISPATCH: &str = "SELECT p.park, p.outcome, p.row_status, \
     p.arm_outcomes, p.arm_deadlines, p.arm_settled \
     FROM keiro_instances_park_dispatch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
     $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24) p";

/// One statement for the whole batch: an outcome per request, in the batch's order. An error
/// here means the statement failed, so nothing of it was written; a refusal of one park (not
/// found, lease lost) is that park's outcome.
async fn parks_dispatch(
    store: &PgStore,
    batch: &[ParkRequest],
    slot: Option<&SlotHold>,
) -> Result<Vec<Option<Result<(ParkOutcome, Vec<RemoteArmOutcome>)>>>> {
    let mut names = Vec::with_capacity(batch.len());
    let mut ids = Vec::with_capacity(batch.len());
    let mut generations = Vec::with_capacity(batch.len());
    let mut owners = Vec::with_capacity(batch.len());
    let mut epochs = Vec::with_capacity(batch.len());
    let mut wake_after = Vec::with_capacity(batch.len());
    let (mut awaited_from, mut awaited_to, mut awaited) = (Vec::new(), Vec::new(), Vec::new());
    let (mut arms_from, mut arms_to, mut arms) = (Vec::new(), Vec::new(), ArmColumns::default());
    let mut arm_count = 0;
    for request in batch {
        let park = &request.park;
        names.push(park.key.name.as_str());
        ids.push(park.key.id.as_str());
        generations.push(park.generation);
        owners.push(park.fence.as_ref().map(|f| f.owner.as_str()));
        epochs.push(park.fence.as_ref().map(|f| f.epoch));
        wake_after.push(park.wake_after);
        // 1-based inclusive slices; an empty one ends before it starts.
        awaited_from.push(position(awaited.len() + 1));
        awaited.extend(park.awaited.iter().map(String::as_str));
        awaited_to.push(position(awaited.len()));
        arms_from.push(position(arm_count + 1));
        request.arms.iter().for_each(|arm| arms.push(arm));
        arm_count += request.arms.len();
        arms_to.push(position(arm_count));
    }
    let mut params: Vec<&(dyn ToSql + Sync)> = vec![
        &names,
        &ids,
        &generations,
        &owners,
        &epochs,
        &wake_after,
        &awaited_from,
        &awaited_to,
        &awaited,
        &arms_from,
        &arms_to,
    ];
    params.extend(arms.params());
    let rows = store
        .query_in_slot(PARK_BATCH, INSTANCES_PARK_DISPATCH, &params, slot)
        .await?;
    // From here on the batch has committed: a row that cannot be read is that park's error,
    // never a reason to park again.
    Ok(in_batch_order(
        &rows,
        batch.len(),
        PARK_BATCH,
        "park",
        |row, i| Some(park_dispatch_outcome(row, &batch[i].park, &batch[i].arms)),
    ))
}
