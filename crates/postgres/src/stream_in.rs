//! A stream append inside a transaction step: [`write_stream_in`].
//!
//! `ctx.write_stream` journals each item as a step of its own, in its own transaction. Inside
//! `ctx.transaction(name, |tx| ..)` an item can instead be written in the step's transaction
//! (`keiro_stream_append_in`, message.sql): it commits with the step's statements and its
//! journal row, or not at all, so a reader never sees an item of work that rolled back. It
//! needs no journal row of its own: a committed step is replayed, never run again, so its
//! items are never written twice. The step's transaction holds the instance row from its first
//! statement, its fence checked, so no other holder can write meanwhile.

use keiro_journal::store::{encode_payload, encoded_len, run_store, validate_message_key};
use keiro_journal::{Ctx, WorkflowError};
use serde::Serialize;
use tokio_postgres::Transaction;

use crate::row::column;
use crate::PgStore;

/// Why [`write_stream_in`] wrote nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamInError {
    /// The write was refused before or by the store: a bad key, an unstorable value, a closed
    /// or full stream ([`WorkflowError::StreamClosed`], [`WorkflowError::StreamFull`]), a run
    /// that is over, or a run whose store is not a [`PgStore`]. Return it from the closure: the
    /// transaction rolls back.
    #[error("writing to stream {key:?} was refused")]
    Refused {
        /// The stream.
        key: String,
        /// Why.
        #[source]
        error: WorkflowError,
    },
    /// The database failed the statement; the transaction is aborted. Return it from the
    /// closure: the step retries a serialization failure or deadlock in place, as for its own
    /// statements.
    #[error("writing to stream {key:?} failed")]
    Database {
        /// The stream.
        key: String,
        /// The database's error.
        #[source]
        error: tokio_postgres::Error,
    },
}

/// Appends `value` to stream `key` of the run of `ctx`, inside `tx`, the transaction of a
/// `ctx.transaction` step's closure: it commits with the step or not at all (see the module
/// docs). Returns the item's offset. The stream's own bounds of the run's
/// [`StreamBudget`](keiro_journal::message::StreamBudget) apply; the per-generation ones count
/// `ctx.write_stream`'s items only.
///
/// ```no_run
/// use keiro_journal::{Ctx, WorkflowError};
/// use keiro_postgres::{write_stream_in, TransactionStep};
///
/// async fn settle(ctx: Ctx) -> Result<(), WorkflowError> {
///     ctx.transaction("settle", |tx| {
///         let ctx = ctx.clone();
///         Box::pin(async move {
///             tx.execute("UPDATE app.orders SET settled = true WHERE id = 7", &[]).await?;
///             write_stream_in(&ctx, tx, "progress", &"settled").await?;
///             Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
///         })
///     })
///     .await
/// }
/// ```
///
/// # Errors
///
/// [`StreamInError`].
pub async fn write_stream_in<T: Serialize + ?Sized>(
    ctx: &Ctx,
    tx: &Transaction<'_>,
    key: &str,
    value: &T,
) -> Result<u64, StreamInError> {
    let refused = |error: WorkflowError| StreamInError::Refused {
        key: key.to_owned(),
        error,
    };
    validate_message_key(key).map_err(|e| refused(e.into()))?;
    let store = run_store(ctx)
        .as_any()
        .and_then(|any| any.downcast_ref::<PgStore>())
        .cloned()
        .ok_or_else(|| {
            refused(WorkflowError::Unsupported {
                step: format!("stream:{key}"),
                reason: "a stream write in a transaction needs the Postgres store".into(),
            })
        })?;
    let step = format!("stream:{key}");
    let json = encode_payload(&step, value, ctx.options().payload_len_max).map_err(refused)?;
    // Sealed as the store's own stream writes are, when the run's store applies a codec.
    let json = match run_store(ctx).payload_codec() {
        Some(codec) => codec.seal(&json).map_err(|source| {
            refused(WorkflowError::Store(keiro_journal::StoreError::Codec {
                operation: "writing to a stream in a transaction",
                source,
            }))
        })?,
        None => json,
    };
    let budget = ctx.options().stream_budget;
    let len = i64::try_from(encoded_len(&json)).unwrap_or(i64::MAX);
    let items_max = i64::try_from(budget.items).unwrap_or(i64::MAX);
    let bytes_max = i64::try_from(budget.bytes).unwrap_or(i64::MAX);
    // Qualified by keiro's schema: the step's search_path is the application's.
    let sql = format!(
        "SELECT outcome, stream_offset, stream_items, stream_bytes \
         FROM \"{}\".keiro_stream_append_in($1, $2, $3, $4, $5, $6, $7)",
        store.schema()
    );
    let name = ctx.key().name.as_str();
    let id = ctx.key().id.as_str();
    let database = |error| StreamInError::Database {
        key: key.to_owned(),
        error,
    };
    // The closure's transaction is a plain one (no statement cache): prepared, then run.
    let row = tx
        .query_one(
            sql.as_str(),
            &[&name, &id, &key, &json, &len, &items_max, &bytes_max],
        )
        .await
        .map_err(database)?;
    store.count_round_trips(2);
    let malformed = |e: keiro_journal::StoreError| {
        refused(WorkflowError::Halted {
            reason: e.to_string(),
        })
    };
    let outcome: String = column(&row, "outcome", "writing to a stream").map_err(malformed)?;
    let count = |name: &str| -> Result<u64, StreamInError> {
        let n: Option<i64> = column(&row, name, "writing to a stream").map_err(malformed)?;
        Ok(n.and_then(|n| u64::try_from(n).ok()).unwrap_or(0))
    };
    match outcome.as_str() {
        "appended" => count("stream_offset"),
        "stream_closed" => Err(refused(WorkflowError::StreamClosed {
            key: key.to_owned(),
        })),
        "stream_full" => Err(refused(WorkflowError::StreamFull {
            key: key.to_owned(),
            scope: "stream",
            items: count("stream_items")? + 1,
            bytes: count("stream_bytes")?.saturating_add(u64::try_from(len).unwrap_or(0)),
            budget_items: budget.items,
            budget_bytes: budget.bytes,
        })),
        other => Err(refused(WorkflowError::Halted {
            reason: format!(
                "the run of {} cannot write to its streams: {other}",
                ctx.key()
            ),
        })),
    }
}
