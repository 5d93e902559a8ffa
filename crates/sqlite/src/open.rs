//! Opening a file: the checks that refuse what keiro cannot use, the durability settings (set,
//! then read back), and the migrations.

use crate::cached::Cached;
use std::path::{Path, PathBuf};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags};
use sha2::{Digest, Sha256};

use crate::config::{Config, Synchronous};
use crate::error::{Error, Result};

/// The migrations, numbered from 1, in order. Never edited once released: a later file
/// changes what an earlier one made (STYLE.md §6).
pub(crate) const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "init", include_str!("../migrations/0001_init.sql")),
    (
        2,
        "notifications",
        include_str!("../migrations/0002_notifications.sql"),
    ),
    (3, "queues", include_str!("../migrations/0003_queues.sql")),
    (
        4,
        "remote_queues",
        include_str!("../migrations/0004_remote_queues.sql"),
    ),
    (
        5,
        "events_streams",
        include_str!("../migrations/0005_events_streams.sql"),
    ),
    (6, "updates", include_str!("../migrations/0006_updates.sql")),
    (
        7,
        "versions",
        include_str!("../migrations/0007_versions.sql"),
    ),
    (
        8,
        "search_attributes",
        include_str!("../migrations/0008_search_attributes.sql"),
    ),
    (
        9,
        "free_queue_runs",
        include_str!("../migrations/0009_free_queue_runs.sql"),
    ),
    (
        10,
        "open_refusals",
        include_str!("../migrations/0010_open_refusals.sql"),
    ),
];

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// The error for a SQLite failure while opening, with the two failures that have their own
/// variant recognised by code.
fn sqlite<'a>(operation: &'static str, path: &'a Path) -> impl Fn(rusqlite::Error) -> Error + 'a {
    move |source| match source.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => Error::NotADatabase {
            path: path.to_owned(),
            source,
        },
        Some(ErrorCode::ReadOnly) => Error::ReadOnly {
            path: path.to_owned(),
            detail: source.to_string(),
        },
        _ => Error::Sqlite {
            operation,
            path: path.to_owned(),
            source,
        },
    }
}

/// Refuses a path that is a directory or a file that cannot be written, before SQLite sees it
/// (SQLite would open a read-only file read-only without a word, and fail at the first write).
/// The permission bits are checked, not tried: a superuser could write through them.
pub(crate) fn check_path(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(Error::IsDirectory {
            path: path.to_owned(),
        }),
        Ok(meta) if meta.permissions().readonly() => Err(Error::ReadOnly {
            path: path.to_owned(),
            detail: "the file's permissions allow no writes".into(),
        }),
        _ => Ok(()),
    }
}

/// Opens the writer's connection: checks, durability, migrations.
pub(crate) fn writer(path: &Path, config: &Config, now_micros: i64) -> Result<Connection> {
    check_path(path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(sqlite("opening", path))?;
    prepare(&conn, path, config)?;
    // The first read of the file: a file that is not a database fails here.
    conn.query_row_cached("SELECT count(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    })
    .map_err(sqlite("reading the schema of", path))?;
    if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
        return Err(Error::ReadOnly {
            path: path.to_owned(),
            detail: "SQLite opened it read-only".into(),
        });
    }
    durability(&conn, path, config)?;
    // The savepoint of each operation in a batch journals the pages it changes first; an
    // insert into `workflows` and its indexes changes more than SQLite keeps in memory before
    // spilling that journal to a temporary file (64 KiB), which then costs a write a page.
    // In memory it is bounded by one operation's pages and emptied at each release.
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(sqlite("keeping temporary data in memory on", path))?;
    migrate(&conn, path, now_micros)?;
    Ok(conn)
}

/// Opens a reader's connection: read-only, on the file the writer already checked.
pub(crate) fn reader(path: &Path, config: &Config) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(sqlite("opening", path))?;
    prepare(&conn, path, config)?;
    Ok(conn)
}

/// What every connection sets: the busy timeout, the length limit, the statement cache and
/// stable plans.
fn prepare(conn: &Connection, path: &Path, config: &Config) -> Result<()> {
    conn.busy_timeout(config.busy_timeout)
        .map_err(sqlite("setting the busy timeout of", path))?;
    conn.set_prepared_statement_cache_capacity(crate::cached::STATEMENT_CACHE);
    // A plan that does not depend on the values bound to it. Without this, a statement whose
    // parameter the planner compared with a partial index's constant (`status = ?` against
    // `WHERE status = 'running'`) is compiled again every time a value is bound, which undoes
    // the statement cache; the rules write the constants their partial indexes need inline.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(sqlite("fixing the query plans of", path))?;
    // Validated to fit an i32 (Config::validate).
    let limit = i32::try_from(config.value_len_max).unwrap_or(i32::MAX);
    conn.set_limit(rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH, limit)
        .map_err(sqlite("setting the length limit of", path))?;
    // The store's version, which every insert of a run records: PostgreSQL's
    // `keiro.app_version` session setting, NULL when unversioned.
    let version = Some(config.app_version.clone()).filter(|v| !v.is_empty());
    conn.create_scalar_function(
        "keiro_app_version",
        0,
        rusqlite::functions::FunctionFlags::SQLITE_UTF8,
        move |_| Ok(version.clone()),
    )
    .map_err(sqlite("defining keiro_app_version on", path))?;
    Ok(())
}

/// Switches the file to WAL. Two stores opening a new file at once both read it (a shared lock)
/// and then both want the exclusive lock the switch takes: SQLite answers one of them "busy" at
/// once, without its busy handler, since waiting could deadlock. That one retries, until the
/// busy timeout, once the other's switch is done (then a no-op: the file is already WAL).
fn journal_mode_wal(conn: &Connection, path: &Path, config: &Config) -> Result<String> {
    let started = std::time::Instant::now();
    loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0)) {
            Err(e)
                if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy)
                    && started.elapsed() < config.busy_timeout =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            answer => return answer.map_err(sqlite("setting WAL mode on", path)),
        }
    }
}

/// Sets WAL, the synchronous level and foreign keys, and reads each back: a setting SQLite
/// ignores (WAL on a filesystem without shared memory, an unknown level) is an error, never a
/// weaker store than asked for.
fn durability(conn: &Connection, path: &Path, config: &Config) -> Result<()> {
    let journal_mode = journal_mode_wal(conn, path, config)?;
    if !journal_mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Durability {
            path: path.to_owned(),
            pragma: "journal_mode",
            wanted: "wal".into(),
            found: journal_mode,
        });
    }
    let (level, wanted) = match config.synchronous {
        Synchronous::Full => ("FULL", 2),
        Synchronous::NormalLosesCommitsOnPowerLoss => ("NORMAL", 1),
    };
    conn.pragma_update(None, "synchronous", level)
        .map_err(sqlite("setting synchronous on", path))?;
    let found: i64 = conn
        .pragma_query_value(None, "synchronous", |row| row.get(0))
        .map_err(sqlite("reading synchronous of", path))?;
    if found != wanted {
        return Err(Error::Durability {
            path: path.to_owned(),
            pragma: "synchronous",
            wanted: level.into(),
            found: found.to_string(),
        });
    }
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(sqlite("enabling foreign keys on", path))?;
    let on: i64 = conn
        .pragma_query_value(None, "foreign_keys", |row| row.get(0))
        .map_err(sqlite("reading foreign_keys of", path))?;
    if on != 1 {
        return Err(Error::Durability {
            path: path.to_owned(),
            pragma: "foreign_keys",
            wanted: "1".into(),
            found: on.to_string(),
        });
    }
    Ok(())
}

/// The bookkeeping table, as the Postgres store's `keiro_migrations`.
const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS keiro_migrations ( \
         version    INTEGER PRIMARY KEY, \
         name       TEXT    NOT NULL, \
         checksum   BLOB    NOT NULL, \
         applied_at INTEGER NOT NULL)";

const MIGRATIONS_APPLIED: &str = "SELECT version, checksum FROM keiro_migrations ORDER BY version";

const MIGRATION_RECORD: &str =
    "INSERT INTO keiro_migrations (version, name, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)";

fn checksum(sql: &str) -> Vec<u8> {
    Sha256::digest(sql.as_bytes()).to_vec()
}

/// The applied migrations, checked against this build: none newer, none changed.
fn applied(conn: &Connection, path: &Path) -> Result<Vec<i64>> {
    let mut statement = conn
        .prepare(MIGRATIONS_APPLIED)
        .map_err(sqlite("reading the migrations of", path))?;
    let rows = statement
        .query_map([], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Vec<u8>>(1)?))
        })
        .and_then(Iterator::collect::<rusqlite::Result<Vec<_>>>)
        .map_err(sqlite("reading the migrations of", path))?;
    if let Some((found, _)) = rows.iter().rev().find(|(v, _)| *v > SCHEMA_VERSION) {
        return Err(Error::NewerSchema {
            path: path.to_owned(),
            found: *found,
            supported: SCHEMA_VERSION,
        });
    }
    for (version, sum) in &rows {
        let known = MIGRATIONS.iter().find(|(v, _, _)| v == version);
        if known.is_none_or(|(_, _, sql)| checksum(sql) != *sum) {
            return Err(Error::ChecksumMismatch {
                path: path.to_owned(),
                version: *version,
            });
        }
    }
    Ok(rows.into_iter().map(|(v, _)| v).collect())
}

/// Runs `body` in one `BEGIN IMMEDIATE` transaction: committed if it returns `Ok`, rolled back
/// otherwise.
fn immediate<T>(conn: &Connection, path: &Path, body: impl FnOnce() -> Result<T>) -> Result<T> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(sqlite("locking for migration", path))?;
    match body() {
        Ok(value) => {
            conn.execute_batch("COMMIT")
                .map_err(sqlite("committing a migration of", path))?;
            Ok(value)
        }
        Err(e) => {
            // The error is the answer; a failed rollback leaves nothing worse (SQLite rolls
            // back an open transaction when the connection closes).
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Applies every pending migration, each in its own `BEGIN IMMEDIATE` transaction with its
/// bookkeeping row, after refusing a file migrated by a newer build. The write lock makes a
/// second process opening the same file wait, then find the migration applied.
fn migrate(conn: &Connection, path: &Path, now_micros: i64) -> Result<()> {
    migrate_through(conn, path, now_micros, SCHEMA_VERSION)
}

/// [`migrate`] up to and including version `last`: a test makes the file an older build left,
/// to check what a later migration does to its rows.
fn migrate_through(conn: &Connection, path: &Path, now_micros: i64, last: i64) -> Result<()> {
    immediate(conn, path, || {
        conn.execute_batch(MIGRATIONS_TABLE)
            .map_err(sqlite("creating the migrations table of", path))?;
        applied(conn, path).map(drop)
    })?;
    for (version, name, sql) in MIGRATIONS.iter().take_while(|(v, _, _)| *v <= last) {
        immediate(conn, path, || {
            if applied(conn, path)?.contains(version) {
                return Ok(());
            }
            conn.execute_batch(sql)
                .map_err(sqlite("applying a migration to", path))?;
            conn.execute_cached(
                MIGRATION_RECORD,
                rusqlite::params![version, name, checksum(sql), now_micros],
            )
            .map_err(sqlite("recording a migration in", path))?;
            Ok(())
        })?;
    }
    Ok(())
}

/// The path as given, for errors.
pub(crate) fn owned(path: &Path) -> PathBuf {
    path.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How a refusal's last error begins (`keiro::codec::OPEN_REFUSED`).
    const REFUSED: &str = "payload cannot be opened by this worker: payload sealed with key \"k2\"";

    /// Migration 0010 moves the refusals the builds before it counted in `attempts` to
    /// `open_refusals`, for live runs only (PostgreSQL's 0028 is tested the same way).
    #[test]
    fn the_refusals_counted_as_attempts_move_to_their_own_count() -> Result<()> {
        let dir = std::env::temp_dir().join(format!(
            "keiro-open-0010-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let path = dir.join("before.db");
        let conn = Connection::open(&path).expect("a new file");
        // The file as the build before 0010 left it, with the rows it wrote.
        migrate_through(&conn, &path, 0, 9)?;
        let rows = [
            ("refused", "running", 4, Some(REFUSED)),
            ("refused-parked", "suspended", 2, Some(REFUSED)),
            ("crashed", "running", 2, Some("boom")),
            ("fresh", "running", 0, None),
            ("failed", "failed", 3, Some(REFUSED)),
        ];
        for (id, status, attempts, error) in rows {
            conn.execute(
                "INSERT INTO workflows (workflow_name, workflow_id, status, attempts, \
                                        last_error, created_at, updated_at) \
                 VALUES ('wf', ?1, ?2, ?3, ?4, 0, 0)",
                rusqlite::params![id, status, attempts, error],
            )
            .expect("a row of the older schema");
        }
        migrate(&conn, &path, 0)?;
        let mut counts = Vec::new();
        for (id, ..) in rows {
            let (attempts, refusals): (i64, i64) = conn
                .query_row(
                    "SELECT attempts, open_refusals FROM workflows WHERE workflow_id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .expect("kept");
            counts.push((id, attempts, refusals));
        }
        drop(conn);
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(
            counts,
            [
                ("refused", 0, 4),
                ("refused-parked", 0, 2),
                ("crashed", 2, 0),
                ("fresh", 0, 0),
                ("failed", 3, 0),
            ]
        );
        Ok(())
    }
}
