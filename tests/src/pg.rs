//! A fresh, migrated Postgres schema per test.
//!
//! ```no_run
//! use keiro_journal::JournalStore;
//! use keiro_tests::pg::TestDb;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let db = TestDb::new().await; // keiro_test_<hex>, migrated; dropped with `db`
//! let store = db.store();
//! let key = keiro_journal::InstanceKey::parse("order", "order-1")?;
//! assert!(store.instance_get(&key).await?.is_none());
//! # Ok(()) }
//! ```

use keiro::workflow::error_chain;
use keiro_postgres::{Config, PgStore};

/// The environment variable naming the test database.
pub const TEST_DATABASE_URL: &str = "TEST_DATABASE_URL";

/// The database used when [`TEST_DATABASE_URL`] is unset: the local server of the
/// contributing guide.
pub const TEST_DATABASE_URL_DEFAULT: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Prefix of every schema a [`TestDb`] creates, so leftovers of killed test runs are easy to
/// find and drop.
pub const TEST_SCHEMA_PREFIX: &str = "keiro_test_";

/// The URL of the test database: [`TEST_DATABASE_URL`], or [`TEST_DATABASE_URL_DEFAULT`].
pub fn test_database_url() -> String {
    std::env::var(TEST_DATABASE_URL).unwrap_or_else(|_| TEST_DATABASE_URL_DEFAULT.to_owned())
}

/// One test's own schema on the test database, migrated, with a [`PgStore`] bound to it.
///
/// Each `TestDb` has a random schema, so tests run in parallel without sharing anything. The
/// schema is dropped (`DROP SCHEMA ... CASCADE`) when the `TestDb` is dropped; stores cloned
/// from it stop working then.
pub struct TestDb {
    store: PgStore,
    config: Config,
}

impl std::fmt::Debug for TestDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestDb")
            .field("schema", &self.config.schema)
            .finish_non_exhaustive()
    }
}

impl TestDb {
    /// Creates and migrates a fresh schema `keiro_test_<16 hex>` on the test database.
    ///
    /// # Panics
    ///
    /// When the database named by [`TEST_DATABASE_URL`] cannot be reached or migrated: a test
    /// that needs Postgres must fail without one, never pass silently.
    pub async fn new() -> Self {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let config = Config {
            schema: format!("{TEST_SCHEMA_PREFIX}{}", &suffix[..16]),
            ..Config::new(test_database_url())
        };
        let store = match PgStore::connect(config.clone()).await {
            Ok(store) => store,
            Err(e) => panic!(
                "cannot reach the test database {} ({}); set {TEST_DATABASE_URL} to a reachable PostgreSQL: {}",
                config.url_redacted(),
                if std::env::var(TEST_DATABASE_URL).is_ok() { "from TEST_DATABASE_URL" } else { "the default" },
                error_chain(&e),
            ),
        };
        // Built before migrating so the schema is dropped even if migrating panics below.
        let db = Self { store, config };
        if let Err(e) = db.store.migrate().await {
            panic!(
                "cannot migrate schema {} of the test database {} ({TEST_DATABASE_URL}): {}",
                db.config.schema,
                db.config.url_redacted(),
                error_chain(&e),
            );
        }
        db
    }

    /// A store bound to this schema (a cheap clone sharing one pool and one round-trip counter).
    pub fn store(&self) -> PgStore {
        self.store.clone()
    }

    /// The configuration of this schema's store, for building another store on it (a second
    /// pool, another process).
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// The database URL, for handing to a subprocess together with [`schema`](Self::schema).
    pub fn url(&self) -> &str {
        &self.config.url
    }

    /// The schema this test owns.
    pub fn schema(&self) -> &str {
        &self.config.schema
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Err(e) = self.store.drop_schema_blocking() {
            eprintln!(
                "warning: test schema {} was not dropped: {}",
                self.config.schema,
                error_chain(&e)
            );
        }
    }
}
