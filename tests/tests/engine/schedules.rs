//! Schedule rules that hold of one store alone: an unreadable Postgres row, and the SQLite
//! store's pinned clock driving the scheduler. The rules of every store are in the contract
//! suite (`keiro_tests::contract::schedule`).

use std::time::Duration;

use keiro::{
    schedule::CatchUp, schedule::Overlap, schedule::SchedulerOptions, InstanceKey, Keiro, Status,
};
use keiro_tests::contract::schedule::scheduler::{
    every_minute, job, options, started, worker, MINUTE,
};
use keiro_tests::{until_status, Harness, TestResult};
use time::macros::datetime;

/// A row keiro cannot read (edited by hand, or by another build, into a workflow name no id
/// may carry) is one schedule's failure on Postgres: recorded on its row and backed off, while
/// the others start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_schedule_row_never_holds_up_the_others() -> TestResult {
    let h = Harness::postgres().await;
    let db = h.db.as_ref().expect("postgres");
    every_minute(
        &h,
        "garbled",
        Overlap::AllowAll,
        CatchUp::None,
        datetime!(2026-01-01 10:00:30 UTC),
    )
    .await?;
    every_minute(
        &h,
        "fine",
        Overlap::AllowAll,
        CatchUp::None,
        datetime!(2026-01-01 10:01:30 UTC),
    )
    .await?;
    db.store()
        .pool()
        .get()
        .await?
        .execute(
            "UPDATE schedules SET workflow_name = 'no:such' WHERE name = 'garbled'",
            &[],
        )
        .await?;
    let w = worker(&h, "a")?;
    let now = datetime!(2026-01-01 10:02:01 UTC);
    let pass = w.schedule_once(Some(now)).await?;
    assert_eq!(
        started(&h, "fine", &[datetime!(2026-01-01 10:02 UTC)])
            .await?
            .len(),
        1,
        "the readable schedule starts"
    );
    assert_eq!(pass.failed, 1);
    let client = db.store().pool().get().await?;
    let row = client
        .query_one(
            "SELECT last_error, failures, retry_at > $1 AS backed_off FROM schedules \
             WHERE name = 'garbled'",
            &[&now],
        )
        .await?;
    let error: Option<String> = row.get("last_error");
    let error = error.expect("the reason is recorded");
    assert!(error.contains("malformed"), "{error}");
    assert_eq!(row.get::<_, i32>("failures"), 1);
    assert!(row.get::<_, bool>("backed_off"));
    let again = w.schedule_once(Some(now)).await?;
    assert_eq!(again.failed, 0, "backed off");
    Ok(())
}

/// The SQLite store's pinned clock drives the scheduler when no `now` is passed: a test moves
/// it past a tick instead of sleeping.
#[tokio::test]
async fn the_sqlite_stores_pinned_clock_drives_the_scheduler() -> TestResult {
    let sqlite = keiro::store::sqlite::SqliteStore::temporary()?;
    sqlite.pin_clock(Some(datetime!(2026-01-01 10:00:30 UTC)));
    let keiro = Keiro::builder(sqlite.clone()).without_push().build();
    keiro.schedule("m", "job").every(MINUTE).save().await?;
    let w = keiro
        .worker()
        .register("job", job)
        .scheduler(Some(options("m")))
        .build()?;
    assert_eq!(w.schedule_once(None).await?.started, 0);
    sqlite.pin_clock(Some(datetime!(2026-01-01 10:01:00 UTC)));
    assert_eq!(w.schedule_once(None).await?.started, 1);
    let key = InstanceKey::parse("job", "m@20260101T100100Z")?;
    assert!(keiro.instance(&key).await?.is_some());
    Ok(())
}

/// The loop a worker runs: started by `run_until`, it starts a due tick on its own.
#[tokio::test]
async fn a_running_worker_schedules_on_its_own() -> TestResult {
    let sqlite = keiro::store::sqlite::SqliteStore::temporary()?;
    sqlite.pin_clock(Some(datetime!(2026-01-01 10:00:59 UTC)));
    let keiro = Keiro::builder(sqlite.clone()).build();
    keiro.schedule("loop", "job").every(MINUTE).save().await?;
    sqlite.pin_clock(Some(datetime!(2026-01-01 10:01:00 UTC)));
    let w = keiro
        .worker()
        .register("job", job)
        .scheduler(Some(SchedulerOptions {
            poll_interval: Duration::from_millis(20),
            ..options("loop")
        }))
        .build()?;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn({
        let w = w.clone();
        async move {
            w.run_until(async {
                let _ = done_rx.await;
            })
            .await
        }
    });
    // The worker runs the tick; the test only looks.
    until_status(
        &keiro,
        "job",
        "loop@20260101T100100Z",
        Status::Completed,
        || async { Ok(()) },
    )
    .await?;
    let _ = done_tx.send(());
    runner.await?;
    // Shutdown gave the leadership up.
    assert!(
        !keiro
            .schedule_store()
            .expect("the sqlite store has schedules")
            .scheduler_release("loop")
            .await?
    );
    Ok(())
}
