//! `Keiro`'s client calls (start, cancel, deliver, inspect), the ways to get a handle, and
//! the builders of the workers on its store. The handle itself is in `handle`.

use std::sync::Arc;

use keiro_journal::{
    store::validate_signal_token, AppendOutcome, AwakeableOutcome, CancelOutcome, DeliveryBacklog,
    Instance, InstanceKey, IntoInstanceKey, JournalEntry, SignalOptions, SignalSendOutcome,
    Started,
};
use keiro_lease::LeaseStore;
use keiro_remote::{RemoteWorker, RemoteWorkerBuilder};
use keiro_resume::Notifier;
use serde::Serialize;
use uuid::Uuid;

use crate::handle::{Operate, Remote};
use crate::store::Store;
use crate::{Error, Keiro, KeiroBuilder, WorkerBuilder};

impl Keiro {
    /// A builder over `store`: the one way to wrap a store you built yourself. Push wake-ups
    /// come with a store that has them (`PgStore`'s LISTEN, `SqliteStore`'s notification table), so
    /// workers and result waiters built from the handle wake within milliseconds.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// let keiro = keiro::Keiro::builder(keiro::store::sqlite::SqliteStore::temporary()?)
    ///     .payload_len_max(64 * 1024)
    ///     .build();
    /// assert!(keiro.notifier().is_some());
    /// # }
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder<S: Store>(store: S) -> KeiroBuilder {
        KeiroBuilder::new(Arc::new(store))
    }

    /// A handle, with push, on a fresh SQLite file in a new temporary directory, removed when
    /// the last handle on it is dropped ([`SqliteStore::temporary`](crate::store::sqlite::SqliteStore::temporary)):
    /// for tests, examples and scratch runs. Nothing outlives the process; for a file that
    /// does, [`connect`](Self::connect) a `sqlite:PATH` URL.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # let _ = keiro; }
    /// # Ok::<_, keiro::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the directory or the file cannot be made.
    #[cfg(feature = "sqlite")]
    pub fn temporary() -> Result<Self, Error> {
        Ok(Self::builder(keiro_sqlite::SqliteStore::temporary()?).build())
    }

    /// The largest payload accepted by [`start`](Self::start), [`deliver`](Self::deliver),
    /// signals and awakeable completions, and the default limit of the step results and outputs
    /// of the workers built by [`worker`](Self::worker) and of the handler outputs of those built
    /// by [`remote_worker`](Self::remote_worker) (each can still set its own).
    /// Defaults to [`PAYLOAD_LEN_MAX_DEFAULT`](keiro_journal::PAYLOAD_LEN_MAX_DEFAULT).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let keiro = keiro.with_payload_len_max(8);
    /// let refused = keiro.start("order", "order-1", &"longer than eight bytes").await;
    /// assert!(matches!(refused, Err(keiro::Error::Payload(_))));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    #[must_use]
    pub fn with_payload_len_max(mut self, payload_len_max: usize) -> Self {
        self.payload_len_max = payload_len_max;
        self
    }

    /// How many deliveries that no await has read [`deliver`](Self::deliver) lets a
    /// generation hold (and their bytes): past it a delivery is refused with
    /// [`DeliveryRefusal::Backlog`](crate::workflow::DeliveryRefusal::Backlog), unless it answers a wait
    /// the parked run waits on. Defaults to [`DeliveryBacklog::default`] (1,000 deliveries,
    /// 16 MiB).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?.with_delivery_backlog(keiro::workflow::DeliveryBacklog {
    ///     deliveries: 1,
    ///     ..keiro::workflow::DeliveryBacklog::default()
    /// });
    /// keiro.start("order", "order-1", &7).await?;
    /// keiro.deliver(("order", "order-1"), "approval", &true).await?;
    /// let refused = keiro.deliver(("order", "order-1"), "coupon", &"X").await;
    /// assert!(matches!(refused, Err(keiro::Error::DeliveryRefused { .. })));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    #[must_use]
    pub fn with_delivery_backlog(mut self, backlog: DeliveryBacklog) -> Self {
        self.delivery_backlog = backlog;
        self
    }

    /// The store.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// use keiro::store::JournalStore;
    /// let key = keiro::InstanceKey::parse("order", "order-1")?;
    /// assert!(keiro.store().instance_get(&key).await?.is_none());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn store(&self) -> &Arc<dyn LeaseStore> {
        &self.store
    }

    /// The payload limit of [`with_payload_len_max`](Self::with_payload_len_max).
    pub(crate) fn payload_len_max(&self) -> usize {
        self.payload_len_max
    }

    /// The bound of [`with_delivery_backlog`](Self::with_delivery_backlog).
    pub(crate) fn delivery_backlog(&self) -> &DeliveryBacklog {
        &self.delivery_backlog
    }

    /// Starts instance `id` of workflow `name` with `input`, durably: the instance row exists
    /// (status `running`) when this returns, and a worker will drive it. Idempotent by id: a
    /// second start returns the existing instance (`created == false`).
    ///
    /// When a worker built from this handle ([`worker`](Self::worker)) is running in this
    /// process, serves `name` and this handle's application version, has a free slot and
    /// found nothing else to claim, the run is started leased to it and handed over in memory
    /// (no notification, no claim: [`WorkerBuilder::hand_offs`](crate::WorkerBuilder::hand_offs));
    /// the returned row then shows that lease.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let started = keiro.start("order", "order-1", &7).await?;
    /// assert!(started.created);
    /// // Idempotent by id: the first input stands.
    /// assert!(!keiro.start("order", "order-1", &8).await?.created);
    /// // The returned key names the instance in every other call.
    /// keiro.cancel(&started.instance.key).await?;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`], [`Error::Payload`] (does not encode, or too large),
    /// [`Error::Store`].
    pub async fn start<I: Serialize + ?Sized>(
        &self,
        name: &str,
        id: &str,
        input: &I,
    ) -> Result<Started, Error> {
        let key = InstanceKey::parse(name, id)?;
        if let Some(started) = self.start_handed_off(&key, input).await {
            return started;
        }
        Ok(keiro_journal::start(self.store.as_ref(), &key, input, self.payload_len_max).await?)
    }

    /// Starts several instances of workflow `name` at once, each with its own input: what
    /// [`start`](Self::start) does for each, in one transaction on the Postgres store (one
    /// statement and one commit for the lot; the SQLite store shares one commit between them too). The
    /// answer has one outcome per item, in order: `created == false` for an id that was
    /// already started (or that appears earlier in the same call), an error for an invalid id
    /// or input (nothing of that item reaches the store) or a store error. One item's failure
    /// never fails the others.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), keiro::Error> {
    /// let orders = [("order-1", 10_u32), ("order-2", 20), ("order-1", 30)];
    /// let started = keiro.start_many("order", orders.iter().map(|(id, qty)| (*id, qty))).await?;
    /// assert!(started[0].as_ref().is_ok_and(|s| s.created));
    /// assert!(started[2].as_ref().is_ok_and(|s| !s.created)); // order-1 again: the first input stays
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`] when `name` is invalid (then nothing is started). Per item:
    /// [`Error::InvalidId`], [`Error::Payload`], [`Error::Store`].
    pub async fn start_many<'a, I: Serialize + ?Sized + 'a>(
        &self,
        name: &str,
        starts: impl IntoIterator<Item = (&'a str, &'a I)>,
    ) -> Result<Vec<Result<Started, Error>>, Error> {
        let name = keiro_journal::WorkflowName::new(name)?;
        let mut outcomes: Vec<Option<Result<Started, Error>>> = Vec::new();
        let mut requests = Vec::new();
        let mut sent = Vec::new();
        for (id, input) in starts {
            let request = keiro_journal::WorkflowId::new(id)
                .map_err(Error::from)
                .and_then(|id| {
                    let input = keiro_journal::store::encode_payload(
                        keiro_journal::store::INPUT_STEP,
                        input,
                        self.payload_len_max,
                    )
                    .map_err(Error::Payload)?;
                    Ok(keiro_journal::store::StartRequest::new(
                        InstanceKey::new(name.clone(), id),
                        input,
                    ))
                });
            match request {
                Ok(request) => {
                    sent.push(outcomes.len());
                    outcomes.push(None);
                    requests.push(request);
                }
                Err(error) => outcomes.push(Some(Err(error))),
            }
        }
        if !requests.is_empty() {
            let answers = self.store.instances_start(&requests).await;
            for (at, answer) in sent.into_iter().zip(answers) {
                outcomes[at] = Some(answer.map_err(Error::from));
            }
        }
        Ok(outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(Error::Store(keiro_journal::StoreError::Malformed {
                        operation: "starting instances",
                        detail: "the store answered fewer starts than it was asked".into(),
                    }))
                })
            })
            .collect())
    }

    /// Cancels an instance: appends the cancel marker (first writer wins against completion);
    /// the run stops at its next boundary.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// keiro.start("order", "order-1", &7).await?;
    /// assert_eq!(keiro.cancel(("order", "order-1")).await?, keiro::operate::CancelOutcome::Recorded);
    /// let row = keiro.instance(("order", "order-1")).await?.expect("started");
    /// assert_eq!(row.status, keiro::Status::Cancelled);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Store`] with a not-found error for an unknown instance.
    pub async fn cancel(&self, key: impl IntoInstanceKey) -> Result<CancelOutcome, Error> {
        let key = key.into_instance_key()?;
        Ok(keiro_journal::cancel(self.store.as_ref(), &key, false).await?)
    }

    /// Cancels an instance and every live descendant (children, their children, ...), in one
    /// transaction.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// keiro.start("order", "order-1", &7).await?;
    /// let outcome = keiro.cancel_cascade(("order", "order-1")).await?;
    /// assert_eq!(outcome, keiro::operate::CancelOutcome::Recorded);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Store`] with a not-found error for an unknown instance.
    pub async fn cancel_cascade(&self, key: impl IntoInstanceKey) -> Result<CancelOutcome, Error> {
        let key = key.into_instance_key()?;
        Ok(keiro_journal::cancel(self.store.as_ref(), &key, true).await?)
    }

    /// Completes awakeable `id` with `payload` from any process: journals it into the owner and
    /// wakes it, in one transaction. Idempotent: a second completion changes nothing.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// // The id a run got from `ctx.awakeable()` and handed out (in an approval link, say).
    /// let id = uuid::Uuid::new_v4();
    /// match keiro.complete_awakeable(id, &"approved").await? {
    ///     keiro::workflow::AwakeableOutcome::NotFound => println!("no such awakeable"),
    ///     outcome => println!("{outcome:?}"),
    /// }
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Payload`] for a payload that does not encode or is too large, [`Error::Store`].
    pub async fn complete_awakeable<T: Serialize + ?Sized>(
        &self,
        id: Uuid,
        payload: &T,
    ) -> Result<AwakeableOutcome, Error> {
        let payload = self.payload("awakeable", payload)?;
        Ok(self.store.awakeable_complete(id, &payload).await?)
    }

    /// Cancels awakeable `id`; the run awaiting it sees `WorkflowError::AwakeableCancelled`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let id = uuid::Uuid::new_v4();
    /// let outcome = keiro.cancel_awakeable(id).await?;
    /// assert_eq!(outcome, keiro::workflow::AwakeableOutcome::NotFound);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn cancel_awakeable(&self, id: Uuid) -> Result<AwakeableOutcome, Error> {
        Ok(self.store.awakeable_cancel(id).await?)
    }

    /// Sends a signal on `token`: delivered to the oldest run waiting on it, or buffered (first
    /// in, first out) for the next wait, for at most
    /// [`SIGNAL_TTL_DEFAULT`](keiro_journal::SIGNAL_TTL_DEFAULT) (7 days; see
    /// [`signal_with`](Self::signal_with)). Never delivered twice, and never lost while it is
    /// buffered.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// // No run waits on the token yet: the signal is buffered for the first that will.
    /// let outcome = keiro.signal("order-42/paid", &7).await?;
    /// assert_eq!(outcome, keiro::workflow::SignalSendOutcome::Buffered);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`] for a token no wait could take (empty, over 200 bytes, or with a
    /// control character: see [`validate_signal_token`]), [`Error::Payload`] for a payload
    /// that does not encode or is too large, [`Error::Store`]. Nothing is sent then.
    pub async fn signal<T: Serialize + ?Sized>(
        &self,
        token: &str,
        payload: &T,
    ) -> Result<SignalSendOutcome, Error> {
        self.signal_with(token, payload, SignalOptions::default())
            .await
    }

    /// [`signal`](Self::signal) with options: how long the signal stays buffered when no run
    /// waits on the token yet. Once that has passed it is never delivered, and the store
    /// deletes it.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), keiro::Error> {
    /// use std::time::Duration;
    /// // Only worth delivering within the hour.
    /// let options = keiro::SignalOptions::default().ttl(Duration::from_secs(3600));
    /// keiro.signal_with("order-42/nudge", &"ping", options).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`signal`](Self::signal).
    pub async fn signal_with<T: Serialize + ?Sized>(
        &self,
        token: &str,
        payload: &T,
        options: SignalOptions,
    ) -> Result<SignalSendOutcome, Error> {
        validate_signal_token(token)?;
        let payload = self.payload(token, payload)?;
        Ok(self
            .store
            .signal_send_with(token, &payload, &options)
            .await?)
    }

    fn payload<T: Serialize + ?Sized>(
        &self,
        what: &str,
        payload: &T,
    ) -> Result<serde_json::Value, Error> {
        keiro_journal::store::encode_payload(what, payload, self.payload_len_max)
            .map_err(Error::Payload)
    }

    /// Journals `value` for a run waiting in `ctx.await_step(step)`, and wakes it. A delivery
    /// that comes before the run reaches its await waits in the journal (under
    /// `await:<step>`, which only an await reads, so a delivery naming a `ctx.step` of the body
    /// changes nothing). Deliveries no await has read yet are bounded per generation
    /// ([`with_delivery_backlog`](Self::with_delivery_backlog)); one the parked run waits on is
    /// always taken.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// keiro.start("order", "order-1", &7).await?;
    /// let outcome = keiro.deliver(("order", "order-1"), "approval", &true).await?;
    /// assert_eq!(outcome, keiro::store::AppendOutcome::Appended);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`], [`Error::Payload`], [`Error::Store`];
    /// [`Error::DeliveryRefused`] with [`DeliveryRefusal::Backlog`](crate::workflow::DeliveryRefusal::Backlog)
    /// past the backlog.
    pub async fn deliver<T: Serialize + ?Sized>(
        &self,
        key: impl IntoInstanceKey,
        step: &str,
        value: &T,
    ) -> Result<AppendOutcome, Error> {
        let key = key.into_instance_key()?;
        Ok(keiro_journal::deliver(
            self.store.as_ref(),
            &key,
            step,
            value,
            self.payload_len_max,
            &self.delivery_backlog,
        )
        .await?)
    }

    /// [`deliver`](Self::deliver) bound to generation `generation` (which a body reads with
    /// `ctx.generation()` and hands out with the await it waits on): refused with
    /// [`DeliveryRefusal::StaleGeneration`](keiro_journal::DeliveryRefusal) once the instance
    /// has continued as new, so a retried webhook is not taken by the next generation's await
    /// of the same name.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let started = keiro.start("order", "order-1", &7).await?;
    /// let row = started.instance;
    /// keiro.deliver_to(&row.key, row.generation, "approval", &true).await?;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`deliver`](Self::deliver).
    pub async fn deliver_to<T: Serialize + ?Sized>(
        &self,
        key: impl IntoInstanceKey,
        generation: keiro_journal::Generation,
        step: &str,
        value: &T,
    ) -> Result<AppendOutcome, Error> {
        let key = key.into_instance_key()?;
        Ok(keiro_journal::deliver_to(
            self.store.as_ref(),
            &key,
            generation,
            step,
            value,
            self.payload_len_max,
            &self.delivery_backlog,
        )
        .await?)
    }

    /// The instance row, if the instance exists.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// keiro.start("order", "order-1", &7).await?;
    /// let row = keiro.instance(("order", "order-1")).await?.expect("started");
    /// assert_eq!(row.status, keiro::Status::Running);
    /// assert!(keiro.instance(("order", "order-2")).await?.is_none());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`], [`Error::Store`].
    pub async fn instance(&self, key: impl IntoInstanceKey) -> Result<Option<Instance>, Error> {
        let key = key.into_instance_key()?;
        Ok(self.store.instance_get(&key).await?)
    }

    /// The instance's whole journal, every generation, in append order.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// let worker = keiro.worker().register("hello", hello).build()?;
    /// keiro.start("hello", "h-1", &"ada").await?;
    /// worker.drain().await?;
    /// for entry in keiro.journal(("hello", "h-1")).await? {
    ///     println!("generation {} step {}", entry.generation, entry.event.step_name());
    /// }
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`], [`Error::Store`].
    pub async fn journal(&self, key: impl IntoInstanceKey) -> Result<Vec<JournalEntry>, Error> {
        let key = key.into_instance_key()?;
        Ok(self.store.journal_history(&key).await?)
    }

    /// A builder for a worker on this store.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// let worker = keiro.worker().register("hello", hello).build()?;
    /// keiro.start("hello", "h-1", &"ada").await?;
    /// worker.drain().await?;
    /// let greeting: String = keiro.result(("hello", "h-1"), std::time::Duration::from_secs(1)).await?;
    /// assert_eq!(greeting, "hello ada");
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn worker(&self) -> WorkerBuilder {
        WorkerBuilder::new(self.store.clone())
            .push(self.notifier.clone())
            .payload_len_max(self.payload_len_max)
            .retention_store(self.operate.as_ref().map(Operate::retention))
            .schedule_store(self.schedules.clone())
            .queue_store(self.queues.clone())
            .version_store(self.versions.clone())
            .hand_offs(Some(self.hand_offs.clone()))
    }

    /// This handle with `notifier` as its push notifier.
    /// The push notifier, when the store has one.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// assert!(keiro::Keiro::temporary()?.notifier().is_some());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn notifier(&self) -> Option<&Arc<dyn Notifier>> {
        self.notifier.as_ref()
    }

    /// The payload codec every stored payload passes through
    /// ([`KeiroBuilder::codec`](crate::KeiroBuilder::codec)), if one is configured.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// assert!(keiro::Keiro::temporary()?.codec().is_none());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn codec(&self) -> Option<&Arc<dyn crate::codec::Codec>> {
        self.codec.as_ref()
    }

    pub(crate) fn remote(&self) -> Result<&Remote, Error> {
        self.remote.as_ref().ok_or(Error::Unsupported {
            what: "remote steps (the store was wrapped with `KeiroBuilder::lease_only`)",
        })
    }

    /// A builder for a remote worker on this store (woken by push when the store has it):
    /// register handlers with `handle`, then `build` and `run_until`.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), Box<dyn std::error::Error>> {
    /// use keiro::{remote::TaskContext, remote::TaskError};
    /// keiro
    ///     .remote_worker()?
    ///     .handle("print-label", |order: String, task: TaskContext| async move {
    ///         // Dedupe on `task.step_id`: a retried task has the same one.
    ///         Ok::<_, TaskError>(format!("label for {order} ({})", task.step_id))
    ///     })
    ///     .build()
    ///     .run_until(async { let _ = tokio::signal::ctrl_c().await; })
    ///     .await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] when the store has no remote steps.
    pub fn remote_worker(&self) -> Result<RemoteWorkerBuilder, Error> {
        let builder = RemoteWorker::builder(self.remote()?.transport.clone()).options(
            keiro_remote::RemoteWorkerOptions {
                payload_len_max: self.payload_len_max,
                ..keiro_remote::RemoteWorkerOptions::default()
            },
        );
        Ok(match &self.notifier {
            Some(notifier) => builder.push(notifier.clone()),
            None => builder,
        })
    }
}
