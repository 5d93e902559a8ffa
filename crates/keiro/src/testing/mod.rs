//! A test kit: drive workflows to quiescence, skip time, inject crashes, and check recorded
//! histories against the current code (feature `testing`).
//!
//! A [`TestEnv`] holds a store (a temporary SQLite file, or a throwaway Postgres schema), a [`Keiro`] handle
//! on it and a worker for the workflows you register. Nothing runs in the background: each call
//! that drives ([`run_until_idle`](TestEnv::run_until_idle), [`advance`](TestEnv::advance)) runs
//! resume passes and fires due timers inline until nothing is left to do, so a week-long
//! workflow is tested in milliseconds.
//!
//! ```
//! use std::time::Duration;
//! use keiro::testing::TestEnv;
//! use keiro::{Ctx, Status, WorkflowError};
//!
//! /// A 7-day trial: sleep a week, then send a reminder.
//! async fn trial(ctx: Ctx, user: String) -> Result<String, WorkflowError> {
//!     ctx.sleep("trial-period", Duration::from_secs(7 * 24 * 3600)).await?;
//!     ctx.step("remind", || async move { Ok::<_, std::io::Error>(format!("reminded {user}")) })
//!         .await
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let env = TestEnv::sqlite()?.register("trial", trial).build()?;
//! env.start("trial", "ada", &"ada").await?;
//! env.run_until_idle().await?;
//! assert_eq!(env.status(("trial", "ada")).await?, Status::Suspended); // asleep
//! env.advance(Duration::from_secs(7 * 24 * 3600)).await?; // a week, at once
//! assert_eq!(env.status(("trial", "ada")).await?, Status::Completed);
//! assert_eq!(env.steps(("trial", "ada")).await?, ["sleep:trial-period", "remind"]);
//! # Ok::<_, keiro::Error>(()) }).unwrap();
//! ```

mod clock;
mod crash;
mod replay;

use std::sync::Arc;
use std::time::Duration;

use keiro_journal::{AppendOutcome, Instance, IntoInstanceKey, JournalEntry, Started, Status};
use keiro_resume::{ResumeOptions, ResumeSummary};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use replay::{verify_replay, verify_version, ReplayMismatch};

use crate::{Ctx, Error, Keiro, Worker, WorkerBuilder, WorkflowError};
use clock::TestClock;
use crash::CrashPoints;

/// How many drive rounds [`TestEnv::run_until_idle`] makes before it reports that the
/// workflows never settle (a loop that keeps waking itself).
pub const ROUNDS_MAX: u32 = 10_000;

/// Builds a [`TestEnv`]: register workflows, then [`build`](Self::build).
#[must_use]
pub struct TestEnvBuilder {
    keiro: Keiro,
    clock: TestClock,
    worker: WorkerBuilder,
}

impl std::fmt::Debug for TestEnvBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnvBuilder")
            .field("keiro", &self.keiro)
            .finish_non_exhaustive()
    }
}

impl TestEnvBuilder {
    fn new(keiro: Keiro, clock: TestClock) -> Self {
        let worker = keiro.worker().resume_options(|options| {
            options.lease_ttl = Duration::from_secs(30);
            // Crashes retry at once: time in a test env moves only when told to.
            options.backoff = keiro_journal::Backoff::exponential(
                Duration::from_millis(1),
                Duration::from_millis(1),
            )
            .without_jitter();
        });
        Self {
            keiro,
            clock,
            worker,
        }
    }

    /// Registers every workflow of a registry built elsewhere (replacing registrations made so
    /// far), as [`WorkerBuilder::registry`] does.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let mut registry = keiro::worker::Registry::new();
    /// registry.register("hello", hello)?;
    /// let env = TestEnv::sqlite()?.registry(registry).build()?;
    /// # let _ = env;
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn registry(mut self, registry: keiro_resume::Registry) -> Self {
        self.worker = self.worker.registry(registry);
        self
    }

    /// Adjusts the worker's resume options, such as `max_attempts` or `reconcile`. The kit
    /// starts from the options of [`Keiro::worker`] (the defaults, with the handle's payload
    /// limit) with a 30 s lease and a 1 ms crash backoff without jitter (a crashed run retries
    /// on the next drive), and installs its own crash points as `faults` when it builds.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// let env = TestEnv::sqlite()?
    ///     .resume_options(|options| options.max_attempts = 2)
    ///     .build()?;
    /// assert_eq!(env.worker().options().max_attempts, 2);
    /// # Ok::<_, keiro::Error>(())
    /// ```
    pub fn resume_options(mut self, edit: impl FnOnce(&mut ResumeOptions)) -> Self {
        self.worker = self.worker.resume_options(edit);
        self
    }

    /// Registers `body` under `name`, as [`WorkerBuilder::register`] does.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// # let _ = env;
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn register<F, Fut, I, O>(mut self, name: &str, body: F) -> Self
    where
        F: Fn(Ctx, I) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<O, WorkflowError>> + Send + 'static,
        I: DeserializeOwned + 'static,
        O: Serialize + 'static,
    {
        self.worker = self.worker.register(name, body);
        self
    }

    /// The environment.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let twice = TestEnv::sqlite()?.register("hello", hello).register("hello", hello).build();
    /// assert!(matches!(twice, Err(keiro::Error::Registry(_))));
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Registry`] for an invalid or duplicate registration.
    pub fn build(self) -> Result<TestEnv, Error> {
        let crashes = Arc::new(CrashPoints::default());
        let faults = crashes.clone();
        let worker = self
            .worker
            .resume_options(|options| options.faults = Some(faults))
            .build()?;
        Ok(TestEnv {
            keiro: self.keiro,
            clock: self.clock,
            worker,
            crashes,
        })
    }
}

/// A store, a [`Keiro`] handle on it and a worker, driven inline by the test.
pub struct TestEnv {
    keiro: Keiro,
    clock: TestClock,
    worker: Worker,
    crashes: Arc<CrashPoints>,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("keiro", &self.keiro)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl TestEnv {
    /// An environment on a fresh SQLite file in a temporary directory, removed with the
    /// environment ([`Keiro::temporary`]); its clock is the store's own, which
    /// [`advance`](TestEnv::advance) moves.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// env.start("hello", "h-1", &"ada").await?;
    /// env.run_until_idle().await?;
    /// assert_eq!(env.output::<String>(("hello", "h-1")).await?, "hello ada");
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Sqlite`] when the directory or the file cannot be made.
    pub fn sqlite() -> Result<TestEnvBuilder, Error> {
        let store = keiro_sqlite::SqliteStore::temporary()?;
        let clock = TestClock::sqlite(store.clone());
        Ok(TestEnvBuilder::new(Keiro::builder(store).build(), clock))
    }

    /// An environment on a throwaway schema (`keiro_testenv_<random>`) of the PostgreSQL at
    /// `url`, migrated, and dropped when the environment is dropped.
    ///
    /// ```no_run
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let env = TestEnv::postgres("postgres://postgres@127.0.0.1:5432/postgres")
    ///     .await?
    ///     .register("hello", hello)
    ///     .build()?;
    /// env.start("hello", "h-1", &"ada").await?;
    /// env.run_until_idle().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Postgres`] when the database cannot be reached or migrated.
    #[cfg(feature = "postgres")]
    pub async fn postgres(url: &str) -> Result<TestEnvBuilder, Error> {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let config = keiro_postgres::Config {
            schema: format!("keiro_testenv_{}", &suffix[..16]),
            ..keiro_postgres::Config::new(url)
        };
        let store = keiro_postgres::PgStore::connect(config.clone()).await?;
        // Owned before migrating, so the schema goes even if migrating fails half-way.
        let clock = TestClock::postgres(store.clone(), config);
        store.migrate().await?;
        Ok(TestEnvBuilder::new(Keiro::builder(store).build(), clock))
    }

    /// The handle on the environment's store, for everything the kit does not wrap.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// let counts = env.keiro().counts().await?;
    /// # let _ = counts;
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn keiro(&self) -> &Keiro {
        &self.keiro
    }

    /// The worker that drives the registered workflows.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// env.start("hello", "h-1", &"ada").await?;
    /// env.worker().resume_once().await?; // one pass, where run_until_idle would loop
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// Starts an instance, as [`Keiro::start`] does. It runs on the next drive.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// assert!(env.start("hello", "h-1", &"ada").await?.created);
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::start`].
    pub async fn start<I: Serialize + ?Sized>(
        &self,
        name: &str,
        id: &str,
        input: &I,
    ) -> Result<Started, Error> {
        self.keiro.start(name, id, input).await
    }

    /// Drives until nothing is left to do now: resume passes and due timers, round after
    /// round, until two rounds in a row advance nothing (a crashed run's retry, due a
    /// millisecond later, falls between them).
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// env.start("hello", "h-1", &"ada").await?;
    /// env.run_until_idle().await?;
    /// assert_eq!(env.status(("hello", "h-1")).await?, keiro::Status::Completed);
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// A store error, or [`Error::Unsettled`] after [`ROUNDS_MAX`] rounds.
    pub async fn run_until_idle(&self) -> Result<ResumeSummary, Error> {
        let mut total = ResumeSummary::default();
        let mut idle = 0;
        for _ in 0..ROUNDS_MAX {
            let pass = self.worker.drain().await?;
            let fired = self.worker.fire_due_timers().await?.fired.len();
            let advanced = pass.advanced;
            total += pass;
            if advanced == 0 && fired == 0 {
                idle += 1;
                if idle == 2 {
                    return Ok(total);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            } else {
                idle = 0;
            }
        }
        Err(Error::Unsettled { rounds: ROUNDS_MAX })
    }

    /// Moves the environment's clock `by` forward without waiting, then drives until idle:
    /// every sleep, timeout and retry due by then fires. On SQLite the store's clock
    /// moves; on Postgres, whose clock is the server's, every pending deadline of the schema
    /// (timers, wake-ups, crash retries, leases) moves `by` earlier instead.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use std::time::Duration;
    /// async fn nap(ctx: keiro::Ctx, _: ()) -> Result<(), keiro::WorkflowError> {
    ///     ctx.sleep("nap", Duration::from_secs(3600)).await
    /// }
    /// let env = TestEnv::sqlite()?.register("nap", nap).build()?;
    /// env.start("nap", "n-1", &()).await?;
    /// env.run_until_idle().await?; // asleep
    /// env.advance(Duration::from_secs(3600)).await?;
    /// assert_eq!(env.status(("nap", "n-1")).await?, keiro::Status::Completed);
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`run_until_idle`](Self::run_until_idle).
    pub async fn advance(&self, by: Duration) -> Result<ResumeSummary, Error> {
        self.move_clock(by).await?;
        self.run_until_idle().await
    }

    /// Moves the environment's clock `by` forward, as [`advance`](Self::advance) does, but
    /// drives nothing: what came due stays undone until the test drives, with
    /// [`run_until_idle`](Self::run_until_idle) or one step at a time through the
    /// [`worker`](Self::worker) (`resume_once`, `fire_due_timers`), so it can look at the state
    /// in between (a sleep due but not yet fired).
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use std::time::Duration;
    /// async fn nap(ctx: keiro::Ctx, _: ()) -> Result<(), keiro::WorkflowError> {
    ///     ctx.sleep("nap", Duration::from_secs(3600)).await
    /// }
    /// let env = TestEnv::sqlite()?.register("nap", nap).build()?;
    /// env.start("nap", "n-1", &()).await?;
    /// env.run_until_idle().await?;
    /// env.move_clock(Duration::from_secs(3600)).await?;
    /// assert_eq!(env.status(("nap", "n-1")).await?, keiro::Status::Suspended); // due, not fired
    /// env.run_until_idle().await?;
    /// assert_eq!(env.status(("nap", "n-1")).await?, keiro::Status::Completed);
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// A store error (Postgres: moving the deadlines).
    pub async fn move_clock(&self, by: Duration) -> Result<(), Error> {
        self.clock.advance(by).await
    }

    /// Makes the next run that journals a step named `step` crash right after it, as a
    /// process dying after its commit would: the crash is counted and retried, the step is
    /// replayed, and only the tail runs again. One crash per call.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// async fn two(ctx: keiro::Ctx, _: ()) -> Result<(), keiro::WorkflowError> {
    ///     ctx.step("one", || async { Ok::<_, std::io::Error>(()) }).await?;
    ///     ctx.step("two", || async { Ok::<_, std::io::Error>(()) }).await
    /// }
    /// let env = TestEnv::sqlite()?.register("two", two).build()?;
    /// env.crash_after("one");
    /// env.start("two", "t-1", &()).await?;
    /// env.run_until_idle().await?;
    /// assert_eq!(env.crashes_pending(), 0);
    /// assert_eq!(env.steps(("two", "t-1")).await?, ["one", "two"]); // "one" ran once
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn crash_after(&self, step: &str) {
        self.crashes.arm(step);
    }

    /// How many crashes armed with [`crash_after`](Self::crash_after) have not happened.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// env.crash_after("never-journaled");
    /// assert_eq!(env.crashes_pending(), 1);
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn crashes_pending(&self) -> u32 {
        self.crashes.pending()
    }

    /// Delivers `value` to the await `step` of an instance, as [`Keiro::deliver`] does.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// async fn gate(ctx: keiro::Ctx, _: ()) -> Result<bool, keiro::WorkflowError> {
    ///     ctx.await_step("open").await
    /// }
    /// let env = TestEnv::sqlite()?.register("gate", gate).build()?;
    /// env.start("gate", "g-1", &()).await?;
    /// env.deliver(("gate", "g-1"), "open", &true).await?;
    /// env.run_until_idle().await?;
    /// assert!(env.output::<bool>(("gate", "g-1")).await?);
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::deliver`].
    pub async fn deliver<T: Serialize + ?Sized>(
        &self,
        key: impl IntoInstanceKey,
        step: &str,
        value: &T,
    ) -> Result<AppendOutcome, Error> {
        self.keiro.deliver(key, step, value).await
    }

    /// Sends a signal by token, as [`Keiro::signal`] does.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// let outcome = env.signal("h-1/nudge", &()).await?;
    /// assert_eq!(outcome, keiro::workflow::SignalSendOutcome::Buffered);
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Keiro::signal`].
    pub async fn signal<T: Serialize + ?Sized>(
        &self,
        token: &str,
        payload: &T,
    ) -> Result<keiro_journal::SignalSendOutcome, Error> {
        self.keiro.signal(token, payload).await
    }

    /// The instance row.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// env.start("hello", "h-1", &"ada").await?;
    /// let row = env.instance(("hello", "h-1")).await?;
    /// assert_eq!(row.status, keiro::Status::Running);
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// A store error, or [`Error::Store`] with not-found for an unknown instance.
    pub async fn instance(&self, key: impl IntoInstanceKey) -> Result<Instance, Error> {
        let key = key.into_instance_key()?;
        self.keiro
            .instance(&key)
            .await?
            .ok_or_else(|| Error::Store(keiro_journal::StoreError::NotFound { key }))
    }

    /// The instance's status.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// env.start("hello", "h-1", &"ada").await?;
    /// env.run_until_idle().await?;
    /// assert_eq!(env.status(("hello", "h-1")).await?, keiro::Status::Completed);
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`instance`](Self::instance).
    pub async fn status(&self, key: impl IntoInstanceKey) -> Result<Status, Error> {
        Ok(self.instance(key).await?.status)
    }

    /// The instance's output decoded as `T`, once it completed.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// env.start("hello", "h-1", &"ada").await?;
    /// env.run_until_idle().await?;
    /// assert_eq!(env.output::<String>(("hello", "h-1")).await?, "hello ada");
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`instance`](Self::instance), and [`Error::NotCompleted`] when it has not
    /// completed, [`Error::Payload`] when the output does not decode as `T`.
    pub async fn output<T: DeserializeOwned>(&self, key: impl IntoInstanceKey) -> Result<T, Error> {
        let row = self.instance(key).await?;
        match (row.status, row.output) {
            (Status::Completed, Some(output)) => serde_json::from_value(output).map_err(|e| {
                Error::Payload(WorkflowError::Decode {
                    step: keiro_journal::store::OUTPUT_STEP.into(),
                    source: e,
                })
            }),
            (status, _) => Err(Error::NotCompleted {
                status,
                last_error: row.last_error,
            }),
        }
    }

    /// The instance's whole journal, every generation, in append order.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// env.start("hello", "h-1", &"ada").await?;
    /// env.run_until_idle().await?;
    /// assert!(!env.journal(("hello", "h-1")).await?.is_empty());
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// A store error.
    pub async fn journal(&self, key: impl IntoInstanceKey) -> Result<Vec<JournalEntry>, Error> {
        self.keiro.journal(key).await
    }

    /// The names of the steps the instance journaled in its current generation, in order,
    /// without lifecycle markers: what a test usually asserts.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// async fn two(ctx: keiro::Ctx, _: ()) -> Result<(), keiro::WorkflowError> {
    ///     ctx.step("one", || async { Ok::<_, std::io::Error>(()) }).await?;
    ///     ctx.step("two", || async { Ok::<_, std::io::Error>(()) }).await
    /// }
    /// let env = TestEnv::sqlite()?.register("two", two).build()?;
    /// env.start("two", "t-1", &()).await?;
    /// env.run_until_idle().await?;
    /// assert_eq!(env.steps(("two", "t-1")).await?, ["one", "two"]);
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// A store error.
    pub async fn steps(&self, key: impl IntoInstanceKey) -> Result<Vec<String>, Error> {
        let row = self.instance(key).await?;
        let generation = row.generation;
        Ok(self
            .journal(&row.key)
            .await?
            .into_iter()
            .filter(|e| e.generation == generation && e.event.marker().is_none())
            .map(|e| e.event.step_name().into_owned())
            .collect())
    }

    /// Re-drives the instance's recorded history against the workflow now registered under
    /// its name, doing nothing fresh (see [`verify_replay`]): the check a CI runs after a
    /// code change against histories recorded by the old code.
    ///
    /// ```
    /// use keiro::testing::TestEnv;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let env = TestEnv::sqlite()?.register("hello", hello).build()?;
    /// env.start("hello", "h-1", &"ada").await?;
    /// env.run_until_idle().await?;
    /// assert!(env.verify_replay(("hello", "h-1")).await?.is_ok());
    /// # Ok::<_, Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`ReplayMismatch`] inside `Ok(Err(..))` when the code no longer matches; the outer
    /// error for a store failure or an unknown instance.
    pub async fn verify_replay(
        &self,
        key: impl IntoInstanceKey,
    ) -> Result<Result<(), ReplayMismatch>, Error> {
        let row = self.instance(key).await?;
        let history = self.journal(&row.key).await?;
        let Some(workflow) = self.worker.registry().get(&row.key.name) else {
            return Ok(Err(ReplayMismatch::Unreplayable(format!(
                "no workflow is registered under {:?}",
                row.key.name.as_str()
            ))));
        };
        Ok(verify_replay(workflow.as_ref(), &row.key, &row.input, &history).await)
    }
}
