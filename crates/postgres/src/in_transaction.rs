//! Store operations inside the caller's own transaction: the transactional outbox without an
//! outbox.
//!
//! A service writes its business row and starts the workflow that follows it in one
//! transaction of its own: if it commits, the instance exists and a worker runs it; if it rolls
//! back, nothing of keiro's is left, not even a wake-up, because keiro's functions `NOTIFY` in
//! the transaction that calls them, and PostgreSQL delivers a notification only on commit.
//!
//! The caller's session is the caller's: its `search_path` need not name keiro's schema, so
//! every statement here names the schema itself. Each operation is one call of the same
//! `keiro_*` function as the pooled path, read back by the same row readers, so outcomes and
//! errors are the same; they just commit (or not) with the caller.
//!
//! So is its isolation level, which keiro's own connections pin to READ COMMITTED
//! ([`TRANSACTION_ISOLATION`](crate::TRANSACTION_ISOLATION)). At REPEATABLE READ or
//! SERIALIZABLE every statement reads the transaction's snapshot, taken at its first statement,
//! so what an operation reads after taking a lock may predate the lock. Each operation here is
//! decided for that case:
//!
//! - a start, a delivery (a journal append) and an awakeable's completion or cancellation work
//!   at every level: each locks the row it changes (the instance's, the awakeable's) before it
//!   reads it, and PostgreSQL answers a row changed after the snapshot with a serialization
//!   failure (SQLSTATE 40001, a retryable [`StoreError::Database`]), never with the stale row,
//!   as it answers an insert of a key that a transaction it cannot see committed. What the
//!   snapshot never saw is not there for them, as for any statement of the caller's: an
//!   instance or an awakeable created after it is not found.
//! - a signal send and a cancel refuse both levels with [`StoreError::IsolationRefused`],
//!   before anything is sent: a send reads the token's waiters after taking the token's lock,
//!   and from an older snapshot it would buffer the signal past a waiter that registered
//!   meanwhile (the waiter's row is new, so no lock conflict tells); a cancel reads the live
//!   children it cascades to, and the remote tasks and awakeables of the generation it closes,
//!   which can be just as new. The check costs these two one more round trip.

use keiro_journal::store::{Append, AppendOutcome, DeliveryOutcome, Result};
use keiro_journal::{
    store::awakeable_step, store::StartRequest, AwakeableOutcome, AwakeableStatus, DeliveryBacklog,
    Envelope, Instance, InstanceKey, SignalOptions, SignalSendOutcome, Started, StoreError,
};
use serde_json::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row};
use uuid::Uuid;

use crate::error::Failure;
use crate::ops::awakeable::{self, settle_outcome, status_text};
use crate::ops::instance::{self, GET, START};
use crate::ops::journal::{
    append_outcome, appendable, delivery_outcome, AppendArgs, DeliveryArgs, APPEND, DELIVER,
};
use crate::ops::signal::{self, send_outcome, signal_token, ttl_ms};
use crate::row::{self, column, instance_columns};
use crate::PgStore;

/// keiro's store operations on a client or transaction the caller owns, for one schema: get
/// one with [`PgStore::in_transaction`].
///
/// Nothing here commits, rolls back or opens a transaction: on a `Transaction` the operations
/// take effect when the caller commits, on a plain `Client` each is its own transaction.
/// Values are taken as the store traits take them (a parsed [`InstanceKey`], an encoded
/// payload); the facade's `Keiro::start_in` and its siblings check payload sizes first, as
/// `Keiro::start` does.
///
/// ```no_run
/// use keiro_journal::{InstanceKey, store::StartRequest};
/// use keiro_postgres::PgStore;
///
/// # async fn demo(store: PgStore, client: &mut keiro_postgres::tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let tx = client.transaction().await?;
/// tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&"order-42"]).await?;
/// let key = InstanceKey::parse("order", "order-42")?;
/// let request = StartRequest { key, input: serde_json::json!({ "sku": 7 }), parent: None, priority: 0, queue: None, attributes: Default::default() };
/// store.in_transaction(&tx).instance_start(&request).await?;
/// tx.commit().await?; // the order row and the instance, or neither
/// # Ok(()) }
/// ```
pub struct InTransaction<'c, C: ?Sized> {
    client: &'c C,
    /// keiro's schema, quoted, for qualifying every function and table.
    schema: String,
}

impl<C: ?Sized> std::fmt::Debug for InTransaction<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InTransaction")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// keiro's operations on `client`, a transaction (or connection) of the caller's, on the
    /// same database as this store: see [`InTransaction`].
    pub fn in_transaction<'c, C>(&self, client: &'c C) -> InTransaction<'c, C>
    where
        C: GenericClient + Sync + ?Sized,
    {
        InTransaction {
            client,
            // `Config` refuses a schema name that is not a plain identifier, so quoting it
            // needs no escaping.
            schema: format!("\"{}\"", self.schema()),
        }
    }
}

impl<C> InTransaction<'_, C>
where
    C: GenericClient + Sync + ?Sized,
{
    /// Runs `sql` (already qualified) on the caller's client and returns its one row.
    async fn query_one(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row> {
        let mut rows = self.query(operation, sql, params).await?;
        if rows.len() != 1 {
            return Err(StoreError::Malformed {
                operation,
                detail: format!("expected exactly one row, got {}", rows.len()),
            });
        }
        Ok(rows.swap_remove(0))
    }

    /// Refuses to go on inside a transaction whose snapshot may predate the locks the
    /// operation takes (see the module docs): anything but READ COMMITTED.
    async fn read_committed_only(&self, operation: &'static str) -> Result<()> {
        const TRANSACTION_ISOLATION_GET: &str = "SELECT current_setting('transaction_isolation')";
        let row = self
            .query_one(operation, TRANSACTION_ISOLATION_GET, &[])
            .await?;
        let level: String = column(&row, "current_setting", operation)?;
        // READ UNCOMMITTED is READ COMMITTED in PostgreSQL: a snapshot per statement.
        if level == crate::TRANSACTION_ISOLATION || level == "read uncommitted" {
            return Ok(());
        }
        Err(StoreError::IsolationRefused { operation, level })
    }

    async fn query(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        // Classified as the pooled path classifies, so a refused value or a lost connection is
        // the same `StoreError` here.
        self.client
            .query(sql, params)
            .await
            .map_err(|e| Failure::from(e).into_store_in(operation, self.schema.trim_matches('"')))
    }

    /// [`JournalStore::instance_start`](keiro_journal::JournalStore::instance_start) in the
    /// caller's transaction: idempotent by key within it too, and a key a rolled-back
    /// transaction started is free again.
    ///
    /// # Errors
    ///
    /// As the pooled operation.
    pub async fn instance_start(&self, request: &StartRequest) -> Result<Started> {
        if !request.attributes.is_empty() {
            return self.start_attributed(request).await;
        }
        if let Some(queue) = &request.queue {
            return self.queue_start(request, queue).await;
        }
        let sql = format!(
            "SELECT s.created, {} FROM {}.keiro_instance_start($1, $2, $3, $4, $5, $6) s",
            instance_columns!("(s.instance)."),
            self.schema
        );
        let parent_name = request.parent.as_ref().map(|p| p.name.as_str());
        let parent_id = request.parent.as_ref().map(|p| p.id.as_str());
        let row = self
            .query_one(
                START,
                &sql,
                &[
                    &request.key.name.as_str(),
                    &request.key.id.as_str(),
                    &request.input,
                    &parent_name,
                    &parent_id,
                    &request.priority,
                ],
            )
            .await?;
        Ok(Started {
            created: column(&row, "created", START)?,
            instance: row::instance(&row, START)?,
        })
    }

    /// A start with search attributes in the caller's transaction
    /// (`keiro_instance_start_attributed`, on its queue if it has one).
    async fn start_attributed(&self, request: &StartRequest) -> Result<Started> {
        let sql = format!(
            "SELECT s.outcome, s.created, {} FROM {}.keiro_instance_start_attributed($1, $2, $3, \
             $4, $5, $6, $7, $8, $9, $10, $11) s",
            instance_columns!("(s.instance)."),
            self.schema
        );
        let parent_name = request.parent.as_ref().map(|p| p.name.as_str());
        let parent_id = request.parent.as_ref().map(|p| p.id.as_str());
        let queue = request.queue.as_ref();
        let queue_name = queue.map(|q| q.queue.as_str());
        let key = queue.and_then(|q| q.key.as_deref());
        let dedup_id = queue.and_then(|q| q.dedup_id.as_deref());
        let not_before = queue.and_then(|q| q.not_before);
        let attrs = serde_json::to_value(&request.attributes)
            .map_err(|e| crate::row::malformed(START, format_args!("attributes: {e}")))?;
        let row = self
            .query_one(
                START,
                &sql,
                &[
                    &request.key.name.as_str(),
                    &request.key.id.as_str(),
                    &request.input,
                    &parent_name,
                    &parent_id,
                    &request.priority,
                    &queue_name,
                    &key,
                    &dedup_id,
                    &not_before,
                    &attrs,
                ],
            )
            .await?;
        crate::ops::queue::queue_started(&row, queue_name.unwrap_or(""))
    }

    /// A start on a queue in the caller's transaction (`keiro_queue_start`): the queue's checks
    /// and dedup, as the pooled start does; the run waits for admission once the caller
    /// commits.
    async fn queue_start(
        &self,
        request: &StartRequest,
        queue: &keiro_journal::queue::QueueStart,
    ) -> Result<Started> {
        let sql = format!(
            "SELECT s.outcome, s.created, {} FROM {}.keiro_queue_start($1, $2, $3, $4, $5, $6, \
             $7, $8, $9, $10, true) s",
            instance_columns!("(s.instance)."),
            self.schema
        );
        let parent_name = request.parent.as_ref().map(|p| p.name.as_str());
        let parent_id = request.parent.as_ref().map(|p| p.id.as_str());
        let row = self
            .query_one(
                crate::ops::queue::START,
                &sql,
                &[
                    &request.key.name.as_str(),
                    &request.key.id.as_str(),
                    &request.input,
                    &parent_name,
                    &parent_id,
                    &request.priority,
                    &queue.queue,
                    &queue.key,
                    &queue.dedup_id,
                    &queue.not_before,
                ],
            )
            .await?;
        crate::ops::queue::queue_started(&row, &queue.queue)
    }

    /// [`JournalStore::instance_get`](keiro_journal::JournalStore::instance_get) as the
    /// caller's transaction sees it (its own uncommitted starts included).
    ///
    /// # Errors
    ///
    /// As the pooled operation.
    pub async fn instance_get(&self, key: &InstanceKey) -> Result<Option<Instance>> {
        let sql = format!(
            "SELECT {} FROM {}.workflows WHERE workflow_name = $1 AND workflow_id = $2",
            instance_columns!(""),
            self.schema
        );
        let rows = self
            .query(GET, &sql, &[&key.name.as_str(), &key.id.as_str()])
            .await?;
        rows.first().map(|row| row::instance(row, GET)).transpose()
    }

    /// [`JournalStore::journal_append`](keiro_journal::JournalStore::journal_append) in the
    /// caller's transaction, as a delivery (`keiro_journal::store::delivery_append`) makes.
    ///
    /// # Errors
    ///
    /// As the pooled operation.
    pub async fn journal_append(&self, append: &Append) -> Result<AppendOutcome> {
        appendable(append)?;
        let sql = format!(
            "SELECT outcome, recorded, marker \
             FROM {}.keiro_journal_append_to($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            self.schema
        );
        let args = AppendArgs::new(append, append.event.encode());
        let row = self.query_one(APPEND, &sql, &args.params()).await?;
        append_outcome(&row, APPEND, &append.key, append.fence.as_ref())
    }

    /// [`JournalStore::delivery_append`](keiro_journal::JournalStore::delivery_append) in the
    /// caller's transaction: the delivery `keiro_journal::store::delivery_append` makes, bounded by
    /// `backlog` as the pooled operation is.
    ///
    /// # Errors
    ///
    /// As the pooled operation.
    pub async fn delivery_append(
        &self,
        append: &Append,
        backlog: &DeliveryBacklog,
    ) -> Result<DeliveryOutcome> {
        let args = DeliveryArgs::new(append, backlog)?;
        let sql = format!(
            "SELECT outcome, recorded, marker, unread, unread_bytes \
             FROM {}.keiro_delivery_append($1, $2, $3, $4, $5, $6, $7, $8)",
            self.schema
        );
        let row = self.query_one(DELIVER, &sql, &args.params()).await?;
        delivery_outcome(&row, &append.key)
    }

    /// [`JournalStore::instance_cancel`](keiro_journal::JournalStore::instance_cancel) in the
    /// caller's transaction: the cancel marker (and with `cascade`, every live descendant's)
    /// is written, and the run woken to stop, when the caller commits. READ COMMITTED only.
    ///
    /// # Errors
    ///
    /// As the pooled operation: [`StoreError::NotFound`] for an unknown instance; and
    /// [`StoreError::IsolationRefused`] inside a REPEATABLE READ or SERIALIZABLE transaction,
    /// which could not see a child, a task or an awakeable that came after its snapshot.
    pub async fn instance_cancel(&self, key: &InstanceKey, cascade: bool) -> Result<AppendOutcome> {
        self.read_committed_only(instance::CANCEL).await?;
        let sql = format!(
            "SELECT outcome, recorded, marker FROM {}.keiro_instance_cancel($1, $2, $3)",
            self.schema
        );
        let row = self
            .query_one(
                instance::CANCEL,
                &sql,
                &[&key.name.as_str(), &key.id.as_str(), &cascade],
            )
            .await?;
        append_outcome(&row, instance::CANCEL, key, None)
    }

    /// Settles awakeable `id` as `status`, journaling `envelope` into its owner.
    async fn awakeable_settle(
        &self,
        operation: &'static str,
        id: Uuid,
        status: AwakeableStatus,
        payload: Option<&Value>,
        envelope: Value,
    ) -> Result<AwakeableOutcome> {
        let sql = format!(
            "SELECT outcome, settled_status FROM {}.keiro_awakeable_settle($1, $2, $3, $4, $5)",
            self.schema
        );
        let row = self
            .query_one(
                operation,
                &sql,
                &[
                    &id,
                    &status_text(status),
                    &payload,
                    &awakeable_step(id),
                    &envelope,
                ],
            )
            .await?;
        settle_outcome(&row, operation)
    }

    /// [`JournalStore::awakeable_complete`](keiro_journal::JournalStore::awakeable_complete)
    /// in the caller's transaction.
    ///
    /// # Errors
    ///
    /// As the pooled operation.
    pub async fn awakeable_complete(&self, id: Uuid, payload: &Value) -> Result<AwakeableOutcome> {
        let envelope = Envelope::ok(payload.clone());
        self.awakeable_settle(
            awakeable::COMPLETE,
            id,
            AwakeableStatus::Completed,
            Some(payload),
            envelope,
        )
        .await
    }

    /// [`JournalStore::awakeable_cancel`](keiro_journal::JournalStore::awakeable_cancel) in
    /// the caller's transaction.
    ///
    /// # Errors
    ///
    /// As the pooled operation.
    pub async fn awakeable_cancel(&self, id: Uuid) -> Result<AwakeableOutcome> {
        self.awakeable_settle(
            awakeable::CANCEL,
            id,
            AwakeableStatus::Cancelled,
            None,
            Envelope::cancelled(),
        )
        .await
    }

    /// [`JournalStore::signal_send_with`](keiro_journal::JournalStore::signal_send_with) in
    /// the caller's transaction. The token's advisory lock is a transaction lock, so it is
    /// held until the caller commits or rolls back. READ COMMITTED only.
    ///
    /// # Errors
    ///
    /// As the pooled operation: [`StoreError::ValueRefused`] for a token no wait could take;
    /// and [`StoreError::IsolationRefused`] inside a REPEATABLE READ or SERIALIZABLE
    /// transaction, which could not see a waiter that registered after its snapshot.
    pub async fn signal_send_with(
        &self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome> {
        signal_token(signal::SEND, token)?;
        self.read_committed_only(signal::SEND).await?;
        let sql = format!(
            "SELECT outcome, to_name, to_id FROM {}.keiro_signal_send($1, $2, $3)",
            self.schema
        );
        let row = self
            .query_one(signal::SEND, &sql, &[&token, payload, &ttl_ms(options)])
            .await?;
        send_outcome(&row)
    }
}
