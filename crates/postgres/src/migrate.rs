//! The migration runner: the numbered migrations and the function files of `keiro-migrations`,
//! embedded at build time, applied to the store's schema.
//!
//! Runners race safely: each takes a session advisory lock keyed on the schema before it looks
//! at anything, so the second one waits and then finds nothing left to do. It waits at most
//! [`Config::migrate_lock_timeout`](crate::Config#structfield.migrate_lock_timeout), then fails
//! with [`Error::MigrationLocked`] rather than hang behind a runner that never finishes.
//!
//! Numbered migrations hold tables, indexes and data changes. Each is applied in one
//! transaction together with its bookkeeping row in `keiro_migrations`, so a failure leaves no
//! half-applied migration. A file that was applied with a different checksum is refused:
//! migrations are never edited once shipped, later files change what earlier ones did. The one
//! exception is the rewrite that moved every function out of 0001-0016: the checksum each of
//! those files shipped with is accepted too.
//!
//! Functions (and the triggers that call them) live one group per file, each function in its
//! current form only, and are applied after the pending migrations: each file that is new to
//! the schema or whose checksum differs from the one recorded in `keiro_functions` is applied
//! (every statement is `CREATE OR REPLACE`) in one transaction with its new bookkeeping row; an
//! unchanged file costs nothing. A schema that a newer build migrated keeps that build's
//! functions: they are skipped, with a warning. A build is newer when the schema holds a
//! migration it does not know, or, between builds with the same migrations (a rolling deploy,
//! where old and new processes both migrate at start), when its files have a higher revision.
//! The files as a whole carry one revision, raised with every change and recorded in
//! `keiro_function_revisions` with their combined checksum once they are in place; without it
//! the two builds would put back their own bodies in turn at every start. The same revision
//! with other files is [`Error::FunctionRevisionChanged`]: a unit test keeps a build from
//! shipping a changed file under an old revision, and this keeps two such builds apart.
//!
//! Only applying needs privileges beyond a running role's: what is applied is read first (a
//! catalog lookup, then plain SELECTs on the bookkeeping tables), so a role without CREATE on
//! an up-to-date schema migrates as a no-op, and one that would need it is told so before
//! anything is attempted.
//!
//! The runner ([`Runner`]) works on the store's parts (its pool, schema, lock timeout and
//! round-trip counter), never on the store handle: [`PgStore::migrate`](crate::PgStore::migrate)
//! builds one, and the schema check (`readiness`), which the pool (`db`) runs below the store,
//! reads this build's migrations from here.

use std::time::{Duration, Instant};

use deadpool_postgres::{Object, Pool};
use keiro_journal::Backoff;
use sha2::{Digest, Sha256};
use tokio_postgres::types::{ToSql, Type};

use crate::error::{Error, Failure, Result};
use keiro_migrations::{Migration, FUNCTION_FILES, MIGRATIONS};

use crate::function_set::{
    file_checksum, FunctionFile, FunctionFiles, FunctionSet, FunctionsPlan, FunctionsRecorded,
};

/// The revision of [`FUNCTION_FILES`], raised by one with every change to a function file of
/// `keiro-migrations` (or to that list), so that of two builds migrating one schema only the one
/// with the newer files applies them.
const FUNCTIONS_REVISION: i32 = 22;

/// The combined checksum (hex) of [`FUNCTION_FILES`] at [`FUNCTIONS_REVISION`], as
/// [`FunctionSet::checksum`] computes it: the unit test
/// `the_function_files_revision_is_raised_with_every_change` compares the two, so a changed
/// file cannot ship under the revision of the old one. The runner records the checksum it
/// computes, so a build whose files differ from this one's refuses this one's revision.
#[cfg(test)]
const FUNCTIONS_REVISION_CHECKSUM: &str =
    "2e6a0f40652e7d6d7fe09fe3a655991a3eebb9d14ee4c27a2d0605790c0d2d08";

/// This build's function files.
const FUNCTIONS: FunctionSet<'static> = FunctionSet {
    revision: FUNCTIONS_REVISION,
    files: FUNCTION_FILES,
};

const MIGRATE: &str = "migrating the schema";

fn checksum(sql: &str) -> Vec<u8> {
    Sha256::digest(sql.as_bytes()).to_vec()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// Whether `recorded` is the checksum of `migration` as embedded or as it shipped.
fn accepts(migration: &Migration, recorded: &[u8]) -> bool {
    recorded == checksum(migration.sql).as_slice()
        || migration.shipped == Some(hex(recorded).as_str())
}

/// This build's migrations, each as its version and name: a schema lacking one is not ready
/// for this build (`readiness`).
pub(crate) fn migrations_needed() -> impl Iterator<Item = (i32, &'static str)> {
    MIGRATIONS.iter().map(|m| (m.version, m.name))
}

/// This build's function-files revision: a schema recording an older one is not ready for
/// this build (`readiness`).
pub(crate) fn functions_revision() -> i32 {
    FUNCTIONS.revision
}

/// What one [`PgStore::migrate_report`](crate::PgStore::migrate_report) call did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migrated {
    /// The numbered migrations applied, in order: empty when none was pending.
    pub migrations: Vec<i32>,
    /// What became of the function files of `keiro-migrations`.
    pub functions: FunctionFiles,
}

/// The advisory lock key of a schema's migrations: the first eight bytes of a hash of a
/// keiro-specific label, so it neither collides across schemas nor with other applications'
/// small integer keys, and stays the same across builds (an older and a newer build racing
/// must take the same lock).
fn lock_key(schema: &str) -> i64 {
    let digest = Sha256::digest(format!("keiro.migrate:{schema}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

/// The pauses between two tries of a held migration lock: 50 ms, doubling up to 1 s, jittered
/// so runners that found it held together do not all try again at once.
const LOCK_RETRY: Backoff = Backoff::exponential(Duration::from_millis(50), Duration::from_secs(1));

// A try in a loop rather than `pg_advisory_lock` under `lock_timeout`: the wait stays on the
// client, so it needs no session setting to be set and reset on a pooled connection.
const MIGRATE_TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1)";
const MIGRATE_UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

/// What counts the runner's round trips: the store's counter ([`Db`](crate::db::Db)
/// implements it).
pub(crate) trait RoundTrips: Sync {
    /// Counts `n` more round trips.
    fn count_round_trips(&self, n: u64);
}

/// The runner, on one store's pool and schema: what
/// [`PgStore::migrate`](crate::PgStore::migrate) runs, and in tests what another build's
/// migrate runs. It takes the store's parts, not the store, so it sits below the store handle.
#[derive(Clone, Copy)]
pub(crate) struct Runner<'a> {
    /// The store's pool: the runner takes one connection for the whole run.
    pub(crate) pool: &'a Pool,
    /// The schema migrated (the connections' `search_path`).
    pub(crate) schema: &'a str,
    /// How long to wait for another runner's lock
    /// ([`Config::migrate_lock_timeout`](crate::Config#structfield.migrate_lock_timeout)).
    pub(crate) lock_timeout: Duration,
    /// The store's round-trip counter.
    pub(crate) round_trips: &'a dyn RoundTrips,
}

impl Runner<'_> {
    /// Migrates as this build: every pending migration, then the function files.
    pub(crate) async fn this_build(self) -> Result<Migrated> {
        self.migrate_up_to(None, MIGRATIONS, &FUNCTIONS).await
    }

    /// Tests only: as a build whose function files are `files` (each a name and its
    /// statements, in order) at `revision`, such as an older build during a rolling deploy.
    pub(crate) async fn as_build(
        self,
        revision: i32,
        files: &[(&'static str, &'static str)],
    ) -> Result<Migrated> {
        self.migrate_as_build_of(MIGRATIONS, revision, files).await
    }

    /// Tests only: [`as_build`](Self::as_build) as a build that knows the migrations up to
    /// `migrations` only, such as the previous build of a rolling deploy that adds a migration.
    /// [`Error::Config`] for a migration this build does not have.
    pub(crate) async fn as_older_build(
        self,
        migrations: i32,
        revision: i32,
        files: &[(&'static str, &'static str)],
    ) -> Result<Migrated> {
        let known = MIGRATIONS
            .iter()
            .position(|m| m.version == migrations)
            .ok_or_else(|| Error::Config {
                field: "migrations",
                problem: format!("names migration {migrations}, which this build does not have"),
            })?;
        self.migrate_as_build_of(&MIGRATIONS[..=known], revision, files)
            .await
    }

    /// Tests only: this build's migrations up to `version` only, and the function files only
    /// once `version` is the newest this build knows. A test migrates a schema step by step
    /// with it, as successive builds did.
    pub(crate) async fn to_version(self, version: i32) -> Result<Vec<i32>> {
        Ok(self
            .migrate_up_to(Some(version), MIGRATIONS, &FUNCTIONS)
            .await?
            .migrations)
    }

    fn count_round_trips(&self, n: u64) {
        self.round_trips.count_round_trips(n);
    }

    /// Migrates as a build whose migrations are `known` and whose function files are `files`
    /// at `revision`.
    async fn migrate_as_build_of(
        &self,
        known: &[Migration],
        revision: i32,
        files: &[(&'static str, &'static str)],
    ) -> Result<Migrated> {
        let files: Vec<FunctionFile> = files
            .iter()
            .map(|&(name, sql)| FunctionFile { name, sql })
            .collect();
        let set = FunctionSet {
            revision,
            files: &files,
        };
        self.migrate_up_to(None, known, &set).await
    }

    /// Migrates as a build whose migrations are `known` (this build's, or the first of them for
    /// an older build in tests) and whose function files are `functions`.
    async fn migrate_up_to(
        &self,
        target: Option<i32>,
        known: &[Migration],
        functions: &FunctionSet<'_>,
    ) -> Result<Migrated> {
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| Failure::from(e).into_error(MIGRATE))?;
        let key = lock_key(self.schema);
        self.migrate_lock(&client, key).await?;
        let migrated = self
            .migrate_locked(&mut client, target, known, functions)
            .await;
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

    /// Takes the schema's migration lock, trying again with growing pauses until the
    /// configured wait is over.
    async fn migrate_lock(&self, client: &Object, key: i64) -> Result<()> {
        let fail = |e| Failure::from(e).into_error(MIGRATE);
        let wait = self.lock_timeout;
        let started = Instant::now();
        let mut tries = 0;
        loop {
            self.count_round_trips(1);
            let row = client
                .query_typed_one(MIGRATE_TRY_LOCK, &[(&key, Type::INT8)])
                .await
                .map_err(fail)?;
            if row.try_get::<_, bool>(0).map_err(fail)? {
                return Ok(());
            }
            let waited = started.elapsed();
            if waited >= wait {
                return Err(Error::MigrationLocked {
                    schema: self.schema.to_owned(),
                    waited,
                });
            }
            tries += 1;
            tokio::time::sleep(LOCK_RETRY.delay_random(tries).min(wait - waited)).await;
        }
    }

    async fn migrate_locked(
        &self,
        client: &mut Object,
        target: Option<i32>,
        known: &[Migration],
        functions: &FunctionSet<'_>,
    ) -> Result<Migrated> {
        let state = self.schema_state(client).await?;
        let applied = if state.bookkept {
            self.migrations_applied(client).await?
        } else {
            Vec::new()
        };
        // Every applied file is checked before anything is applied, so an edited migration
        // stops the run with the schema untouched.
        for migration in known {
            if let Some((_, recorded)) = applied.iter().find(|(v, _)| *v == migration.version) {
                if !accepts(migration, recorded) {
                    return Err(Error::MigrationChanged {
                        schema: self.schema.to_owned(),
                        version: migration.version,
                        name: migration.name,
                    });
                }
            }
        }
        let newest = known.last().map_or(0, |m| m.version);
        let newer = applied
            .iter()
            .map(|(v, _)| *v)
            .filter(|v| *v > newest)
            .max();
        if let Some(version) = newer {
            // A newer build migrated this schema; its migrations only add, so this build keeps
            // working, but its function files may be older than the ones in place, so they are
            // left alone. Whoever rolled back should know.
            tracing::warn!(
                schema = self.schema,
                version,
                "the schema has a migration this build does not know; its function files are \
                 not applied"
            );
        }
        let target = target.unwrap_or(newest);
        let pending: Vec<&Migration> = known
            .iter()
            .filter(|m| m.version <= target && !applied.iter().any(|(v, _)| *v == m.version))
            .collect();
        let plan = if target < newest {
            FunctionsPlan::Leave(FunctionFiles::Pending)
        } else if let Some(version) = newer {
            FunctionsPlan::Leave(FunctionFiles::NewerMigration { version })
        } else if !state.functions_readable && !state.may_create {
            // A running role granted its tables before an upgrade created the bookkeeping. It
            // could not apply a file anyway, so it goes on as before; whoever migrates with
            // the owning role applies what is pending.
            tracing::warn!(
                schema = self.schema,
                "the role may not read keiro_functions or keiro_function_revisions, so the \
                 function files are not checked"
            );
            FunctionsPlan::Leave(FunctionFiles::Unreadable)
        } else {
            functions.plan(&self.functions_recorded(client, &state).await?)
        };
        let (stale, record, mut report) = match plan {
            FunctionsPlan::Changed => {
                return Err(Error::FunctionRevisionChanged {
                    schema: self.schema.to_owned(),
                    revision: functions.revision,
                })
            }
            FunctionsPlan::Leave(why) => {
                if let FunctionFiles::NewerRevision { ours, schema } = why {
                    // A rolling deploy: the newer build's bodies stay in place.
                    tracing::warn!(
                        schema = self.schema,
                        revision = ours,
                        recorded = schema,
                        "the schema's function files are of a newer revision than this \
                         build's; they are not applied"
                    );
                }
                (Vec::new(), false, why)
            }
            // Recording a revision with every file in place changes no function, so a role
            // that may not create the bookkeeping leaves it to the owning role.
            FunctionsPlan::Apply { files, record } => (
                files,
                record && state.may_create,
                FunctionFiles::UpToDate {
                    revision: functions.revision,
                },
            ),
        };
        if pending.is_empty() && stale.is_empty() && !record {
            return Ok(Migrated {
                migrations: Vec::new(),
                functions: report,
            });
        }
        if !state.may_create {
            let privilege = if state.schema_exists {
                format!("CREATE on schema {}", self.schema)
            } else {
                format!("CREATE on database {}", state.database)
            };
            return Err(match (pending.first(), stale.first()) {
                (Some(first), _) => Error::MigrationPrivilege {
                    schema: self.schema.to_owned(),
                    version: first.version,
                    name: first.name,
                    privilege,
                },
                (None, Some(file)) => Error::FunctionFilePrivilege {
                    schema: self.schema.to_owned(),
                    file: file.name,
                    privilege,
                },
                (None, None) => unreachable!("returned above when nothing is pending"),
            });
        }
        self.schema_create(client, &state).await?;
        let mut done = Vec::new();
        for migration in pending {
            self.apply(
                client,
                "applying a migration",
                &[migration.sql],
                MIGRATION_RECORD,
                &[
                    (&migration.version, Type::INT4),
                    (&migration.name, Type::TEXT),
                    (&checksum(migration.sql), Type::BYTEA),
                ],
            )
            .await
            .map_err(|source| Error::Migration {
                schema: self.schema.to_owned(),
                version: migration.version,
                name: migration.name,
                source: Box::new(source),
            })?;
            tracing::info!(
                schema = self.schema,
                version = migration.version,
                name = migration.name,
                "applied migration"
            );
            done.push(migration.version);
        }
        let mut applied_files = Vec::new();
        for file in stale {
            // The pin follows the file in its transaction: `CREATE OR REPLACE` dropped the
            // search_path of every function the file defined.
            self.apply(
                client,
                "applying a function file",
                &[file.sql, FUNCTIONS_PIN],
                FUNCTION_FILE_RECORD,
                &[
                    (&file.name, Type::TEXT),
                    (&file_checksum(file), Type::BYTEA),
                ],
            )
            .await
            .map_err(|source| Error::FunctionFile {
                schema: self.schema.to_owned(),
                file: file.name,
                source: Box::new(source),
            })?;
            tracing::info!(
                schema = self.schema,
                file = file.name,
                "applied function file"
            );
            applied_files.push(file.name);
        }
        // Recorded once every file of the revision is in place: a run that fails half-way
        // leaves the old record, and the next run applies what is still missing.
        if record {
            self.apply(
                client,
                "recording the function files' revision",
                &[],
                FUNCTIONS_REVISION_RECORD,
                &[
                    (&functions.revision, Type::INT4),
                    (&functions.checksum(), Type::BYTEA),
                ],
            )
            .await?;
        }
        if !applied_files.is_empty() {
            report = FunctionFiles::Applied {
                revision: functions.revision,
                files: applied_files,
            };
        }
        Ok(Migrated {
            migrations: done,
            functions: report,
        })
    }
}

/// What is there before anything is applied, read from the catalogs, which every role may read.
struct SchemaState {
    schema_exists: bool,
    /// Whether the bookkeeping table of migrations exists.
    bookkept: bool,
    /// Whether the bookkeeping table of function files exists.
    functions_bookkept: bool,
    /// Whether the bookkeeping table of function-files revisions exists.
    revisions_bookkept: bool,
    /// Whether the role may read both tables (those that exist).
    functions_readable: bool,
    /// Whether the role may create what is missing: on the schema, or on the database when the
    /// schema itself is missing.
    may_create: bool,
    /// The database's name, for the message of a missing privilege.
    database: String,
}

const SCHEMA_STATE: &str = "SELECT n.oid IS NOT NULL, \
         EXISTS (SELECT 1 FROM pg_class c \
                 WHERE c.relnamespace = n.oid AND c.relname = 'keiro_migrations'), \
         EXISTS (SELECT 1 FROM pg_class c \
                 WHERE c.relnamespace = n.oid AND c.relname = 'keiro_functions'), \
         EXISTS (SELECT 1 FROM pg_class c \
                 WHERE c.relnamespace = n.oid AND c.relname = 'keiro_function_revisions'), \
         coalesce((SELECT bool_and(has_table_privilege(c.oid, 'SELECT')) FROM pg_class c \
                   WHERE c.relnamespace = n.oid \
                     AND c.relname IN ('keiro_functions', 'keiro_function_revisions')), true), \
         CASE WHEN n.oid IS NULL THEN has_database_privilege(current_database(), 'CREATE') \
              ELSE has_schema_privilege(n.oid, 'CREATE') END, \
         current_database()::text \
     FROM (SELECT $1::text AS name) s LEFT JOIN pg_namespace n ON n.nspname = s.name";
const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS keiro_migrations ( \
         version    integer PRIMARY KEY, \
         name       text NOT NULL, \
         checksum   bytea NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now())";
const FUNCTIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS keiro_functions ( \
         file       text PRIMARY KEY, \
         checksum   bytea NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now())";
/// One row per revision of the function files a build applied (or found in place), with their
/// combined checksum; the newest is the schema's.
const FUNCTION_REVISIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS keiro_function_revisions ( \
         revision   integer PRIMARY KEY, \
         checksum   bytea NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now())";

impl Runner<'_> {
    /// Reads what exists and what the role may create, touching nothing.
    async fn schema_state(&self, client: &Object) -> Result<SchemaState> {
        let fail = |e| Failure::from(e).into_error(MIGRATE);
        self.count_round_trips(1);
        let row = client
            .query_typed_one(SCHEMA_STATE, &[(&self.schema, Type::TEXT)])
            .await
            .map_err(fail)?;
        Ok(SchemaState {
            schema_exists: row.try_get(0).map_err(fail)?,
            bookkept: row.try_get(1).map_err(fail)?,
            functions_bookkept: row.try_get(2).map_err(fail)?,
            revisions_bookkept: row.try_get(3).map_err(fail)?,
            functions_readable: row.try_get(4).map_err(fail)?,
            may_create: row.try_get(5).map_err(fail)?,
            database: row.try_get(6).map_err(fail)?,
        })
    }

    /// Creates the schema and the bookkeeping tables when missing.
    async fn schema_create(&self, client: &Object, state: &SchemaState) -> Result<()> {
        let fail = |e| Failure::from(e).into_error(MIGRATE);
        // Only when missing: even with `IF NOT EXISTS`, `CREATE SCHEMA` demands CREATE on the
        // database and `CREATE TABLE` CREATE on the schema when there is nothing to create.
        if !state.schema_exists {
            // DDL takes no bind parameters for identifiers. The name is a validated plain
            // identifier ([a-z_][a-z0-9_]*), so quoting it is all it needs.
            let create = format!("CREATE SCHEMA IF NOT EXISTS \"{}\"", self.schema);
            self.count_round_trips(1);
            client.batch_execute(&create).await.map_err(fail)?;
        }
        // Unqualified: they land in the connection's search_path, the store's schema.
        if !state.bookkept {
            self.count_round_trips(1);
            client.batch_execute(MIGRATIONS_TABLE).await.map_err(fail)?;
        }
        if !state.functions_bookkept {
            self.count_round_trips(1);
            client.batch_execute(FUNCTIONS_TABLE).await.map_err(fail)?;
        }
        if !state.revisions_bookkept {
            self.count_round_trips(1);
            client
                .batch_execute(FUNCTION_REVISIONS_TABLE)
                .await
                .map_err(fail)?;
        }
        Ok(())
    }
}

const MIGRATIONS_APPLIED: &str = "SELECT version, checksum FROM keiro_migrations ORDER BY version";

impl Runner<'_> {
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

const FUNCTIONS_APPLIED: &str = "SELECT file, checksum, NULL::integer FROM keiro_functions";
// The files and the newest revision in one round trip: a revision row is the one whose third
// column is set. The revisions table is younger than the files', so either may be read alone.
const FUNCTIONS_AND_REVISION_APPLIED: &str = "\
    SELECT file, checksum, NULL::integer FROM keiro_functions \
    UNION ALL \
    (SELECT NULL, checksum, revision FROM keiro_function_revisions \
     ORDER BY revision DESC LIMIT 1)";

impl Runner<'_> {
    /// The function files and checksums applied last, and the newest revision recorded.
    async fn functions_recorded(
        &self,
        client: &Object,
        state: &SchemaState,
    ) -> Result<FunctionsRecorded> {
        let fail = |e| Failure::from(e).into_error(MIGRATE);
        let query = match (state.functions_bookkept, state.revisions_bookkept) {
            (true, true) => FUNCTIONS_AND_REVISION_APPLIED,
            (true, false) => FUNCTIONS_APPLIED,
            // Without the files' bookkeeping every file is applied, whatever a revision says.
            (false, _) => return Ok(FunctionsRecorded::default()),
        };
        self.count_round_trips(1);
        let rows = client.query_typed(query, &[]).await.map_err(fail)?;
        let mut recorded = FunctionsRecorded::default();
        for row in &rows {
            let checksum: Vec<u8> = row.try_get(1).map_err(fail)?;
            match row.try_get::<_, Option<i32>>(2).map_err(fail)? {
                Some(revision) => recorded.revision = Some((revision, checksum)),
                None => recorded
                    .files
                    .push((row.try_get(0).map_err(fail)?, checksum)),
            }
        }
        Ok(recorded)
    }
}

const MIGRATION_RECORD: &str =
    "INSERT INTO keiro_migrations (version, name, checksum) VALUES ($1, $2, $3)";

const FUNCTIONS_REVISION_RECORD: &str =
    "INSERT INTO keiro_function_revisions (revision, checksum) VALUES ($1, $2)";

impl Runner<'_> {
    /// Runs `statements` (a file and what must follow it), then the bookkeeping statement
    /// `record` with its parameters, in one transaction: a failure leaves neither the file's
    /// changes nor its record.
    async fn apply(
        &self,
        client: &mut Object,
        operation: &'static str,
        statements: &[&str],
        record: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<()> {
        let fail = |e| Failure::from(e).into_error(operation);
        self.count_round_trips(1);
        let tx = client.transaction().await.map_err(fail)?;
        for statement in statements {
            self.count_round_trips(1);
            tx.batch_execute(statement).await.map_err(fail)?;
        }
        self.count_round_trips(1);
        tx.query_typed(record, params).await.map_err(fail)?;
        self.count_round_trips(1);
        tx.commit().await.map_err(fail)
    }
}

/// Pins the `search_path` of every keiro function of the schema that lacks the pin: after a
/// function file, the functions it created or replaced (`CREATE OR REPLACE FUNCTION` drops a
/// function's settings, so the file's own are the only ones left).
///
/// Every keiro function resolves names through `<schema>, pg_temp`, never through its
/// caller's search_path. With the caller's, a role that can create objects in a schema the
/// caller searches could have keiro's functions call its own code instead of a built-in
/// (CVE-2018-1058): an overload with a more specific argument type (`to_jsonb(text)` against
/// `pg_catalog.to_jsonb(anyelement)`) wins wherever it sits on the path, one with the
/// built-in's very signature wins when searched before pg_catalog; and a temporary table named
/// like one of keiro's is searched before every schema unless pg_temp is listed.
/// * pg_catalog is left out on purpose: Postgres searches an unlisted pg_catalog first, so the
///   built-ins come before anything in keiro's schema all the same. Listing it first would
///   resolve names the same way but make `current_schema()` return `pg_catalog`, and the wake
///   channel and the signal lock key are derived from `current_schema()`.
/// * keiro's tables and functions, which the bodies name unqualified, resolve in this schema.
/// * pg_temp, listed last, can no longer shadow a table.
///
/// What remains trusted is keiro's own schema: the store refuses a schema others may create
/// objects in (`public`) unless the caller explicitly allows it. Only keiro's functions are
/// altered (named `keiro_`, not an extension's), so the other functions of a schema keiro was
/// explicitly allowed to share are left as they are. The runner's connections have keiro's
/// schema as their search_path, hence `current_schema()`. The runner pins rather than each
/// definition, so a function added to a file cannot forget it.
const FUNCTIONS_PIN: &str = r"
DO $$
DECLARE
    v_function regprocedure;
BEGIN
    FOR v_function IN
        SELECT p.oid::regprocedure
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = pg_catalog.current_schema()
          AND p.prokind = 'f'
          AND p.proname LIKE 'keiro\_%'
          AND NOT EXISTS (
              SELECT 1 FROM pg_catalog.pg_depend d
              WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
                AND d.objid = p.oid AND d.deptype = 'e')
          AND NOT coalesce(p.proconfig, '{}') @> ARRAY[
              'search_path=' || pg_catalog.quote_ident(pg_catalog.current_schema()) || ', pg_temp']
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = %I, pg_temp',
                                  v_function, pg_catalog.current_schema());
    END LOOP;
END;
$$";

const FUNCTION_FILE_RECORD: &str = "INSERT INTO keiro_functions (file, checksum) VALUES ($1, $2) \
     ON CONFLICT (file) DO UPDATE SET checksum = excluded.checksum, applied_at = now()";

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
    fn a_shipped_checksum_is_only_kept_for_a_rewritten_file() {
        for migration in MIGRATIONS {
            if let Some(shipped) = migration.shipped {
                assert_eq!(shipped.len(), 64, "{}", migration.name);
                assert_ne!(shipped, hex(&checksum(migration.sql)), "{}", migration.name);
                assert!(accepts(migration, &checksum(migration.sql)));
            }
        }
    }

    #[test]
    fn no_migration_defines_a_function_or_a_trigger() {
        for migration in MIGRATIONS {
            let sql = migration.sql.to_uppercase();
            for word in ["FUNCTION", "TRIGGER"] {
                let defines = sql
                    .lines()
                    .filter(|line| !line.trim_start().starts_with("--"))
                    .any(|line| line.contains(word));
                assert!(
                    !defines,
                    "{} names a {word}: it goes in crates/migrations/functions/",
                    migration.name
                );
            }
        }
    }

    #[test]
    fn function_files_are_named_once() {
        for (i, file) in FUNCTION_FILES.iter().enumerate() {
            assert!(!file.sql.trim().is_empty(), "{}", file.name);
            assert!(FUNCTION_FILES[..i].iter().all(|f| f.name != file.name));
        }
    }

    #[test]
    fn the_function_files_revision_is_raised_with_every_change() {
        let checksum = hex(&FUNCTIONS.checksum());
        assert!(
            checksum == FUNCTIONS_REVISION_CHECKSUM,
            "the function files changed since revision {FUNCTIONS_REVISION} (a file of \
             crates/migrations/functions/ was edited, added, removed or reordered): in \
             crates/postgres/src/migrate.rs, raise FUNCTIONS_REVISION to {} and set \
             FUNCTIONS_REVISION_CHECKSUM to \"{checksum}\". Without it, a build with the old \
             files and one with the new would refuse each other's schema \
             (crates/migrations/functions/README.md, \"Changing a function\")",
            FUNCTIONS_REVISION + 1
        );
    }

    #[test]
    fn lock_keys_differ_per_schema_and_are_stable() {
        assert_ne!(lock_key("keiro"), lock_key("keiro_test_a"));
        assert_eq!(lock_key("keiro"), lock_key("keiro"));
    }
}
