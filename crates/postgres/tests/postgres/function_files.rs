//! The function files (`crates/migrations/functions/`): every way a schema gets to this build ends with the
//! same functions, triggers, tables and indexes as a fresh one; a changed file is applied
//! again and an unchanged one costs nothing; a schema a newer build migrated (a migration this
//! build does not know, or function files of a higher revision) keeps its functions, so two
//! builds of a rolling deploy do not put back their own in turn; the checksums migrations
//! shipped with before the files existed are accepted.

use keiro_postgres::builds::OtherBuild as _;
use std::time::{Duration, Instant};

use crate::common::{history, sql, TestResult};
use keiro_postgres::{Config, Error, FunctionFiles, PgStore};
use keiro_tests::pg::TestDb;
use sha2::{Digest, Sha256};

/// The last commit whose migrations still defined every function: schemas migrated by a
/// build of it (or of any commit since 0017 until the function files) hold exactly what its
/// `migrations/` folder made.
const LAST_BUILD_WITH_FUNCTIONS_IN_MIGRATIONS: &str = "22cf95a1b301b4f06e7e01636b412540b57ef4fd";

/// What a schema holds, as sorted `(kind, name, definition)` lines with the schema's name
/// replaced by `SCHEMA`, so two schemas compare equal when they were made alike.
async fn snapshot(
    store: &PgStore,
    schema: &str,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    const SNAPSHOT: &str = "\
        SELECT 'function', p.oid::regprocedure::text, \
               pg_get_functiondef(p.oid) || ' config ' || coalesce(p.proconfig::text, '') \
        FROM pg_proc p WHERE p.pronamespace = $1::text::regnamespace \
        UNION ALL \
        SELECT 'trigger', c.relname || '.' || t.tgname, pg_get_triggerdef(t.oid) \
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
        WHERE c.relnamespace = $1::text::regnamespace AND NOT t.tgisinternal \
        UNION ALL \
        SELECT 'column', c.relname || '.' || a.attname, \
               format_type(a.atttypid, a.atttypmod) || ' collate ' || coalesce(co.collname, '') \
               || ' not null ' || a.attnotnull || ' identity ' || a.attidentity::text \
               || ' default ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') \
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
        LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0 \
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
        WHERE c.relnamespace = $1::text::regnamespace AND c.relkind = 'r' \
          AND a.attnum > 0 AND NOT a.attisdropped \
        UNION ALL \
        SELECT 'constraint', c.relname || '.' || k.conname, pg_get_constraintdef(k.oid) \
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid \
        WHERE c.relnamespace = $1::text::regnamespace \
        UNION ALL \
        SELECT 'index', c.relname, pg_get_indexdef(c.oid) \
        FROM pg_class c WHERE c.relnamespace = $1::text::regnamespace AND c.relkind = 'i'";
    let rows = sql(store).await?.query(SNAPSHOT, &[&schema]).await?;
    let mut lines: Vec<String> = rows
        .iter()
        .map(|row| {
            let (kind, name, definition): (String, String, String) =
                (row.get(0), row.get(1), row.get(2));
            format!("{kind} {name}: {definition}").replace(schema, "SCHEMA")
        })
        .collect();
    lines.sort();
    Ok(lines)
}

/// Only the lines of one kind.
fn of_kind<'a>(lines: &'a [String], kind: &str) -> Vec<&'a String> {
    lines
        .iter()
        .filter(|line| line.starts_with(&format!("{kind} ")))
        .collect()
}

/// Asserts two snapshots are equal, naming the lines that differ.
fn assert_same(left: &[String], right: &[String], what: &str) {
    let missing: Vec<&String> = left.iter().filter(|l| !right.contains(l)).collect();
    let extra: Vec<&String> = right.iter().filter(|l| !left.contains(l)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: only in the first: {missing:#?}\nonly in the second: {extra:#?}"
    );
}

/// Empties a test's schema (its `TestDb` drops it again at the end).
async fn empty(db: &TestDb) -> TestResult {
    sql(&db.store())
        .await?
        .batch_execute(&format!(
            "DROP SCHEMA \"{0}\" CASCADE; CREATE SCHEMA \"{0}\"",
            db.schema()
        ))
        .await?;
    Ok(())
}

/// The function files recorded in `keiro_functions`, with their checksums and the transaction
/// that wrote each row (a row left alone keeps its `xmin`).
async fn recorded(
    store: &PgStore,
) -> Result<Vec<(String, Vec<u8>, String)>, Box<dyn std::error::Error + Send + Sync>> {
    Ok(sql(store)
        .await?
        .query(
            "SELECT file, checksum, xmin::text FROM keiro_functions ORDER BY file",
            &[],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect())
}

#[tokio::test]
async fn a_schema_migrated_step_by_step_ends_like_a_fresh_one() -> TestResult {
    let fresh = TestDb::new().await;
    let stepped = TestDb::new().await;
    empty(&stepped).await?;
    let store = stepped.store();
    let newest: i32 = sql(&fresh.store())
        .await?
        .query_one("SELECT max(version) FROM keiro_migrations", &[])
        .await?
        .get(0);
    for version in 1..=newest {
        assert_eq!(store.migrate_to(version).await?, vec![version]);
        let files: i64 = sql(&store)
            .await?
            .query_one("SELECT count(*) FROM keiro_functions", &[])
            .await?
            .get(0);
        // The function files come once the newest migration is in, not before.
        assert_eq!(files > 0, version == newest, "after migration {version}");
    }
    assert!(store.migrate().await?.is_empty());

    let expected = snapshot(&fresh.store(), fresh.schema()).await?;
    assert!(of_kind(&expected, "function").len() > 30);
    assert_eq!(of_kind(&expected, "trigger").len(), 7);
    assert_same(
        &expected,
        &snapshot(&store, stepped.schema()).await?,
        "fresh, then stepped",
    );
    Ok(())
}

/// The migrations of the last build that defined functions in them, read from git, with
/// their file names.
fn shipped_migrations(git: &history::Git) -> Result<Vec<(String, String)>, String> {
    git.files(LAST_BUILD_WITH_FUNCTIONS_IN_MIGRATIONS, "migrations/")?
        .into_iter()
        .filter(|path| path.ends_with(".sql"))
        .map(|path| {
            let sql = git.show(LAST_BUILD_WITH_FUNCTIONS_IN_MIGRATIONS, &path)?;
            Ok((path.trim_start_matches("migrations/").to_owned(), sql))
        })
        .collect()
}

#[tokio::test]
async fn a_schema_the_previous_layout_migrated_upgrades_to_exactly_a_fresh_schema() -> TestResult {
    let what = format!("the migrations of commit {LAST_BUILD_WITH_FUNCTIONS_IN_MIGRATIONS}");
    let Some(shipped) = history::read(&what, shipped_migrations)? else {
        return Ok(());
    };
    assert_eq!(
        shipped.len(),
        17,
        "{:?}",
        shipped.iter().map(|(f, _)| f).collect::<Vec<_>>()
    );
    let fresh = TestDb::new().await;
    let old = TestDb::new().await;
    empty(&old).await?;

    // What that build's runner did: each file in a transaction with its bookkeeping row.
    let mut client = sql(&old.store()).await?;
    client
        .batch_execute(
            "CREATE TABLE keiro_migrations (version integer PRIMARY KEY, name text NOT NULL, \
             checksum bytea NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await?;
    for (file, migration) in &shipped {
        let version: i32 = file[..4].parse()?;
        let name = file[5..].trim_end_matches(".sql");
        let tx = client.transaction().await?;
        tx.batch_execute(migration).await?;
        tx.execute(
            "INSERT INTO keiro_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            &[
                &version,
                &name,
                &Sha256::digest(migration.as_bytes()).to_vec(),
            ],
        )
        .await?;
        tx.commit().await?;
    }
    drop(client);

    // This build's files replace every function and trigger of the previous layout (that
    // layout made the very same ones when the files were written; later edits of the files
    // show here as what an upgrade changes).
    let expected = snapshot(&fresh.store(), fresh.schema()).await?;
    // Its shipped checksums are accepted, only the migrations written after that build are
    // pending, and every file is applied.
    let shipped_last = i32::try_from(shipped.len())?;
    let written_since: Vec<i32> = migration_versions()?
        .into_iter()
        .filter(|v| *v > shipped_last)
        .collect();
    assert_eq!(old.store().migrate().await?, written_since);
    assert_same(
        &expected,
        &snapshot(&old.store(), old.schema()).await?,
        "fresh, then upgraded",
    );
    assert!(old.store().migrate().await?.is_empty());
    Ok(())
}

/// The version of every numbered migration file (`crates/migrations/numbered/`), in order.
fn migration_versions() -> Result<Vec<i32>, Box<dyn std::error::Error + Send + Sync>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations/numbered");
    let mut versions = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(version) = name.get(..4).and_then(|v| v.parse().ok()) {
            versions.push(version);
        }
    }
    versions.sort_unstable();
    Ok(versions)
}

#[tokio::test]
async fn a_changed_function_file_is_applied_again_and_an_unchanged_one_is_skipped() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let before = recorded(&store).await?;
    assert!(before.len() >= 9, "{before:?}");
    let expected = snapshot(&store, db.schema()).await?;

    // An unchanged schema: the lock, the catalog, both bookkeeping tables, the unlock. No
    // transaction, no write.
    let trips = store.round_trips();
    assert!(store.migrate().await?.is_empty());
    assert_eq!(store.round_trips() - trips, 5);
    assert_eq!(recorded(&store).await?, before);

    // As if `journal.sql` had changed since: another checksum, and an older body in place.
    let client = sql(&store).await?;
    client
        .batch_execute(
            "UPDATE keiro_functions SET checksum = '\\x00' WHERE file = 'journal'; \
             CREATE OR REPLACE FUNCTION keiro_step_revision(p_stored text) RETURNS integer \
             LANGUAGE sql IMMUTABLE AS $$ SELECT 0 $$;",
        )
        .await?;
    assert!(store.migrate().await?.is_empty());
    let after = recorded(&store).await?;
    for ((file, sum, xmin), (_, sum_before, xmin_before)) in after.iter().zip(&before) {
        assert_eq!(
            sum, sum_before,
            "{file}: the file's own checksum is recorded"
        );
        assert_eq!(
            xmin != xmin_before,
            file == "journal",
            "{file} applied again"
        );
    }
    assert_same(
        &expected,
        &snapshot(&store, db.schema()).await?,
        "before, then after re-applying",
    );
    let revision: i32 = client
        .query_one("SELECT keiro_step_revision('remote:charge#3')", &[])
        .await?
        .get(0);
    assert_eq!(revision, 3);

    // A file missing from the bookkeeping is applied too.
    client
        .batch_execute("DELETE FROM keiro_functions WHERE file = 'remote'")
        .await?;
    assert!(store.migrate().await?.is_empty());
    assert_eq!(recorded(&store).await?.len(), before.len());
    Ok(())
}

#[tokio::test]
async fn a_schema_a_newer_build_migrated_keeps_its_functions() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let client = sql(&store).await?;
    // A newer build applied a migration this one does not know, and its `journal.sql` (here:
    // another checksum and another body).
    client
        .batch_execute(
            "INSERT INTO keiro_migrations (version, name, checksum) \
                 VALUES (9999, 'from_the_future', '\\x00'); \
             UPDATE keiro_functions SET checksum = '\\x01' WHERE file = 'journal'; \
             CREATE OR REPLACE FUNCTION keiro_step_revision(p_stored text) RETURNS integer \
             LANGUAGE sql IMMUTABLE AS $$ SELECT 42 $$;",
        )
        .await?;
    let before = recorded(&store).await?;

    assert!(store.migrate().await?.is_empty());
    assert_eq!(recorded(&store).await?, before, "nothing applied");
    let revision: i32 = client
        .query_one("SELECT keiro_step_revision('remote:charge#3')", &[])
        .await?
        .get(0);
    assert_eq!(revision, 42, "the newer build's function stays");
    Ok(())
}

/// `notify.sql` as a build of other function files has it: another body of one function.
const OTHER_NOTIFY: &str = "\
    CREATE OR REPLACE FUNCTION keiro_notify_timer() RETURNS void \
    LANGUAGE sql AS $$ SELECT pg_notify(current_schema() || '.wake', 'another body') $$;";

/// What `pg_get_functiondef` shows of `keiro_notify_timer` in the store's schema.
async fn notify_timer(store: &PgStore) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    Ok(sql(store)
        .await?
        .query_one(
            "SELECT pg_get_functiondef('keiro_notify_timer'::regproc)",
            &[],
        )
        .await?
        .get(0))
}

/// The revisions recorded, oldest first.
async fn revisions(store: &PgStore) -> Result<Vec<i32>, Box<dyn std::error::Error + Send + Sync>> {
    Ok(sql(store)
        .await?
        .query(
            "SELECT revision FROM keiro_function_revisions ORDER BY revision",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// This build's revision of its function files, as a fresh schema records it.
async fn this_revision(store: &PgStore) -> Result<i32, Box<dyn std::error::Error + Send + Sync>> {
    match store.migrate_report().await?.functions {
        FunctionFiles::UpToDate { revision } => Ok(revision),
        other => Err(format!("a migrated schema is up to date, not {other:?}").into()),
    }
}

#[tokio::test]
async fn an_older_build_of_the_same_migrations_leaves_the_newer_function_files() -> TestResult {
    let db = TestDb::new().await; // migrated by this build
    let store = db.store();
    let ours = this_revision(&store).await?;
    assert_eq!(revisions(&store).await?, vec![ours]);
    let newer_body = notify_timer(&store).await?;
    let before = recorded(&store).await?;

    // A rolling deploy: a process of the previous build, with the same migrations and older
    // function files, starts and migrates after this one did.
    let older = store
        .migrate_as_build(ours - 1, &[("notify", OTHER_NOTIFY)])
        .await?;
    assert_eq!(
        notify_timer(&store).await?,
        newer_body,
        "the newer body stays"
    );
    assert!(older.migrations.is_empty());
    assert_eq!(
        older.functions,
        FunctionFiles::NewerRevision {
            ours: ours - 1,
            schema: ours
        }
    );
    assert_eq!(recorded(&store).await?, before, "nothing applied");
    assert_eq!(revisions(&store).await?, vec![ours]);

    // And this build, starting again, finds its own files in place: nothing flips back.
    assert_eq!(this_revision(&store).await?, ours);
    assert_eq!(recorded(&store).await?, before);
    Ok(())
}

#[tokio::test]
async fn a_newer_revision_applies_its_files_and_this_build_then_leaves_them() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let ours = this_revision(&store).await?;

    let newer = store
        .migrate_as_build(ours + 1, &[("notify", OTHER_NOTIFY)])
        .await?;
    assert_eq!(
        newer.functions,
        FunctionFiles::Applied {
            revision: ours + 1,
            files: vec!["notify"]
        }
    );
    let newer_body = notify_timer(&store).await?;
    assert!(newer_body.contains("another body"), "{newer_body}");
    assert_eq!(revisions(&store).await?, vec![ours, ours + 1]);

    let report = store.migrate_report().await?;
    assert_eq!(
        report.functions,
        FunctionFiles::NewerRevision {
            ours,
            schema: ours + 1
        }
    );
    assert_eq!(notify_timer(&store).await?, newer_body);
    Ok(())
}

#[tokio::test]
async fn the_same_revision_with_other_files_is_refused() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let ours = this_revision(&store).await?;
    let body = notify_timer(&store).await?;
    let before = recorded(&store).await?;

    // A build that changed a file and kept the revision.
    let err = store
        .migrate_as_build(ours, &[("notify", OTHER_NOTIFY)])
        .await
        .expect_err("the files differ under one revision");
    assert!(
        matches!(&err, Error::FunctionRevisionChanged { schema, revision }
            if schema == db.schema() && *revision == ours),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("without raising the revision"),
        "{err}"
    );
    assert!(!err.is_retryable());
    assert_eq!(notify_timer(&store).await?, body, "nothing applied");
    assert_eq!(recorded(&store).await?, before);
    Ok(())
}

#[tokio::test]
async fn a_schema_from_before_revisions_gets_this_builds_files_and_revision() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let ours = this_revision(&store).await?;
    let body = notify_timer(&store).await?;
    // As a build from before revisions leaves a schema: no revisions table, and (a rolling
    // deploy from it) its own `notify.sql` put back.
    sql(&store)
        .await?
        .batch_execute(&format!(
            "DROP TABLE keiro_function_revisions; \
             UPDATE keiro_functions SET checksum = '\\x00' WHERE file = 'notify'; {OTHER_NOTIFY}"
        ))
        .await?;

    let report = store.migrate_report().await?;
    assert_eq!(
        report.functions,
        FunctionFiles::Applied {
            revision: ours,
            files: vec!["notify"]
        }
    );
    assert_eq!(notify_timer(&store).await?, body);
    assert_eq!(revisions(&store).await?, vec![ours]);
    Ok(())
}

#[tokio::test]
async fn a_shipped_migration_checksum_is_accepted_and_any_other_is_refused() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let client = sql(&store).await?;
    // The checksum 0001 shipped with, before its functions moved to function files:
    // `git show <LAST_BUILD_WITH_FUNCTIONS_IN_MIGRATIONS>:migrations/0001_init.sql | sha256sum`.
    client
        .batch_execute(
            "UPDATE keiro_migrations SET checksum = \
             '\\x1c45e716cf1cc11a8a39ec6bc4170b7e0e2b5efc1bf3090822435ee88906e278' \
             WHERE version = 1",
        )
        .await?;
    assert!(store.migrate().await?.is_empty());

    // One byte off is an edited migration, as before.
    client
        .batch_execute(
            "UPDATE keiro_migrations SET checksum = \
             '\\x1c45e716cf1cc11a8a39ec6bc4170b7e0e2b5efc1bf3090822435ee88906e279' \
             WHERE version = 1",
        )
        .await?;
    let err = store.migrate().await.expect_err("the checksum differs");
    assert!(
        matches!(
            &err,
            Error::MigrationChanged {
                version: 1,
                name: "init",
                ..
            }
        ),
        "{err:?}"
    );
    Ok(())
}

/// The key of the schema's migration lock, derived as every build derives it: builds racing
/// on one schema must take the same lock.
fn migration_lock_key(schema: &str) -> i64 {
    let digest = Sha256::digest(format!("keiro.migrate:{schema}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}

#[tokio::test]
async fn a_runner_waits_for_a_held_migration_lock_only_as_long_as_configured() -> TestResult {
    let db = TestDb::new().await;
    // Another runner's session holds the lock, and does not let go.
    let holder = sql(&db.store()).await?;
    let key = migration_lock_key(db.schema());
    let taken: bool = holder
        .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
        .await?
        .get(0);
    assert!(taken);

    let wait = Duration::from_millis(300);
    let store = PgStore::connect(Config {
        migrate_lock_timeout: wait,
        ..db.config()
    })
    .await?;
    let started = Instant::now();
    let err = store.migrate().await.expect_err("the lock is held");
    let took = started.elapsed();
    assert!(
        matches!(&err, Error::MigrationLocked { schema, waited } if schema == db.schema() && *waited >= wait),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(err.to_string().contains("migration lock"), "{err}");
    assert!(
        took >= wait && took < wait + Duration::from_secs(2),
        "{took:?}"
    );

    // Once the holder lets go, the same runner goes through.
    holder
        .query_one("SELECT pg_advisory_unlock($1)", &[&key])
        .await?;
    assert!(store.migrate().await?.is_empty());
    Ok(())
}

#[test]
fn a_zero_lock_wait_is_refused() {
    let config = Config {
        migrate_lock_timeout: Duration::ZERO,
        ..Config::default()
    };
    let err = config.validate().expect_err("zero");
    assert!(
        matches!(
            &err,
            Error::Config {
                field: "migrate_lock_timeout",
                ..
            }
        ),
        "{err:?}"
    );
}
