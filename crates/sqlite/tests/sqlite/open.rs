//! Opening a file: what is refused with which error, what is set and checked, migrations.

use crate::common::{start_request, TempDir};
use keiro_sqlite::{Config, Error, SqliteStore, Synchronous, SCHEMA_VERSION};
use rusqlite::Connection;
use serde_json::json;

#[tokio::test]
async fn a_new_file_is_created_migrated_and_in_wal_mode() -> Result<(), Box<dyn std::error::Error>>
{
    let dir = TempDir::new("open-new");
    let path = dir.file("new.db");
    let store = SqliteStore::open(&path, Config::default())?;
    assert!(path.is_file());
    let raw = Connection::open(&path)?;
    let mode: String = raw.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    assert_eq!(mode, "wal");
    let versions: Vec<i64> = raw
        .prepare("SELECT version FROM keiro_migrations ORDER BY version")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    let started = store.instance_start(&start_request("a", json!(1))).await?;
    assert!(started.created);
    Ok(())
}

#[tokio::test]
async fn reopening_keeps_the_data_and_applies_nothing_twice(
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir::new("open-again");
    let path = dir.file("again.db");
    {
        let store = SqliteStore::open(&path, Config::default())?;
        store
            .instance_start(&start_request("a", json!("kept")))
            .await?;
    }
    let store = SqliteStore::open(&path, Config::default())?;
    let again = store
        .instance_start(&start_request("a", json!("other")))
        .await?;
    assert!(!again.created);
    assert_eq!(again.instance.input, json!("kept"));
    let raw = Connection::open(&path)?;
    let rows: i64 = raw.query_row("SELECT count(*) FROM keiro_migrations", [], |r| r.get(0))?;
    assert_eq!(rows, SCHEMA_VERSION);
    Ok(())
}

#[test]
fn a_directory_is_refused() {
    let dir = TempDir::new("open-dir");
    let err = SqliteStore::open(dir.path(), Config::default()).unwrap_err();
    assert!(matches!(err, Error::IsDirectory { .. }), "{err:?}");
    assert!(err.to_string().contains("is a directory"), "{err}");
}

#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_as_it_was() {
    let dir = TempDir::new("open-notdb");
    let path = dir.file("notes.txt");
    let text = "these are not the pages of a database, ".repeat(200);
    std::fs::write(&path, &text).unwrap();
    let err = SqliteStore::open(&path, Config::default()).unwrap_err();
    assert!(matches!(err, Error::NotADatabase { .. }), "{err:?}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        text,
        "nothing written"
    );
}

#[tokio::test]
async fn a_read_only_file_is_refused_and_its_data_kept() -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir::new("open-ro");
    let path = dir.file("ro.db");
    {
        let store = SqliteStore::open(&path, Config::default())?;
        store.instance_start(&start_request("a", json!(1))).await?;
    }
    let mut permissions = std::fs::metadata(&path)?.permissions();
    permissions.set_readonly(true);
    std::fs::set_permissions(&path, permissions.clone())?;
    let err = SqliteStore::open(&path, Config::default()).unwrap_err();
    assert!(matches!(err, Error::ReadOnly { .. }), "{err:?}");
    #[allow(clippy::permissions_set_readonly_false)] // the test's own file, made writable again
    permissions.set_readonly(false);
    std::fs::set_permissions(&path, permissions)?;
    let store = SqliteStore::open(&path, Config::default())?;
    assert!(store
        .instance_get(&crate::common::key("a"))
        .await?
        .is_some());
    Ok(())
}

#[tokio::test]
async fn a_database_of_a_newer_keiro_is_refused_and_nothing_lost(
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir::new("open-newer");
    let path = dir.file("newer.db");
    {
        let store = SqliteStore::open(&path, Config::default())?;
        store.instance_start(&start_request("a", json!(1))).await?;
    }
    let raw = Connection::open(&path)?;
    raw.execute(
        "INSERT INTO keiro_migrations (version, name, checksum, applied_at) \
         VALUES (?1, 'from_the_future', x'00', 0)",
        [SCHEMA_VERSION + 1],
    )?;
    let err = SqliteStore::open(&path, Config::default()).unwrap_err();
    match &err {
        Error::NewerSchema {
            found, supported, ..
        } => {
            assert_eq!(*found, SCHEMA_VERSION + 1);
            assert_eq!(*supported, SCHEMA_VERSION);
        }
        other => panic!("expected NewerSchema, got {other:?}"),
    }
    assert!(err.to_string().contains("newer keiro"), "{err}");
    let kept: i64 = raw.query_row("SELECT count(*) FROM workflows", [], |r| r.get(0))?;
    assert_eq!(kept, 1);
    Ok(())
}

#[test]
fn a_changed_migration_is_refused() -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir::new("open-checksum");
    let path = dir.file("changed.db");
    drop(SqliteStore::open(&path, Config::default())?);
    let raw = Connection::open(&path)?;
    raw.execute(
        "UPDATE keiro_migrations SET checksum = x'00' WHERE version = 1",
        [],
    )?;
    let err = SqliteStore::open(&path, Config::default()).unwrap_err();
    assert!(
        matches!(err, Error::ChecksumMismatch { version: 1, .. }),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn the_weaker_synchronous_level_opens_only_when_asked_for() -> Result<(), Box<dyn std::error::Error>>
{
    let dir = TempDir::new("open-normal");
    let config = Config {
        synchronous: Synchronous::NormalLosesCommitsOnPowerLoss,
        ..Config::default()
    };
    drop(SqliteStore::open(dir.file("normal.db"), config)?);
    assert_eq!(Config::default().synchronous, Synchronous::Full);
    Ok(())
}

#[test]
fn an_invalid_config_names_its_field() {
    let dir = TempDir::new("open-config");
    let config = Config {
        readers: 0,
        ..Config::default()
    };
    let err = SqliteStore::open(dir.file("x.db"), config).unwrap_err();
    assert!(err.to_string().contains("readers"), "{err}");
    assert!(!dir.file("x.db").exists(), "nothing created");
}

#[test]
fn two_stores_open_one_file_concurrently() -> Result<(), Box<dyn std::error::Error>> {
    // Rounds on fresh files: the race is in the first opening of a file (its switch to WAL),
    // and one round alone rarely lands two switches together.
    let dir = TempDir::new("open-two");
    for round in 0..40 {
        let path = dir.file(&format!("two-{round}.db"));
        let start = std::sync::Arc::new(std::sync::Barrier::new(8));
        let opened: Vec<_> = (0..8)
            .map(|_| {
                let path = path.clone();
                let start = start.clone();
                std::thread::spawn(move || {
                    start.wait();
                    SqliteStore::open(path, Config::default()).map(drop)
                })
            })
            .collect();
        for handle in opened {
            handle.join().expect("no panic")?;
        }
        let raw = Connection::open(&path)?;
        let rows: i64 = raw.query_row("SELECT count(*) FROM keiro_migrations", [], |r| r.get(0))?;
        assert_eq!(rows, SCHEMA_VERSION, "each migration applied once");
    }
    Ok(())
}

/// The smallest value limit the config accepts opens a file (the schema's own statements are
/// read under the same limit) and refuses a value past it; a smaller one is a config error.
#[tokio::test]
async fn the_smallest_value_limit_opens_and_refuses_longer_values(
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir::new("open-small-limit");
    let path = dir.file("small.db");
    let config = Config {
        value_len_max: keiro_sqlite::VALUE_LEN_MIN,
        ..Config::default()
    };
    let store = SqliteStore::open(&path, config.clone())?;
    // A second store opens the migrated file under the same limit, as another process would.
    let again = SqliteStore::open(&path, config.clone())?;
    let fits = "x".repeat(keiro_sqlite::VALUE_LEN_MIN / 2);
    assert!(
        again
            .instance_start(&start_request("fits", json!(fits)))
            .await?
            .created
    );
    let long = "x".repeat(keiro_sqlite::VALUE_LEN_MIN + 1);
    let refused = store
        .instance_start(&start_request("long", json!(long)))
        .await;
    assert!(
        matches!(refused, Err(keiro_journal::StoreError::ValueRefused { .. })),
        "{refused:?}"
    );
    let below = Config {
        value_len_max: keiro_sqlite::VALUE_LEN_MIN - 1,
        ..Config::default()
    };
    let err = SqliteStore::open(dir.file("below.db"), below).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("value_len_max"), "{err}");
    // The limit holds the schema: every statement keiro-sqlite keeps is shorter than it.
    let raw = Connection::open(&path)?;
    let longest: i64 = raw.query_row("SELECT max(length(sql)) FROM sqlite_master", [], |r| {
        r.get(0)
    })?;
    assert!(
        usize::try_from(longest)? < keiro_sqlite::VALUE_LEN_MIN / 2,
        "{longest}"
    );
    Ok(())
}

/// Every single-row write of every table (an insert of every column, an update of every column
/// by primary key, a delete by primary key) compiles to a program that builds no temporary
/// b-tree: their CHECKs, partial indexes' predicates and triggers' conditions run on each write,
/// and a constant `IN` list of more than two values would build one afresh every time. The one
/// exception is the instance delete's cascade, below.
#[test]
fn no_single_row_write_builds_a_temporary_btree() -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir::new("open-ephemeral");
    let path = dir.file("ephemeral.db");
    drop(SqliteStore::open(&path, Config::default())?);
    let raw = Connection::open(&path)?;
    let tables: Vec<String> = raw
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' \
             AND name NOT LIKE 'sqlite_%' ORDER BY name",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    assert!(tables.len() >= 8, "{tables:?}");
    let mut offenders = Vec::new();
    for table in &tables {
        // (name, primary-key position) of each column.
        let columns: Vec<(String, i64)> = raw
            .prepare(&format!("PRAGMA table_info({table})"))?
            .query_map([], |r| Ok((r.get(1)?, r.get(5)?)))?
            .collect::<Result<_, _>>()?;
        let mut key: Vec<&str> = columns
            .iter()
            .filter(|(_, pk)| *pk > 0)
            .map(|(name, _)| name.as_str())
            .collect();
        if key.is_empty() {
            key.push("rowid");
        }
        let by_key = key
            .iter()
            .map(|k| format!("{k} = ?"))
            .collect::<Vec<_>>()
            .join(" AND ");
        let names: Vec<&str> = columns.iter().map(|(name, _)| name.as_str()).collect();
        let statements = [
            format!(
                "INSERT INTO {table} ({}) VALUES ({})",
                names.join(", "),
                vec!["?"; names.len()].join(", ")
            ),
            format!(
                "UPDATE {table} SET {} WHERE {by_key}",
                names
                    .iter()
                    .map(|n| format!("{n} = {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!("DELETE FROM {table} WHERE {by_key}"),
        ];
        for sql in statements {
            // Parameters left unbound (NULL): EXPLAIN only compiles the statement.
            let mut explain = raw.prepare(&format!("EXPLAIN {sql}"))?;
            let mut rows = explain.raw_query();
            let mut opcodes: Vec<String> = Vec::new();
            while let Some(row) = rows.next()? {
                opcodes.push(row.get(1)?);
            }
            // Deleting an instance cascades to its rows in the other tables, and a cascade into
            // a table with its own trigger collects the keys first: retention's one delete per
            // instance, not a write a step makes.
            let cascade = sql.starts_with("DELETE FROM workflows ");
            let built = opcodes.iter().filter(|op| *op == "OpenEphemeral").count();
            if built > usize::from(cascade) {
                offenders.push(sql);
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
    Ok(())
}
