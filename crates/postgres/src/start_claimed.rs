//! Direct starts (`LeaseStore::instance_start_claimed`): the row created, or found and
//! claimed, leased to its caller, in one statement. Concurrent direct starts of one process
//! share a transaction through their own group-commit lane (`keiro_instances_start_claimed`),
//! as step appends and plain starts do (see `batch`).

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{Fence, StartRequest};
use keiro_lease::{classify_refusal, Claim, ClaimOutcome, StartClaim};
use time::OffsetDateTime;
use tokio_postgres::Row;

use crate::batch::{in_batch_order, Batched, SlotHold};
use crate::lease::{claimed_journal, gate, instance_release};
use crate::row::{self, column, instance_columns};
use crate::store::span_ms;
use crate::PgStore;

const START_CLAIMED: &str = "starting an instance leased to its caller";

// One statement: the start and the claim commit together (sql/functions/lease.sql says why
// the row is inserted with its lease rather than claimed after the insert).
const INSTANCE_START_CLAIMED: &str = concat!(
    "SELECT c.created, c.granted, c.clock, ",
    instance_columns!("(c.instance)."),
    ", c.journal_seq, c.journal_step, c.journal_kind, c.journal_payload, c.journal_recorded_at",
    " FROM keiro_instance_start_claimed($1, $2, $3, $4, $5, $6, $7, $8, $9) c"
);

const INSTANCES_START_CLAIMED: &str = concat!(
    "SELECT c.n, c.created, c.granted, c.clock, ",
    instance_columns!("(c.instance)."),
    ", c.journal_seq, c.journal_step, c.journal_kind, c.journal_payload, c.journal_recorded_at",
    " FROM keiro_instances_start_claimed($1, $2, $3, $4, $5, $6, $7, $8, $9) c"
);

/// One direct start waiting in the direct start lane.
#[derive(Debug, Clone)]
pub(crate) struct StartClaimedRequest {
    request: StartRequest,
    owner: String,
    ttl: Duration,
    now: Option<OffsetDateTime>,
}

/// A direct start, through the store's direct start lane.
pub(crate) async fn instance_start_claimed(
    store: &PgStore,
    request: &StartRequest,
    owner: &str,
    ttl: Duration,
    now: Option<OffsetDateTime>,
) -> Result<StartClaim> {
    let request = StartClaimedRequest {
        request: request.clone(),
        owner: owner.to_owned(),
        ttl,
        now,
    };
    store.lanes().direct_starts.call(store, request).await
}

impl Batched for StartClaimedRequest {
    type Output = StartClaim;

    const OPERATION: &'static str = START_CLAIMED;

    const NAME: &'static str = "instance_start_claimed";

    const SHARES_APPEND_SLOTS: bool = true;

    async fn send_many(
        store: &PgStore,
        batch: &[Self],
        slot: Option<&SlotHold>,
    ) -> Result<Vec<Option<Result<StartClaim>>>> {
        let names: Vec<&str> = batch.iter().map(|r| r.request.key.name.as_str()).collect();
        let ids: Vec<&str> = batch.iter().map(|r| r.request.key.id.as_str()).collect();
        let inputs: Vec<&serde_json::Value> = batch.iter().map(|r| &r.request.input).collect();
        let parent_names: Vec<Option<&str>> = batch
            .iter()
            .map(|r| r.request.parent.as_ref().map(|p| p.name.as_str()))
            .collect();
        let parent_ids: Vec<Option<&str>> = batch
            .iter()
            .map(|r| r.request.parent.as_ref().map(|p| p.id.as_str()))
            .collect();
        let priorities: Vec<i32> = batch.iter().map(|r| r.request.priority).collect();
        let owners: Vec<&str> = batch.iter().map(|r| r.owner.as_str()).collect();
        let ttls: Vec<i64> = batch.iter().map(|r| span_ms(r.ttl)).collect();
        let nows: Vec<Option<OffsetDateTime>> = batch.iter().map(|r| r.now).collect();
        let rows = store
            .query_in_slot(
                START_CLAIMED,
                INSTANCES_START_CLAIMED,
                &[
                    &names,
                    &ids,
                    &inputs,
                    &parent_names,
                    &parent_ids,
                    &priorities,
                    &owners,
                    &ttls,
                    &nows,
                ],
                slot,
            )
            .await?;
        let mut answers = Vec::with_capacity(batch.len());
        for answer in in_batch_order(&rows, batch.len(), START_CLAIMED, "n", |row, i| {
            Some(Ok((row.clone(), i)))
        }) {
            answers.push(match answer {
                Some(Ok((row, i))) => Some(start_claim(store, &row, &batch[i]).await),
                Some(Err(error)) => Some(Err(error)),
                None => None,
            });
        }
        Ok(answers)
    }

    async fn send_one(
        store: &PgStore,
        request: &Self,
        slot: Option<&SlotHold>,
    ) -> Result<StartClaim> {
        let StartClaimedRequest {
            request: start,
            owner,
            ttl,
            now,
        } = request;
        let parent_name = start.parent.as_ref().map(|p| p.name.as_str());
        let parent_id = start.parent.as_ref().map(|p| p.id.as_str());
        let row = store
            .query_one_in_slot(
                START_CLAIMED,
                INSTANCE_START_CLAIMED,
                &[
                    &start.key.name.as_str(),
                    &start.key.id.as_str(),
                    &start.input,
                    &parent_name,
                    &parent_id,
                    &start.priority,
                    &owner.as_str(),
                    &span_ms(*ttl),
                    now,
                ],
                slot,
            )
            .await?;
        start_claim(store, &row, request).await
    }
}

/// What one row of either statement says: the claim granted (with the journal to replay), or
/// the refusal classified at the statement's clock.
async fn start_claim(
    store: &PgStore,
    row: &Row,
    request: &StartClaimedRequest,
) -> Result<StartClaim> {
    let created: bool = column(row, "created", START_CLAIMED)?;
    let granted: bool = column(row, "granted", START_CLAIMED)?;
    if !granted {
        let clock: OffsetDateTime = column(row, "clock", START_CLAIMED)?;
        return Ok(StartClaim {
            created,
            claim: classify_refusal(gate(row)?, clock).into(),
        });
    }
    let instance = row::instance(row, START_CLAIMED)?;
    let fence = Fence {
        owner: request.owner.clone(),
        epoch: instance.lease_epoch,
    };
    let journal = match claimed_journal(row, &instance) {
        Ok(journal) => journal,
        Err(malformed) => {
            // As for a claim: a journal nobody can drive goes back unleased.
            let _ = instance_release(store, &request.request.key, &fence, false).await;
            return Err(malformed);
        }
    };
    Ok(StartClaim {
        created,
        claim: ClaimOutcome::Acquired(Box::new(Claim {
            fence,
            instance,
            journal,
        })),
    })
}
