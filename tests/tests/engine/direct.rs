//! Direct execution (issue 15, item 2): `Worker::run_workflow` / `run_named` start an instance
//! already leased to the caller (one transaction, no claim round trip, no worker pass) and
//! drive it in the calling task with the worker's own drive; what parks or crashes is resumed
//! by the workers while the caller awaits the result; a caller that goes away leaves an
//! instance the resume worker recovers at lease expiry. Both stores.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::{
    store::ClaimOutcome, store::StartClaim, worker::Notifier, worker::WakeFilter,
    worker::WakeReason, Ctx, DirectError, Keiro, ResultError, Status, Worker, WorkerBuilder,
    WorkflowDef, WorkflowError,
};
use keiro_journal::store::StartRequest;
use keiro_tests::counting::CountingStore;
use keiro_tests::workflows::Sum;
use keiro_tests::{key, on_both_stores, Backend, FastWorker, Harness, Ledger, TestResult};

on_both_stores!(
    a_direct_run_completes_in_its_caller_without_a_worker,
    the_direct_start_leases_the_instance_from_its_first_moment,
    an_existing_instance_is_driven_only_under_a_claim_a_worker_could_make,
    a_dropped_direct_run_is_recovered_when_its_lease_expires,
    a_panicking_step_crashes_a_direct_run_as_under_a_worker,
    unknown_names_and_bad_input_are_typed_errors_and_start_nothing,
    a_failed_or_cancelled_direct_run_gives_a_typed_error,
    a_direct_run_that_continues_as_new_is_driven_on_here,
    two_direct_runs_of_one_id_run_its_body_once,
);

/// A worker on `store` with the harness's fast options and `Sum` registered.
fn sum_worker(store: Arc<dyn keiro::store::LeaseStore>, ledger: &Ledger) -> Worker {
    WorkerBuilder::new(store)
        .fast()
        .register_workflow_with(Sum {
            ledger: ledger.clone(),
        })
        .build()
        .expect("valid registration")
}

async fn a_direct_run_completes_in_its_caller_without_a_worker(h: Harness) -> TestResult {
    let counting = CountingStore::new(h.store.clone());
    let ledger = Ledger::default();
    let worker = sum_worker(Arc::new(counting.clone()), &ledger);

    let total = worker.run_workflow::<Sum>("s-1", &10).await?;
    assert_eq!(total, 13);

    // One start that leased the instance; no discovery, no claim, no plain start.
    assert_eq!(counting.calls("instance_start_claimed"), 1);
    for absent in [
        "instance_start",
        "instance_claim",
        "instances_claim_batch",
        "instances_runnable",
        "instance_release",
    ] {
        assert_eq!(counting.calls(absent), 0, "{absent}");
    }
    let row = h.keiro.instance(("sum", "s-1")).await?.expect("started");
    assert_eq!(row.status, Status::Completed);
    assert_eq!(row.output, Some(serde_json::json!(13)));
    assert_eq!((row.lease_owner, row.attempts), (None, 0));
    assert_eq!(
        (
            ledger.count("step-0"),
            ledger.count("step-1"),
            ledger.count("step-2")
        ),
        (1, 1, 1)
    );
    Ok(())
}

async fn the_direct_start_leases_the_instance_from_its_first_moment(h: Harness) -> TestResult {
    let k = key("sum", "s-2");
    let request = StartRequest {
        attributes: Default::default(),
        key: k.clone(),
        input: serde_json::json!(1),
        parent: None,
        priority: 0,
        queue: None,
    };
    let ttl = Duration::from_secs(30);
    let StartClaim { created, claim } = h
        .store
        .instance_start_claimed(&request, "direct", ttl, None)
        .await?;
    assert!(created);
    let ClaimOutcome::Acquired(claim) = claim else {
        panic!("a fresh instance is leased to its starter: {claim:?}");
    };
    assert_eq!(
        (claim.fence.owner.as_str(), claim.fence.epoch),
        ("direct", 1)
    );
    assert!(claim.journal.is_empty());
    assert_eq!(claim.instance.status, Status::Running);
    assert_eq!(claim.instance.input, serde_json::json!(1));
    assert!(claim.instance.lease_expires_at.is_some());

    // Runnable for discovery, but no worker may take it while the lease lives.
    assert!(h.store.instances_runnable(None, None).await?.contains(&k));
    assert_eq!(
        h.store.instance_claim(&k, "worker", ttl, None).await?,
        ClaimOutcome::LeaseHeld
    );
    let names = [k.name.clone()];
    assert!(h
        .store
        .instances_claim_batch(&names, "worker", ttl, 10, None)
        .await?
        .is_empty());

    // Past its expiry a worker claims it with the next epoch, which fences the starter.
    let later = time::OffsetDateTime::now_utc() + time::Duration::minutes(5);
    let ClaimOutcome::Acquired(taken) = h
        .store
        .instance_claim(&k, "worker", ttl, Some(later))
        .await?
    else {
        panic!("an expired direct lease is claimable");
    };
    assert_eq!(taken.fence.epoch, 2);
    let stale = keiro::store::Append {
        key: k.clone(),
        generation: Some(0),
        event: keiro::store::Event::StepRecorded {
            step: "step-0".into(),
            kind: keiro::store::StepKind::Step,
            result: serde_json::json!(0),
        },
        fence: Some(claim.fence.clone()),
        renew: None,
    };
    let refused = h.store.journal_append(&stale).await;
    assert!(
        matches!(&refused, Err(e) if e.is_lease_lost()),
        "{refused:?}"
    );
    Ok(())
}

async fn an_existing_instance_is_driven_only_under_a_claim_a_worker_could_make(
    h: Harness,
) -> TestResult {
    let ledger = Ledger::default();
    let worker = sum_worker(h.store.clone(), &ledger);
    let ttl = Duration::from_secs(30);

    // Completed: answers its recorded output; the body does not run again, the input stands.
    assert_eq!(worker.run_workflow::<Sum>("done", &1).await?, 4);
    assert_eq!(worker.run_workflow::<Sum>("done", &100).await?, 4);
    assert_eq!(ledger.count("step-0"), 1);

    // Started for the workers but not claimed yet: taken here under a claim, with its own input.
    h.keiro.start("sum", "queued", &20).await?;
    assert_eq!(worker.run_workflow::<Sum>("queued", &0).await?, 23);
    assert_eq!(ledger.count("step-0"), 2);

    // Leased by someone else: left alone and awaited, then answered once a worker finishes it.
    let held = key("sum", "held");
    h.keiro.start("sum", "held", &30).await?;
    let ClaimOutcome::Acquired(other) = h.store.instance_claim(&held, "other", ttl, None).await?
    else {
        panic!("a fresh start is claimable");
    };
    let waiting = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_workflow::<Sum>("held", &0).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    assert_eq!(ledger.count("step-0"), 2, "a held instance is not driven");
    let row = h.keiro.instance(("sum", "held")).await?.expect("started");
    assert_eq!(row.lease_epoch, other.fence.epoch, "nor claimed");
    h.store.instance_release(&held, &other.fence, false).await?;
    worker.drain().await?;
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), waiting).await???,
        33
    );

    // Parked with no due wake-up, or paced by a crash: not claimed, the row as it was.
    let request = |id: &str| StartRequest {
        attributes: Default::default(),
        key: key("sum", id),
        input: serde_json::json!(0),
        parent: None,
        priority: 0,
        queue: None,
    };
    h.keiro.start("sum", "parked", &0).await?;
    let ClaimOutcome::Acquired(parker) = h
        .store
        .instance_claim(&key("sum", "parked"), "w", ttl, None)
        .await?
    else {
        panic!("claimable");
    };
    h.store
        .instance_park(&keiro_journal::store::Park {
            key: key("sum", "parked"),
            generation: 0,
            fence: Some(parker.fence),
            awaited: vec!["await:approval".into()],
            wake_after: None,
        })
        .await?;
    let parked = h
        .store
        .instance_start_claimed(&request("parked"), "direct", ttl, None)
        .await?;
    assert!(!parked.created);
    assert_eq!(parked.claim, ClaimOutcome::Unavailable);
    let row = h.keiro.instance(("sum", "parked")).await?.expect("started");
    assert_eq!((row.status, row.lease_owner), (Status::Suspended, None));

    h.keiro.start("sum", "paced", &0).await?;
    let ClaimOutcome::Acquired(crasher) = h
        .store
        .instance_claim(&key("sum", "paced"), "w", ttl, None)
        .await?
    else {
        panic!("claimable");
    };
    h.store
        .instance_record_crash(
            &key("sum", "paced"),
            &crasher.fence,
            &keiro_lease::Crash {
                error: "boom".into(),
                retry_delay: Duration::from_secs(600),
                max_attempts: 5,
            },
        )
        .await?;
    let paced = h
        .store
        .instance_start_claimed(&request("paced"), "direct", ttl, None)
        .await?;
    assert_eq!(paced.claim, ClaimOutcome::Paced);
    Ok(())
}

/// Step `a`, then step `b`, whose first execution never ends (the caller is dropped in it).
struct Stuck {
    a: Arc<AtomicU32>,
    b: Arc<AtomicU32>,
}

impl WorkflowDef for Stuck {
    const NAME: &'static str = "stuck";
    type Input = ();
    type Output = String;

    async fn run(&self, ctx: Ctx, (): ()) -> Result<String, WorkflowError> {
        let a = self.a.clone();
        let first: String = ctx
            .step("a", || async move {
                a.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>("a".to_owned())
            })
            .await?;
        let b = self.b.clone();
        let second: String = ctx
            .step("b", || async move {
                if b.fetch_add(1, Ordering::SeqCst) == 0 {
                    std::future::pending::<()>().await;
                }
                Ok::<_, Infallible>("b".to_owned())
            })
            .await?;
        Ok(first + &second)
    }
}

/// Polls `check` every 20 ms until it holds, for at most `within`.
async fn eventually<F, Fut>(within: Duration, mut check: F) -> Result<bool, keiro::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, keiro::Error>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() > deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_dropped_direct_run_is_recovered_when_its_lease_expires(h: Harness) -> TestResult {
    let (a, b) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let lease_ttl = Duration::from_millis(300);
    let worker = h
        .keiro
        .worker()
        .fast()
        .lease_ttl(lease_ttl)
        .register_workflow_with(Stuck {
            a: a.clone(),
            b: b.clone(),
        })
        .build()?;
    let caller = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_workflow::<Stuck>("s", &()).await }
    });
    let b_seen = b.clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let b = b_seen.clone();
            async move { Ok(b.load(Ordering::SeqCst) == 1) }
        })
        .await?
    );
    // The caller goes away in the middle of step `b`.
    caller.abort();
    assert!(caller.await.is_err_and(|e| e.is_cancelled()));
    let row = h.keiro.instance(("stuck", "s")).await?.expect("started");
    assert_eq!(row.status, Status::Running);
    assert!(row.lease_owner.is_some(), "the lease outlives its holder");

    // While the lease lives no worker takes the run; once it expires one does, and replays `a`.
    let first = worker.resume_once().await?;
    assert_eq!((first.lease_skipped, first.completed), (1, 0), "{first:?}");
    let recovered = eventually(Duration::from_secs(10), || async {
        worker.resume_once().await?;
        let row = h.keiro.instance(("stuck", "s")).await?.expect("started");
        Ok(row.status == Status::Completed)
    })
    .await?;
    assert!(recovered, "recovered within the lease ttl and a few passes");
    assert_eq!(
        a.load(Ordering::SeqCst),
        1,
        "a journaled step never runs again"
    );
    assert_eq!(
        b.load(Ordering::SeqCst),
        2,
        "the interrupted step runs again"
    );
    let row = h.keiro.instance(("stuck", "s")).await?.expect("started");
    assert_eq!(row.output, Some(serde_json::json!("ab")));
    assert_eq!(row.attempts, 0, "a lapsed lease is no crash");
    Ok(())
}

async fn a_panicking_step_crashes_a_direct_run_as_under_a_worker(h: Harness) -> TestResult {
    let panics = Arc::new(AtomicU32::new(0));
    let body = {
        let panics = panics.clone();
        move |ctx: Ctx, (): ()| {
            let panics = panics.clone();
            async move {
                ctx.step("flaky", || async move {
                    if panics.fetch_add(1, Ordering::SeqCst) == 0 {
                        panic!("the first attempt panics");
                    }
                    Ok::<_, Infallible>(7_u32)
                })
                .await
            }
        }
    };
    let worker = h.keiro.worker().fast().register("flaky", body).build()?;
    let caller = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_named::<u32, _>("flaky", "f", &()).await }
    });
    // The crash is recorded as a worker records it: an attempt, the error, the lease released.
    let crashed = eventually(Duration::from_secs(10), || async {
        let row = h.keiro.instance(("flaky", "f")).await?;
        Ok(row.is_some_and(|r| r.attempts == 1))
    })
    .await?;
    assert!(crashed);
    let row = h.keiro.instance(("flaky", "f")).await?.expect("started");
    assert_eq!(
        (row.status, row.lease_owner.as_deref()),
        (Status::Running, None)
    );
    assert!(
        row.last_error
            .as_deref()
            .is_some_and(|e| e.contains("panicked")),
        "{row:?}"
    );
    assert!(row.next_attempt_at.is_some(), "backoff like a worker's");
    assert!(!caller.is_finished(), "the caller waits for the retry");

    // A worker retries it; the caller gets the output.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let worker = worker.clone();
        async move {
            worker
                .run_until(async {
                    let _ = stop_rx.await;
                })
                .await
        }
    });
    let output = tokio::time::timeout(Duration::from_secs(10), caller).await???;
    let _ = stop_tx.send(());
    running.await?;
    assert_eq!(output, 7);
    assert_eq!(panics.load(Ordering::SeqCst), 2);
    Ok(())
}

/// A typed workflow no worker of these tests registers.
struct Unregistered;

impl WorkflowDef for Unregistered {
    const NAME: &'static str = "unregistered";
    type Input = ();
    type Output = ();

    async fn run(&self, _ctx: Ctx, (): ()) -> Result<(), WorkflowError> {
        Ok(())
    }
}

async fn unknown_names_and_bad_input_are_typed_errors_and_start_nothing(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let worker = WorkerBuilder::new(h.store.clone())
        .fast()
        .payload_len_max(64)
        .register_workflow_with(Sum {
            ledger: ledger.clone(),
        })
        .register("echo", |_ctx: Ctx, s: String| async move { Ok(s) })
        .build()?;

    let unknown = worker.run_named::<u64, _>("nope", "n-1", &1).await;
    assert!(
        matches!(&unknown, Err(DirectError::Unregistered { name }) if name.as_str() == "nope"),
        "{unknown:?}"
    );
    assert!(h.keiro.instance(("nope", "n-1")).await?.is_none());
    let typed = worker.run_workflow::<Unregistered>("u-1", &()).await;
    assert!(
        matches!(&typed, Err(DirectError::Unregistered { .. })),
        "{typed:?}"
    );
    assert!(h.keiro.instance(("unregistered", "u-1")).await?.is_none());

    let bad_id = worker.run_workflow::<Sum>("a/b", &1).await;
    assert!(
        matches!(bad_id, Err(DirectError::InvalidId(_))),
        "{bad_id:?}"
    );
    let too_large = worker
        .run_named::<String, _>("echo", "big", &"x".repeat(100))
        .await;
    assert!(
        matches!(too_large, Err(DirectError::Payload(_))),
        "{too_large:?}"
    );
    let nul = worker
        .run_named::<String, _>("echo", "nul", &"a\u{0}b")
        .await;
    assert!(matches!(nul, Err(DirectError::Payload(_))), "{nul:?}");
    for id in ["big", "nul"] {
        assert!(h.keiro.instance(("echo", id)).await?.is_none(), "{id}");
    }

    // Registered, but the output asked for is another type: the run completes, the decode fails.
    let wrong = worker.run_named::<u64, _>("echo", "w", &"text").await;
    assert!(
        matches!(wrong, Err(DirectError::Result(ResultError::Decode { .. }))),
        "{wrong:?}"
    );
    Ok(())
}

async fn a_failed_or_cancelled_direct_run_gives_a_typed_error(h: Harness) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("rejects", |_ctx: Ctx, (): ()| async move {
            Err::<(), _>(WorkflowError::app("rejected"))
        })
        .register("awaits", |ctx: Ctx, (): ()| async move {
            ctx.await_step::<()>("never").await
        })
        .build()?;
    let failed = worker.run_named::<(), _>("rejects", "r", &()).await;
    match &failed {
        Err(error @ DirectError::Result(ResultError::Failed { reason, .. })) => {
            assert!(reason.contains("rejected"), "{reason}");
            assert!(error.is_final());
        }
        other => panic!("expected a failure, got {other:?}"),
    }

    let caller = tokio::spawn({
        let worker = worker.clone();
        async move { worker.run_named::<(), _>("awaits", "c", &()).await }
    });
    let parked = eventually(Duration::from_secs(10), || async {
        let row = h.keiro.instance(("awaits", "c")).await?;
        Ok(row.is_some_and(|r| r.status == Status::Suspended))
    })
    .await?;
    assert!(parked);
    h.keiro.cancel(("awaits", "c")).await?;
    let cancelled = tokio::time::timeout(Duration::from_secs(10), caller).await??;
    assert!(
        matches!(
            cancelled,
            Err(DirectError::Result(ResultError::Cancelled { .. }))
        ),
        "{cancelled:?}"
    );
    Ok(())
}

async fn a_direct_run_that_continues_as_new_is_driven_on_here(h: Harness) -> TestResult {
    let counting = CountingStore::new(h.store.clone());
    let worker = WorkerBuilder::new(Arc::new(counting.clone()))
        .fast()
        .register("countdown", |ctx: Ctx, n: u32| async move {
            let n: u32 = ctx
                .step("tick", || async move { Ok::<_, Infallible>(n) })
                .await?;
            if n > 0 {
                return Err(ctx.continue_as_new(&(n - 1)));
            }
            Ok("liftoff".to_owned())
        })
        .build()?;
    let output: String = worker.run_named("countdown", "c", &2_u32).await?;
    assert_eq!(output, "liftoff");
    let row = h
        .keiro
        .instance(("countdown", "c"))
        .await?
        .expect("started");
    assert_eq!((row.status, row.generation), (Status::Completed, 2));
    // Each next generation was taken under a proper claim, here; no worker pass ran.
    assert_eq!(counting.calls("instance_claim"), 2);
    assert_eq!(counting.calls("instances_runnable"), 0);
    Ok(())
}

async fn two_direct_runs_of_one_id_run_its_body_once(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let worker = sum_worker(h.store.clone(), &ledger);
    let runs: Vec<_> = (0..2)
        .map(|_| {
            let worker = worker.clone();
            tokio::spawn(async move { worker.run_workflow::<Sum>("twice", &5).await })
        })
        .collect();
    for run in runs {
        let total = tokio::time::timeout(Duration::from_secs(10), run).await???;
        assert_eq!(total, 8);
    }
    assert_eq!(ledger.count("step-0"), 1);
    let row = h.keiro.instance(("sum", "twice")).await?.expect("started");
    assert_eq!(row.attempts, 0);
    Ok(())
}

/// The parked case with push: the caller is woken by the store's notification when a worker
/// finishes the run, not by its fallback poll (an hour here).
mod pushed {
    use super::*;

    async fn a_parked_direct_run_is_finished_by_a_worker_and_its_caller_woken_by_push(
        keiro: Keiro,
        notifier: Arc<dyn Notifier>,
    ) -> TestResult {
        let worker = keiro
            .worker()
            .push(Some(notifier))
            .poll_interval(Duration::from_secs(3600))
            .register("approval", |ctx: Ctx, who: String| async move {
                let approved_by: String = ctx.await_step("approval").await?;
                Ok(format!("{who} approved by {approved_by}"))
            })
            .build()?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let running = tokio::spawn({
            let worker = worker.clone();
            async move {
                worker
                    .run_until(async {
                        let _ = stop_rx.await;
                    })
                    .await
            }
        });
        let caller = tokio::spawn({
            let worker = worker.clone();
            async move { worker.run_named::<String, _>("approval", "p", &"ada").await }
        });
        let parked = eventually(Duration::from_secs(10), || async {
            let row = keiro.instance(("approval", "p")).await?;
            Ok(row.is_some_and(|r| r.status == Status::Suspended))
        })
        .await?;
        assert!(parked, "the direct run parks and releases its lease");
        let row = keiro.instance(("approval", "p")).await?.expect("started");
        assert_eq!(row.lease_owner, None);
        keiro.deliver(("approval", "p"), "approval", &"bob").await?;
        let output = tokio::time::timeout(Duration::from_secs(10), caller).await???;
        assert_eq!(output, "ada approved by bob");
        let _ = stop_tx.send(());
        running.await?;
        Ok(())
    }

    /// A direct start notifies no worker: none may take the run while its lease lives. A
    /// plain start first proves the subscription hears the store.
    async fn a_direct_start_wakes_no_worker(
        keiro: Keiro,
        notifier: Arc<dyn Notifier>,
    ) -> TestResult {
        let ledger = Ledger::default();
        let worker = keiro
            .worker()
            .register_workflow_with(Sum {
                ledger: ledger.clone(),
            })
            .build()?;
        let mut wake = notifier.subscribe(WakeFilter::Instances);
        // The listener may still be connecting: start until one start is heard.
        for attempt in 0.. {
            assert!(attempt < 50, "no notification");
            keiro.start("sum", &format!("plain-{attempt}"), &0).await?;
            if wake.wait(Duration::from_millis(200)).await == WakeReason::Notified {
                break;
            }
        }
        while wake.wait(Duration::from_millis(200)).await != WakeReason::Timeout {}

        assert_eq!(worker.run_workflow::<Sum>("direct", &1).await?, 4);
        assert_eq!(
            wake.wait(Duration::from_millis(500)).await,
            WakeReason::Timeout
        );
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_no_wake() -> TestResult {
        let store = keiro_sqlite::SqliteStore::temporary()?;
        let keiro = Keiro::builder(store.clone()).without_push().build();
        a_direct_start_wakes_no_worker(keiro, Arc::new(store)).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_no_wake() -> TestResult {
        let h = Harness::postgres().await;
        let db = h.db.as_ref().expect("a postgres harness has a schema");
        let notifier: Arc<dyn Notifier> = Arc::new(db.store());
        a_direct_start_wakes_no_worker(h.keiro.clone(), notifier).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() -> TestResult {
        let store = keiro_sqlite::SqliteStore::temporary()?;
        let keiro = Keiro::builder(store.clone()).without_push().build();
        let store = Arc::new(store);
        a_parked_direct_run_is_finished_by_a_worker_and_its_caller_woken_by_push(keiro, store).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() -> TestResult {
        let h = Harness::postgres().await;
        assert_eq!(h.backend, Backend::Postgres);
        let db = h.db.as_ref().expect("a postgres harness has a schema");
        let notifier: Arc<dyn Notifier> = Arc::new(db.store());
        a_parked_direct_run_is_finished_by_a_worker_and_its_caller_woken_by_push(
            h.keiro.clone(),
            notifier,
        )
        .await
    }
}
