//! One test scenario, run against either store: the harness hands out the store, a facade
//! handle and small tools (a side-effect ledger, option presets).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keiro::testing::{TestEnv, TestEnvBuilder};
use keiro::worker::{ResumeOptions, Tuning};
use keiro::{store::LeaseStore, InstanceKey, Keiro, WorkerBuilder};
use keiro_journal::InspectStore;
use keiro_remote::{RemoteAdmin, Transport};

use crate::pg::TestDb;

/// What a test returns: `?` works on every error.
pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Which store a scenario runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `keiro-postgres` on a fresh schema of the test database.
    Postgres,
    /// `keiro-sqlite` on a fresh file in a temporary directory of its own.
    Sqlite,
}

/// A store for one test, plus what keeps it alive.
pub struct Harness {
    /// Which store this is.
    pub backend: Backend,
    /// The store.
    pub store: Arc<dyn LeaseStore>,
    /// The same store as a remote-step transport.
    pub transport: Arc<dyn Transport>,
    /// The same store's operator tools.
    pub admin: Arc<dyn RemoteAdmin>,
    /// The same store's operator reads, with the instant they take (the facade's pass none).
    pub inspect: Arc<dyn InspectStore>,
    /// The same store's queue operations, with the instant they take (the facade's pass none).
    pub queues: Arc<dyn keiro_lease::QueueStore>,
    /// The same store's application versions (unversioned).
    pub versions: Arc<dyn keiro_lease::VersionStore>,
    /// The same store's stored payloads, as they are.
    pub payloads: Arc<dyn keiro::store::PayloadStore>,
    /// The facade over the same store.
    pub keiro: Keiro,
    /// The Postgres schema, when `backend` is Postgres; dropped with the harness.
    pub db: Option<TestDb>,
    /// The SQLite file's directory, when `backend` is Sqlite; removed with the harness.
    pub sqlite_dir: Option<SqliteDir>,
    /// The SQLite store itself, when `backend` is Sqlite: its push and clock.
    pub sqlite: Option<keiro_sqlite::SqliteStore>,
}

/// A second store on a harness's schema or file, with an application version of its own
/// ([`Harness::versioned`]).
pub struct Versioned {
    /// The store.
    pub store: Arc<dyn LeaseStore>,
    /// The same store's application versions.
    pub versions: Arc<dyn keiro_lease::VersionStore>,
    /// The facade over the same store, without push.
    pub keiro: Keiro,
}

impl Versioned {
    fn of<S: keiro::store::Store + Clone>(store: S) -> Self {
        let store = Arc::new(store);
        Self {
            keiro: Keiro::builder((*store).clone()).without_push().build(),
            versions: store.clone(),
            store,
        }
    }
}

/// A temporary directory holding one test's SQLite file, removed when dropped.
#[derive(Debug)]
pub struct SqliteDir(std::path::PathBuf);

impl SqliteDir {
    /// A fresh directory under the system's temporary directory.
    fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "keiro-tests-sqlite-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        if let Err(e) = std::fs::create_dir_all(&dir) {
            panic!("cannot create {}: {e}", dir.display());
        }
        Self(dir)
    }

    /// The database file's path.
    pub fn file(&self) -> std::path::PathBuf {
        self.0.join("keiro.db")
    }
}

impl Drop for SqliteDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Harness {
    /// A harness on a fresh SQLite file in a temporary directory of its own (removed with the
    /// harness). Panics when the file cannot be opened.
    pub fn sqlite() -> Self {
        let dir = SqliteDir::new();
        let store =
            match keiro_sqlite::SqliteStore::open(dir.file(), keiro_sqlite::Config::default()) {
                Ok(store) => Arc::new(store),
                Err(e) => panic!("cannot open {}: {e}", dir.file().display()),
            };
        Self {
            backend: Backend::Sqlite,
            keiro: Keiro::builder((*store).clone()).without_push().build(),
            transport: store.clone(),
            admin: store.clone(),
            inspect: store.clone(),
            queues: store.clone(),
            versions: store.clone(),
            payloads: store.clone(),
            sqlite: Some((*store).clone()),
            store,
            db: None,
            sqlite_dir: Some(dir),
        }
    }

    /// A harness on a fresh Postgres schema. Panics, naming `TEST_DATABASE_URL`, when the
    /// database cannot be reached.
    pub async fn postgres() -> Self {
        let db = TestDb::new().await;
        let store = Arc::new(db.store());
        Self {
            backend: Backend::Postgres,
            keiro: Keiro::builder((*store).clone()).without_push().build(),
            transport: store.clone(),
            admin: store.clone(),
            inspect: store.clone(),
            queues: store.clone(),
            versions: store.clone(),
            payloads: store.clone(),
            store,
            db: Some(db),
            sqlite_dir: None,
            sqlite: None,
        }
    }

    /// A harness on a fresh Postgres schema whose store never batches (`Config::batching`
    /// off): one transaction per append, start and park, to check that group commit changes
    /// no outcome. Panics like [`postgres`](Self::postgres).
    pub async fn postgres_unbatched() -> Self {
        let db = TestDb::new().await;
        let store = match keiro_postgres::PgStore::connect(db.config().batching(false)).await {
            Ok(store) => Arc::new(store),
            Err(e) => panic!("cannot connect an unbatched store to {}: {e}", db.schema()),
        };
        Self {
            backend: Backend::Postgres,
            keiro: Keiro::builder((*store).clone()).without_push().build(),
            transport: store.clone(),
            admin: store.clone(),
            inspect: store.clone(),
            queues: store.clone(),
            versions: store.clone(),
            payloads: store.clone(),
            store,
            db: Some(db),
            sqlite_dir: None,
            sqlite: None,
        }
    }

    /// Another store on this harness's schema or file whose runs record `version`: what a
    /// process of another build sees. Panics when it cannot be opened.
    pub async fn versioned(&self, version: &str) -> Versioned {
        match (&self.db, &self.sqlite_dir) {
            (Some(db), _) => {
                let config = keiro_postgres::Config {
                    app_version: version.to_owned(),
                    ..db.config()
                };
                let store = match keiro_postgres::PgStore::connect(config).await {
                    Ok(store) => store,
                    Err(e) => panic!(
                        "cannot connect a store of {version} to {}: {e}",
                        db.schema()
                    ),
                };
                Versioned::of(store)
            }
            (None, Some(dir)) => {
                let config = keiro_sqlite::Config {
                    app_version: version.to_owned(),
                    ..keiro_sqlite::Config::default()
                };
                match keiro_sqlite::SqliteStore::open(dir.file(), config) {
                    Ok(store) => Versioned::of(store),
                    Err(e) => panic!("cannot open {} for {version}: {e}", dir.file().display()),
                }
            }
            (None, None) => unreachable!("a harness has a schema or a file"),
        }
    }

    /// Resume options for fast tests: a 20 ms poll, a 30 s lease, millisecond backoff.
    pub fn fast_options(&self) -> ResumeOptions {
        ResumeOptions {
            poll_interval: FAST_POLL_INTERVAL,
            lease_ttl: FAST_LEASE_TTL,
            backoff: fast_backoff(),
            ..ResumeOptions::default()
        }
    }

    /// The tuning of [`fast_options`](Self::fast_options): millisecond backoff, the rest
    /// default. For a builder that sets a tuning of its own after [`FastWorker::fast`].
    pub fn fast_tuning(&self) -> Tuning {
        Tuning {
            backoff: fast_backoff(),
            ..Tuning::default()
        }
    }
}

/// The poll interval of [`Harness::fast_options`].
const FAST_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// The lease of [`Harness::fast_options`].
const FAST_LEASE_TTL: Duration = Duration::from_secs(30);

/// The crash backoff of [`Harness::fast_options`]: a crashed run retries within a millisecond.
fn fast_backoff() -> keiro::Backoff {
    keiro::Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1)).without_jitter()
}

/// [`Harness::fast_options`] on a worker's builder.
pub trait FastWorker {
    /// Sets the poll interval, lease and tuning of [`Harness::fast_options`] (a later
    /// [`tuning`](keiro::WorkerBuilder::tuning) replaces the tuning; start it from
    /// [`Harness::fast_tuning`]).
    fn fast(self) -> Self;
}

impl FastWorker for WorkerBuilder {
    fn fast(self) -> Self {
        self.poll_interval(FAST_POLL_INTERVAL)
            .lease_ttl(FAST_LEASE_TTL)
            .tuning(Tuning {
                backoff: fast_backoff(),
                ..Tuning::default()
            })
    }
}

/// An error that crashes a run (counted, retried with backoff), as a failing step gives:
/// tests that simulate a crash use it, because the body's own `WorkflowError::app` fails the
/// run for good.
pub fn crash(message: &str) -> keiro::WorkflowError {
    keiro::WorkflowError::Step {
        step: "crash".into(),
        message: message.into(),
    }
}

/// Parses a key, for brevity in tests.
pub fn key(name: &str, id: &str) -> InstanceKey {
    InstanceKey::parse(name, id).expect("test keys are valid")
}

/// Counts side effects by label, shared between a test and the workflow bodies it registers.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    counts: Arc<Mutex<BTreeMap<String, u32>>>,
}

impl Ledger {
    /// Records one execution of `label`.
    pub fn bump(&self, label: &str) {
        *self.lock().entry(label.to_owned()).or_default() += 1;
    }

    /// How many times `label` ran.
    pub fn count(&self, label: &str) -> u32 {
        self.lock().get(label).copied().unwrap_or(0)
    }

    /// Every label and its count.
    pub fn all(&self) -> BTreeMap<String, u32> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u32>> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A test kit environment on a fresh temporary SQLite file, to register workflows on. Panics
/// when the file cannot be made.
pub fn env_sqlite() -> TestEnvBuilder {
    match TestEnv::sqlite() {
        Ok(env) => env,
        Err(e) => panic!("cannot make a temporary SQLite store: {e}"),
    }
}

/// A test kit environment on a throwaway schema of the test database. Panics, naming
/// `TEST_DATABASE_URL`, when the database cannot be reached.
pub async fn env_postgres() -> TestEnvBuilder {
    let url = crate::pg::test_database_url();
    match TestEnv::postgres(&url).await {
        Ok(env) => env,
        Err(e) => panic!(
            "the test database at {url} (TEST_DATABASE_URL) could not be reached or migrated: {e}"
        ),
    }
}

/// Generates one `#[tokio::test]` per scenario and store: `postgres::<name>` and
/// `sqlite::<name>`, each calling `<name>(harness)` from the enclosing module. Scenarios
/// listed after `; env:` take a test kit environment instead
/// (`keiro::testing::TestEnvBuilder`, on the same store kind) and are named the same way, so
/// one file mixes both.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)? $(; env: $($env:ident),* $(,)?)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> $crate::TestResult {
                    super::$name($crate::Harness::postgres().await).await
                }
            )*
            $($(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $env() -> $crate::TestResult {
                    super::$env($crate::harness::env_postgres().await).await
                }
            )*)?
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> $crate::TestResult {
                    super::$name($crate::Harness::sqlite()).await
                }
            )*
            $($(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $env() -> $crate::TestResult {
                    super::$env($crate::harness::env_sqlite()).await
                }
            )*)?
        }
    };
}

/// [`on_both_stores!`] for a file whose scenarios all take a test kit environment.
#[macro_export]
macro_rules! on_both_envs {
    ($($env:ident),* $(,)?) => {
        $crate::on_both_stores!(; env: $($env),*);
    };
}

/// [`on_both_stores!`] plus a third run of each scenario on a Postgres store with group commit
/// off ([`Harness::postgres_unbatched`]), as `postgres_unbatched::<name>`: for the scenarios
/// whose appends and starts must not change outcome whether they share a transaction or not.
#[macro_export]
macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        $crate::on_both_stores!($($name),*);
        mod postgres_unbatched {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> $crate::TestResult {
                    super::$name($crate::Harness::postgres_unbatched().await).await
                }
            )*
        }
    };
}

/// Drives one unfenced run of `workflow` for `key` inline, with default options.
pub async fn run_inline(
    h: &Harness,
    key: &InstanceKey,
    workflow: &dyn keiro::workflow::Workflow,
) -> Result<keiro::workflow::RunOutcome, keiro::workflow::RunError> {
    run_with(h, key, workflow, keiro::workflow::RunOptions::default()).await
}

/// Drives one run of `workflow` for `key` inline with `options`.
pub async fn run_with(
    h: &Harness,
    key: &InstanceKey,
    workflow: &dyn keiro::workflow::Workflow,
    options: keiro::workflow::RunOptions,
) -> Result<keiro::workflow::RunOutcome, keiro::workflow::RunError> {
    let store: Arc<dyn keiro::store::JournalStore> = h.store.clone();
    keiro_journal::run(store, key, workflow, options)
        .await
        .result
}

/// The stored step names and payloads of `key`'s journal, every generation, in append order.
pub async fn journal_steps(
    h: &Harness,
    key: &InstanceKey,
) -> Result<Vec<(String, serde_json::Value)>, keiro::store::StoreError> {
    Ok(h.store
        .journal_history(key)
        .await?
        .into_iter()
        .map(|e| {
            let encoded = e.event.encode();
            (encoded.step_name, encoded.payload)
        })
        .collect())
}
