//! Applying the migrations again, or from racing processes, applies nothing twice.

use crate::common::TestResult;
use keiro_postgres::PgStore;
use keiro_tests::pg::TestDb;

/// The versions of every numbered migration file (`crates/migrations/numbered/`), numbered
/// from 1: each must be applied, once.
fn every_version() -> Vec<i32> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations/numbered");
    let files = std::fs::read_dir(dir)
        .expect("the migrations folder exists")
        .filter_map(Result::ok)
        .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "sql"))
        .count();
    (1..=i32::try_from(files).expect("a few migrations")).collect()
}

#[tokio::test]
async fn a_second_run_applies_nothing() -> TestResult {
    let db = TestDb::new().await; // the first run
    let store = db.store();
    assert!(store.migrate().await?.is_empty());
    // A store built afresh on the same schema agrees.
    let other = PgStore::connect(db.config()).await?;
    assert!(other.migrate().await?.is_empty());

    let client = store.pool().get().await?;
    let versions: Vec<i32> = client
        .query("SELECT version FROM keiro_migrations ORDER BY version", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(versions, every_version());
    Ok(())
}

#[tokio::test]
async fn racing_runners_apply_each_migration_once() -> TestResult {
    let db = TestDb::new().await;
    // Start from an empty schema; the TestDb drops it again at the end.
    let client = db.store().pool().get().await?;
    client
        .batch_execute(&format!("DROP SCHEMA \"{}\" CASCADE", db.schema()))
        .await?;
    drop(client);

    let (a, b) = (
        PgStore::connect(db.config()).await?,
        PgStore::connect(db.config()).await?,
    );
    let (applied_a, applied_b) = tokio::join!(a.migrate(), b.migrate());
    let mut applied = [applied_a?, applied_b?];
    applied.sort();
    assert_eq!(applied, [vec![], every_version()]);
    Ok(())
}
