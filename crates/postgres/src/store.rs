//! The store handle: a connection pool bound to one schema, and the round-trip counter.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use keiro_journal::{batch::BatchLimits, StoreError};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::config::{Config, WAKE_CHANNEL_SUFFIX};
use crate::db::Db;
use crate::error::{Error, Failure, Result};
use crate::lanes::{BatchStats, Lanes};
use crate::listen::Hub;
use crate::migrate::{Migrated, Runner};
use crate::readiness::{self, SchemaCheck};
use crate::tls::{rustls_error, TlsConnector};

/// keiro's Postgres store: every store trait of `keiro-journal`, `keiro-lease` and
/// `keiro-remote` over a `deadpool-postgres` pool whose connections all use one schema.
///
/// Cloning is cheap and shares the pool, the counter and the wake listener (see the
/// `keiro_resume::Notifier` impl), which stops when the last clone is dropped. Build it with [`PgStore::connect`],
/// then [`migrate`](PgStore::migrate) once per deploy (idempotent, safe to race).
///
/// ```no_run
/// use keiro_postgres::{Config, PgStore};
///
/// # async fn demo() -> Result<(), keiro_postgres::Error> {
/// let store = PgStore::connect(Config::new("postgres://postgres@127.0.0.1/postgres")).await?;
/// store.migrate().await?;
/// assert_eq!(store.wake_channel(), "keiro.wake");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The pool, the schema and the round-trip counter the operations run on.
    db: Arc<Db>,
    wake_channel: String,
    connection: tokio_postgres::Config,
    tls: TlsConnector,
    /// How long [`PgStore::migrate`] waits for another runner's migration lock.
    migrate_lock_timeout: Duration,
    /// The push notifications: one LISTEN connection, started by the first subscription and
    /// stopped when this is dropped.
    wakes: Hub,
    /// The group-commit lanes (appends, starts, parks), each started by its first call; they
    /// know whether calls go through them ([`Config::batching`]) and how they cut batches.
    lanes: Lanes,
    /// What resets a connection a transaction step lent to the user's closure (`session`).
    session_reset: String,
    /// The application version pinned on every connection ([`Config::app_version`]).
    app_version: String,
}

/// A handle that does not keep the store (nor its listener) alive: what a subscription holds.
#[derive(Clone)]
pub(crate) struct WeakStore(Weak<Inner>);

impl WeakStore {
    /// The store, while any [`PgStore`] clone is alive.
    pub(crate) fn upgrade(&self) -> Option<PgStore> {
        self.0.upgrade().map(|inner| PgStore { inner })
    }
}

impl PgStore {
    /// Validates `config`, builds the pool and opens one connection, so an unreachable or
    /// misconfigured database shows here rather than at the first operation. Does not migrate,
    /// but checks on that connection whether the schema holds what this build needs: until it
    /// does (until [`migrate`](Self::migrate) or another process migrates it), every operation
    /// answers [`StoreError::SchemaNotMigrated`], naming the schema, instead of whatever
    /// PostgreSQL finds missing.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), keiro_postgres::Error> {
    /// use keiro_postgres::{Config, PgStore};
    /// let config = Config { schema: "billing".into(), ..Config::new("postgres://app@db/app") };
    /// match PgStore::connect(config).await {
    ///     Ok(store) => println!("connected to schema {}", store.schema()),
    ///     Err(e) if e.is_unavailable() => eprintln!("database down, retry later: {e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an invalid config; [`Error::Unavailable`] when the database cannot
    /// be reached within [`Config::connect_timeout`]; [`Error::Tls`] when the TLS handshake
    /// fails (a certificate `verify-ca` or `verify-full` refuses); [`Error::Database`] when the
    /// server refuses the connection (unknown database, authentication, no TLS under
    /// `sslmode=require`).
    pub async fn connect(config: Config) -> Result<Self> {
        const CONNECT: &str = "connecting to the database";
        let store = Self::connect_lazy(config)?;
        let first = store.pool().get().await.map_err(|e| {
            // A refused certificate is refused again: not an outage to wait out.
            if rustls_error(&e).is_some() {
                return Error::Tls {
                    operation: CONNECT,
                    mode: store.inner.tls.mode(),
                    source: Box::new(e),
                };
            }
            Failure::from(e).into_error(CONNECT)
        })?;
        // On the connection just opened, not counted as an operation's round trips. A check
        // that fails (a role that may not read the catalogs) leaves the schema unchecked: the
        // operations' own errors still name a missing object.
        match readiness::check(&first, store.schema()).await {
            Ok(found) => store.schema_check().set(&found),
            Err(error) => tracing::debug!(%error, "checking the schema failed"),
        }
        // Back into the pool: the first operation reuses it.
        drop(first);
        Ok(store)
    }

    /// Validates `config` and builds the pool without opening a connection; the first
    /// operation connects. Needs no runtime until then.
    ///
    /// ```
    /// let store = keiro_postgres::PgStore::connect_lazy(keiro_postgres::Config::default())?;
    /// assert_eq!(store.schema(), "keiro");
    /// assert_eq!(store.round_trips(), 0);
    /// # Ok::<(), keiro_postgres::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for an invalid config.
    pub fn connect_lazy(config: Config) -> Result<Self> {
        config.validate_fields()?;
        let connection = config.connection_config()?;
        let tls = config.tls_connector()?;
        let wakes = Hub::new(&config, &connection, &tls);
        let session_reset = crate::session::reset_sql(&config.session_settings());
        let manager = Manager::from_config(
            connection.clone(),
            tls.clone(),
            ManagerConfig {
                // No statement on checkout: a broken connection surfaces as `Unavailable` on
                // its first use, and every statement the store sends stays counted.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size)
            .wait_timeout(Some(config.acquire_timeout))
            .create_timeout(Some(config.connect_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| Error::Database {
                operation: "building the connection pool",
                retryable: false,
                source: Box::new(e),
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                wake_channel: format!("{}{WAKE_CHANNEL_SUFFIX}", config.schema),
                db: Arc::new(Db::new(pool, config.schema)),
                connection,
                tls,
                migrate_lock_timeout: config.migrate_lock_timeout,
                wakes,
                lanes: Lanes::new(
                    config.batching,
                    BatchLimits {
                        len_max: config.batch_len_max,
                        in_flight: config.batch_in_flight,
                    },
                ),
                session_reset,
                app_version: config.app_version,
            }),
        })
    }

    /// The connection pool, for queries of your own in keiro's schema (every connection's
    /// `search_path` is [`schema`](Self::schema)). Statements sent through it directly are
    /// not counted by [`round_trips`](Self::round_trips).
    pub fn pool(&self) -> &Pool {
        self.inner.db.pool()
    }

    /// The schema this store works in.
    pub fn schema(&self) -> &str {
        self.inner.db.schema()
    }

    /// The application version this store records on the runs it starts
    /// ([`Config::app_version`]); empty when unversioned.
    pub fn app_version(&self) -> &str {
        &self.inner.app_version
    }

    /// The channel wake notifications are sent on: `<schema>.wake`, with the payload
    /// `<workflow_name>/<workflow_id>`, in the same transaction as the change that causes them.
    /// It contains a dot, so `LISTEN` needs it double-quoted.
    pub fn wake_channel(&self) -> &str {
        &self.inner.wake_channel
    }

    /// The driver settings every pooled connection uses (including the `search_path` option),
    /// for opening a dedicated connection such as a `LISTEN` one.
    pub fn connection_config(&self) -> &tokio_postgres::Config {
        &self.inner.connection
    }

    /// Puts keiro's session settings ([`Config::session_settings`]: the schema as
    /// `search_path`, READ COMMITTED as the default isolation) back on `client`, a connection of
    /// this store's pool that something changed them on (a `SET` without `LOCAL`, `DISCARD
    /// ALL`, `SET SESSION CHARACTERISTICS`), so it runs keiro's statements as a fresh pooled
    /// connection does. One statement, for the rest of the session.
    ///
    /// ```no_run
    /// # async fn demo(store: keiro_postgres::PgStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let client = store.pool().get().await?;
    /// client.batch_execute("SET search_path TO public").await?;
    /// store.restore_session(&**client).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Database`] or [`Error::Unavailable`] when the statement fails.
    pub async fn restore_session<C>(&self, client: &C) -> Result<()>
    where
        C: tokio_postgres::GenericClient + Sync + ?Sized,
    {
        const RESTORE: &str = "restoring keiro's session settings";
        // `set_config(.., false)` is `SET` with bind parameters: the values are never spliced
        // into the statement.
        const SESSION_RESTORE: &str = "SELECT set_config(s.name, s.value, false) \
             FROM unnest($1::text[], $2::text[]) AS s(name, value)";
        let settings = crate::config::session_settings(self.schema(), self.app_version());
        let names: Vec<&str> = settings.iter().map(|(name, _)| *name).collect();
        let values: Vec<&str> = settings.iter().map(|(_, value)| value.as_str()).collect();
        client
            .execute(SESSION_RESTORE, &[&names, &values])
            .await
            .map_err(|e| Failure::from(e).into_error(RESTORE))?;
        Ok(())
    }

    /// The TLS connector every pooled connection uses (the URL's `sslmode` and
    /// `sslrootcert`), for a dedicated connection with [`connection_config`](Self::connection_config).
    ///
    /// ```no_run
    /// # async fn demo(store: keiro_postgres::PgStore) -> Result<(), tokio_postgres::Error> {
    /// let (client, connection) =
    ///     store.connection_config().connect(store.tls_connector().clone()).await?;
    /// tokio::spawn(connection);
    /// # Ok(()) }
    /// ```
    pub fn tls_connector(&self) -> &TlsConnector {
        &self.inner.tls
    }

    /// How many round trips to the server this store has made since it was built: every
    /// statement executed, plus every statement prepared (once per statement per connection);
    /// a group-commit batch counts two (its statement, written together with its `BEGIN`, and
    /// its `COMMIT`).
    /// Opening connections is not counted (nor the schema check [`connect`](Self::connect)
    /// makes on its first), nor is the wake listener's `LISTEN`. Benchmarks divide it by the work done.
    ///
    /// ```no_run
    /// # async fn demo(store: keiro_postgres::PgStore, key: keiro_journal::InstanceKey) -> Result<(), Box<dyn std::error::Error>> {
    /// use keiro_journal::JournalStore;
    /// let before = store.round_trips();
    /// store.instance_get(&key).await?;
    /// assert!(store.round_trips() - before <= 2); // 1 once the statement is prepared
    /// # Ok(()) }
    /// ```
    pub fn round_trips(&self) -> u64 {
        self.inner.db.round_trips()
    }

    /// The push-notification hub.
    pub(crate) fn wakes(&self) -> &Hub {
        &self.inner.wakes
    }

    /// The group-commit lanes.
    pub(crate) fn lanes(&self) -> &Lanes {
        &self.inner.lanes
    }

    /// The pool the operations run on.
    pub(crate) fn db(&self) -> &Arc<Db> {
        &self.inner.db
    }

    /// Whether concurrent calls share transactions ([`Config::batching`]).
    ///
    /// ```
    /// use keiro_postgres::{Config, PgStore};
    /// let store = PgStore::connect_lazy(Config::default().batching(false))?;
    /// assert!(!store.batching());
    /// # Ok::<(), keiro_postgres::Error>(())
    /// ```
    pub fn batching(&self) -> bool {
        self.inner.lanes.batching()
    }

    /// What each group-commit lane sent so far: batches and the calls they carried, so a
    /// caller can tell how many calls shared each commit. Counters only grow; take two reads
    /// and [`BatchStats::since`] for a phase.
    ///
    /// ```
    /// use keiro_postgres::{Config, PgStore};
    /// let store = PgStore::connect_lazy(Config::default())?;
    /// let stats = store.batch_stats();
    /// assert_eq!(stats.appends.batches, 0);
    /// assert_eq!(stats.appends.mean_len(), None);
    /// # Ok::<(), keiro_postgres::Error>(())
    /// ```
    pub fn batch_stats(&self) -> BatchStats {
        self.inner.lanes.stats()
    }

    /// A handle that does not keep the store alive.
    pub(crate) fn downgrade(&self) -> WeakStore {
        WeakStore(Arc::downgrade(&self.inner))
    }

    /// The migration runner on this store's pool and schema: [`migrate`](Self::migrate), and
    /// the other builds' runs of [`builds`](crate::builds).
    pub(crate) fn migrator(&self) -> Runner<'_> {
        Runner {
            pool: self.pool(),
            schema: self.schema(),
            lock_timeout: self.inner.migrate_lock_timeout,
            round_trips: self.inner.db.as_ref(),
        }
    }

    /// The statements that reset a connection after a transaction step (`session`).
    pub(crate) fn session_reset(&self) -> &str {
        &self.inner.session_reset
    }

    pub(crate) fn count_round_trips(&self, n: u64) {
        self.inner.db.count_round_trips(n);
    }

    /// What this store knows of its schema.
    pub(crate) fn schema_check(&self) -> &SchemaCheck {
        self.inner.db.schema_check()
    }

    /// A pooled connection for one store operation ([`Db::client`]).
    pub(crate) async fn client(&self, operation: &'static str) -> Result<Object, StoreError> {
        self.inner.db.client(operation).await
    }

    /// The store error of a failed statement of `operation` ([`Db::failed`]).
    pub(crate) fn failed(
        &self,
        operation: &'static str,
        error: tokio_postgres::Error,
    ) -> StoreError {
        self.inner.db.failed(operation, error)
    }

    /// Runs one prepared statement and returns its rows ([`Db::query`]).
    pub(crate) async fn query(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        self.inner.db.query(operation, sql, params).await
    }

    /// Runs one prepared statement that returns exactly one row ([`Db::query_one`]).
    pub(crate) async fn query_one(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, StoreError> {
        self.inner.db.query_one(operation, sql, params).await
    }

    /// Runs one prepared statement and returns the number of rows it changed
    /// ([`Db::execute`]).
    pub(crate) async fn execute(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        self.inner.db.execute(operation, sql, params).await
    }
}

impl PgStore {
    /// Creates the schema if needed, applies every migration it lacks, in order, then every
    /// function file that is new or changed. Returns the migration versions applied by this
    /// call: empty when no migration was pending ([`migrate_report`](Self::migrate_report) also
    /// says what became of the function files).
    ///
    /// Safe to run from many processes at once, and at every start. On an up-to-date schema it
    /// only reads, so a role with no CREATE privilege (one that only runs workflows) can call it
    /// too; applying a migration or a function file needs CREATE on the schema (on the
    /// database, when the schema is missing) and ownership of keiro's tables and functions,
    /// which the role that first migrated the schema has.
    ///
    /// ```no_run
    /// # async fn demo(store: keiro_postgres::PgStore) -> Result<(), keiro_postgres::Error> {
    /// let applied = store.migrate().await?;
    /// println!("applied {applied:?}");
    /// assert!(store.migrate().await?.is_empty());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::MigrationChanged`] when an applied migration differs from the embedded file,
    /// [`Error::FunctionRevisionChanged`] when the schema records this build's function-files
    /// revision with other files (nothing is applied then); [`Error::MigrationLocked`] when
    /// another runner holds the schema's migration lock for longer than
    /// [`Config::migrate_lock_timeout`](crate::Config#structfield.migrate_lock_timeout);
    /// [`Error::MigrationPrivilege`] or [`Error::FunctionFilePrivilege`] when something is
    /// pending and the role lacks the CREATE privilege applying it needs (nothing is applied
    /// then); [`Error::Migration`] or [`Error::FunctionFile`] when a file fails to apply (its
    /// transaction is rolled back); [`Error::Unavailable`] or [`Error::Database`] otherwise.
    pub async fn migrate(&self) -> Result<Vec<i32>> {
        Ok(self.migrate_report().await?.migrations)
    }

    /// [`migrate`](Self::migrate), returning what it did with the function files too: applied
    /// (which), already in place, or left alone (and why). `keiro migrate` prints it.
    ///
    /// ```no_run
    /// # async fn demo(store: keiro_postgres::PgStore) -> Result<(), keiro_postgres::Error> {
    /// use keiro_postgres::FunctionFiles;
    ///
    /// let report = store.migrate_report().await?;
    /// if let FunctionFiles::NewerRevision { ours, schema } = report.functions {
    ///     println!("a newer build's function files (revision {schema} > {ours}) stay");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Those of [`migrate`](Self::migrate).
    pub async fn migrate_report(&self) -> Result<Migrated> {
        let migrated = self.migrator().this_build().await?;
        // Every migration of this build is applied and its files (or a newer build's) are in
        // place: operations stop checking the schema first.
        self.schema_check().migrated();
        Ok(migrated)
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.pool().status();
        f.debug_struct("PgStore")
            .field("schema", &self.schema())
            .field("pool_size", &status.size)
            .field("pool_max_size", &status.max_size)
            .field("round_trips", &self.round_trips())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lazy_store_is_bound_to_its_schema_and_channel() {
        let store = PgStore::connect_lazy(Config {
            schema: "tenant_a".into(),
            ..Config::default()
        })
        .unwrap();
        assert_eq!(store.schema(), "tenant_a");
        assert_eq!(store.wake_channel(), "tenant_a.wake");
        assert_eq!(
            store.connection_config().get_options(),
            Some(r"-c search_path=tenant_a -c default_transaction_isolation=read\ committed")
        );
        assert!(format!("{store:?}").contains("tenant_a"));
    }
}
