//! Resume worker and lease conformance (the seed's `Keiro.Workflow.Resume` and lease renewal
//! behaviours) against the SQLite and Postgres stores.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::{
    operate::ResurrectOutcome, store::Append, store::AppendOutcome, store::ClaimOutcome,
    store::Event, store::LeaseStore, store::StepKind, worker::Registry, worker::ResumeSummary,
    worker::Tuning, workflow::RunOutcome, workflow::WorkflowName, Ctx, Status, WorkflowError,
};
use keiro_tests::{
    key, on_both_stores, run_inline, FastWorker, FaultyStore, Harness, Ledger, TestResult,
};
use serde_json::json;
use time::OffsetDateTime;

on_both_stores!(
    crashed_mid_run_resumes_running_only_the_tail,
    suspended_resumes_once_its_awaited_step_is_journaled,
    unknown_name_is_skipped_and_counted,
    poison_workflow_is_isolated,
    sequential_and_concurrent_passes_report_identically,
    crash_against_a_terminal_workflow_records_no_attempt,
    failing_at_the_ceiling_short_circuits_later_runs,
    resurrect_completes_without_rerunning_the_prefix_and_can_fail_again,
    store_errors_are_transient_and_consume_no_attempt,
    lease_claim_expiry_and_skip,
    renewal_before_a_slow_step_keeps_the_lease,
    lost_lease_stops_the_run_and_records_no_crash,
    stale_holder_cannot_change_a_recorded_result,
    discovery_returns_exactly_the_runnable_and_wake_due,
    completed_workflow_is_not_discovered_and_passes_are_stable,
    fixed_poll_loop_survives_poison_and_shuts_down_gracefully,
    backoff_paces_a_crashed_workflow,
    batch_claim_takes_only_claimable_registered_instances,
    concurrent_batch_claims_never_share_an_instance,
    a_batch_claim_goes_by_priority_then_age_across_free_expired_and_due_runs,
    the_next_claim_is_sent_while_the_last_ones_runs_still_run,
    a_run_whose_body_returned_gives_its_slot_to_the_next,
    a_run_started_while_a_long_one_runs_is_claimed_at_once,
    a_pass_at_its_claim_limit_does_not_hold_back_new_runs,
    a_shutdown_waits_for_the_runs_passes_handed_over,
    a_worker_with_no_practical_concurrency_bound_runs,
);

fn counted(
    ledger: Ledger,
    fail: Arc<AtomicBool>,
) -> impl Fn(
    Ctx,
    u32,
)
    -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<u32, WorkflowError>> + Send>>
       + Send
       + Sync
       + 'static {
    move |ctx: Ctx, n: u32| {
        let (ledger, fail) = (ledger.clone(), fail.clone());
        Box::pin(async move {
            let a: u32 = ctx
                .step("a", || async {
                    ledger.bump("a");
                    Ok::<_, Infallible>(n + 1)
                })
                .await?;
            let b: u32 = ctx
                .step("b", || async {
                    ledger.bump("b");
                    Ok::<_, Infallible>(a + 1)
                })
                .await?;
            if fail.load(Ordering::SeqCst) {
                ledger.bump("crash");
                return Err(keiro_tests::crash("simulated crash after b"));
            }
            let c: u32 = ctx
                .step("c", || async {
                    ledger.bump("c");
                    Ok::<_, Infallible>(b + 1)
                })
                .await?;
            Ok(c)
        })
    }
}

async fn crashed_mid_run_resumes_running_only_the_tail(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let fail = Arc::new(AtomicBool::new(true));
    let mut registry = Registry::new();
    registry.register("counted", counted(ledger.clone(), fail.clone()))?;
    let options = h.fast_options();
    h.keiro.start("counted", "c-1", &1u32).await?;

    let first = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(
        (
            first.discovered,
            first.resumed,
            first.advanced,
            first.completed
        ),
        (1, 1, 1, 0)
    );
    let row = h.keiro.instance(("counted", "c-1")).await?.expect("row");
    assert_eq!((row.status, row.attempts), (Status::Running, 1));
    assert!(row
        .last_error
        .unwrap_or_default()
        .contains("simulated crash"));

    fail.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(5)).await; // the 1 ms backoff gate
    let second = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(
        (second.resumed, second.completed, second.advanced),
        (1, 1, 1)
    );
    assert_eq!(
        (ledger.count("a"), ledger.count("b"), ledger.count("c")),
        (1, 1, 1)
    );
    let row = h.keiro.instance(("counted", "c-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.attempts, row.output),
        (Status::Completed, 0, Some(json!(4)))
    );
    assert!(
        row.lease_owner.is_none() && row.lease_expires_at.is_none(),
        "the lease is released"
    );
    Ok(())
}

async fn suspended_resumes_once_its_awaited_step_is_journaled(h: Harness) -> TestResult {
    let mut registry = Registry::new();
    registry.register("gate", |ctx: Ctx, (): ()| async move {
        let v: u32 = ctx.await_step("open").await?;
        Ok(v * 2)
    })?;
    let mut options = h.fast_options();
    options.reconcile = None;
    h.keiro.start("gate", "g-1", &()).await?;
    let parked = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(
        (parked.resumed, parked.completed, parked.still_suspended),
        (1, 0, 0)
    );
    assert_eq!(
        h.keiro
            .instance(("gate", "g-1"))
            .await?
            .expect("row")
            .status,
        Status::Suspended
    );

    let idle = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(
        idle,
        ResumeSummary::default(),
        "a parked workflow is not discovered"
    );

    h.keiro.deliver(("gate", "g-1"), "open", &21).await?;
    let woken = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!((woken.discovered, woken.completed), (1, 1));
    assert_eq!(
        h.keiro
            .instance(("gate", "g-1"))
            .await?
            .expect("row")
            .output,
        Some(json!(42))
    );
    Ok(())
}

async fn unknown_name_is_skipped_and_counted(h: Harness) -> TestResult {
    let registry = Registry::new();
    h.keiro.start("nobody-knows", "n-1", &()).await?;
    let summary = keiro::worker::resume_once(&h.store, &registry, &h.fast_options()).await?;
    assert_eq!(
        (summary.discovered, summary.unknown_name, summary.resumed),
        (1, 1, 0)
    );
    assert_eq!(
        summary.unregistered_names.into_iter().collect::<Vec<_>>(),
        [WorkflowName::new("nobody-knows")?]
    );
    assert_eq!(
        h.keiro
            .instance(("nobody-knows", "n-1"))
            .await?
            .expect("row")
            .status,
        Status::Running,
        "left alone"
    );
    Ok(())
}

fn mixed_registry(ledger: Ledger) -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    let l = ledger.clone();
    registry.register("healthy", move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            ctx.step("work", || async {
                l.bump("healthy");
                Ok::<_, Infallible>(())
            })
            .await?;
            Ok(())
        }
    })?;
    registry.register("poison", |ctx: Ctx, (): ()| async move {
        ctx.step("work", || async { Ok::<_, Infallible>(()) })
            .await?;
        if true {
            panic!("poison pill");
        }
        Ok(())
    })?;
    registry.register("parker", |ctx: Ctx, (): ()| async move {
        let _: u32 = ctx.await_step("never").await?;
        Ok(())
    })?;
    Ok(registry)
}

async fn poison_workflow_is_isolated(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let registry = mixed_registry(ledger.clone())?;
    h.keiro.start("poison", "p-1", &()).await?;
    h.keiro.start("healthy", "h-1", &()).await?;
    let summary = keiro::worker::resume_once(&h.store, &registry, &h.fast_options()).await?;
    assert_eq!(
        (summary.discovered, summary.resumed, summary.completed),
        (2, 2, 1)
    );
    assert_eq!(ledger.count("healthy"), 1);
    let poison = h.keiro.instance(("poison", "p-1")).await?.expect("row");
    assert_eq!((poison.status, poison.attempts), (Status::Running, 1));
    assert!(poison
        .last_error
        .unwrap_or_default()
        .contains("poison pill"));
    Ok(())
}

/// Builds the same mixed population on `h` and runs one pass with `concurrency`.
async fn mixed_pass(
    h: &Harness,
    concurrency: usize,
) -> Result<ResumeSummary, Box<dyn std::error::Error + Send + Sync>> {
    let registry = mixed_registry(Ledger::default())?;
    for i in 0..4 {
        h.keiro.start("healthy", &format!("h-{i}"), &()).await?;
    }
    h.keiro.start("poison", "p-1", &()).await?;
    h.keiro.start("parker", "k-1", &()).await?;
    h.keiro.start("unknown", "u-1", &()).await?;
    h.keiro.start("healthy", "leased", &()).await?;
    let held = h
        .store
        .instance_claim(
            &key("healthy", "leased"),
            "someone-else",
            Duration::from_secs(60),
            None,
        )
        .await?;
    assert!(matches!(held, ClaimOutcome::Acquired(_)));
    let mut options = h.fast_options();
    options.max_concurrent_advances = concurrency;
    Ok(keiro::worker::resume_once(&h.store, &registry, &options).await?)
}

async fn sequential_and_concurrent_passes_report_identically(h: Harness) -> TestResult {
    let other = match h.backend {
        keiro_tests::Backend::Postgres => Harness::postgres().await,
        keiro_tests::Backend::Sqlite => Harness::sqlite(),
    };
    let sequential = mixed_pass(&h, 1).await?;
    let concurrent = mixed_pass(&other, 4).await?;
    assert_eq!(sequential, concurrent);
    assert_eq!(
        (
            sequential.discovered,
            sequential.resumed,
            sequential.completed,
            sequential.unknown_name,
            sequential.lease_skipped
        ),
        (8, 6, 4, 1, 1)
    );
    Ok(())
}

async fn crash_against_a_terminal_workflow_records_no_attempt(h: Harness) -> TestResult {
    let keiro = h.keiro.clone();
    let mut registry = Registry::new();
    registry.register("self-cancel", move |ctx: Ctx, (): ()| {
        let keiro = keiro.clone();
        async move {
            let _: () = ctx.step("s", || async { Ok::<_, Infallible>(()) }).await?;
            // The step's append is held back until the body waits on something (it would go
            // with a completion); the scenario wants it journaled before the cancel lands.
            loop {
                let journal = keiro
                    .journal(("self-cancel", "sc-1"))
                    .await
                    .map_err(WorkflowError::app)?;
                if journal.iter().any(|e| e.event.step_name() == "s") {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            // Cancelled from outside, then the body crashes before reaching a boundary.
            keiro
                .cancel(("self-cancel", "sc-1"))
                .await
                .map_err(WorkflowError::app)?;
            Err::<(), _>(keiro_tests::crash("crash after the cancel landed"))
        }
    })?;
    h.keiro.start("self-cancel", "sc-1", &()).await?;
    let summary = keiro::worker::resume_once(&h.store, &registry, &h.fast_options()).await?;
    assert_eq!(
        (summary.resumed, summary.transient_errors, summary.failed),
        (1, 1, 0)
    );
    let row = h
        .keiro
        .instance(("self-cancel", "sc-1"))
        .await?
        .expect("row");
    assert_eq!((row.status, row.attempts), (Status::Cancelled, 0));
    Ok(())
}

async fn failing_at_the_ceiling_short_circuits_later_runs(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let body = move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            ctx.step("try", || async {
                l.bump("try");
                Err::<(), _>("always fails")
            })
            .await?;
            Ok(())
        }
    };
    let mut registry = Registry::new();
    registry.register("doomed", body.clone())?;
    let mut options = h.fast_options();
    options.max_attempts = 3;
    h.keiro.start("doomed", "d-1", &()).await?;
    let mut total = ResumeSummary::default();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        total += keiro::worker::resume_once(&h.store, &registry, &options).await?;
    }
    assert_eq!((total.resumed, total.failed), (3, 1));
    let row = h.keiro.instance(("doomed", "d-1")).await?.expect("row");
    assert_eq!((row.status, row.attempts), (Status::Failed, 3));
    let markers: Vec<_> = h
        .keiro
        .journal(("doomed", "d-1"))
        .await?
        .into_iter()
        .filter_map(|e| e.event.marker())
        .collect();
    assert_eq!(markers, [keiro::store::Marker::Failed]);

    let direct = run_inline(
        &h,
        &key("doomed", "d-1"),
        keiro::workflow::workflow_fn(body).as_ref(),
    )
    .await?;
    assert_eq!(direct, RunOutcome::Failed);
    assert_eq!(
        ledger.count("try"),
        3,
        "the short-circuited run ran nothing"
    );
    let after = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(after.discovered, 0);
    Ok(())
}

async fn resurrect_completes_without_rerunning_the_prefix_and_can_fail_again(
    h: Harness,
) -> TestResult {
    let ledger = Ledger::default();
    let fail = Arc::new(AtomicBool::new(true));
    let mut registry = Registry::new();
    registry.register("counted", counted(ledger.clone(), fail.clone()))?;
    let mut options = h.fast_options();
    options.max_attempts = 1;
    h.keiro.start("counted", "r-1", &1u32).await?;
    let failed = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(failed.failed, 1);

    // Resurrected while still broken: it fails again, in the same generation.
    assert_eq!(
        h.keiro.resurrect(("counted", "r-1")).await?,
        ResurrectOutcome::Resurrected
    );
    let again = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(again.failed, 1);
    assert_eq!(
        h.keiro
            .instance(("counted", "r-1"))
            .await?
            .expect("row")
            .status,
        Status::Failed
    );

    fail.store(false, Ordering::SeqCst);
    assert_eq!(
        h.keiro.resurrect(("counted", "r-1")).await?,
        ResurrectOutcome::Resurrected
    );
    let done = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(done.completed, 1);
    assert_eq!(
        (ledger.count("a"), ledger.count("b"), ledger.count("c")),
        (1, 1, 1)
    );
    let history = h.keiro.journal(("counted", "r-1")).await?;
    let failures = history
        .iter()
        .filter(|e| e.event.marker() == Some(keiro::store::Marker::Failed))
        .count();
    let resurrections = history
        .iter()
        .filter(|e| e.event == Event::Resurrected)
        .count();
    assert_eq!(
        (failures, resurrections),
        (2, 2),
        "history is appended to, never rewritten"
    );
    assert_eq!(
        h.keiro.resurrect(("counted", "r-1")).await?,
        ResurrectOutcome::NotFailed(Status::Completed)
    );
    assert_eq!(
        h.keiro.resurrect(("counted", "missing")).await?,
        ResurrectOutcome::NotFound
    );
    Ok(())
}

async fn store_errors_are_transient_and_consume_no_attempt(h: Harness) -> TestResult {
    let faulty = FaultyStore::new(h.store.clone());
    let store: Arc<dyn LeaseStore> = Arc::new(faulty.clone());
    let ledger = Ledger::default();
    let mut registry = Registry::new();
    registry.register(
        "counted",
        counted(ledger.clone(), Arc::new(AtomicBool::new(false))),
    )?;
    h.keiro.start("counted", "s-1", &1u32).await?;
    faulty.fail_appends(true);
    let summary = keiro::worker::resume_once(&store, &registry, &h.fast_options()).await?;
    assert_eq!(
        (summary.resumed, summary.transient_errors, summary.failed),
        (1, 1, 0)
    );
    let row = h.keiro.instance(("counted", "s-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.attempts),
        (Status::Running, 0),
        "no attempt consumed"
    );
    assert!(
        row.lease_owner.is_none(),
        "the lease was released for the next pass"
    );
    faulty.fail_appends(false);
    let summary = keiro::worker::resume_once(&store, &registry, &h.fast_options()).await?;
    assert_eq!(summary.completed, 1);
    Ok(())
}

async fn lease_claim_expiry_and_skip(h: Harness) -> TestResult {
    h.keiro.start("l", "l-1", &()).await?;
    let k = key("l", "l-1");
    let ttl = Duration::from_secs(60);
    let ClaimOutcome::Acquired(first) = h.store.instance_claim(&k, "a", ttl, None).await? else {
        panic!("the first claim is granted")
    };
    assert_eq!(
        h.store.instance_claim(&k, "b", ttl, None).await?,
        ClaimOutcome::LeaseHeld
    );
    // Past expiry (the clock is pinned, nothing sleeps) another owner takes over with a new epoch.
    let later = OffsetDateTime::now_utc() + time::Duration::seconds(61);
    let ClaimOutcome::Acquired(second) = h.store.instance_claim(&k, "b", ttl, Some(later)).await?
    else {
        panic!("an expired lease is claimable")
    };
    assert!(second.fence.epoch > first.fence.epoch);
    let stale = h.store.instance_lease_renew(&k, &first.fence, ttl).await;
    assert!(matches!(&stale, Err(e) if e.is_lease_lost()), "{stale:?}");
    assert!(
        !h.store.instance_release(&k, &first.fence, true).await?,
        "a stale release changes nothing"
    );
    assert!(h.store.instance_release(&k, &second.fence, true).await?);

    let mut registry = Registry::new();
    registry.register("l", |_ctx: Ctx, (): ()| async move { Ok(()) })?;
    let _held = h.store.instance_claim(&k, "c", ttl, None).await?;
    let summary = keiro::worker::resume_once(&h.store, &registry, &h.fast_options()).await?;
    assert_eq!(
        (summary.discovered, summary.lease_skipped, summary.resumed),
        (1, 1, 0)
    );
    assert_eq!(
        h.store
            .instance_claim(&key("l", "missing"), "c", ttl, None)
            .await?,
        ClaimOutcome::Unavailable
    );
    Ok(())
}

async fn renewal_before_a_slow_step_keeps_the_lease(h: Harness) -> TestResult {
    // Lease of 1.2 s. The body spends 0.6 s outside any step, then runs a 0.9 s step: without a
    // renewal before that step the lease would lapse mid-step and a rival could claim it.
    let ledger = Ledger::default();
    let l = ledger.clone();
    let store = h.store.clone();
    let rival_claim = Arc::new(std::sync::Mutex::new(None));
    let seen = rival_claim.clone();
    let mut registry = Registry::new();
    registry.register("slow", move |ctx: Ctx, (): ()| {
        let (l, store, seen) = (l.clone(), store.clone(), seen.clone());
        async move {
            ctx.step("quick", || async { Ok::<_, Infallible>(()) })
                .await?;
            tokio::time::sleep(Duration::from_millis(600)).await;
            ctx.step("slow", || async {
                l.bump("slow");
                tokio::time::sleep(Duration::from_millis(900)).await;
                let rival = store
                    .instance_claim(&key("slow", "s-1"), "rival", Duration::from_secs(5), None)
                    .await;
                *seen.lock().expect("lock") = Some(format!("{rival:?}"));
                Ok::<_, Infallible>(())
            })
            .await?;
            Ok(())
        }
    })?;
    let mut options = h.fast_options();
    options.lease_ttl = Duration::from_millis(1200);
    h.keiro.start("slow", "s-1", &()).await?;
    let summary = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(summary.completed, 1, "{summary:?}");
    let rival = rival_claim
        .lock()
        .expect("lock")
        .clone()
        .expect("the rival tried");
    assert!(
        rival.contains("LeaseHeld"),
        "the rival was refused: {rival}"
    );
    assert_eq!(ledger.count("slow"), 1);
    Ok(())
}

async fn lost_lease_stops_the_run_and_records_no_crash(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let (l, keiro) = (ledger.clone(), h.keiro.clone());
    let release_once = Arc::new(AtomicBool::new(true));
    let mut registry = Registry::new();
    registry.register("lost", move |ctx: Ctx, (): ()| {
        let (l, keiro, release_once) = (l.clone(), keiro.clone(), release_once.clone());
        async move {
            ctx.step("one", || async {
                // An operator force-releases the lease while this step runs (the first time).
                if release_once.swap(false, Ordering::SeqCst) {
                    keiro
                        .force_release(("lost", "x-1"))
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            })
            .await?;
            ctx.step("two", || async {
                l.bump("two");
                Ok::<_, Infallible>(())
            })
            .await?;
            Ok(())
        }
    })?;
    h.keiro.start("lost", "x-1", &()).await?;
    let summary = keiro::worker::resume_once(&h.store, &registry, &h.fast_options()).await?;
    assert_eq!(
        (
            summary.resumed,
            summary.lease_skipped,
            summary.transient_errors
        ),
        (1, 1, 0)
    );
    assert_eq!(ledger.count("two"), 0, "nothing ran after the lost lease");
    let row = h.keiro.instance(("lost", "x-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.attempts),
        (Status::Running, 0),
        "no crash recorded"
    );
    assert!(
        h.keiro.journal(("lost", "x-1")).await?.is_empty(),
        "the step's append was refused"
    );
    let next = keiro::worker::resume_once(&h.store, &registry, &h.fast_options()).await?;
    assert_eq!(next.completed, 1);
    Ok(())
}

async fn stale_holder_cannot_change_a_recorded_result(h: Harness) -> TestResult {
    h.keiro.start("stale", "s-1", &()).await?;
    let k = key("stale", "s-1");
    let ttl = Duration::from_secs(60);
    let ClaimOutcome::Acquired(old) = h.store.instance_claim(&k, "old", ttl, None).await? else {
        panic!()
    };
    let later = OffsetDateTime::now_utc() + time::Duration::seconds(120);
    let ClaimOutcome::Acquired(new) = h.store.instance_claim(&k, "new", ttl, Some(later)).await?
    else {
        panic!()
    };
    let record = |fence: keiro::store::Fence, v: u32| Append {
        key: k.clone(),
        generation: Some(0),
        event: Event::StepRecorded {
            step: "x".into(),
            kind: StepKind::Step,
            result: json!(v),
        },
        fence: Some(fence),
        renew: Some(ttl),
    };
    assert_eq!(
        h.store
            .journal_append(&record(new.fence.clone(), 2))
            .await?,
        AppendOutcome::Appended
    );
    let stale = h.store.journal_append(&record(old.fence.clone(), 1)).await;
    assert!(
        matches!(&stale, Ok(AppendOutcome::AlreadyPresent(v)) if *v == json!(2))
            || matches!(&stale, Err(e) if e.is_lease_lost()),
        "{stale:?}"
    );
    let fresh_stale = h
        .store
        .journal_append(&Append {
            event: Event::StepRecorded {
                step: "y".into(),
                kind: StepKind::Step,
                result: json!(1),
            },
            ..record(old.fence.clone(), 1)
        })
        .await;
    assert!(
        matches!(&fresh_stale, Err(e) if e.is_lease_lost()),
        "{fresh_stale:?}"
    );
    let journal = h.store.journal_load(&k, 0).await?;
    assert_eq!(journal.len(), 1);
    assert!(matches!(&journal[0].event, Event::StepRecorded { result, .. } if *result == json!(2)));
    Ok(())
}

async fn discovery_returns_exactly_the_runnable_and_wake_due(h: Harness) -> TestResult {
    let now = OffsetDateTime::now_utc();
    for id in ["running", "parked", "due", "future", "done"] {
        h.keiro.start("d", id, &()).await?;
    }
    let park = |id: &str, wake_after: Option<OffsetDateTime>| keiro_journal::store::Park {
        key: key("d", id),
        generation: 0,
        fence: None,
        awaited: vec!["x".into()],
        wake_after,
    };
    h.store.instance_park(&park("parked", None)).await?;
    h.store
        .instance_park(&park("due", Some(now - time::Duration::seconds(1))))
        .await?;
    h.store
        .instance_park(&park("future", Some(now + time::Duration::hours(1))))
        .await?;
    h.store
        .journal_append(&Append::external(
            key("d", "done"),
            Event::WorkflowCompleted {
                output: json!(null),
            },
        ))
        .await?;
    let mut found: Vec<String> = h
        .store
        .instances_runnable(None, None)
        .await?
        .into_iter()
        .map(|k| k.id.to_string())
        .collect();
    found.sort();
    assert_eq!(found, ["due", "running"]);
    let limited = h.store.instances_runnable(None, Some(1)).await?;
    assert_eq!(limited.len(), 1);
    Ok(())
}

async fn completed_workflow_is_not_discovered_and_passes_are_stable(h: Harness) -> TestResult {
    let mut registry = Registry::new();
    registry.register("once", |ctx: Ctx, (): ()| async move {
        ctx.step("s", || async { Ok::<_, Infallible>(1) }).await
    })?;
    h.keiro.start("once", "o-1", &()).await?;
    let first = keiro::worker::drain(&h.store, &registry, &h.fast_options()).await?;
    assert_eq!(first.completed, 1);
    for _ in 0..3 {
        assert_eq!(
            keiro::worker::resume_once(&h.store, &registry, &h.fast_options()).await?,
            ResumeSummary::default()
        );
    }
    Ok(())
}

async fn fixed_poll_loop_survives_poison_and_shuts_down_gracefully(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let registry = mixed_registry(ledger.clone())?;
    h.keiro.start("poison", "p-1", &()).await?;
    h.keiro.start("healthy", "h-1", &()).await?;
    let worker = h.keiro.worker().registry(registry).fast().build()?;
    let looping = keiro_tests::spawn_worker(worker);
    // Start another healthy one while the loop runs; it must be picked up too.
    tokio::time::sleep(Duration::from_millis(100)).await;
    h.keiro.start("healthy", "h-2", &()).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // The loop must complete both healthy workflows and keep retrying the poison (one pass
    // per poll interval, 1 ms backoff) rather than dying on it.
    loop {
        let poison = h.keiro.instance(("poison", "p-1")).await?.expect("row");
        if ledger.count("healthy") >= 2 && poison.attempts >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "healthy ran {} times, poison attempts {}",
            ledger.count("healthy"),
            poison.attempts
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let total = looping.stop().await?;
    assert!(total.completed >= 2 && total.resumed >= 4, "{total:?}");
    Ok(())
}

async fn backoff_paces_a_crashed_workflow(h: Harness) -> TestResult {
    let mut registry = Registry::new();
    registry.register("crashy", |_ctx: Ctx, (): ()| async move {
        Err::<(), _>(keiro_tests::crash("nope"))
    })?;
    let mut options = h.fast_options();
    options.backoff = keiro::store::CRASH_BACKOFF_DEFAULT; // 2 s after the first crash
    h.keiro.start("crashy", "c-1", &()).await?;
    let first = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(first.resumed, 1);
    let row = h.keiro.instance(("crashy", "c-1")).await?.expect("row");
    let gate = row.next_attempt_at.expect("a backoff gate");
    let wait = gate - row.updated_at;
    assert!(
        wait >= time::Duration::milliseconds(1900) && wait <= time::Duration::milliseconds(2100),
        "{wait}"
    );
    let paced = keiro::worker::resume_once(&h.store, &registry, &options).await?;
    assert_eq!(
        (paced.discovered, paced.paced, paced.resumed, paced.advanced),
        (1, 1, 0, 0),
        "still discovered, but paced"
    );
    Ok(())
}

async fn batch_claim_takes_only_claimable_registered_instances(h: Harness) -> TestResult {
    let names = [WorkflowName::new("mine")?];
    let ttl = Duration::from_secs(60);
    for id in ["fresh", "leased", "paced", "parked", "done", "second"] {
        h.keiro.start("mine", id, &()).await?;
    }
    h.keiro.start("theirs", "other", &()).await?;
    h.store
        .journal_append(&Append::external(
            key("mine", "second"),
            Event::StepRecorded {
                step: "s".into(),
                kind: StepKind::Step,
                result: json!(7),
            },
        ))
        .await?;
    assert!(matches!(
        h.store
            .instance_claim(&key("mine", "leased"), "someone", ttl, None)
            .await?,
        ClaimOutcome::Acquired(_)
    ));
    let ClaimOutcome::Acquired(paced) = h
        .store
        .instance_claim(&key("mine", "paced"), "someone", ttl, None)
        .await?
    else {
        panic!()
    };
    let crash = keiro_lease::Crash {
        error: "x".into(),
        retry_delay: Duration::from_secs(60),
        max_attempts: 5,
    };
    h.store
        .instance_record_crash(&key("mine", "paced"), &paced.fence, &crash)
        .await?;
    h.store
        .instance_park(&keiro_journal::store::Park {
            key: key("mine", "parked"),
            generation: 0,
            fence: None,
            awaited: vec!["x".into()],
            wake_after: None,
        })
        .await?;
    h.store
        .journal_append(&Append::external(
            key("mine", "done"),
            Event::WorkflowCompleted { output: json!(1) },
        ))
        .await?;

    let claims = h
        .store
        .instances_claim_batch(&names, "me", ttl, 10, None)
        .await?;
    let mut got: Vec<String> = claims
        .iter()
        .map(|c| c.instance.key.id.to_string())
        .collect();
    got.sort();
    assert_eq!(got, ["fresh", "second"]);
    for claim in &claims {
        assert_eq!(claim.fence.owner, "me");
        assert_eq!(claim.instance.lease_owner.as_deref(), Some("me"));
        assert_eq!(claim.fence.epoch, claim.instance.lease_epoch);
    }
    let second = claims
        .iter()
        .find(|c| c.instance.key.id.as_str() == "second")
        .expect("claimed");
    assert_eq!(second.journal.len(), 1, "the claim carries the journal");
    assert!(
        h.store
            .instances_claim_batch(&names, "me", ttl, 10, None)
            .await?
            .is_empty(),
        "now all leased"
    );
    assert!(h
        .store
        .instances_claim_batch(&names, "me", ttl, 0, None)
        .await?
        .is_empty());
    Ok(())
}

/// The rows a batch claim may take sit in different places (a running row nobody holds, a
/// running row whose lease expired, a suspended row whose wake is due); whichever it is, the
/// batch takes the highest priority first, then the oldest, and never a row whose lease lives.
async fn a_batch_claim_goes_by_priority_then_age_across_free_expired_and_due_runs(
    h: Harness,
) -> TestResult {
    let names = [WorkflowName::new("mine")?];
    let ttl = Duration::from_secs(60);
    // Started in this order, so each is older than the next.
    for (id, priority) in [
        ("free-low", 0),
        ("expired-high", 5),
        ("live-top", 9),
        ("due-mid", 3),
        ("free-high", 5),
        ("expired-low", 0),
    ] {
        h.store
            .instance_start(&keiro_journal::store::StartRequest {
                attributes: Default::default(),
                key: key("mine", id),
                input: json!(null),
                parent: None,
                priority,
                queue: None,
            })
            .await?;
    }
    let an_hour_ago = OffsetDateTime::now_utc() - Duration::from_secs(3600);
    for id in ["expired-high", "expired-low"] {
        // Leased an hour ago for a minute: expired now, its holder gone.
        let claimed = h
            .store
            .instance_claim(&key("mine", id), "gone", ttl, Some(an_hour_ago))
            .await?;
        assert!(matches!(claimed, ClaimOutcome::Acquired(_)));
    }
    let live = h
        .store
        .instance_claim(
            &key("mine", "live-top"),
            "busy",
            Duration::from_secs(3600),
            None,
        )
        .await?;
    assert!(matches!(live, ClaimOutcome::Acquired(_)));
    let parked = h
        .store
        .instance_park(&keiro_journal::store::Park {
            key: key("mine", "due-mid"),
            generation: 0,
            fence: None,
            awaited: vec!["never".into()],
            wake_after: Some(an_hour_ago),
        })
        .await?;
    assert_eq!(parked, keiro_journal::store::ParkOutcome::Suspended);

    let ids = |claims: &[keiro_lease::Claim]| -> Vec<String> {
        claims
            .iter()
            .map(|c| c.instance.key.id.to_string())
            .collect()
    };
    let first = h
        .store
        .instances_claim_batch(&names, "me", ttl, 3, None)
        .await?;
    assert_eq!(ids(&first), ["expired-high", "free-high", "due-mid"]);
    for claim in &first {
        assert_eq!(claim.fence.owner, "me");
        assert_eq!(claim.fence.epoch, claim.instance.lease_epoch);
    }
    let rest = h
        .store
        .instances_claim_batch(&names, "me", ttl, 10, None)
        .await?;
    assert_eq!(ids(&rest), ["free-low", "expired-low"]);
    assert!(h
        .store
        .instances_claim_batch(&names, "me", ttl, 10, None)
        .await?
        .is_empty());
    Ok(())
}

async fn concurrent_batch_claims_never_share_an_instance(h: Harness) -> TestResult {
    let names = [WorkflowName::new("pile")?];
    for i in 0..60 {
        h.keiro.start("pile", &format!("p-{i}"), &()).await?;
    }
    let ttl = Duration::from_secs(60);
    let (a, b, c) = tokio::join!(
        h.store.instances_claim_batch(&names, "a", ttl, 25, None),
        h.store.instances_claim_batch(&names, "b", ttl, 25, None),
        h.store.instances_claim_batch(&names, "c", ttl, 25, None),
    );
    let mut all: Vec<String> = [a?, b?, c?]
        .into_iter()
        .flatten()
        .map(|c| c.instance.key.id.to_string())
        .collect();
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), total, "an instance was claimed twice");
    assert_eq!(total, 60, "together they claimed everything");
    Ok(())
}

/// A worker loop claims its next runs beside the ones it drives, not between them: with two
/// slots it claims four runs, and once two of them finished (the queue down to half a
/// slot-set) it asks for more while the other two still run, instead of after one of them
/// ends. The runs are held on a semaphore the test opens one permit at a time.
async fn the_next_claim_is_sent_while_the_last_ones_runs_still_run(h: Harness) -> TestResult {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut registry = Registry::new();
    {
        let (gate, finished) = (gate.clone(), finished.clone());
        registry.register("held", move |ctx: Ctx, (): ()| {
            let (gate, finished) = (gate.clone(), finished.clone());
            async move {
                ctx.step("wait", || async {
                    gate.acquire().await.expect("open").forget();
                    Ok::<_, Infallible>(())
                })
                .await?;
                finished.fetch_add(1, Ordering::SeqCst);
                Ok::<_, WorkflowError>(())
            }
        })?;
    }
    for i in 0..6 {
        h.keiro.start("held", &format!("h-{i}"), &()).await?;
    }
    let counting = keiro_tests::counting::CountingStore::new(h.store.clone());
    let worker = keiro::WorkerBuilder::new(Arc::new(counting.clone()))
        .registry(registry)
        .fast()
        .concurrency(2)
        .build()?;
    let looping = keiro_tests::spawn_worker(worker);
    let claims = {
        let counting = counting.clone();
        move || counting.calls("instances_claim_batch")
    };
    let done = {
        let finished = finished.clone();
        move || finished.load(Ordering::SeqCst)
    };
    keiro_tests::until("the first claim", || claims() == 1).await;
    gate.add_permits(2);
    keiro_tests::until("two runs to finish", || done() == 2).await;
    // The third and fourth runs hold their slots (no permit is left); the next claim must be
    // on its way anyway.
    keiro_tests::until("the second claim, sent beside the running two", || {
        claims() >= 2
    })
    .await;
    assert_eq!(done(), 2, "no permit was left for a third run to finish");
    gate.add_permits(4);
    keiro_tests::until("all six runs", || done() == 6).await;
    looping.stop().await?;
    for i in 0..6 {
        let id = format!("h-{i}");
        let row = h.keiro.instance(("held", id.as_str())).await?.expect("row");
        assert_eq!(row.status, Status::Completed, "{id}");
    }
    Ok(())
}

/// A slot bounds the bodies running, not the closing writes: with one slot, a second run's body
/// starts while the first run's completion still waits for the store, and closing runs are
/// bounded too (running and closing runs together within two slot-sets).
async fn a_run_whose_body_returned_gives_its_slot_to_the_next(h: Harness) -> TestResult {
    let bodies = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut registry = Registry::new();
    {
        let bodies = bodies.clone();
        registry.register("quick", move |ctx: Ctx, (): ()| {
            let bodies = bodies.clone();
            async move {
                bodies.fetch_add(1, Ordering::SeqCst);
                ctx.step("one", || async { Ok::<_, Infallible>(1) }).await
            }
        })?;
    }
    for i in 0..4 {
        h.keiro.start("quick", &format!("q-{i}"), &()).await?;
    }
    let faulty = FaultyStore::new(h.store.clone());
    faulty.hold_completions(true);
    let worker = keiro::WorkerBuilder::new(Arc::new(faulty.clone()))
        .registry(registry)
        .fast()
        .concurrency(1)
        .build()?;
    let looping = keiro_tests::spawn_worker(worker);
    let started = {
        let bodies = bodies.clone();
        move || bodies.load(Ordering::SeqCst)
    };
    keiro_tests::until("the first completion to be held", || {
        faulty.completions_waiting() >= 1
    })
    .await;
    keiro_tests::until(
        "a second body, started while the first completion waits",
        || started() == 2 && faulty.completions_waiting() == 2,
    )
    .await;
    // Two runs are closing: running and closing runs stay within two slot-sets, so no third
    // body starts until one of them ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        started(),
        2,
        "running and closing runs stay within two slot-sets"
    );
    faulty.hold_completions(false);
    keiro_tests::until("all four runs", || started() == 4).await;
    for i in 0..4 {
        until_completed(&h, "quick", &format!("q-{i}")).await?;
    }
    looping.stop().await?;
    Ok(())
}

/// A pass whose claim came back short keeps claiming while it has free slots: a run started
/// while a long run holds one slot is claimed on the next wake or poll, not when the long run
/// ends and its pass with it.
async fn a_run_started_while_a_long_one_runs_is_claimed_at_once(h: Harness) -> TestResult {
    let gated = Gated::new()?;
    let looping = gated.long_run_holding_a_slot(&h, None).await?;
    h.keiro.start("quick", "q-1", &()).await?;
    until_completed(&h, "quick", "q-1").await?;
    gated.finish_long_run(&h).await?;
    looping.stop().await?;
    Ok(())
}

/// A pass that claimed its `pass_limit` ends without waiting for its runs, which the next pass
/// takes over: a run started then is claimed while a long run of the earlier pass still runs.
async fn a_pass_at_its_claim_limit_does_not_hold_back_new_runs(h: Harness) -> TestResult {
    let gated = Gated::new()?;
    let looping = gated.long_run_holding_a_slot(&h, Some(2)).await?;
    // The pass's second claim, and then one past its limit.
    for id in ["q-1", "q-2", "q-3"] {
        h.keiro.start("quick", id, &()).await?;
        until_completed(&h, "quick", id).await?;
    }
    gated.finish_long_run(&h).await?;
    let total = looping.stop().await?;
    assert_eq!(total.completed, 4, "{total:?}");
    Ok(())
}

/// Graceful shutdown covers every run the loop holds, whichever pass claimed it: runs handed
/// from pass to pass (a claim limit of one) finish and complete, none is dropped mid-step.
async fn a_shutdown_waits_for_the_runs_passes_handed_over(h: Harness) -> TestResult {
    let gated = Gated::new()?;
    for i in 0..3 {
        h.keiro.start("long", &format!("l-{i}"), &()).await?;
    }
    let worker = keiro::WorkerBuilder::new(h.store.clone())
        .registry(gated.registry.clone())
        .fast()
        .concurrency(4)
        .tuning(Tuning {
            pass_limit: Some(1),
            ..h.fast_tuning()
        })
        .build()?;
    let looping = keiro_tests::spawn_worker(worker);
    keiro_tests::until("three runs in their step, one claimed per pass", || {
        gated.in_step() == 3
    })
    .await;
    let stopping = tokio::spawn(looping.stop());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !stopping.is_finished(),
        "the loop waits for the runs it holds"
    );
    gated.gate.add_permits(3);
    let total = stopping.await??;
    assert_eq!(total.completed, 3, "{total:?}");
    for i in 0..3 {
        let id = format!("l-{i}");
        let row = h.keiro.instance(("long", id.as_str())).await?.expect("row");
        assert_eq!(row.status, Status::Completed, "{id}");
    }
    Ok(())
}

/// `max_concurrent_advances` as large as a `usize` goes ("no bound") runs like any other value:
/// the worker's slots are capped where the semaphore that counts them stops, not a panic.
async fn a_worker_with_no_practical_concurrency_bound_runs(h: Harness) -> TestResult {
    let gated = Gated::new()?;
    h.keiro.start("quick", "q-1", &()).await?;
    let worker = keiro::WorkerBuilder::new(h.store.clone())
        .registry(gated.registry.clone())
        .fast()
        .concurrency(usize::MAX)
        .build()?;
    let looping = keiro_tests::spawn_worker(worker);
    until_completed(&h, "quick", "q-1").await?;
    looping.stop().await?;
    Ok(())
}

/// A `long` workflow whose one step waits for a permit of `gate`, counting the runs in it, and
/// a `quick` one-step workflow: for the scenarios where a long run holds a worker's slot.
struct Gated {
    registry: Registry,
    gate: Arc<tokio::sync::Semaphore>,
    in_step: Arc<std::sync::atomic::AtomicUsize>,
}

impl Gated {
    fn new() -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let in_step = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut registry = Registry::new();
        {
            let (gate, in_step) = (gate.clone(), in_step.clone());
            registry.register("long", move |ctx: Ctx, (): ()| {
                let (gate, in_step) = (gate.clone(), in_step.clone());
                async move {
                    ctx.step("wait", || async {
                        in_step.fetch_add(1, Ordering::SeqCst);
                        gate.acquire().await.expect("open").forget();
                        Ok::<_, Infallible>(())
                    })
                    .await
                }
            })?;
        }
        registry.register("quick", |ctx: Ctx, (): ()| async move {
            ctx.step("one", || async { Ok::<_, Infallible>(1) }).await
        })?;
        Ok(Self {
            registry,
            gate,
            in_step,
        })
    }

    /// Runs of `long` inside their step now.
    fn in_step(&self) -> usize {
        self.in_step.load(Ordering::SeqCst)
    }

    /// Starts `long/l-1` and a worker of four slots (and `pass_limit`) over `h`'s store, and
    /// waits until the long run is in its step, holding one slot.
    async fn long_run_holding_a_slot(
        &self,
        h: &Harness,
        pass_limit: Option<usize>,
    ) -> Result<keiro_tests::RunningWorker, Box<dyn std::error::Error + Send + Sync>> {
        h.keiro.start("long", "l-1", &()).await?;
        let worker = keiro::WorkerBuilder::new(h.store.clone())
            .registry(self.registry.clone())
            .fast()
            .concurrency(4)
            .tuning(Tuning {
                pass_limit,
                ..h.fast_tuning()
            })
            .build()?;
        let looping = keiro_tests::spawn_worker(worker);
        keiro_tests::until("the long run's step", || self.in_step() == 1).await;
        Ok(looping)
    }

    /// Checks that `long/l-1` is still in its step, lets it through and waits for it to
    /// complete.
    async fn finish_long_run(&self, h: &Harness) -> TestResult {
        let long = h.keiro.instance(("long", "l-1")).await?.expect("row");
        assert_eq!(
            long.status,
            Status::Running,
            "the long run is still in its step"
        );
        self.gate.add_permits(1);
        until_completed(h, "long", "l-1").await
    }
}

/// Waits until `name/id` is completed by the worker the test runs.
async fn until_completed(h: &Harness, name: &str, id: &str) -> TestResult {
    keiro_tests::until_status(&h.keiro, name, id, Status::Completed, || async { Ok(()) }).await
}
