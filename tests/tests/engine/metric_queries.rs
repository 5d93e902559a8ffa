//! What metrics cost the store, and what they count: the database-counted gauges are sampled on
//! a period, not per pass or batch, and awakeables nobody can await any more (a cancelled
//! run's, a generation's left by continue-as-new) are settled rather than pending forever.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use keiro::{store::LeaseStore, worker::Registry, workflow::AwakeableOutcome, Ctx, WorkflowError};
use keiro_journal::AwakeableStatus;
use keiro_resume::TimerOptions;
use keiro_telemetry::names;
use keiro_telemetry::testing::Recorder;
use keiro_tests::counting::CountingStore;
use keiro_tests::{key, on_both_stores, Harness, TestResult};
use uuid::Uuid;

on_both_stores!(
    passes_and_timer_batches_sample_the_gauges_once_per_interval,
    a_cancelled_runs_awakeables_are_settled,
    awakeables_of_a_generation_left_by_continue_as_new_are_settled,
);

/// `approver` parks on an awakeable and records its id; `roller` creates one in generation 0
/// and continues as new without awaiting it.
fn registry(ids: Arc<Mutex<Vec<Uuid>>>) -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    let approver_ids = ids.clone();
    registry.register("approver", move |ctx: Ctx, (): ()| {
        let ids = approver_ids.clone();
        async move {
            let approval = ctx.awakeable::<String>("approval").await?;
            ids.lock().expect("lock").push(approval.id());
            approval.value().await
        }
    })?;
    registry.register("roller", move |ctx: Ctx, round: u32| {
        let ids = ids.clone();
        async move {
            if round == 0 {
                let abandoned = ctx.awakeable::<String>("approval").await?;
                ids.lock().expect("lock").push(abandoned.id());
                return Err::<u32, WorkflowError>(ctx.continue_as_new(&1));
            }
            Ok(round)
        }
    })?;
    Ok(registry)
}

async fn passes_and_timer_batches_sample_the_gauges_once_per_interval(h: Harness) -> TestResult {
    let recorder = Recorder::new();
    let counting = CountingStore::new(h.store.clone());
    let store: Arc<dyn LeaseStore> = Arc::new(counting.clone());
    let options = keiro::worker::ResumeOptions {
        metrics: Some(recorder.metrics.clone()),
        ..h.fast_options()
    };
    let registry = registry(Arc::default())?;
    h.keiro.start("approver", "a-1", &()).await?;
    for _ in 0..10 {
        keiro::worker::resume_once(&store, &registry, &options).await?;
    }
    // The worker loop's passes (claim passes) share the same pace.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(keiro_resume::run_loop(
        store.clone(),
        registry.clone(),
        options.clone(),
        keiro::worker::FixedPoll,
        async {
            let _ = stopped.await;
        },
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = stop.send(());
    worker.await?;
    assert!(
        counting.calls("instances_claim_batch") >= 5,
        "{:?}",
        counting.all()
    );
    assert_eq!(
        counting.calls("awakeables_pending"),
        1,
        "{:?}",
        counting.all()
    );
    assert_eq!(recorder.total(names::WORKFLOW_AWAKEABLES_PENDING)?, 0.0);

    let timers = TimerOptions {
        metrics: Some(recorder.metrics.clone()),
        ..TimerOptions::default()
    };
    for _ in 0..10 {
        keiro_resume::fire_due_once(&store, &timers).await?;
    }
    assert_eq!(counting.calls("timers_fire_due"), 10);
    assert_eq!(
        counting.calls("timers_due_count"),
        1,
        "{:?}",
        counting.all()
    );
    Ok(())
}

async fn a_cancelled_runs_awakeables_are_settled(h: Harness) -> TestResult {
    let ids = Arc::new(Mutex::new(Vec::new()));
    let registry = registry(ids.clone())?;
    let options = h.fast_options();
    h.keiro.start("approver", "a-1", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(h.store.awakeables_pending().await?, 1);
    let id = ids.lock().expect("lock")[0];

    h.keiro.cancel(("approver", "a-1")).await?;
    assert_eq!(h.store.awakeables_pending().await?, 0);
    let journal = h.store.journal_history(&key("approver", "a-1")).await?;
    // Settled by the cancel, so a late completion journals nothing into the cancelled run.
    assert_eq!(
        h.keiro.complete_awakeable(id, "late").await?,
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
    );
    assert_eq!(
        h.store.journal_history(&key("approver", "a-1")).await?,
        journal
    );
    Ok(())
}

async fn awakeables_of_a_generation_left_by_continue_as_new_are_settled(h: Harness) -> TestResult {
    let ids = Arc::new(Mutex::new(Vec::new()));
    let registry = registry(ids.clone())?;
    let options = h.fast_options();
    h.keiro.start("roller", "r-1", &0u32).await?;
    keiro::worker::drain(&h.store, &registry, &options).await?;
    let row = h.keiro.instance(("roller", "r-1")).await?.expect("row");
    assert_eq!((row.generation, row.status), (1, keiro::Status::Completed));
    assert_eq!(h.store.awakeables_pending().await?, 0);
    let id = ids.lock().expect("lock")[0];
    assert_eq!(
        h.keiro.cancel_awakeable(id).await?,
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
    );
    Ok(())
}
