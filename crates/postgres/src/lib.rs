//! keiro-postgres: keiro's PostgreSQL store.
//!
//! [`PgStore`] implements `keiro_journal::JournalStore`, `keiro_lease::LeaseStore` and the
//! remote-step traits `keiro_remote::Transport` and `keiro_remote::RemoteAdmin` on
//! tokio-postgres with a deadpool-postgres pool. Every store operation is one atomic
//! transaction and one round trip: the operations that touch more than one row are plpgsql
//! functions of the embedded `crates/migrations/functions/` files, which [`PgStore::migrate`] applies after
//! the numbered migrations (tables, indexes, data).
//! Everything lives in one schema (`keiro` by default, see [`Config::schema`]), chosen by the
//! connections' `search_path`, so several installations can share a database.
//!
//! ```no_run
//! use keiro_journal::{InstanceKey, JournalStore, store::StartRequest};
//! use keiro_lease::LeaseStore;
//! use keiro_postgres::{Config, PgStore};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgStore::connect(Config::new("postgres://postgres@127.0.0.1:5432/postgres")).await?;
//! store.migrate().await?; // idempotent; safe to race
//!
//! let key = InstanceKey::parse("order", "order-42")?;
//! let request = StartRequest { key, input: serde_json::json!({ "sku": 7 }), parent: None, priority: 0, queue: None, attributes: Default::default() };
//! let started = store.instance_start(&request).await?; // idempotent by key
//! println!("{} created: {}", started.instance.key, started.created);
//!
//! let runnable = store.instances_runnable(None, Some(100)).await?;
//! println!("{} runnable, {} round trips so far", runnable.len(), store.round_trips());
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//!
//! - Each trait method is one transaction: an append and the instance-row change it causes
//!   commit together, and so does a wake with its `NOTIFY` on [`PgStore::wake_channel`].
//! - Every writer of an instance's journal locks its instance row first, so the checks of an
//!   append (recorded step, terminal row, fence) and its write see one state.
//! - Leases expire by the database clock unless a caller pins `now`.
//! - Discovery is one query on the partial index `workflows_active_idx`: terminal and parked
//!   instances cost nothing per pass.
//! - Migrations are applied under an advisory lock (waited for at most
//!   [`Config::migrate_lock_timeout`]), each with its bookkeeping row in one transaction, and an
//!   edited migration is refused. Function files are applied after them the same way, and
//!   again whenever their checksum changes.
//! - Wake sources (durable timers, awakeables, signals, child workflows) are resolved in the
//!   same transaction as the journal append they cause, through the same append rules, so a
//!   wake is never lost and never applied twice: concurrent timer workers split the due timers
//!   (`FOR UPDATE SKIP LOCKED`), a signal wait and send on one token are serialized by an
//!   advisory lock, and a child's terminal transaction journals its result into its parent.
//! - Remote steps: `PgStore` implements `keiro_remote::Transport` over the `remote_tasks`
//!   table (a claim is one round trip, `FOR UPDATE SKIP LOCKED`; a report settles the task
//!   and journals its result into the owner in one transaction) and `keiro_remote::RemoteAdmin`
//!   (redispatch, requeue with `StepReset` rows, fix-and-replay), each one function call.
//!   Parks that dispatch remote steps, from runs parking at the same moment, share one
//!   transaction and round trip (each park still atomic with its own tasks, and answered as
//!   if it had been alone).
//! - Push: `PgStore` implements `keiro_resume::Notifier` with one `LISTEN` connection per
//!   store, shared by all subscriptions, reconnected with backoff (reported as
//!   `Reconnected`), and closed when the last clone of the store is dropped.
//!
//! # Errors
//!
//! Store operations return `keiro_journal::StoreError`: a closed connection, an I/O error or a
//! pool timeout is `Unavailable`; a serialization failure or deadlock is a retryable
//! `Database` error; anything else a database refuses is a non-retryable `Database` error;
//! rows that do not read as keiro data are `Malformed`. Connecting, configuring and migrating
//! return this crate's [`Error`].

mod config;
mod conninfo;
mod db;
mod error;
mod function_set;
mod impls;
mod in_transaction;
mod inspect;
mod lanes;
mod listen;
mod migrate;
mod ops;
mod payloads;
mod readiness;
mod retention;
mod row;
mod schedule;
mod scratch;
mod session;
mod store;
mod stream_in;
mod tls;
mod transaction_step;
mod versions;

pub use config::{
    Config, ACQUIRE_TIMEOUT_DEFAULT, APPLICATION_NAME_DEFAULT, BATCHES_IN_FLIGHT_DEFAULT,
    BATCH_LEN_MAX_DEFAULT, CONNECT_TIMEOUT_DEFAULT, LISTEN_CHECK_INTERVAL_DEFAULT,
    LISTEN_CHECK_TIMEOUT_DEFAULT, MIGRATE_LOCK_TIMEOUT_DEFAULT, POOL_SIZE_DEFAULT, POOL_SIZE_MIN,
    SCHEMA_DEFAULT, SCHEMA_LEN_MAX, TRANSACTION_ISOLATION, URL_DEFAULT,
};
pub use error::{Error, Result};
pub use function_set::FunctionFiles;
pub use in_transaction::InTransaction;
pub use lanes::{BatchStats, CallTime, LaneStats};
pub use migrate::Migrated;
pub use scratch::DROP_SCHEMA_LOCK_TIMEOUT;
pub use store::PgStore;
pub use stream_in::{write_stream_in, StreamInError};
pub use tls::{SslMode, TlsConnector, UnknownSslMode};
pub use transaction_step::{
    TransactionFailure, TransactionOptions, TransactionStage, TransactionStep,
    SERIALIZATION_TRIES_MAX,
};

/// The driver, re-exported for the transaction step's closures (`tokio_postgres::Transaction`,
/// `tokio_postgres::Error`) so their types match keiro's own.
pub use tokio_postgres;

/// The exact statements behind the store's hot reads, for the plan tests (and anyone checking a
/// plan on their own database): `EXPLAIN` them to see which index serves each.
///
/// ```no_run
/// # async fn demo(client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
/// let plan = client
///     .query(&format!("EXPLAIN {}", keiro_postgres::plans::INSTANCES_RUNNABLE), &[&None::<time::OffsetDateTime>, &Some(10_i64)])
///     .await?;
/// # let _ = plan; Ok(()) }
/// ```
pub mod plans {
    pub use crate::inspect::{ListStatement, INSTANCES_THROUGHPUT, INSTANCE_WAITS};
    pub use crate::ops::lease::INSTANCES_RUNNABLE;
    pub use crate::retention::INSTANCES_GC_CANDIDATES;
}

/// Migrating as another build of keiro would, for upgrade tests: an older build during a
/// rolling deploy, or successive builds migrating a schema step by step. Import the trait to
/// call its methods on a [`PgStore`].
///
/// ```no_run
/// # async fn demo(store: keiro_postgres::PgStore) -> Result<(), keiro_postgres::Error> {
/// use keiro_postgres::builds::OtherBuild as _;
/// let applied = store.migrate_to(1).await?;
/// # let _ = applied; Ok(()) }
/// ```
pub mod builds {
    use std::future::Future;

    use crate::{Migrated, PgStore, Result};

    /// [`PgStore::migrate_report`] as another build would run it.
    pub trait OtherBuild {
        /// As a build whose function files are `files` (each a name and its statements, in
        /// order) at `revision` runs it, such as an older build during a rolling deploy.
        ///
        /// # Errors
        ///
        /// Those of [`PgStore::migrate`].
        fn migrate_as_build(
            &self,
            revision: i32,
            files: &[(&'static str, &'static str)],
        ) -> impl Future<Output = Result<Migrated>>;

        /// [`migrate_as_build`](Self::migrate_as_build) as a build that knows the migrations up
        /// to `migrations` only, such as the previous build of a rolling deploy that adds one.
        ///
        /// # Errors
        ///
        /// Those of [`PgStore::migrate`]; [`Error::Config`](crate::Error::Config) for a
        /// migration this build does not have.
        fn migrate_as_older_build(
            &self,
            migrations: i32,
            revision: i32,
            files: &[(&'static str, &'static str)],
        ) -> impl Future<Output = Result<Migrated>>;

        /// [`PgStore::migrate`], but only the migrations up to `version`, and the function files
        /// only once `version` is the newest this build knows; returns the versions applied.
        ///
        /// # Errors
        ///
        /// Those of [`PgStore::migrate`].
        fn migrate_to(&self, version: i32) -> impl Future<Output = Result<Vec<i32>>>;
    }

    impl OtherBuild for PgStore {
        fn migrate_as_build(
            &self,
            revision: i32,
            files: &[(&'static str, &'static str)],
        ) -> impl Future<Output = Result<Migrated>> {
            self.migrator().as_build(revision, files)
        }

        fn migrate_as_older_build(
            &self,
            migrations: i32,
            revision: i32,
            files: &[(&'static str, &'static str)],
        ) -> impl Future<Output = Result<Migrated>> {
            self.migrator().as_older_build(migrations, revision, files)
        }

        fn migrate_to(&self, version: i32) -> impl Future<Output = Result<Vec<i32>>> {
            self.migrator().to_version(version)
        }
    }
}
