//! `WorkerBuilder`: how a store and a registry become a [`Worker`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keiro_journal::{Ctx, RetentionStore, WorkflowError};
use keiro_lease::LeaseStore;
use keiro_resume::{
    LogHook, Notifier, Registry, RegistryError, ResumeOptions, ScheduleStore, SchedulerOptions,
    TimerOptions,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::schedules::WorkerSchedules;
use super::{Tuning, Worker};
use crate::Error;

/// Builds a [`Worker`]: register workflows, adjust options, then [`build`](Self::build).
///
/// Each option is set one way. What people change day to day has a method of its own:
/// [`concurrency`](Self::concurrency), [`lease_ttl`](Self::lease_ttl),
/// [`poll_interval`](Self::poll_interval), [`owner`](Self::owner), the telemetry
/// ([`log`](Self::log), [`metrics`](Self::metrics), [`tracing`](Self::tracing)), the payload
/// limit, retention, timers, push and the scheduler. The rest, rarely changed, is a
/// [`Tuning`] set as a whole with [`tuning`](Self::tuning). No option is reached by two
/// methods, so the calls can come in any order; a method called twice keeps its last value.
/// Every option defaults to the value documented on its method or [`Tuning`] field.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use keiro::worker::Tuning;
/// let worker = keiro::Keiro::temporary()?
///     .worker()
///     .tuning(Tuning { max_attempts: 5, ..Tuning::default() })
///     .concurrency(16)
///     .lease_ttl(Duration::from_secs(30))
///     .owner("billing-1")
///     .build()?;
/// assert_eq!((worker.options().max_attempts, worker.options().concurrency()), (5, 16));
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))] fn main() {}
/// ```
#[must_use]
pub struct WorkerBuilder {
    store: Arc<dyn LeaseStore>,
    registry: Registry,
    options: ResumeOptions,
    timers: Option<TimerOptions>,
    push: Option<Arc<dyn Notifier>>,
    errors: Vec<RegistryError>,
    retention: Option<Arc<dyn RetentionStore>>,
    queue_store: Option<Arc<dyn keiro_lease::QueueStore>>,
    /// The store's versions (its own version, heartbeats), and the versions served when set
    /// explicitly.
    version_store: Option<Arc<dyn keiro_lease::VersionStore>>,
    serve: Option<keiro_lease::Versions>,
    /// Where schedules live, and how this worker's scheduler runs (`schedules`).
    schedules: WorkerSchedules,
    /// Where this worker's loops take runs started beside them (`Keiro::worker` passes its
    /// handle's).
    hand_offs: Option<Arc<keiro_resume::HandOffs>>,
}

impl std::fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("registry", &self.registry)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// A builder on `store` with an empty registry and default options.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// let store: Arc<dyn keiro::store::LeaseStore> = Arc::new(keiro::store::sqlite::SqliteStore::temporary()?);
    /// let worker = keiro::WorkerBuilder::new(store).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn new(store: Arc<dyn LeaseStore>) -> Self {
        Self {
            store,
            registry: Registry::new(),
            options: ResumeOptions::default(),
            timers: Some(TimerOptions::default()),
            push: None,
            errors: Vec::new(),
            retention: None,
            queue_store: None,
            version_store: None,
            serve: None,
            schedules: WorkerSchedules::default(),
            hand_offs: None,
        }
    }

    /// The hand-offs of the `Keiro` handle this worker runs beside: while one of its loops
    /// runs, a run that handle starts without a queue, of a workflow the worker serves, when
    /// the loop has a free slot and nothing else is claimable, is started leased to the loop
    /// and handed to it in memory (no notification, no claim; `keiro_resume::HandOffs`).
    /// `None` takes every run through claims. Defaults to the handle's when built through
    /// `Keiro::worker`, else `None`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // A worker that only claims, beside a handle that starts runs.
    /// let worker = keiro::Keiro::temporary()?.worker().hand_offs(None).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn hand_offs(mut self, hand_offs: Option<Arc<keiro_resume::HandOffs>>) -> Self {
        self.hand_offs = hand_offs;
        self
    }

    /// The store's application versions: the version this worker runs (and serves by
    /// default), and where its heartbeat row goes. `None`: no heartbeat, and every version is
    /// served unless [`serve`](Self::serve) says otherwise. Defaults to the store's when built
    /// through `Keiro::worker`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().version_store(None).build()?;
    /// assert_eq!(worker.options().versions, keiro::versions::Versions::Any);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn version_store(mut self, store: Option<Arc<dyn keiro_lease::VersionStore>>) -> Self {
        self.version_store = store;
        self
    }

    /// Claims only runs of `versions` (`keiro::versions`): a list, or
    /// [`Versions::Any`](keiro_lease::Versions::Any). Defaults to the store's own version
    /// (the one its starts record), or any version when the store is unversioned.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use keiro::versions::Versions;
    /// let worker = keiro::Keiro::temporary()?.worker().serve(Versions::only(["v1", "v2"])).build()?;
    /// assert!(worker.options().versions.serves("v1"));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn serve(mut self, versions: keiro_lease::Versions) -> Self {
        self.serve = Some(versions);
        self
    }

    /// Wakes the worker by push notifications from `notifier` (passes run within milliseconds
    /// of a wake; `poll_interval` becomes the fallback). `None` polls only.
    /// Defaults to the store's notifier when built through `Keiro::worker`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// // Poll only, every 100 ms.
    /// let worker = keiro.worker().push(None).poll_interval(std::time::Duration::from_millis(100)).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn push(mut self, notifier: Option<Arc<dyn Notifier>>) -> Self {
        self.push = notifier;
        self
    }

    /// Runs a timer worker beside the resume loop (`None`: don't; another process fires
    /// timers). Defaults to `Some(TimerOptions::default())`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Timers fire in another process.
    /// let worker = keiro::Keiro::temporary()?.worker().timers(None).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn timers(mut self, timers: Option<TimerOptions>) -> Self {
        self.timers = timers;
        self
    }

    /// The largest step result or workflow output the worker's runs journal; a larger one
    /// fails its run at once. Defaults to the facade's limit when built through `Keiro::worker`
    /// ([`Keiro::with_payload_len_max`](crate::Keiro::with_payload_len_max)), else
    /// [`PAYLOAD_LEN_MAX_DEFAULT`](keiro_journal::PAYLOAD_LEN_MAX_DEFAULT).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().payload_len_max(64 * 1024).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn payload_len_max(mut self, payload_len_max: usize) -> Self {
        self.options.payload_len_max = payload_len_max;
        self
    }

    /// The store retention deletes from when [`retention`](Self::retention) is set. Defaults
    /// to the store's own when built through `Keiro::worker`, else `None`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// let store = Arc::new(keiro::store::sqlite::SqliteStore::temporary()?);
    /// let worker = keiro::Worker::builder(store.as_ref().clone())
    ///     .retention_store(Some(store))
    ///     .retention(Some(std::time::Duration::from_secs(30 * 86_400)))
    ///     .build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn retention_store(mut self, store: Option<Arc<dyn RetentionStore>>) -> Self {
        self.retention = store;
        self
    }

    /// The store the queue gauges are read from (`keiro.queue.waiting`, `keiro.queue.running`,
    /// `keiro.queue.throttled`, sampled while the worker runs when it has
    /// [`metrics`](Self::metrics) and serves a [`queue`](Self::queue)). Set to the store's own
    /// when built through `Keiro::worker`, else `None` (no queue gauges).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// let store = Arc::new(keiro::store::sqlite::SqliteStore::temporary()?);
    /// let worker = keiro::Worker::builder(store.as_ref().clone())
    ///     .queue_store(Some(store))
    ///     .queue("llm")
    ///     .build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn queue_store(mut self, store: Option<Arc<dyn keiro_lease::QueueStore>>) -> Self {
        self.queue_store = store;
        self
    }

    /// Deletes terminal instances once they have been terminal for longer than `older_than`
    /// (`None`: keep them forever), in bounded batches at a bounded rate beside the resume
    /// loop; at most one worker collects at a time. Defaults to `None`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let thirty_days = std::time::Duration::from_secs(30 * 86_400);
    /// let worker = keiro::Keiro::temporary()?.worker().retention(Some(thirty_days)).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn retention(mut self, older_than: Option<Duration>) -> Self {
        self.options.retention = older_than;
        self
    }

    /// Registers `body` under `name`; an invalid or duplicate name is reported by `build`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// let worker = keiro::Keiro::temporary()?.worker().register("hello", hello).build()?;
    /// assert!(worker.registry().get(&keiro::workflow::WorkflowName::new("hello")?).is_some());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn register<F, Fut, I, O>(mut self, name: &str, body: F) -> Self
    where
        F: Fn(Ctx, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
        I: DeserializeOwned + 'static,
        O: Serialize + 'static,
    {
        if let Err(error) = self.registry.register(name, body) {
            self.errors.push(error);
        }
        self
    }

    /// Registers the typed workflow `W` under [`W::NAME`](crate::WorkflowDef::NAME), with
    /// `W::default()` as its definition (for a unit struct, `#[derive(Default)]`); an invalid
    /// or duplicate name is reported by `build`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use keiro::{Ctx, WorkflowDef, WorkflowError};
    ///
    /// #[derive(Default)]
    /// struct Noop;
    ///
    /// impl WorkflowDef for Noop {
    ///     const NAME: &'static str = "noop";
    ///     type Input = ();
    ///     type Output = ();
    ///     async fn run(&self, _ctx: Ctx, _input: ()) -> Result<(), WorkflowError> { Ok(()) }
    /// }
    ///
    /// let worker = keiro::Keiro::temporary()?.worker().register_workflow::<Noop>().build();
    /// assert!(worker.is_ok());
    /// # }
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn register_workflow<W: crate::WorkflowDef + Default>(self) -> Self {
        self.register_workflow_with(W::default())
    }

    /// Registers `definition`, a typed workflow whose body needs state of its own (a client, a
    /// pool), under [`W::NAME`](crate::WorkflowDef::NAME); shared by every run of the worker.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use keiro::{Ctx, WorkflowDef, WorkflowError};
    /// # #[derive(Default)]
    /// # struct Double;
    /// # impl WorkflowDef for Double {
    /// #     const NAME: &'static str = "double";
    /// #     type Input = u32;
    /// #     type Output = u64;
    /// #     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    /// #         let factor: u64 = ctx.await_step("factor").await?;
    /// #         Ok(u64::from(n) * factor)
    /// #     }
    /// # }
    /// let worker = keiro::Keiro::temporary()?.worker().register_workflow_with(Double).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn register_workflow_with<W: crate::WorkflowDef>(self, definition: W) -> Self {
        let definition = Arc::new(definition);
        self.register(W::NAME, move |ctx: Ctx, input: W::Input| {
            let definition = definition.clone();
            async move { definition.run(ctx, input).await }
        })
    }

    /// Uses a registry built elsewhere (replacing registrations made so far).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// let mut registry = keiro::worker::Registry::new();
    /// registry.register("hello", hello)?;
    /// let worker = keiro::Keiro::temporary()?.worker().registry(registry).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn registry(mut self, registry: Registry) -> Self {
        self.registry = registry;
        self
    }

    /// Gap between passes when nothing advanced (with push, the fallback poll). Defaults to
    /// [`POLL_INTERVAL_DEFAULT`](keiro_resume::POLL_INTERVAL_DEFAULT), 1 s.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().poll_interval(std::time::Duration::from_secs(5)).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.options.poll_interval = interval;
        self
    }

    /// Lease time-to-live: a dead worker's runs resume within it plus one poll interval.
    /// Defaults to [`LEASE_TTL_DEFAULT`](keiro_journal::LEASE_TTL_DEFAULT), 60 s.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().lease_ttl(std::time::Duration::from_secs(60)).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.options.lease_ttl = ttl;
        self
    }

    /// Runs whose bodies a worker drives at once. Defaults to
    /// [`MAX_CONCURRENT_ADVANCES_DEFAULT`](keiro_resume::MAX_CONCURRENT_ADVANCES_DEFAULT), 1:
    /// one run at a time. A run holds its slot while its body runs; a run that parks (a sleep,
    /// an awaited event, a remote step) or returns gives it back, and its closing write commits
    /// without one.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().concurrency(32).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn concurrency(mut self, advances: usize) -> Self {
        self.options.max_concurrent_advances = advances;
        self
    }

    /// The options that are rarely changed, all at once: crash ceiling and backoff, the
    /// reconcile fallback, the pass limit and the journal budget (see [`Tuning`]). A second
    /// call replaces the first. Defaults to [`Tuning::default`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use keiro::worker::Tuning;
    /// let tuning = Tuning {
    ///     max_attempts: 3,
    ///     backoff: keiro::store::CRASH_BACKOFF_DEFAULT,
    ///     ..Tuning::default()
    /// };
    /// let worker = keiro::Keiro::temporary()?.worker().tuning(tuning).build()?;
    /// assert_eq!(worker.options().max_attempts, 3);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn tuning(mut self, tuning: Tuning) -> Self {
        tuning.apply(&mut self.options);
        self
    }

    /// Edits the resume options in place, for the test kit, which also installs its crash
    /// points (`faults`) here; not public, so each option keeps one public way in.
    #[cfg(feature = "testing")]
    pub(crate) fn resume_options(mut self, edit: impl FnOnce(&mut ResumeOptions)) -> Self {
        edit(&mut self.options);
        self
    }

    /// The lease owner id. Defaults to a fresh id per pass (one for the worker's life when it
    /// serves a queue).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().owner("billing-7f9c").build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.options.owner = Some(owner.into());
        self
    }

    /// Serves queue `name`: the worker admits runs started on it, within its limits
    /// ([`Keiro::declare_queue`](crate::Keiro::declare_queue)). A run on a queue no worker
    /// serves waits. Call once per queue.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().queue("llm").build()?;
    /// assert_eq!(worker.options().queues, ["llm"]);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        let name = name.into();
        if !self.options.queues.contains(&name) {
            self.options.queues.push(name);
        }
        self
    }

    /// Where notable events go. Defaults to
    /// [`tracing_log_hook`](keiro_resume::tracing_log_hook), which logs them with `tracing`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// let hook: keiro::worker::LogHook = Arc::new(|event: &keiro::worker::ResumeLogEvent| eprintln!("{event:?}"));
    /// let worker = keiro::Keiro::temporary()?.worker().log(hook).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn log(mut self, hook: LogHook) -> Self {
        self.options.log = hook;
        self
    }

    /// Records OpenTelemetry metrics. Defaults to none.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().metrics(keiro::Metrics::global()).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn metrics(mut self, metrics: keiro_telemetry::Metrics) -> Self {
        self.options.metrics = Some(metrics);
        self
    }

    /// Creates a `workflow <name>` OpenTelemetry span per drive, whose trace context the
    /// remote steps it dispatches carry to their workers. Defaults to none.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().tracing(keiro::Tracing::global()).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn tracing(mut self, tracing: keiro_telemetry::Tracing) -> Self {
        self.options.tracing = Some(tracing);
        self
    }

    /// Where schedules live; the worker runs a scheduler only with one. Defaults to the
    /// facade's store when built through [`Keiro::worker`](crate::Keiro::worker), else `None`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().schedule_store(None).build()?;
    /// # let _ = worker;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn schedule_store(mut self, store: Option<Arc<dyn ScheduleStore>>) -> Self {
        self.schedules.store = store;
        self
    }

    /// How this worker's scheduler runs; `None`: this worker never schedules (another one
    /// does). Every scheduling worker on a schema competes for one leadership, and only the
    /// leader starts runs, those of every schedule whatever this worker registers. Defaults to
    /// `Some(SchedulerOptions::default())`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// let worker = keiro::Keiro::temporary()?.worker().scheduler(None).build()?;
    /// # let _ = worker; }
    /// # Ok::<(), keiro::Error>(())
    /// ```
    pub fn scheduler(mut self, options: Option<SchedulerOptions>) -> Self {
        self.schedules.options = options;
        self
    }

    /// Validates the registrations and options.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// let keiro = keiro::Keiro::temporary()?;
    /// assert!(keiro.worker().register("hello", hello).build().is_ok());
    /// // The same name twice is refused.
    /// let twice = keiro.worker().register("hello", hello).register("hello", hello).build();
    /// assert!(matches!(twice, Err(keiro::Error::Registry(_))));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Registry`] for the first refused registration, [`Error::Options`] for an option
    /// out of bounds.
    pub fn build(mut self) -> Result<Worker, Error> {
        if !self.errors.is_empty() {
            return Err(Error::Registry(self.errors.remove(0)));
        }
        self.options.validate()?;
        for queue in &self.options.queues {
            keiro_journal::queue::QueueStart::new(queue.clone()).validate()?;
        }
        if !self.options.queues.is_empty() && self.options.owner.is_none() {
            // Per-worker queue limits count this worker's leases by owner, so the owner must
            // outlive a pass.
            self.options.owner = Some(format!("keiro-{}", uuid::Uuid::new_v4()));
        }
        if self.options.retention.is_some() && self.retention.is_none() {
            return Err(Error::Unsupported {
                what: "retention (the worker has no retention store)",
            });
        }
        self.schedules.validate()?;
        self.options.versions = match self.serve {
            Some(versions) => versions,
            None => self
                .version_store
                .as_ref()
                .map_or(keiro_lease::Versions::Any, |store| {
                    keiro_lease::Versions::own(store.app_version())
                }),
        };
        self.options.versions.validate()?;
        let mut timers = self.timers;
        if let Some(timers) = &mut timers {
            timers.metrics = timers
                .metrics
                .take()
                .or_else(|| self.options.metrics.clone());
        }
        Ok(Worker {
            store: self.store,
            registry: self.registry,
            options: self.options,
            timers,
            push: self.push,
            retention: self.retention,
            queue_store: self.queue_store,
            version_store: self.version_store,
            schedules: self.schedules,
            hand_offs: self.hand_offs,
        })
    }
}
