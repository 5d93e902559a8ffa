//! Metrics after real scenarios (crash, resume, lease skip, failure at the ceiling, transient
//! errors, awakeables, timers), read back through the OpenTelemetry SDK's in-memory exporter;
//! and a scenario with metrics off that records nothing and behaves the same.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::{
    store::ClaimOutcome, store::LeaseStore, worker::Registry, worker::ResumeOptions,
    worker::TimerOptions, Ctx,
};
use keiro_telemetry::names;
use keiro_telemetry::testing::Recorder;
use keiro_tests::{key, on_both_stores, FaultyStore, Harness, TestResult};

on_both_stores!(
    crash_then_resume_records_steps_runs_and_lengths,
    lease_skip_failure_and_store_errors_are_counted,
    awakeables_and_timers_are_sampled,
    metrics_off_records_nothing_and_changes_nothing,
    queue_admissions_waits_and_depth_are_recorded,
);

fn registry(fail: Arc<AtomicBool>) -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("m", move |ctx: Ctx, (): ()| {
        let fail = fail.clone();
        async move {
            ctx.step("a", || async { Ok::<_, Infallible>(1) }).await?;
            ctx.step("b", || async { Ok::<_, Infallible>(2) }).await?;
            if fail.swap(false, Ordering::SeqCst) {
                return Err(keiro_tests::crash("crash once"));
            }
            ctx.step("c", || async { Ok::<_, Infallible>(3) }).await?;
            Ok(())
        }
    })?;
    registry.register("always-fails", |_ctx: Ctx, (): ()| async move {
        Err::<(), _>(keiro_tests::crash("no"))
    })?;
    registry.register("parks", |ctx: Ctx, (): ()| async move {
        let approval = ctx.awakeable::<bool>("approval").await?;
        approval.value().await
    })?;
    registry.register("naps", |ctx: Ctx, (): ()| async move {
        ctx.sleep("nap", Duration::from_millis(1)).await?;
        Ok(())
    })?;
    Ok(registry)
}

fn with_metrics(h: &Harness, recorder: &Recorder) -> ResumeOptions {
    ResumeOptions {
        metrics: Some(recorder.metrics.clone()),
        ..h.fast_options()
    }
}

async fn crash_then_resume_records_steps_runs_and_lengths(h: Harness) -> TestResult {
    let recorder = Recorder::new();
    let options = with_metrics(&h, &recorder);
    let registry = registry(Arc::new(AtomicBool::new(true)))?;
    h.keiro.start("m", "m-1", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(recorder.total(names::WORKFLOW_RESUMED)?, 1.0);
    assert_eq!(recorder.total(names::WORKFLOW_STEPS_EXECUTED)?, 2.0);
    assert_eq!(recorder.total(names::WORKFLOW_STEPS_REPLAYED)?, 0.0);
    tokio::time::sleep(Duration::from_millis(5)).await;
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(recorder.total(names::WORKFLOW_RESUMED)?, 2.0);
    assert_eq!(
        recorder.total(names::WORKFLOW_STEPS_EXECUTED)?,
        3.0,
        "only the tail ran"
    );
    assert_eq!(recorder.total(names::WORKFLOW_STEPS_REPLAYED)?, 2.0);
    assert_eq!(
        recorder.total(names::WORKFLOW_JOURNAL_LENGTH)?,
        1.0,
        "one completion recorded"
    );
    assert_eq!(
        recorder.total(names::STEP_DURATION)?,
        3.0,
        "one duration per executed step"
    );
    assert_eq!(
        recorder.total(names::WORKFLOW_ACTIVE)?,
        0.0,
        "no run left in progress"
    );
    assert_eq!(recorder.total(names::WORKFLOW_FAILED)?, 0.0);
    let points = recorder.points(names::WORKFLOW_RESUMED)?;
    assert_eq!(
        points.len(),
        1,
        "one series: attributes are bounded to the workflow name"
    );
    assert_eq!(
        points[0].0.get(names::WORKFLOW_NAME).map(String::as_str),
        Some("m")
    );
    Ok(())
}

async fn lease_skip_failure_and_store_errors_are_counted(h: Harness) -> TestResult {
    let recorder = Recorder::new();
    let mut options = with_metrics(&h, &recorder);
    let registry = registry(Arc::new(AtomicBool::new(false)))?;
    h.keiro.start("m", "held", &()).await?;
    let held = h
        .store
        .instance_claim(
            &key("m", "held"),
            "elsewhere",
            Duration::from_secs(60),
            None,
        )
        .await?;
    assert!(matches!(held, ClaimOutcome::Acquired(_)));
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(recorder.total(names::WORKFLOW_LEASE_SKIPPED)?, 1.0);

    options.max_attempts = 1;
    h.keiro.start("always-fails", "f-1", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(recorder.total(names::WORKFLOW_FAILED)?, 1.0);

    let faulty = FaultyStore::new(h.store.clone());
    faulty.fail_appends(true);
    let store: Arc<dyn LeaseStore> = Arc::new(faulty);
    h.keiro.start("m", "flaky", &()).await?;
    keiro::worker::resume_once(&store, &registry, &options).await?;
    assert!(recorder.total(names::WORKFLOW_RESUME_ERRORS)? >= 1.0);
    assert_eq!(
        recorder.total(names::WORKFLOW_FAILED)?,
        1.0,
        "a store error is no failure"
    );
    Ok(())
}

async fn awakeables_and_timers_are_sampled(h: Harness) -> TestResult {
    let recorder = Recorder::new();
    // Sampled at every chance here; the default pace is metric_queries.rs's.
    let metrics = recorder.metrics.clone().gauge_interval(Duration::ZERO);
    let options = ResumeOptions {
        metrics: Some(metrics.clone()),
        ..h.fast_options()
    };
    let registry = registry(Arc::new(AtomicBool::new(false)))?;
    h.keiro.start("parks", "p-1", &()).await?;
    h.keiro.start("naps", "n-1", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    // The gauge is sampled at the start of a pass: the next pass sees the one pending.
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(recorder.total(names::WORKFLOW_AWAKEABLES_PENDING)?, 1.0);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let timers = TimerOptions {
        metrics: Some(metrics),
        ..TimerOptions::default()
    };
    let fired = keiro_resume::fire_due_once(&h.store, &timers).await?;
    assert_eq!(fired.fired.len(), 1);
    assert_eq!(
        recorder.total(names::TIMER_FIRE_LAG)?,
        1.0,
        "one lag recorded per fired timer"
    );
    assert_eq!(
        recorder.total(names::TIMER_BACKLOG)?,
        0.0,
        "nothing left due"
    );
    Ok(())
}

async fn metrics_off_records_nothing_and_changes_nothing(h: Harness) -> TestResult {
    let recorder = Recorder::new();
    let options = h.fast_options(); // metrics: None
    let registry = registry(Arc::new(AtomicBool::new(true)))?;
    h.keiro.start("m", "quiet", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let summary = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(summary.completed, 1);
    assert!(
        recorder.collect()?.is_empty(),
        "nothing reached the provider"
    );
    Ok(())
}

async fn queue_admissions_waits_and_depth_are_recorded(h: Harness) -> TestResult {
    use keiro::queue::{QueueSpec, StartOptions};
    let recorder = Recorder::new();
    h.keiro
        .declare_queue(&QueueSpec::new("llm")?.concurrency(1))
        .await?;
    for n in 0..3 {
        h.keiro
            .start_with("m", &format!("q-{n}"), &(), &StartOptions::on_queue("llm"))
            .await?;
    }
    let worker = h
        .keiro
        .worker()
        .registry(registry(Arc::new(AtomicBool::new(false)))?)
        .metrics(recorder.metrics.clone())
        .queue("llm")
        .build()?;
    // The gauge loop samples while the worker runs, before the runs are admitted one by one.
    let keiro = h.keiro.clone();
    worker
        .run_until(async move {
            for _ in 0..500 {
                let done = keiro
                    .queue("llm")
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|q| q.waiting == 0 && q.running == 0);
                if done {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    assert_eq!(recorder.total(names::QUEUE_ADMITTED)?, 3.0);
    let waits = recorder.points(names::QUEUE_ADMISSION_WAIT)?;
    assert_eq!(waits.len(), 1, "one series, by queue name");
    assert_eq!(
        waits[0].0.get(names::QUEUE_NAME).map(String::as_str),
        Some("llm")
    );
    assert_eq!(
        recorder.total(names::QUEUE_ADMISSION_WAIT)?,
        3.0,
        "a wait per first admission"
    );
    let waiting = recorder.points(names::QUEUE_WAITING)?;
    assert_eq!(waiting.len(), 1, "sampled once at least, one series");
    Ok(())
}
