//! Deliveries, and the bound on the ones no await has read (`keiro_journal`'s `delivery`
//! module): a delivery is one call of `keiro_delivery_append` (sql/functions/journal.sql),
//! which journals it through the append rules, counts it, and refuses it past the caller's
//! bound; a run's report of what its awaits read is one UPDATE of the instance row.

use keiro_journal::store::{DeliveryOutcome, Result};
use keiro_journal::{
    encoded_len, Append, Deliveries, DeliveryBacklog, Event, Generation, InstanceKey, StepKind,
    StoreError,
};
use serde_json::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::journal::append_outcome;
use crate::row::column;
use crate::PgStore;

pub(crate) const DELIVER: &str = "journaling a delivery";
const READ: &str = "counting the deliveries a run read";

/// The arguments of `keiro_delivery_append`, in order.
pub(crate) struct DeliveryArgs<'a> {
    name: &'a str,
    id: &'a str,
    generation: Option<Generation>,
    step: String,
    payload: &'a Value,
    bytes: i64,
    unread_max: i64,
    unread_bytes_max: i64,
}

/// A count the database keeps as a `bigint`.
fn bigint(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl<'a> DeliveryArgs<'a> {
    /// The arguments of `append` under `backlog`; a delivery is an unfenced `await` record.
    pub(crate) fn new(append: &'a Append, backlog: &DeliveryBacklog) -> Result<Self> {
        let (step, payload) = match &append.event {
            Event::StepRecorded {
                step,
                kind: StepKind::Await,
                result,
            } if append.fence.is_none() => (step.clone(), result),
            _ => {
                return Err(StoreError::Database {
                    operation: DELIVER,
                    retryable: false,
                    source: "a delivery is an unfenced await record".into(),
                })
            }
        };
        Ok(Self {
            name: append.key.name.as_str(),
            id: append.key.id.as_str(),
            generation: append.generation,
            step,
            payload,
            bytes: bigint(encoded_len(payload)),
            unread_max: bigint(backlog.deliveries),
            unread_bytes_max: bigint(backlog.bytes),
        })
    }

    pub(crate) fn params(&self) -> [&(dyn ToSql + Sync); 8] {
        [
            &self.name,
            &self.id,
            &self.generation,
            &self.step,
            self.payload,
            &self.bytes,
            &self.unread_max,
            &self.unread_bytes_max,
        ]
    }
}

/// Reads a delivery's `outcome, recorded, marker, unread, unread_bytes`.
pub(crate) fn delivery_outcome(row: &Row, key: &InstanceKey) -> Result<DeliveryOutcome> {
    let outcome: String = column(row, "outcome", DELIVER)?;
    if outcome != "backlog" {
        return append_outcome(row, DELIVER, key, None).map(DeliveryOutcome::Append);
    }
    let count = |name| -> Result<usize> {
        let n: Option<i64> = column(row, name, DELIVER)?;
        Ok(usize::try_from(n.unwrap_or(0)).unwrap_or(0))
    };
    Ok(DeliveryOutcome::Backlog(Deliveries {
        count: count("unread")?,
        bytes: count("unread_bytes")?,
    }))
}

const DELIVERY_APPEND: &str = "SELECT outcome, recorded, marker, unread, unread_bytes \
     FROM keiro_delivery_append($1, $2, $3, $4, $5, $6, $7, $8)";

/// [`JournalStore::delivery_append`](keiro_journal::JournalStore::delivery_append): one call,
/// not batched with the appends of runs (deliveries are rare beside steps, and the batch has
/// no bound to check).
pub(crate) async fn delivery_append(
    store: &PgStore,
    append: &Append,
    backlog: &DeliveryBacklog,
) -> Result<DeliveryOutcome> {
    let args = DeliveryArgs::new(append, backlog)?;
    let row = store
        .query_one(DELIVER, DELIVERY_APPEND, &args.params())
        .await?;
    delivery_outcome(&row, &append.key)
}

// Only the current generation, once the store has counted a delivery in it; the totals only
// grow (a drive replays the generation from the start, so its total includes the earlier
// drives' reads). One row, one statement: no function needed.
const DELIVERIES_READ: &str = "UPDATE workflows SET \
         deliveries_read = greatest(coalesce(deliveries_read, 0), $4), \
         deliveries_read_bytes = greatest(coalesce(deliveries_read_bytes, 0), $5) \
     WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3 \
       AND deliveries_generation = $3 \
       AND (deliveries_read IS DISTINCT FROM $4 OR deliveries_read_bytes IS DISTINCT FROM $5)";

/// [`JournalStore::deliveries_read`](keiro_journal::JournalStore::deliveries_read).
pub(crate) async fn deliveries_read(
    store: &PgStore,
    key: &InstanceKey,
    generation: Generation,
    read: Deliveries,
) -> Result<()> {
    let count = i32::try_from(read.count).unwrap_or(i32::MAX);
    store
        .execute(
            READ,
            DELIVERIES_READ,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &generation,
                &count,
                &bigint(read.bytes),
            ],
        )
        .await?;
    Ok(())
}
