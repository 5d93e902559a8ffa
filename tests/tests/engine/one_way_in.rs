//! One way in (issue 16, item 4): every way of getting a `Keiro` handle over a store that can
//! push wakes its workers by push, without the caller asking for it. Before, `Keiro::new` over
//! a `PgStore` silently lost push and its workers waited for their poll.

use std::sync::Arc;
use std::time::Duration;

use keiro::{Ctx, Keiro, KeiroBuilder, Status, WorkflowError};
use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;

/// Starts a one-step run and requires it finished long before the worker's 30 s poll: only a
/// push can wake the worker in time.
async fn completes_by_push(keiro: &Keiro) -> TestResult {
    assert!(keiro.notifier().is_some(), "the handle has push");
    let worker = keiro
        .worker()
        .register("hello", |ctx: Ctx, name: String| async move {
            ctx.step("greet", || async move {
                Ok::<_, WorkflowError>(format!("hello {name}"))
            })
            .await
        })
        .poll_interval(Duration::from_secs(30))
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    // Let the worker's first pass (which finds nothing) go by, so only a wake-up can find the
    // start below.
    tokio::time::sleep(Duration::from_millis(300)).await;
    keiro.start("hello", "h-1", &"ada").await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while keiro.instance(("hello", "h-1")).await?.expect("row").status != Status::Completed {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a push woke the worker before its poll"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(5), running).await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_with_a_config_has_push() -> TestResult {
    let db = TestDb::new().await;
    let keiro = Keiro::connect(db.config()).await?;
    completes_by_push(&keiro).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_builder_over_a_postgres_store_has_push() -> TestResult {
    let db = TestDb::new().await;
    completes_by_push(&Keiro::builder(db.store()).build()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_only_builder_over_a_postgres_store_finds_its_push() -> TestResult {
    let db = TestDb::new().await;
    let keiro = KeiroBuilder::lease_only(Arc::new(db.store())).build();
    completes_by_push(&keiro).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_builder_over_a_sqlite_store_has_push() -> TestResult {
    completes_by_push(&Keiro::builder(keiro::store::sqlite::SqliteStore::temporary()?).build())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_push_is_only_ever_asked_for() -> TestResult {
    let db = TestDb::new().await;
    let keiro = Keiro::builder(db.store()).without_push().build();
    assert!(keiro.notifier().is_none());
    let sqlite = Keiro::builder(keiro::store::sqlite::SqliteStore::temporary()?)
        .without_push()
        .build();
    assert!(sqlite.notifier().is_none());
    Ok(())
}

/// A batch of starts sends one wake notification for all of them (sql/functions/instance.sql,
/// `keiro_instances_start`): a worker woken by it claims every run of the batch, long before
/// its 30 s poll. Fails if the batch stops notifying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_starts_wakes_the_worker_by_push() -> TestResult {
    let db = TestDb::new().await;
    let keiro = Keiro::builder(db.store()).build();
    let worker = keiro
        .worker()
        .register("many", |ctx: Ctx, n: u32| async move {
            ctx.step("double", || async move { Ok::<_, WorkflowError>(n * 2) })
                .await
        })
        .poll_interval(Duration::from_secs(30))
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids: Vec<String> = (0..8).map(|i| format!("m-{i}")).collect();
    let inputs: Vec<u32> = (0..8).collect();
    let started = keiro
        .start_many("many", ids.iter().map(String::as_str).zip(&inputs))
        .await?;
    assert_eq!(started.len(), ids.len());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for id in &ids {
        while keiro
            .instance(("many", id.as_str()))
            .await?
            .expect("row")
            .status
            != Status::Completed
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the batch's notification woke the worker before its poll"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(5), running).await??;
    Ok(())
}
