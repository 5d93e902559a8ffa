//! Parks that dispatch remote steps, from runs parking at about the same moment, share one
//! transaction.
//!
//! A worker busy with remote steps parks a run on every one of them, and a transaction per park
//! (its round trip, its commit, its statement's set-up) cost about as much as the park's own
//! work. The batcher sends the parks that arrive while earlier batches are in flight as one
//! call of `keiro_instances_park_dispatch` (migration 0007), which runs each exactly as
//! `keiro_instance_park_dispatch` would; a park that arrives alone takes that single
//! statement, so an idle worker waits for nothing. A batch that fails as a whole (a lost
//! connection, a deadlock the server broke) rolled back entirely and is retried park by park,
//! so every caller gets the answer a call of its own would have given.

use std::sync::OnceLock;

use keiro_journal::store::Result;
use keiro_journal::{Park, ParkOutcome, RemoteArm, RemoteArmOutcome};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_postgres::types::ToSql;

use crate::remote::{instance_park_dispatch, park_dispatch_outcome, ArmColumns};
use crate::row::{column, malformed};
use crate::store::WeakStore;
use crate::PgStore;

/// The most parks one batch carries.
const BATCH_MAX: usize = 64;

/// Batches in flight at once: while one commits the next fills, and the database works on
/// several in parallel.
const BATCHES_IN_FLIGHT: usize = 4;

const PARK_BATCH: &str = "parking runs with their remote dispatches";

type Outcome = Result<(ParkOutcome, Vec<RemoteArmOutcome>)>;

/// One park waiting for its batch, with where its outcome goes.
struct Request {
    park: Park,
    arms: Vec<RemoteArm>,
    reply: oneshot::Sender<Outcome>,
}

/// The queue of parks waiting to be sent; its task starts with the first park.
#[derive(Default)]
pub(crate) struct ParkBatcher {
    queue: OnceLock<mpsc::UnboundedSender<Request>>,
}

/// [`JournalStore::instance_park_dispatch`](keiro_journal::JournalStore::instance_park_dispatch)
/// through the store's batcher.
pub(crate) async fn park_dispatch(store: &PgStore, park: &Park, arms: &[RemoteArm]) -> Outcome {
    let queue = store.park_batcher().queue.get_or_init(|| {
        let (queue, requests) = mpsc::unbounded_channel();
        tokio::spawn(run(store.downgrade(), requests));
        queue
    });
    let (reply, outcome) = oneshot::channel();
    let request = Request {
        park: park.clone(),
        arms: arms.to_vec(),
        reply,
    };
    if queue.send(request).is_ok() {
        if let Ok(outcome) = outcome.await {
            return outcome;
        }
    }
    // The batcher's task is gone (the runtime it was started on shut down): park directly. A
    // request it dropped unanswered was most likely never sent; if its batch did commit,
    // parking again is still safe: the re-arm learns the task it wrote (the first arm wins)
    // and the park is repeated.
    instance_park_dispatch(store, park, arms).await
}

/// Sends batches until the store is dropped.
async fn run(store: WeakStore, mut requests: mpsc::UnboundedReceiver<Request>) {
    let mut in_flight = JoinSet::new();
    loop {
        if in_flight.len() >= BATCHES_IN_FLIGHT {
            in_flight.join_next().await;
            continue;
        }
        let mut batch = Vec::with_capacity(BATCH_MAX);
        if requests.recv_many(&mut batch, BATCH_MAX).await == 0 {
            break;
        }
        let Some(store) = store.upgrade() else { break };
        in_flight.spawn(async move { send(&store, batch).await });
    }
    while in_flight.join_next().await.is_some() {}
}

/// Parks one batch and answers each request.
async fn send(store: &PgStore, mut batch: Vec<Request>) {
    if batch.len() > 1 {
        match parks_dispatch(store, &batch).await {
            Ok(outcomes) => {
                for (request, outcome) in batch.into_iter().zip(outcomes) {
                    let _ = request.reply.send(outcome);
                }
                return;
            }
            Err(error) => {
                tracing::debug!(%error, parks = batch.len(), "park batch failed; parking one by one");
            }
        }
    }
    for request in batch.drain(..) {
        let outcome = instance_park_dispatch(store, &request.park, &request.arms).await;
        let _ = request.reply.send(outcome);
    }
}

const INSTANCES_PARK_DISPATCH: &str = "SELECT p.park, p.outcome, p.row_status, \
     p.arm_outcomes, p.arm_deadlines, p.arm_settled \
     FROM keiro_instances_park_dispatch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
     $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24) p";

/// One statement for the whole batch: an outcome per request, in the batch's order. An error
/// here means the statement failed, so nothing of it was written; a refusal of one park (not
/// found, lease lost) is that park's outcome.
async fn parks_dispatch(store: &PgStore, batch: &[Request]) -> Result<Vec<Outcome>> {
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
        .query(PARK_BATCH, INSTANCES_PARK_DISPATCH, &params)
        .await?;
    // From here on the batch has committed: a row that cannot be read is that park's error,
    // never a reason to park again.
    let mut outcomes: Vec<Option<Outcome>> = batch.iter().map(|_| None).collect();
    for row in &rows {
        let park = column::<i32>(row, "park", PARK_BATCH)
            .ok()
            .and_then(|p| usize::try_from(p).ok())
            .and_then(|p| p.checked_sub(1))
            .filter(|&i| i < batch.len());
        if let Some(i) = park {
            outcomes[i] = Some(park_dispatch_outcome(row, &batch[i].park, &batch[i].arms));
        }
    }
    Ok(outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| Err(malformed(PARK_BATCH, "no outcome for this park")))
        })
        .collect())
}

/// A 1-based array position.
fn position(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}
