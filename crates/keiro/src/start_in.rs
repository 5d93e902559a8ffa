//! `Keiro::start_in` and its siblings: start, deliver, signal and settle awakeables inside the
//! caller's own Postgres transaction, so a business row and the workflow that follows it
//! commit together, or neither does (the transactional outbox, without an outbox).
//!
//! Each method checks its input exactly as its pooled twin does (ids, step names, tokens,
//! payload encoding and size) before anything reaches the database, and answers with the same
//! outcomes and errors. Wake-ups come with the commit: keiro's functions `NOTIFY` inside the
//! caller's transaction, and PostgreSQL delivers a notification only when it commits.
//!
//! Isolation levels: `start_in`, `deliver_in`, `deliver_to_in`, `complete_awakeable_in` and
//! `cancel_awakeable_in` work at READ COMMITTED, REPEATABLE READ and SERIALIZABLE (a row that
//! changed after the caller's snapshot is a retryable serialization failure; retry the
//! transaction). `signal_in`, `signal_with_in`, `cancel_in` and `cancel_cascade_in` need READ
//! COMMITTED and refuse the other two with `StoreError::IsolationRefused`, naming the level,
//! before anything is written (see `keiro::postgres::InTransaction`).

use keiro_journal::{
    store::cancel_outcome, store::encode_payload, store::DeliveryOutcome, store::StartRequest,
    store::INPUT_STEP, AppendOutcome, AwakeableOutcome, CancelOutcome, Generation, InstanceKey,
    IntoInstanceKey, SignalOptions, SignalSendOutcome, Started, StoreError,
};
use keiro_postgres::tokio_postgres::GenericClient;
use keiro_postgres::{InTransaction, PgStore};
use serde::Serialize;
use uuid::Uuid;

use crate::codec::Sealing;
use crate::{Error, Keiro};

/// The operations of `start_in` and its siblings, as the codec reports them.
const SEAL: &str = "writing in the caller's transaction (payload codec)";

impl Keiro {
    /// The handle's codec on its own, for the writes the store decorator does not see.
    fn sealing(&self) -> Option<Sealing<()>> {
        self.codec.clone().map(Sealing::bare)
    }

    /// `request` with its input sealed by the handle's codec, if it has one.
    fn sealed_start(&self, request: StartRequest) -> Result<StartRequest, Error> {
        Ok(match self.sealing() {
            Some(sealing) => sealing.seal_start(SEAL, &request)?,
            None => request,
        })
    }

    /// `started` with its payloads opened by the handle's codec, if it has one.
    fn opened_started(&self, started: Started) -> Result<Started, Error> {
        Ok(match self.sealing() {
            Some(sealing) => sealing.open_started(SEAL, started)?,
            None => started,
        })
    }

    /// The Postgres store's operations on the caller's `client`.
    fn in_transaction<'c, C>(&self, client: &'c C) -> Result<InTransaction<'c, C>, Error>
    where
        C: GenericClient + Sync + ?Sized,
    {
        self.store()
            .as_any()
            .and_then(|any| any.downcast_ref::<PgStore>())
            .map(|store| store.in_transaction(client))
            .ok_or(Error::Unsupported {
                what: "operations in the caller's transaction (they need the Postgres store)",
            })
    }

    /// [`start`](Self::start) inside the caller's transaction `client` (a
    /// `tokio_postgres::Transaction`, or a `Client` for a statement of its own) on keiro's
    /// database: the instance exists once the caller commits, and a worker then runs it; if the
    /// caller rolls back, nothing of it is left, and the id can be started again. Idempotent by
    /// id, within the transaction too. The caller's `search_path` does not matter.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro, client: &mut keiro::postgres::tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let tx = client.transaction().await?;
    /// tx.execute("INSERT INTO orders (id, sku) VALUES ($1, $2)", &[&"order-42", &7_i32]).await?;
    /// keiro.start_in(&tx, "order", "order-42", &serde_json::json!({ "sku": 7 })).await?;
    /// tx.commit().await?; // the order and its workflow, or neither
    /// # Ok(()) }
    /// ```
    ///
    /// Works at every isolation level. At REPEATABLE READ or SERIALIZABLE, a start of an id
    /// that another transaction started after the caller's snapshot is a serialization failure
    /// (a retryable [`StoreError`]): retry the transaction, as for
    /// any write PostgreSQL cannot order. So are `deliver_in` and the awakeable settlements.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), and [`Error::Unsupported`] when this handle's store is not
    /// the Postgres store. An error from the database (not a refused id or payload, which are
    /// checked first) leaves the caller's transaction aborted, as any failed statement does.
    pub async fn start_in<C, I>(
        &self,
        client: &C,
        name: &str,
        id: &str,
        input: &I,
    ) -> Result<Started, Error>
    where
        C: GenericClient + Sync + ?Sized,
        I: Serialize + ?Sized,
    {
        let key = InstanceKey::parse(name, id)?;
        let input =
            encode_payload(INPUT_STEP, input, self.payload_len_max()).map_err(Error::Payload)?;
        let request = self.sealed_start(StartRequest {
            attributes: Default::default(),
            key,
            input,
            parent: None,
            priority: 0,
            queue: None,
        })?;
        let started = self
            .in_transaction(client)?
            .instance_start(&request)
            .await?;
        self.opened_started(started)
    }

    /// [`start_with`](Self::start_with) inside the caller's transaction `client`: on a queue,
    /// the run waits for admission once the caller commits (the queue's checks and dedup
    /// apply in the transaction, as for [`start_in`](Self::start_in)).
    ///
    /// # Errors
    ///
    /// As [`start_with`](Self::start_with) and [`start_in`](Self::start_in).
    pub async fn start_in_with<C, I>(
        &self,
        client: &C,
        name: &str,
        id: &str,
        input: &I,
        options: &crate::queue::StartOptions,
    ) -> Result<Started, Error>
    where
        C: GenericClient + Sync + ?Sized,
        I: Serialize + ?Sized,
    {
        let request = self.sealed_start(self.start_request(name, id, input, options)?)?;
        let started = self
            .in_transaction(client)?
            .instance_start(&request)
            .await?;
        self.opened_started(started)
    }

    /// [`deliver`](Self::deliver) inside the caller's transaction `client`: the value is
    /// journaled, and the waiting run woken, when the caller commits.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro, tx: keiro::postgres::tokio_postgres::Transaction<'_>) -> Result<(), Box<dyn std::error::Error>> {
    /// tx.execute("UPDATE payments SET state = 'paid' WHERE id = $1", &[&"pay-7"]).await?;
    /// keiro.deliver_in(&tx, ("order", "order-42"), "payment", &"paid").await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`deliver`](Self::deliver) and [`start_in`](Self::start_in).
    pub async fn deliver_in<C, T>(
        &self,
        client: &C,
        key: impl IntoInstanceKey,
        step: &str,
        value: &T,
    ) -> Result<AppendOutcome, Error>
    where
        C: GenericClient + Sync + ?Sized,
        T: Serialize + ?Sized,
    {
        self.deliver_at_in(client, key, None, step, value).await
    }

    /// [`deliver_to`](Self::deliver_to) inside the caller's transaction `client`.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro, tx: keiro::postgres::tokio_postgres::Transaction<'_>) -> Result<(), Box<dyn std::error::Error>> {
    /// keiro.deliver_to_in(&tx, ("order", "order-42"), 0, "payment", &"paid").await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`deliver_to`](Self::deliver_to) and [`start_in`](Self::start_in).
    pub async fn deliver_to_in<C, T>(
        &self,
        client: &C,
        key: impl IntoInstanceKey,
        generation: Generation,
        step: &str,
        value: &T,
    ) -> Result<AppendOutcome, Error>
    where
        C: GenericClient + Sync + ?Sized,
        T: Serialize + ?Sized,
    {
        self.deliver_at_in(client, key, Some(generation), step, value)
            .await
    }

    /// `keiro_journal::deliver`'s steps, on the caller's client.
    async fn deliver_at_in<C, T>(
        &self,
        client: &C,
        key: impl IntoInstanceKey,
        generation: Option<Generation>,
        step: &str,
        value: &T,
    ) -> Result<AppendOutcome, Error>
    where
        C: GenericClient + Sync + ?Sized,
        T: Serialize + ?Sized,
    {
        let key = key.into_instance_key()?;
        let append = keiro_journal::store::delivery_append(
            &key,
            generation,
            step,
            value,
            self.payload_len_max(),
        )?;
        let append = match self.sealing() {
            Some(sealing) => sealing.seal_append(SEAL, &append)?,
            None => append,
        };
        let tx = self.in_transaction(client)?;
        let backlog = self.delivery_backlog();
        match tx.delivery_append(&append, backlog).await? {
            // Nothing was written: read the generation, in the same transaction, to say why.
            DeliveryOutcome::Append(AppendOutcome::Conflict) => {
                let current = tx
                    .instance_get(&key)
                    .await?
                    .ok_or(StoreError::NotFound { key })?
                    .generation;
                Err(keiro_journal::store::delivery_refused(step, generation, current).into())
            }
            DeliveryOutcome::Append(outcome) => Ok(match self.sealing() {
                Some(sealing) => sealing.open_outcome(SEAL, outcome)?,
                None => outcome,
            }),
            DeliveryOutcome::Backlog(unread) => {
                Err(keiro_journal::store::delivery_backlogged(step, unread, *backlog).into())
            }
        }
    }

    /// [`signal`](Self::signal) inside the caller's transaction `client`: delivered or
    /// buffered when the caller commits. The token's lock is held until then. The transaction
    /// must be READ COMMITTED: from an older snapshot the send could not see a waiter that
    /// registered meanwhile, and would buffer the signal past it.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro, tx: keiro::postgres::tokio_postgres::Transaction<'_>) -> Result<(), Box<dyn std::error::Error>> {
    /// keiro.signal_in(&tx, "order-42/nudge", &"ping").await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`signal`](Self::signal) and [`start_in`](Self::start_in), and
    /// [`StoreError::IsolationRefused`] (in [`Error::Store`]) inside a REPEATABLE READ or
    /// SERIALIZABLE transaction, which is left as it was.
    pub async fn signal_in<C, T>(
        &self,
        client: &C,
        token: &str,
        payload: &T,
    ) -> Result<SignalSendOutcome, Error>
    where
        C: GenericClient + Sync + ?Sized,
        T: Serialize + ?Sized,
    {
        self.signal_with_in(client, token, payload, SignalOptions::default())
            .await
    }

    /// [`signal_with`](Self::signal_with) inside the caller's transaction `client`.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro, tx: keiro::postgres::tokio_postgres::Transaction<'_>) -> Result<(), Box<dyn std::error::Error>> {
    /// let options = keiro::SignalOptions::default().ttl(std::time::Duration::from_secs(3600));
    /// keiro.signal_with_in(&tx, "order-42/nudge", &"ping", options).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`signal_in`](Self::signal_in).
    pub async fn signal_with_in<C, T>(
        &self,
        client: &C,
        token: &str,
        payload: &T,
        options: SignalOptions,
    ) -> Result<SignalSendOutcome, Error>
    where
        C: GenericClient + Sync + ?Sized,
        T: Serialize + ?Sized,
    {
        keiro_journal::store::validate_signal_token(token)?;
        let payload =
            encode_payload(token, payload, self.payload_len_max()).map_err(Error::Payload)?;
        let payload = match self.sealing() {
            Some(sealing) => sealing.seal_signal(SEAL, token, &payload)?,
            None => payload,
        };
        Ok(self
            .in_transaction(client)?
            .signal_send_with(token, &payload, &options)
            .await?)
    }

    /// [`cancel`](Self::cancel) inside the caller's transaction `client`: the cancel marker is
    /// written when the caller commits (the run then stops at its next boundary); if the caller
    /// rolls back, the instance runs on as if nothing happened. The transaction must be READ
    /// COMMITTED: a cancel closes the remote tasks and awakeables of the run (and cascades to
    /// its children), which an older snapshot may not see yet.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro, tx: keiro::postgres::tokio_postgres::Transaction<'_>) -> Result<(), Box<dyn std::error::Error>> {
    /// tx.execute("UPDATE orders SET state = 'withdrawn' WHERE id = $1", &[&"order-42"]).await?;
    /// keiro.cancel_in(&tx, ("order", "order-42")).await?;
    /// tx.commit().await?; // the order is withdrawn and its workflow cancelled, or neither
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`cancel`](Self::cancel) and [`start_in`](Self::start_in), and
    /// [`StoreError::IsolationRefused`] (in [`Error::Store`]) inside a REPEATABLE READ or
    /// SERIALIZABLE transaction, which is left as it was.
    pub async fn cancel_in<C>(
        &self,
        client: &C,
        key: impl IntoInstanceKey,
    ) -> Result<CancelOutcome, Error>
    where
        C: GenericClient + Sync + ?Sized,
    {
        self.cancel_at_in(client, key, false).await
    }

    /// [`cancel_cascade`](Self::cancel_cascade) inside the caller's transaction `client`.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro, tx: keiro::postgres::tokio_postgres::Transaction<'_>) -> Result<(), Box<dyn std::error::Error>> {
    /// keiro.cancel_cascade_in(&tx, ("order", "order-42")).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`cancel_cascade`](Self::cancel_cascade) and [`cancel_in`](Self::cancel_in).
    pub async fn cancel_cascade_in<C>(
        &self,
        client: &C,
        key: impl IntoInstanceKey,
    ) -> Result<CancelOutcome, Error>
    where
        C: GenericClient + Sync + ?Sized,
    {
        self.cancel_at_in(client, key, true).await
    }

    /// `keiro_journal::cancel`'s steps, on the caller's client.
    async fn cancel_at_in<C>(
        &self,
        client: &C,
        key: impl IntoInstanceKey,
        cascade: bool,
    ) -> Result<CancelOutcome, Error>
    where
        C: GenericClient + Sync + ?Sized,
    {
        let key = key.into_instance_key()?;
        let tx = self.in_transaction(client)?;
        loop {
            // A conflict means a rotation committed between the function's read and its
            // append; the next statement sees the new generation, so cancelling again there
            // is what the pooled path does too.
            if let Some(outcome) = cancel_outcome(tx.instance_cancel(&key, cascade).await?) {
                return Ok(outcome);
            }
        }
    }

    /// [`complete_awakeable`](Self::complete_awakeable) inside the caller's transaction
    /// `client`: the owner is woken when the caller commits.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro, tx: keiro::postgres::tokio_postgres::Transaction<'_>, id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
    /// keiro.complete_awakeable_in(&tx, id, &"approved").await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`complete_awakeable`](Self::complete_awakeable) and [`start_in`](Self::start_in).
    pub async fn complete_awakeable_in<C, T>(
        &self,
        client: &C,
        id: Uuid,
        payload: &T,
    ) -> Result<AwakeableOutcome, Error>
    where
        C: GenericClient + Sync + ?Sized,
        T: Serialize + ?Sized,
    {
        let payload =
            encode_payload("awakeable", payload, self.payload_len_max()).map_err(Error::Payload)?;
        let payload = match self.sealing() {
            Some(sealing) => sealing.seal(SEAL, &payload)?,
            None => payload,
        };
        Ok(self
            .in_transaction(client)?
            .awakeable_complete(id, &payload)
            .await?)
    }

    /// [`cancel_awakeable`](Self::cancel_awakeable) inside the caller's transaction `client`.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro, tx: keiro::postgres::tokio_postgres::Transaction<'_>, id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
    /// keiro.cancel_awakeable_in(&tx, id).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`cancel_awakeable`](Self::cancel_awakeable) and [`start_in`](Self::start_in).
    pub async fn cancel_awakeable_in<C>(
        &self,
        client: &C,
        id: Uuid,
    ) -> Result<AwakeableOutcome, Error>
    where
        C: GenericClient + Sync + ?Sized,
    {
        Ok(self.in_transaction(client)?.awakeable_cancel(id).await?)
    }
}
