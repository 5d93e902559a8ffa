//! Retention rules that hold of one store alone: Postgres lets one collector run at a time, and
//! a worker refuses to collect on a store without retention. The rules of every store are in
//! the contract suite (`keiro_tests::contract::retention`).

use std::time::Duration;

use keiro::{Error, Status};
use keiro_tests::contract::retention::collect::{later, status, worker};
use keiro_tests::{Harness, TestResult};

/// Postgres: one collector at a time; a second returns at once, locked out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_collector_is_locked_out() -> TestResult {
    let h = Harness::postgres().await;
    let worker = worker(&h)?;
    h.keiro.start("boom", "f-1", &()).await?;
    worker.drain().await?;
    let db = h.db.as_ref().expect("postgres");
    let holder = db.store().pool().get().await?;
    holder
        .execute(
            "SELECT pg_advisory_lock(hashtextextended(current_schema() || '.retention', 0))",
            &[],
        )
        .await?;
    let batch = h.keiro.gc_batch(&later(2)).await?;
    assert!(batch.locked_out, "{batch:?}");
    assert_eq!(batch.instances, 0);
    assert_eq!(status(&h, "boom", "f-1").await?, Some(Status::Failed));
    holder
        .execute(
            "SELECT pg_advisory_unlock(hashtextextended(current_schema() || '.retention', 0))",
            &[],
        )
        .await?;
    let batch = h.keiro.gc_batch(&later(2)).await?;
    assert_eq!((batch.instances, batch.locked_out), (1, false));
    Ok(())
}

/// A worker asked to collect on a store without retention is refused at build.
#[test]
fn retention_needs_a_retention_store() -> TestResult {
    let store = std::sync::Arc::new(keiro::store::sqlite::SqliteStore::temporary()?);
    let built = keiro::WorkerBuilder::new(store)
        .retention(Some(Duration::from_secs(60)))
        .build();
    assert!(matches!(built, Err(Error::Unsupported { .. })), "{built:?}");
    let zero = keiro::Keiro::temporary()?
        .worker()
        .retention(Some(Duration::ZERO))
        .build();
    assert!(matches!(zero, Err(Error::Options(_))), "{zero:?}");
    Ok(())
}
