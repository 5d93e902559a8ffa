//! `crates/migrations/functions/journal.sql`: the append rules (`keiro_journal_append_to`), bounded
//! deliveries (`keiro_delivery_append`) and the batch of appends of several runs
//! (`keiro_journal_append_batch`, and `keiro_journal_append_steps` for a batch of fenced steps
//! only), with the plain reads and writes of the journal beside them.
//! Every function that journals something (a wake source, a child, a signal) takes the
//! parameters of [`AppendArgs`] first and answers with the columns [`append_outcome`] reads.

use keiro_journal::store::{Append, AppendOutcome, DeliveryOutcome, Result};
use keiro_journal::{
    store::encoded_len, store::EncodedEvent, Deliveries, DeliveryBacklog, Event, Fence, Generation,
    InstanceKey, JournalEntry, Marker, StepKind, StoreError,
};
use serde_json::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::db::Db;
use crate::ops::{lease_lost, not_found, span_ms, unknown_outcome};
use crate::row::{self, column, in_batch_order, malformed};

const LOAD: &str = "loading a journal generation";
const HISTORY: &str = "loading a journal's history";
pub(crate) const APPEND: &str = "appending to the journal";
pub(crate) const DELIVER: &str = "journaling a delivery";
const READ: &str = "counting the deliveries a run read";

/// The nine leading parameters every append-shaped function takes, in order: the instance,
/// the writer's generation, the encoded event, and the writer's fence with its renewal.
pub(crate) struct AppendArgs<'a> {
    name: &'a str,
    id: &'a str,
    generation: Option<i32>,
    encoded: EncodedEvent,
    owner: Option<&'a str>,
    epoch: Option<i64>,
    renew_ms: Option<i64>,
}

impl<'a> AppendArgs<'a> {
    pub(crate) fn new(append: &'a Append, encoded: EncodedEvent) -> Self {
        Self {
            name: append.key.name.as_str(),
            id: append.key.id.as_str(),
            generation: append.generation,
            encoded,
            owner: append.fence.as_ref().map(|f| f.owner.as_str()),
            epoch: append.fence.as_ref().map(|f| f.epoch),
            renew_ms: append.renew.map(span_ms),
        }
    }

    /// The parameters; operations with more append them after these.
    pub(crate) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.name,
            &self.id,
            &self.generation,
            &self.encoded.step_name,
            &self.encoded.kind,
            &self.encoded.payload,
            &self.owner,
            &self.epoch,
            &self.renew_ms,
        ]
    }
}

/// Refuses an event `journal_append` does not take.
pub(crate) fn appendable(append: &Append) -> Result<()> {
    if matches!(append.event, Event::Resurrected) {
        // A resurrection changes the instance row in ways an append does not; it goes through
        // `instance_resurrect`, which journals it together with that change.
        return Err(StoreError::Database {
            operation: APPEND,
            retryable: false,
            source: "only steps and lifecycle markers go through journal_append".into(),
        });
    }
    Ok(())
}

/// The encoded event of an append that a wake-source operation makes together with its own
/// rows (an awakeable's allocation, a child's spawn): always a step, never a marker, which
/// would close the instance that the new rows are about to wait on.
pub(crate) fn encoded_step(append: &Append, operation: &'static str) -> Result<EncodedEvent> {
    match &append.event {
        Event::StepRecorded { .. } => Ok(append.event.encode()),
        _ => Err(StoreError::Database {
            operation,
            retryable: false,
            source: format!("expected a step, got {:?}", append.event.step_name()).into(),
        }),
    }
}

/// Reads the `outcome, recorded, marker` columns every append-shaped function returns (an
/// append to `key` by the holder of `fence`, if any) into its outcome or error.
pub(crate) fn append_outcome(
    row: &Row,
    operation: &'static str,
    key: &InstanceKey,
    fence: Option<&Fence>,
) -> Result<AppendOutcome> {
    let outcome: String = column(row, "outcome", operation)?;
    match outcome.as_str() {
        "appended" => Ok(AppendOutcome::Appended),
        "already_present" => {
            let recorded: Option<Value> = column(row, "recorded", operation)?;
            Ok(AppendOutcome::AlreadyPresent(
                recorded.unwrap_or(Value::Null),
            ))
        }
        "conflict" => Ok(AppendOutcome::Conflict),
        "refused_terminal" => {
            let marker: Option<String> = column(row, "marker", operation)?;
            marker
                .as_deref()
                .and_then(Marker::parse)
                .map(AppendOutcome::RefusedTerminal)
                .ok_or_else(|| {
                    malformed(operation, format_args!("unknown closing marker {marker:?}"))
                })
        }
        "not_found" => Err(not_found(key)),
        "lease_lost" => match fence {
            Some(fence) => Err(lease_lost(key, fence)),
            None => Err(unknown_outcome(operation, "lease_lost without a fence")),
        },
        other => Err(unknown_outcome(operation, other)),
    }
}

// `keiro_journal_append_to` itself, not the `keiro_journal_append` wrapper: a LANGUAGE sql
// function returning a record is never inlined, so the wrapper would be parsed and planned
// again on every call.
const JOURNAL_APPEND: &str = "SELECT outcome, recorded, marker \
     FROM keiro_journal_append_to($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// One append: `keiro_journal_append_to`.
pub(crate) async fn journal_append(db: &Db, append: &Append) -> Result<AppendOutcome> {
    let args = AppendArgs::new(append, append.event.encode());
    let row = db.query_one(APPEND, JOURNAL_APPEND, &args.params()).await?;
    append_outcome(&row, APPEND, &append.key, append.fence.as_ref())
}

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
    db: &Db,
    append: &Append,
    backlog: &DeliveryBacklog,
) -> Result<DeliveryOutcome> {
    let args = DeliveryArgs::new(append, backlog)?;
    let row = db
        .query_one(DELIVER, DELIVERY_APPEND, &args.params())
        .await?;
    delivery_outcome(&row, &append.key)
}

const JOURNAL_APPEND_BATCH: &str = "SELECT a.n, a.outcome, a.recorded, a.marker \
     FROM keiro_journal_append_batch($1, $2, $3, $4, $5, $6, $7, $8, $9) a";

const JOURNAL_APPEND_STEPS: &str =
    "SELECT a.n, a.outcome FROM keiro_journal_append_steps($1, $2, $3, $4, $5, $6, $7, $8, $9) a";

/// One row's answer from `keiro_journal_append_batch`: `None` when its instance's row was held
/// by another transaction (the caller sends it alone), `Some(Ok(None))` for a closing pair's
/// completion that was not tried.
pub(crate) type RowAnswer = Option<Result<Option<AppendOutcome>>>;

/// The nine arrays of a batch of appends, a column each, rows in the order given.
struct BatchColumns<'a> {
    names: Vec<&'a str>,
    ids: Vec<&'a str>,
    generations: Vec<Option<i32>>,
    encoded: Vec<EncodedEvent>,
    owners: Vec<Option<&'a str>>,
    epochs: Vec<Option<i64>>,
    renew_ms: Vec<Option<i64>>,
}

impl<'a> BatchColumns<'a> {
    fn new(rows: &[&'a Append]) -> Self {
        Self {
            names: rows.iter().map(|a| a.key.name.as_str()).collect(),
            ids: rows.iter().map(|a| a.key.id.as_str()).collect(),
            generations: rows.iter().map(|a| a.generation).collect(),
            encoded: rows.iter().map(|a| a.event.encode()).collect(),
            owners: rows
                .iter()
                .map(|a| a.fence.as_ref().map(|f| f.owner.as_str()))
                .collect(),
            epochs: rows
                .iter()
                .map(|a| a.fence.as_ref().map(|f| f.epoch))
                .collect(),
            renew_ms: rows.iter().map(|a| a.renew.map(span_ms)).collect(),
        }
    }

    /// Sends `statement` (one of the two batch functions) with the columns as its nine
    /// parameters, and reads its rows with `answer` (a row, the position of its request), in
    /// the batch's order.
    async fn send<O>(
        &self,
        db: &Db,
        statement: &str,
        answer: impl FnMut(&Row, usize) -> Option<Result<O>>,
    ) -> Result<Vec<Option<Result<O>>>> {
        let steps: Vec<&str> = self.encoded.iter().map(|e| e.step_name.as_str()).collect();
        let kinds: Vec<&str> = self.encoded.iter().map(|e| e.kind).collect();
        let payloads: Vec<&Value> = self.encoded.iter().map(|e| &e.payload).collect();
        let rows = db
            .query(
                APPEND,
                statement,
                &[
                    &self.names,
                    &self.ids,
                    &self.generations,
                    &steps,
                    &kinds,
                    &payloads,
                    &self.owners,
                    &self.epochs,
                    &self.renew_ms,
                ],
            )
            .await?;
        Ok(in_batch_order(&rows, self.names.len(), APPEND, "n", answer))
    }
}

/// Appends of several runs in one statement: `keiro_journal_append_batch` over the rows in the
/// order given (sorted by instance key, one instance's rows side by side, the form the
/// function journals without sorting), answered row by row in that order.
pub(crate) async fn journal_append_batch(db: &Db, rows: &[&Append]) -> Result<Vec<RowAnswer>> {
    BatchColumns::new(rows)
        .send(db, JOURNAL_APPEND_BATCH, |row, r| {
            let append = rows[r];
            match column::<String>(row, "outcome", APPEND) {
                // The instance's row was held by another transaction: sent alone.
                Ok(outcome) if outcome == "busy" => None,
                Ok(outcome) if outcome == "skipped" => Some(Ok(None)),
                _ => {
                    Some(append_outcome(row, APPEND, &append.key, append.fence.as_ref()).map(Some))
                }
            }
        })
        .await
}

/// Whether `journal_append_steps` takes `append`: a step (no marker), which that function
/// journals when its run holds a lease that is not due and answers `slow` otherwise.
pub(crate) fn plain_step(append: &Append) -> bool {
    matches!(append.event, Event::StepRecorded { .. }) && append.fence.is_some()
}

/// Steps of several runs in one statement: `keiro_journal_append_steps`, the common batch
/// (every row a [`plain_step`]). Answers `Some(Ok(Appended))` for a step it journaled and
/// `None` for every other (its row held by another transaction, or a step that changes its
/// row or is refused), which the caller sends alone.
pub(crate) async fn journal_append_steps(
    db: &Db,
    rows: &[&Append],
) -> Result<Vec<Option<Result<AppendOutcome>>>> {
    BatchColumns::new(rows)
        .send(db, JOURNAL_APPEND_STEPS, |row, _| {
            match column::<String>(row, "outcome", APPEND) {
                Ok(outcome) if outcome == "appended" => Some(Ok(AppendOutcome::Appended)),
                // Held by another transaction, or not a step this statement writes.
                Ok(outcome) if outcome == "busy" || outcome == "slow" => None,
                Ok(outcome) => Some(Err(unknown_outcome(APPEND, &outcome))),
                Err(error) => Some(Err(error)),
            }
        })
        .await
}

// Served by the journal's unique index: its (name, id, generation) prefix.
const JOURNAL_LOAD: &str =
    "SELECT seq, generation, step_name, kind, payload, recorded_at FROM journal \
     WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3 ORDER BY seq";

pub(crate) async fn journal_load(
    db: &Db,
    key: &InstanceKey,
    generation: Generation,
) -> Result<Vec<JournalEntry>> {
    let rows = db
        .query(
            LOAD,
            JOURNAL_LOAD,
            &[&key.name.as_str(), &key.id.as_str(), &generation],
        )
        .await?;
    row::entries(&rows, LOAD)
}

// Served by the journal's unique index: its (name, id) prefix.
const JOURNAL_HISTORY: &str =
    "SELECT seq, generation, step_name, kind, payload, recorded_at FROM journal \
     WHERE workflow_name = $1 AND workflow_id = $2 ORDER BY seq";

pub(crate) async fn journal_history(db: &Db, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
    let rows = db
        .query(
            HISTORY,
            JOURNAL_HISTORY,
            &[&key.name.as_str(), &key.id.as_str()],
        )
        .await?;
    row::entries(&rows, HISTORY)
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
    db: &Db,
    key: &InstanceKey,
    generation: Generation,
    read: Deliveries,
) -> Result<()> {
    let count = i32::try_from(read.count).unwrap_or(i32::MAX);
    db.execute(
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
