//! The migration runner: the numbered files of the workspace's `migrations/` folder, embedded
//! at build time and applied in order to the store's schema.
//!
//! Runners race safely: each takes a session advisory lock keyed on the schema before it looks
//! at anything, so the second one waits and then finds nothing left to do. Each file is applied
//! in one transaction together with its bookkeeping row in `keiro_migrations`, so a failure
//! leaves no half-applied migration. A file that was applied with a different checksum is
//! refused: migrations are never edited once shipped, later files change what earlier ones did.
//!
//! Only applying needs privileges beyond a running role's: what is applied is read first (a
//! catalog lookup, then a plain SELECT on the bookkeeping table), so a role without CREATE on
//! an up-to-date schema migrates as a no-op, and one that would need it is told so before
//! anything is attempted.

use deadpool_postgres::Object;
use sha2::{Digest, Sha256};
use tokio_postgres::types::Type;

use crate::error::{Error, Failure, Result};
use crate::PgStore;

/// One embedded migration file.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration this build knows, in order. Numbers are never reused or renumbered.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../../migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "wake_sources",
        sql: include_str!("../../../migrations/0002_wake_sources.sql"),
    },
    Migration {
        version: 3,
        name: "claim_batch",
        sql: include_str!("../../../migrations/0003_claim_batch.sql"),
    },
    Migration {
        version: 4,
        name: "hot_path",
        sql: include_str!("../../../migrations/0004_hot_path.sql"),
    },
    Migration {
        version: 5,
        name: "remote_steps",
        sql: include_str!("../../../migrations/0005_remote_steps.sql"),
    },
    Migration {
        version: 6,
        name: "claim_order",
        sql: include_str!("../../../migrations/0006_claim_order.sql"),
    },
    Migration {
        version: 7,
        name: "remote_hot_path",
        sql: include_str!("../../../migrations/0007_remote_hot_path.sql"),
    },
    Migration {
        version: 8,
        name: "remote_claim_attempts",
        sql: include_str!("../../../migrations/0008_remote_claim_attempts.sql"),
    },
    Migration {
        version: 9,
        name: "function_search_path",
        sql: include_str!("../../../migrations/0009_function_search_path.sql"),
    },
    Migration {
        version: 10,
        name: "cancel_remote_tasks",
        sql: include_str!("../../../migrations/0010_cancel_remote_tasks.sql"),
    },
    Migration {
        version: 11,
        name: "signal_ttl_and_children",
        sql: include_str!("../../../migrations/0011_signal_ttl_and_children.sql"),
    },
    Migration {
        version: 12,
        name: "settle_abandoned_awakeables",
        sql: include_str!("../../../migrations/0012_settle_abandoned_awakeables.sql"),
    },
    Migration {
        version: 13,
        name: "requeue_unhandled_failures",
        sql: include_str!("../../../migrations/0013_requeue_unhandled_failures.sql"),
    },
    Migration {
        version: 14,
        name: "settle_leftovers_of_completed_runs",
        sql: include_str!("../../../migrations/0014_settle_leftovers_of_completed_runs.sql"),
    },
    Migration {
        version: 15,
        name: "list_and_retention_indexes",
        sql: include_str!("../../../migrations/0015_list_and_retention_indexes.sql"),
    },
    Migration {
        version: 16,
        name: "notify_terminal",
        sql: include_str!("../../../migrations/0016_notify_terminal.sql"),
    },
    Migration {
        version: 17,
        name: "schedules",
        sql: include_str!("../../../migrations/0017_schedules.sql"),
    },
];

const MIGRATE: &str = "migrating the schema";

impl Migration {
    fn checksum(&self) -> Vec<u8> {
        Sha256::digest(self.sql.as_bytes()).to_vec()
    }
}

/// The advisory lock key of a schema's migrations: the first eight bytes of a hash of a
/// keiro-specific label, so it neither collides across schemas nor with other applications'
/// small integer keys, and stays the same across builds.
fn lock_key(schema: &str) -> i64 {
    let digest = Sha256::digest(format!("keiro.migrate:{schema}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

const MIGRATE_LOCK: &str = "SELECT pg_advisory_lock($1)";
const MIGRATE_UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

impl PgStore {
    /// Creates the schema if needed and applies every migration it lacks, in order. Returns
    /// the versions applied by this call: empty when the schema was up to date.
    ///
    /// Safe to run from many processes at once, and at every start. On an up-to-date schema it
    /// only reads, so a role with no CREATE privilege (one that only runs workflows) can call it
    /// too; applying a migration needs CREATE on the schema (on the database, when the schema is
    /// missing) and ownership of keiro's tables and functions, which the role that first
    /// migrated the schema has.
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
    /// [`Error::MigrationChanged`] when an applied migration differs from the embedded file
    /// (nothing is applied then); [`Error::MigrationPrivilege`] when a migration is pending and
    /// the role lacks the CREATE privilege applying it needs (nothing is applied then);
    /// [`Error::Migration`] when a file fails to apply (its transaction is rolled back);
    /// [`Error::Unavailable`] or [`Error::Database`] otherwise.
    pub async fn migrate(&self) -> Result<Vec<i32>> {
        let mut client = self
            .pool()
            .get()
            .await
            .map_err(|e| Failure::from(e).into_error(MIGRATE))?;
        let key = lock_key(self.schema());
        self.count_round_trips(1);
        client
            .query_typed(MIGRATE_LOCK, &[(&key, Type::INT8)])
            .await
            .map_err(|e| Failure::from(e).into_error(MIGRATE))?;
        let migrated = self.migrate_locked(&mut client).await;
        self.count_round_trips(1);
        if client
            .query_typed(MIGRATE_UNLOCK, &[(&key, Type::INT8)])
            .await
            .is_err()
        {
            // The lock is held by the session: closing the connection instead of returning it
            // to the pool is what releases it.
            drop(Object::take(client));
        }
        migrated
    }

    async fn migrate_locked(&self, client: &mut Object) -> Result<Vec<i32>> {
        let state = self.schema_state(client).await?;
        let applied = if state.bookkept {
            self.migrations_applied(client).await?
        } else {
            Vec::new()
        };
        // Every applied file is checked before anything is applied, so an edited migration
        // stops the run with the schema untouched.
        for migration in MIGRATIONS {
            if let Some((_, checksum)) = applied.iter().find(|(v, _)| *v == migration.version) {
                if *checksum != migration.checksum() {
                    return Err(Error::MigrationChanged {
                        schema: self.schema().to_owned(),
                        version: migration.version,
                        name: migration.name,
                    });
                }
            }
        }
        let newest = MIGRATIONS.last().map_or(0, |m| m.version);
        if let Some((version, _)) = applied.iter().find(|(v, _)| *v > newest) {
            // A newer build migrated this schema; its files only add, so this build keeps
            // working, but whoever rolled back should know.
            tracing::warn!(
                schema = self.schema(),
                version,
                "the schema has a migration this build does not know"
            );
        }
        let pending: Vec<&Migration> = MIGRATIONS
            .iter()
            .filter(|m| !applied.iter().any(|(v, _)| *v == m.version))
            .collect();
        let Some(first) = pending.first() else {
            return Ok(Vec::new());
        };
        if !state.may_create {
            let privilege = if state.schema_exists {
                format!("CREATE on schema {}", self.schema())
            } else {
                format!("CREATE on database {}", state.database)
            };
            return Err(Error::MigrationPrivilege {
                schema: self.schema().to_owned(),
                version: first.version,
                name: first.name,
                privilege,
            });
        }
        self.schema_create(client, &state).await?;
        let mut done = Vec::new();
        for migration in pending {
            self.migration_apply(client, migration)
                .await
                .map_err(|source| Error::Migration {
                    schema: self.schema().to_owned(),
                    version: migration.version,
                    name: migration.name,
                    source: Box::new(source),
                })?;
            tracing::info!(
                schema = self.schema(),
                version = migration.version,
                name = migration.name,
                "applied migration"
            );
            done.push(migration.version);
        }
        Ok(done)
    }
}

/// What is there before anything is applied, read from the catalogs, which every role may read.
struct SchemaState {
    schema_exists: bool,
    /// Whether the bookkeeping table exists.
    bookkept: bool,
    /// Whether the role may create what is missing: on the schema, or on the database when the
    /// schema itself is missing.
    may_create: bool,
    /// The database's name, for the message of a missing privilege.
    database: String,
}

const SCHEMA_STATE: &str = "SELECT n.oid IS NOT NULL, \
         EXISTS (SELECT 1 FROM pg_class c \
                 WHERE c.relnamespace = n.oid AND c.relname = 'keiro_migrations'), \
         CASE WHEN n.oid IS NULL THEN has_database_privilege(current_database(), 'CREATE') \
              ELSE has_schema_privilege(n.oid, 'CREATE') END, \
         current_database()::text \
     FROM (SELECT $1::text AS name) s LEFT JOIN pg_namespace n ON n.nspname = s.name";
const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS keiro_migrations ( \
         version    integer PRIMARY KEY, \
         name       text NOT NULL, \
         checksum   bytea NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now())";

impl PgStore {
    /// Reads what exists and what the role may create, touching nothing.
    async fn schema_state(&self, client: &Object) -> Result<SchemaState> {
        let fail = |e| Failure::from(e).into_error(MIGRATE);
        self.count_round_trips(1);
        let row = client
            .query_typed_one(SCHEMA_STATE, &[(&self.schema(), Type::TEXT)])
            .await
            .map_err(fail)?;
        Ok(SchemaState {
            schema_exists: row.try_get(0).map_err(fail)?,
            bookkept: row.try_get(1).map_err(fail)?,
            may_create: row.try_get(2).map_err(fail)?,
            database: row.try_get(3).map_err(fail)?,
        })
    }

    /// Creates the schema and the bookkeeping table when missing.
    async fn schema_create(&self, client: &Object, state: &SchemaState) -> Result<()> {
        // Only when missing: even with `IF NOT EXISTS`, `CREATE SCHEMA` demands CREATE on the
        // database and `CREATE TABLE` CREATE on the schema when there is nothing to create.
        if !state.schema_exists {
            // DDL takes no bind parameters for identifiers. The name is a validated plain
            // identifier ([a-z_][a-z0-9_]*), so quoting it is all it needs.
            let create = format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", self.schema());
            self.count_round_trips(1);
            client
                .batch_execute(&create)
                .await
                .map_err(|e| Failure::from(e).into_error(MIGRATE))?;
        }
        if state.bookkept {
            return Ok(());
        }
        // Unqualified: it lands in the connection's search_path, the store's schema.
        self.count_round_trips(1);
        client
            .batch_execute(MIGRATIONS_TABLE)
            .await
            .map_err(|e| Failure::from(e).into_error(MIGRATE))
    }
}

const MIGRATIONS_APPLIED: &str = "SELECT version, checksum FROM keiro_migrations ORDER BY version";

impl PgStore {
    /// The versions and checksums already applied.
    async fn migrations_applied(&self, client: &Object) -> Result<Vec<(i32, Vec<u8>)>> {
        self.count_round_trips(1);
        let rows = client
            .query_typed(MIGRATIONS_APPLIED, &[])
            .await
            .map_err(|e| Failure::from(e).into_error(MIGRATE))?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| Failure::from(e).into_error(MIGRATE))
    }
}

const MIGRATION_RECORD: &str =
    "INSERT INTO keiro_migrations (version, name, checksum) VALUES ($1, $2, $3)";

impl PgStore {
    /// Applies one file and records it, in one transaction.
    async fn migration_apply(&self, client: &mut Object, migration: &Migration) -> Result<()> {
        const APPLY: &str = "applying a migration";
        let fail = |e| Failure::from(e).into_error(APPLY);
        self.count_round_trips(1);
        let tx = client.transaction().await.map_err(fail)?;
        self.count_round_trips(1);
        tx.batch_execute(migration.sql).await.map_err(fail)?;
        self.count_round_trips(1);
        tx.query_typed(
            MIGRATION_RECORD,
            &[
                (&migration.version, Type::INT4),
                (&migration.name, Type::TEXT),
                (&migration.checksum(), Type::BYTEA),
            ],
        )
        .await
        .map_err(fail)?;
        self.count_round_trips(1);
        tx.commit().await.map_err(fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_from_one_without_gaps() {
        for (i, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(
                usize::try_from(migration.version).unwrap(),
                i + 1,
                "{}",
                migration.name
            );
            assert!(!migration.sql.trim().is_empty());
        }
    }

    #[test]
    fn lock_keys_differ_per_schema_and_are_stable() {
        assert_ne!(lock_key("keiro"), lock_key("keiro_test_a"));
        assert_eq!(lock_key("keiro"), lock_key("keiro"));
    }
}
