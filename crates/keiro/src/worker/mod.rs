//! `Worker`: the embeddable resume worker, built in a few lines, and what tunes or drives one
//! by hand: [`Tuning`] (the rarely changed options, set as a whole with
//! [`WorkerBuilder::tuning`]), [`ResumeOptions`] (everything a worker runs with, which the
//! one-pass functions take), the wake sources, the log hook, and the one-pass functions
//! ([`resume_once`], [`drain`]) the worker loops over.

mod builder;
mod schedules;
mod tuning;

use std::future::Future;
use std::sync::Arc;

use keiro_journal::{RetentionStore, StoreError};
use keiro_lease::LeaseStore;

pub use builder::WorkerBuilder;
pub use keiro_resume::{
    drain, resume_once, resume_once_up_to, ClosedWait, ClosedWaiters, FixedPoll, LogHook, Notifier,
    Registry, RegistryError, ResumeLogEvent, ResumeOptions, ResumeSummary, RetentionOptions,
    TimerOptions, TimerSummary, WakeFilter, WakeReason, WakeSource,
};
pub use tuning::Tuning;

/// An embeddable resume worker: finds unfinished instances and drives them. It also runs
/// workflows directly in its caller ([`run_workflow`](Self::run_workflow),
/// [`run_named`](Self::run_named)), with the same registry, options and drive.
#[derive(Clone)]
pub struct Worker {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) registry: Registry,
    pub(crate) options: ResumeOptions,
    timers: Option<TimerOptions>,
    pub(crate) push: Option<Arc<dyn Notifier>>,
    retention: Option<Arc<dyn RetentionStore>>,
    pub(crate) queue_store: Option<Arc<dyn keiro_lease::QueueStore>>,
    version_store: Option<Arc<dyn keiro_lease::VersionStore>>,
    schedules: schedules::WorkerSchedules,
    hand_offs: Option<Arc<keiro_resume::HandOffs>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("registry", &self.registry)
            .field("options", &self.options)
            .field("timers", &self.timers)
            .field("push", &self.push.is_some())
            .finish()
    }
}

impl Worker {
    /// A builder on `store`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// use keiro::{Ctx, Worker, WorkflowError};
    /// async fn noop(_ctx: Ctx, _input: ()) -> Result<(), WorkflowError> { Ok(()) }
    /// let worker = Worker::builder(keiro::store::sqlite::SqliteStore::temporary()?)
    ///     .register("noop", noop)
    ///     .build()
    ///     .expect("valid registration");
    /// # let _ = worker; }
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(store: impl LeaseStore) -> WorkerBuilder {
        WorkerBuilder::new(Arc::new(store))
    }

    /// The registry.
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
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The options.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let worker = keiro::Keiro::temporary()?.worker().build()?;
    /// println!("polls every {:?} when idle", worker.options().poll_interval);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn options(&self) -> &ResumeOptions {
        &self.options
    }

    /// One pass over every runnable instance.
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
    /// let summary = worker.resume_once().await?;
    /// println!("{summary:?}");
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// The discovery query's store error.
    pub async fn resume_once(&self) -> Result<ResumeSummary, StoreError> {
        keiro_resume::resume_once(&self.store, &self.registry, &self.options).await
    }

    /// Passes until one advances nothing.
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
    /// let row = keiro.instance(("hello", "h-1")).await?.expect("started");
    /// assert_eq!(row.status, keiro::Status::Completed);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// The first failing discovery query.
    pub async fn drain(&self) -> Result<ResumeSummary, StoreError> {
        keiro_resume::drain(&self.store, &self.registry, &self.options).await
    }

    /// Runs the resume loop (push-aware when the worker has a notifier, fixed-poll otherwise)
    /// and the timer worker until `shutdown` resolves; in-flight runs finish first.
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
    /// let waiter = keiro.clone();
    /// let done = async move {
    ///     let _ = waiter.result::<String>(("hello", "h-1"), std::time::Duration::from_secs(10)).await;
    /// };
    /// worker.run_until(done).await;
    /// let row = keiro.instance(("hello", "h-1")).await?.expect("started");
    /// assert_eq!(row.status, keiro::Status::Completed);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub async fn run_until(&self, shutdown: impl Future<Output = ()> + Send) -> ResumeSummary {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            // An error means the sender is gone, which only happens once we are done anyway.
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let timers = self.timers.clone().map(|mut options| {
            let wake: Box<dyn WakeSource> = match &self.push {
                Some(notifier) => notifier.subscribe(WakeFilter::Timers),
                None => {
                    // Without push a newly armed timer is only seen by polling, so the timer
                    // loop must poll as often as the resume loop does.
                    options.idle_fallback = options.idle_fallback.min(self.options.poll_interval);
                    Box::new(FixedPoll)
                }
            };
            tokio::spawn(keiro_resume::run_timer_loop(
                self.store.clone(),
                options,
                wake,
                stopped(stop_rx.clone()),
            ))
        });
        let retention = self.retention_loop(stopped(stop_rx.clone()));
        let heartbeat = self.heartbeat(stopped(stop_rx.clone()));
        let gauges = self.queue_gauges(stopped(stop_rx.clone()));
        let scheduler = self.spawn_scheduler(stopped(stop_rx.clone()));
        let wake: Box<dyn WakeSource> = match &self.push {
            Some(notifier) => notifier.subscribe(WakeFilter::Instances),
            None => Box::new(FixedPoll),
        };
        let resume = self.run_with(wake, stopped(stop_rx));
        let signal = async {
            shutdown.await;
            let _ = stop_tx.send(true);
        };
        let (summary, ()) = tokio::join!(resume, signal);
        if let Some(timers) = timers {
            // The timer loop stops on the same signal; a panic inside it is not ours to rethrow.
            let _ = timers.await;
        }
        if let Some(retention) = retention {
            // As for the timer loop.
            let _ = retention.await;
        }
        if let Some(scheduler) = scheduler {
            // As the timer loop: it stops on the same signal.
            let _ = scheduler.await;
        }
        if let Some(gauges) = gauges {
            // As the timer loop.
            let _ = gauges.await;
        }
        if let Some(heartbeat) = heartbeat {
            // As the timer loop; it deletes its row as it stops.
            let _ = heartbeat.await;
        }
        summary
    }

    /// Spawns the queue gauge loop when the worker has metrics, serves a queue and has the
    /// store to read queues from.
    fn queue_gauges(
        &self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let metrics = self.options.metrics.clone()?;
        let store = self.queue_store.clone()?;
        if self.options.queues.is_empty() {
            return None;
        }
        Some(tokio::spawn(keiro_resume::run_queue_gauges(
            store,
            self.options.queues.clone(),
            metrics,
            shutdown,
        )))
    }

    /// Spawns the heartbeat (`keiro::versions`) when the worker has the store's versions: its
    /// row says which version it runs and serves, for `keiro versions`.
    fn heartbeat(
        &self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let store = self.version_store.clone()?;
        let beat = keiro_lease::versions::WorkerBeat {
            worker_id: self
                .options
                .owner
                .clone()
                .unwrap_or_else(|| format!("keiro-{}", uuid::Uuid::new_v4())),
            app_version: store.app_version().to_owned(),
            serves: self.options.versions.clone(),
            queues: self.options.queues.clone(),
        };
        Some(tokio::spawn(keiro_resume::run_heartbeat(
            store,
            beat,
            keiro_lease::versions::HEARTBEAT_INTERVAL_DEFAULT,
            shutdown,
        )))
    }

    /// Spawns the retention loop when the options ask for one.
    fn retention_loop(
        &self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Option<tokio::task::JoinHandle<keiro_journal::GcBatch>> {
        let older_than = self.options.retention?;
        let store = self.retention.clone()?;
        Some(tokio::spawn(keiro_resume::run_retention_loop(
            store,
            keiro_resume::RetentionOptions::new(older_than),
            shutdown,
        )))
    }

    /// Fires one batch of due timers (for tests and custom loops).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let worker = keiro.worker().build()?;
    /// let fired = worker.fire_due_timers().await?;
    /// println!("{fired:?}");
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// The store's error.
    pub async fn fire_due_timers(&self) -> Result<keiro_journal::TimerFiring, StoreError> {
        keiro_resume::fire_due_once(&self.store, &self.timers.clone().unwrap_or_default()).await
    }

    /// Runs the resume loop alone with a custom wake source until `shutdown` resolves.
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
    /// // A fixed poll instead of the store's push.
    /// worker.run_with(keiro::worker::FixedPoll, async {}).await;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub async fn run_with<W: WakeSource>(
        &self,
        wake: W,
        shutdown: impl Future<Output = ()> + Send,
    ) -> ResumeSummary {
        let mut options = self.options.clone();
        // Open while this loop runs: the loop closes it as it stops, and the guard if the
        // loop is dropped before (runs delivered and not taken then wait out their lease).
        let mut _closing = None;
        if let Some(hand_offs) = &self.hand_offs {
            options.hand_off = Some(
                hand_offs.open(
                    self.registry.names(),
                    options.versions.clone(),
                    options
                        .owner
                        .clone()
                        .unwrap_or_else(|| format!("keiro-{}", uuid::Uuid::new_v4())),
                    options.lease_ttl,
                ),
            );
            _closing = options.hand_off.clone().map(ClosingHandOff);
        }
        keiro_resume::run_loop(
            self.store.clone(),
            self.registry.clone(),
            options,
            wake,
            shutdown,
        )
        .await
    }

    /// Runs until Ctrl-C (SIGINT), then shuts down gracefully.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), Box<dyn std::error::Error>> {
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// let worker = keiro.worker().register("hello", hello).build()?;
    /// worker.run().await; // until Ctrl-C
    /// # Ok(()) }
    /// ```
    pub async fn run(&self) -> ResumeSummary {
        self.run_until(async {
            // If the signal handler cannot be installed, run until the process is killed.
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
        .await
    }
}

/// Closes a loop's hand-off when dropped, however the loop ended.
struct ClosingHandOff(keiro_resume::HandOff);

impl Drop for ClosingHandOff {
    fn drop(&mut self) {
        drop(self.0.close());
    }
}
