//! Runs stay on the code that started them (issue 38 §1): two workers, v1 and v2, on one schema
//! or file. Runs started under v1 are driven only by v1, even while v2 is idle; after a move
//! to v2 they complete on v2. A running worker's heartbeat row says what it serves. Both stores.

use std::time::Duration;

use keiro::{Ctx, Status, WorkflowError};
use keiro_tests::{on_both_stores, spawn_worker, until_status, FastWorker, Harness, TestResult};

on_both_stores!(
    runs_stay_on_their_version_until_moved,
    a_running_worker_beats_what_it_serves_and_leaves_when_stopped,
    a_direct_run_of_another_versions_run_waits_for_its_version,
    the_check_before_a_move_finds_runs_the_new_code_diverges_from,
);

/// A body that returns the version of the worker that ran its step.
fn tagged(
    tag: &'static str,
) -> impl Fn(
    Ctx,
    (),
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<String, WorkflowError>> + Send>,
> + Clone
       + Send
       + Sync
       + 'static {
    move |ctx: Ctx, (): ()| {
        Box::pin(async move {
            ctx.step("work", || async move {
                Ok::<_, std::convert::Infallible>(tag.to_owned())
            })
            .await
        })
    }
}

async fn output(
    h: &Harness,
    id: &str,
) -> Result<(Status, Option<serde_json::Value>), keiro::Error> {
    let row = h.keiro.instance(("wf", id)).await?.expect("started");
    Ok((row.status, row.output))
}

async fn runs_stay_on_their_version_until_moved(h: Harness) -> TestResult {
    let (v1, v2) = (h.versioned("v1").await, h.versioned("v2").await);
    let w1 = v1
        .keiro
        .worker()
        .fast()
        .register("wf", tagged("v1"))
        .build()?;
    let w2 = v2
        .keiro
        .worker()
        .fast()
        .register("wf", tagged("v2"))
        .build()?;
    v1.keiro.start("wf", "a", &()).await?;
    v2.keiro.start("wf", "c", &()).await?;

    // v2 drives its own run and, idle, leaves v1's alone.
    w2.drain().await?;
    assert_eq!(
        output(&h, "c").await?,
        (Status::Completed, Some("v2".into()))
    );
    assert_eq!(w2.drain().await?.advanced, 0);
    assert_eq!(output(&h, "a").await?, (Status::Running, None));
    assert!(
        h.keiro.journal(("wf", "a")).await?.is_empty(),
        "no step of a ran"
    );

    w1.drain().await?;
    assert_eq!(
        output(&h, "a").await?,
        (Status::Completed, Some("v1".into()))
    );

    // After a move, v1's new run completes on v2, and v1 no longer takes it.
    v1.keiro.start("wf", "b", &()).await?;
    assert_eq!(h.keiro.versions_move("v1", "v2").await?, 1);
    assert_eq!(w1.drain().await?.advanced, 0);
    assert_eq!(output(&h, "b").await?, (Status::Running, None));
    let running = spawn_worker(w2.clone());
    until_status(&h.keiro, "wf", "b", Status::Completed, || async { Ok(()) }).await?;
    running.stop().await?;
    assert_eq!(
        output(&h, "b").await?,
        (Status::Completed, Some("v2".into()))
    );
    let b = h.keiro.instance(("wf", "b")).await?.expect("started");
    assert_eq!(b.app_version.as_deref(), Some("v2"));
    Ok(())
}

async fn a_running_worker_beats_what_it_serves_and_leaves_when_stopped(h: Harness) -> TestResult {
    let v2 = h.versioned("v2").await;
    let worker = v2
        .keiro
        .worker()
        .fast()
        .owner("w-v2")
        .register("wf", tagged("v2"))
        .build()?;
    let running = spawn_worker(worker);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let row = loop {
        if let Some(row) = h.keiro.workers().await?.into_iter().next() {
            break row;
        }
        assert!(tokio::time::Instant::now() < deadline, "no heartbeat");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        (row.worker_id.as_str(), row.app_version.as_str()),
        ("w-v2", "v2")
    );
    assert_eq!(row.serves, keiro::versions::Versions::only(["v2"]));
    running.stop().await?;
    assert!(
        h.keiro.workers().await?.is_empty(),
        "a stopped worker leaves"
    );
    Ok(())
}

async fn a_direct_run_of_another_versions_run_waits_for_its_version(h: Harness) -> TestResult {
    let (v1, v2) = (h.versioned("v1").await, h.versioned("v2").await);
    let w1 = v1
        .keiro
        .worker()
        .fast()
        .register("wf", tagged("v1"))
        .build()?;
    let w2 = v2
        .keiro
        .worker()
        .fast()
        .register("wf", tagged("v2"))
        .build()?;
    v1.keiro.start("wf", "a", &()).await?;
    // v2 runs it directly: the run is v1's, so v2 waits for v1's worker to finish it.
    let direct = tokio::spawn(async move { w2.run_named::<String, _>("wf", "a", &()).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        h.keiro.journal(("wf", "a")).await?.is_empty(),
        "v2 ran no step"
    );
    w1.drain().await?;
    assert_eq!(direct.await??, "v1");
    // A run v2 starts directly is v2's, and v2 runs it.
    let w2 = v2
        .keiro
        .worker()
        .fast()
        .register("wf", tagged("v2"))
        .build()?;
    assert_eq!(w2.run_named::<String, _>("wf", "b", &()).await?, "v2");
    Ok(())
}

/// Ships under `step`, then waits an hour: a live run with one recorded step.
fn parked(
    step: &'static str,
) -> impl Fn(
    Ctx,
    (),
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), WorkflowError>> + Send>>
       + Clone
       + Send
       + Sync
       + 'static {
    move |ctx: Ctx, (): ()| {
        Box::pin(async move {
            ctx.step(step, || async { Ok::<_, std::convert::Infallible>(1) })
                .await?;
            ctx.sleep("wait", Duration::from_secs(3600)).await
        })
    }
}

async fn the_check_before_a_move_finds_runs_the_new_code_diverges_from(h: Harness) -> TestResult {
    let v1 = h.versioned("v1").await;
    let old = v1
        .keiro
        .worker()
        .fast()
        .register("wf", parked("ship"))
        .build()?;
    v1.keiro.start("wf", "a", &()).await?;
    old.drain().await?;
    assert_eq!(output(&h, "a").await?.0, Status::Suspended);

    let same = h.keiro.worker().register("wf", parked("ship")).build()?;
    let refused = keiro::testing::verify_version(&h.keiro, same.registry(), "v1", 100).await?;
    assert!(refused.is_empty(), "{refused:?}");
    let renamed = h.keiro.worker().register("wf", parked("send")).build()?;
    let refused = keiro::testing::verify_version(&h.keiro, renamed.registry(), "v1", 100).await?;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        matches!(
            refused[0].1,
            keiro::testing::ReplayMismatch::NonDeterminism { .. }
        ),
        "{refused:?}"
    );
    Ok(())
}
