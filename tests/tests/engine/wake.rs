//! Wake-source conformance: durable sleep, awakeables, signals, child workflows, cascade
//! cancellation and push, against the SQLite and Postgres stores. The scenarios that wait for
//! deadlines or drive to quiescence use the test kit (`TestEnv`): its clock moves instead of
//! the test sleeping.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::testing::TestEnvBuilder;
use keiro::{
    worker::Registry, worker::ResumeOptions, workflow::AwakeableOutcome, workflow::RunOutcome,
    workflow::SignalSendOutcome, Ctx, Keiro, Status, WorkflowError,
};
use keiro_tests::{key, on_both_stores, run_inline, FastWorker, Harness, Ledger, TestResult};
use serde_json::json;
use time::OffsetDateTime;

on_both_stores!(
    a_timer_firing_twice_journals_once,
    first_sleep_arm_wins,
    awakeable_parked_is_not_discovered_until_completed,
    awakeable_double_completion_is_idempotent,
    awakeable_cancellation_is_a_typed_error,
    awakeable_of_a_terminal_owner_journals_nothing,
    signal_sent_before_the_wait_is_buffered,
    signal_sent_after_the_wait_is_delivered,
    signal_and_wait_race_deliver_exactly_once,
    signals_are_fifo_per_token,
    push_wakes_a_worker_without_waiting_for_its_poll;
    env:
    sleep_parks_until_its_timer_fires,
    signal_wait_times_out,
    child_result_reaches_the_parent,
    child_failure_at_the_ceiling_wakes_the_parent,
    cancel_child_and_cascade,
    open_ended_park_gets_the_reconcile_deadline,
);

fn options(h: &Harness) -> ResumeOptions {
    h.fast_options()
}

async fn pass(
    h: &Harness,
    registry: &Registry,
) -> Result<keiro::worker::ResumeSummary, keiro::store::StoreError> {
    keiro::worker::resume_once(&h.store, registry, &options(h)).await
}

fn sleeper(ledger: Ledger) -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("sleeper", move |ctx: Ctx, ms: u64| {
        let ledger = ledger.clone();
        async move {
            ctx.step("before", || async {
                ledger.bump("before");
                Ok::<_, Infallible>(())
            })
            .await?;
            ctx.sleep("nap", Duration::from_millis(ms)).await?;
            ctx.step("after", || async {
                ledger.bump("after");
                Ok::<_, Infallible>(())
            })
            .await?;
            Ok(())
        }
    })?;
    Ok(registry)
}

async fn sleep_parks_until_its_timer_fires(env: TestEnvBuilder) -> TestResult {
    let ledger = Ledger::default();
    let env = env.registry(sleeper(ledger.clone())?).build()?;
    let (worker, store) = (env.worker(), env.keiro().store());
    let hour = Duration::from_secs(3600);
    env.start("sleeper", "s-1", &3_600_000u64).await?;
    let first = worker.resume_once().await?;
    assert_eq!((first.resumed, first.still_suspended), (1, 1));
    let row = env.instance(("sleeper", "s-1")).await?;
    assert_eq!(row.status, Status::Suspended);
    assert!(
        row.wake_after.is_some(),
        "the sleep's deadline is the wake hint"
    );

    // Not due yet: nothing to discover, nothing to fire.
    assert_eq!(worker.resume_once().await?.discovered, 0);
    assert!(store.timers_fire_due(None, 10).await?.fired.is_empty());

    // Due, but no timer worker fired it: discovered, re-parked, reported as a due sleep.
    env.move_clock(hour + Duration::from_millis(10)).await?;
    let blocked = worker.resume_once().await?;
    assert_eq!((blocked.sleep_due, blocked.advanced), (1, 0), "{blocked:?}");

    let fired = store.timers_fire_due(None, 10).await?;
    assert_eq!(fired.fired.len(), 1);
    assert!(fired.fired[0].delivered);
    let row = env.instance(("sleeper", "s-1")).await?;
    assert_eq!(
        (row.status, row.wake_after),
        (Status::Running, None),
        "the fire flipped the row and cleared the hint"
    );
    let done = worker.resume_once().await?;
    assert_eq!(done.completed, 1);
    assert_eq!((ledger.count("before"), ledger.count("after")), (1, 1));
    Ok(())
}

async fn a_timer_firing_twice_journals_once(h: Harness) -> TestResult {
    let registry = sleeper(Ledger::default())?;
    h.keiro.start("sleeper", "s-2", &0u64).await?;
    pass(&h, &registry).await?;
    let k = key("sleeper", "s-2");
    // Two timer workers race for the same due timer.
    let (a, b) = tokio::join!(
        h.store.timers_fire_due(None, 10),
        h.store.timers_fire_due(None, 10)
    );
    let fired = a?.fired.len() + b?.fired.len();
    assert_eq!(fired, 1, "SKIP LOCKED: exactly one worker fires it");
    // A later re-fire (say, a requeued timer) finds the step journaled and delivers nothing.
    assert!(h.store.timers_fire_due(None, 10).await?.fired.is_empty());
    let sleeps = h
        .store
        .journal_load(&k, 0)
        .await?
        .iter()
        .filter(|e| e.event.step_name() == "sleep:nap")
        .count();
    assert_eq!(sleeps, 1);
    Ok(())
}

async fn first_sleep_arm_wins(h: Harness) -> TestResult {
    let registry = sleeper(Ledger::default())?;
    h.keiro.start("sleeper", "s-3", &60_000u64).await?;
    pass(&h, &registry).await?;
    let first = h
        .keiro
        .instance(("sleeper", "s-3"))
        .await?
        .expect("row")
        .wake_after
        .expect("armed");
    // A re-drive (reconcile, crash) re-arms later; the deadline must not move.
    tokio::time::sleep(Duration::from_millis(30)).await;
    let arm = keiro_journal::store::TimerArm {
        key: key("sleeper", "s-3"),
        generation: 0,
        step: "sleep:nap".into(),
        due: keiro_journal::store::TimerDue::After(Duration::from_secs(5 * 60)),
        kind: keiro_journal::TimerKind::Sleep,
    };
    assert_eq!(h.store.timer_arm(&arm).await?, first);
    let run = run_inline(
        &h,
        &key("sleeper", "s-3"),
        registry
            .get(&keiro::workflow::WorkflowName::new("sleeper")?)
            .expect("registered")
            .as_ref(),
    )
    .await?;
    assert_eq!(run, RunOutcome::Suspended);
    assert_eq!(
        h.keiro
            .instance(("sleeper", "s-3"))
            .await?
            .expect("row")
            .wake_after,
        Some(first)
    );
    Ok(())
}

fn approver(
    ledger: Ledger,
    ids: Arc<std::sync::Mutex<Vec<uuid::Uuid>>>,
) -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("approver", move |ctx: Ctx, (): ()| {
        let (ledger, ids) = (ledger.clone(), ids.clone());
        async move {
            let approval = ctx.awakeable::<String>("approval").await?;
            let id = approval.id();
            ctx.step("announce", || async {
                ledger.bump("announce");
                ids.lock().expect("lock").push(id);
                Ok::<_, Infallible>(())
            })
            .await?;
            match approval.value().await {
                Ok(v) => Ok(format!("approved by {v}")),
                Err(WorkflowError::AwakeableCancelled { .. }) => Ok("cancelled".to_owned()),
                Err(e) => Err(e),
            }
        }
    })?;
    Ok(registry)
}

async fn awakeable_parked_is_not_discovered_until_completed(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
    let registry = approver(ledger.clone(), ids.clone())?;
    let mut opts = options(&h);
    opts.reconcile = None;
    h.keiro.start("approver", "a-1", &()).await?;
    let first = keiro::worker::resume_once(&h.store, &registry, &opts).await?;
    assert_eq!(first.still_suspended, 1);
    assert_eq!(h.store.awakeables_pending().await?, 1);
    for _ in 0..3 {
        assert_eq!(
            keiro::worker::resume_once(&h.store, &registry, &opts)
                .await?
                .discovered,
            0
        );
    }
    let id = ids.lock().expect("lock")[0];
    assert_eq!(
        h.keiro.complete_awakeable(id, "ada").await?,
        AwakeableOutcome::Delivered
    );
    let done = keiro::worker::resume_once(&h.store, &registry, &opts).await?;
    assert_eq!((done.discovered, done.completed), (1, 1));
    let row = h.keiro.instance(("approver", "a-1")).await?.expect("row");
    assert_eq!(row.output, Some(json!("approved by ada")));
    assert_eq!(
        ledger.count("announce"),
        1,
        "the announcement was not replayed"
    );
    assert_eq!(h.store.awakeables_pending().await?, 0);
    Ok(())
}

async fn awakeable_double_completion_is_idempotent(h: Harness) -> TestResult {
    let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
    let registry = approver(Ledger::default(), ids.clone())?;
    h.keiro.start("approver", "a-2", &()).await?;
    pass(&h, &registry).await?;
    let id = ids.lock().expect("lock")[0];
    let (x, y) = tokio::join!(
        h.keiro.complete_awakeable(id, "x"),
        h.keiro.complete_awakeable(id, "y")
    );
    let outcomes = [x?, y?];
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == AwakeableOutcome::Delivered)
            .count(),
        1,
        "{outcomes:?}"
    );
    assert!(outcomes.contains(&AwakeableOutcome::AlreadySettled(
        keiro_journal::AwakeableStatus::Completed
    )));
    pass(&h, &registry).await?;
    let out = h
        .keiro
        .instance(("approver", "a-2"))
        .await?
        .expect("row")
        .output
        .expect("completed");
    assert!(out == json!("approved by x") || out == json!("approved by y"));
    assert_eq!(
        h.keiro
            .complete_awakeable(uuid::Uuid::new_v4(), "z")
            .await?,
        AwakeableOutcome::NotFound
    );
    Ok(())
}

async fn awakeable_cancellation_is_a_typed_error(h: Harness) -> TestResult {
    let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
    let registry = approver(Ledger::default(), ids.clone())?;
    h.keiro.start("approver", "a-3", &()).await?;
    pass(&h, &registry).await?;
    let id = ids.lock().expect("lock")[0];
    assert_eq!(
        h.keiro.cancel_awakeable(id).await?,
        AwakeableOutcome::Delivered
    );
    assert_eq!(
        h.keiro.complete_awakeable(id, "late").await?,
        AwakeableOutcome::AlreadySettled(keiro_journal::AwakeableStatus::Cancelled)
    );
    pass(&h, &registry).await?;
    assert_eq!(
        h.keiro
            .instance(("approver", "a-3"))
            .await?
            .expect("row")
            .output,
        Some(json!("cancelled"))
    );
    Ok(())
}

async fn awakeable_of_a_terminal_owner_journals_nothing(h: Harness) -> TestResult {
    let ids = Arc::new(std::sync::Mutex::new(Vec::new()));
    let registry = approver(Ledger::default(), ids.clone())?;
    h.keiro.start("approver", "a-4", &()).await?;
    pass(&h, &registry).await?;
    let id = ids.lock().expect("lock")[0];
    let before = h.keiro.journal(("approver", "a-4")).await?.len();
    h.keiro.cancel(("approver", "a-4")).await?;
    // The cancel settled the awakeable (0012): a completion finds it cancelled.
    assert_eq!(
        h.keiro.complete_awakeable(id, "too late").await?,
        AwakeableOutcome::AlreadySettled(keiro_journal::AwakeableStatus::Cancelled)
    );
    let after = h.keiro.journal(("approver", "a-4")).await?;
    assert_eq!(after.len(), before + 1, "only the cancel marker was added");
    assert_eq!(
        h.keiro
            .instance(("approver", "a-4"))
            .await?
            .expect("row")
            .status,
        Status::Cancelled
    );
    Ok(())
}

fn listener() -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("listener", |ctx: Ctx, token: String| async move {
        let first: u32 = ctx.wait_signal(&token, None).await?;
        let second: u32 = ctx.wait_signal(&token, None).await?;
        Ok((first, second))
    })?;
    Ok(registry)
}

async fn signal_sent_before_the_wait_is_buffered(h: Harness) -> TestResult {
    let registry = listener()?;
    assert_eq!(
        h.keiro.signal("t-1", &1).await?,
        SignalSendOutcome::Buffered
    );
    assert_eq!(
        h.keiro.signal("t-1", &2).await?,
        SignalSendOutcome::Buffered
    );
    h.keiro.start("listener", "l-1", &"t-1").await?;
    let done = pass(&h, &registry).await?;
    assert_eq!(
        done.completed, 1,
        "both buffered signals were consumed without parking: {done:?}"
    );
    assert_eq!(
        h.keiro
            .instance(("listener", "l-1"))
            .await?
            .expect("row")
            .output,
        Some(json!([1, 2]))
    );
    Ok(())
}

async fn signal_sent_after_the_wait_is_delivered(h: Harness) -> TestResult {
    let registry = listener()?;
    h.keiro.start("listener", "l-2", &"t-2").await?;
    pass(&h, &registry).await?;
    assert_eq!(
        h.keiro
            .instance(("listener", "l-2"))
            .await?
            .expect("row")
            .status,
        Status::Suspended
    );
    assert_eq!(
        h.keiro.signal("t-2", &10).await?,
        SignalSendOutcome::Delivered {
            to: key("listener", "l-2")
        }
    );
    pass(&h, &registry).await?;
    assert_eq!(
        h.keiro.signal("t-2", &20).await?,
        SignalSendOutcome::Delivered {
            to: key("listener", "l-2")
        }
    );
    pass(&h, &registry).await?;
    assert_eq!(
        h.keiro
            .instance(("listener", "l-2"))
            .await?
            .expect("row")
            .output,
        Some(json!([10, 20]))
    );
    Ok(())
}

async fn signal_and_wait_race_deliver_exactly_once(h: Harness) -> TestResult {
    let mut registry = Registry::new();
    registry.register("once", |ctx: Ctx, token: String| async move {
        let v: u32 = ctx.wait_signal(&token, None).await?;
        Ok(v)
    })?;
    for i in 0u32..20 {
        let token = format!("race-{i}");
        let id = format!("o-{i}");
        h.keiro.start("once", &id, &token).await?;
        // The wait (inside a pass) and the send race; in either order the signal lands once.
        let (summary, sent) = tokio::join!(pass(&h, &registry), h.keiro.signal(&token, &i));
        summary?;
        sent?;
        let mut drained = keiro::worker::drain(&h.store, &registry, &options(&h)).await?;
        if h.keiro.instance(("once", &id)).await?.expect("row").status != Status::Completed {
            drained += pass(&h, &registry).await?;
        }
        let row = h.keiro.instance(("once", &id)).await?.expect("row");
        assert_eq!(
            (row.status, row.output),
            (Status::Completed, Some(json!(i))),
            "round {i}: {drained:?}"
        );
        // Nothing left buffered: a second wait on the token would park.
        h.keiro
            .start("once", &format!("{id}-second"), &token)
            .await?;
        pass(&h, &registry).await?;
        let second = h
            .keiro
            .instance(("once", &format!("{id}-second")))
            .await?
            .expect("row");
        assert_eq!(
            second.status,
            Status::Suspended,
            "round {i}: the signal was delivered twice"
        );
    }
    Ok(())
}

async fn signals_are_fifo_per_token(h: Harness) -> TestResult {
    let registry = listener()?;
    for v in [7, 8, 9] {
        h.keiro.signal("fifo", &v).await?;
    }
    h.keiro.signal("other", &100).await?;
    h.keiro.start("listener", "f-1", &"fifo").await?;
    h.keiro.start("listener", "f-2", &"fifo").await?;
    keiro::worker::drain(&h.store, &registry, &options(&h)).await?;
    let a = h.keiro.instance(("listener", "f-1")).await?.expect("row");
    let b = h.keiro.instance(("listener", "f-2")).await?.expect("row");
    let mut got: Vec<serde_json::Value> = [a.output, b.output].into_iter().flatten().collect();
    got.sort_by_key(|v| v.to_string());
    // f-1 (first discovered) takes 7 and 8; f-2 takes 9 and waits for one more.
    assert_eq!(got, [json!([7, 8])]);
    assert_eq!(b.status, Status::Suspended);
    Ok(())
}

async fn signal_wait_times_out(env: TestEnvBuilder) -> TestResult {
    let env = env
        .register("impatient", |ctx: Ctx, (): ()| async move {
            match ctx
                .wait_signal::<u32>("never-sent", Some(Duration::from_secs(60)))
                .await
            {
                Err(WorkflowError::SignalTimeout { token }) => Ok(format!("timed out on {token}")),
                other => other.map(|v| v.to_string()),
            }
        })
        .build()?;
    env.start("impatient", "i-1", &()).await?;
    env.worker().resume_once().await?;
    env.move_clock(Duration::from_secs(61)).await?;
    let fired = env.worker().fire_due_timers().await?;
    assert_eq!(fired.fired.len(), 1);
    env.worker().resume_once().await?;
    assert_eq!(
        env.output::<String>(("impatient", "i-1")).await?,
        "timed out on never-sent"
    );
    // A signal sent after the timeout is buffered for someone else, not lost into the old wait.
    assert_eq!(
        env.signal("never-sent", &1).await?,
        SignalSendOutcome::Buffered
    );
    Ok(())
}

fn family(
    ledger: Ledger,
    child_fails: Arc<AtomicBool>,
) -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    let l = ledger.clone();
    registry.register("parent", move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            ctx.step("before", || async {
                l.bump("parent-before");
                Ok::<_, Infallible>(())
            })
            .await?;
            match ctx.child::<_, u32>("kid", "kid-1", &20u32).await {
                Ok(v) => Ok(format!("child said {v}")),
                Err(WorkflowError::ChildFailed { reason, .. }) => {
                    Ok(format!("child failed: {reason}"))
                }
                Err(WorkflowError::ChildCancelled { .. }) => Ok("child cancelled".to_owned()),
                Err(e) => Err(e),
            }
        }
    })?;
    registry.register("kid", move |ctx: Ctx, n: u32| {
        let (ledger, fails) = (ledger.clone(), child_fails.clone());
        async move {
            let v: u32 = ctx
                .step("work", || async {
                    ledger.bump("kid-work");
                    if fails.load(Ordering::SeqCst) {
                        Err("kid broke")
                    } else {
                        Ok(n + 1)
                    }
                })
                .await?;
            let _: bool = ctx.await_step("hold").await?;
            Ok(v)
        }
    })?;
    Ok(registry)
}

async fn child_result_reaches_the_parent(env: TestEnvBuilder) -> TestResult {
    let ledger = Ledger::default();
    let env = env
        .registry(family(ledger.clone(), Arc::new(AtomicBool::new(false)))?)
        .build()?;
    env.start("parent", "p-1", &()).await?;
    env.run_until_idle().await?;
    let child = env.instance(("kid", "kid-1")).await?; // spawned in the parent's step transaction
    assert_eq!(child.parent, Some(key("parent", "p-1")));
    assert_eq!(env.status(("parent", "p-1")).await?, Status::Suspended);
    env.deliver(("kid", "kid-1"), "hold", &true).await?;
    env.run_until_idle().await?;
    assert_eq!(
        env.output::<String>(("parent", "p-1")).await?,
        "child said 21"
    );
    assert_eq!(
        (ledger.count("parent-before"), ledger.count("kid-work")),
        (1, 1)
    );
    let spawns = env
        .journal(("parent", "p-1"))
        .await?
        .iter()
        .filter(|e| e.event.step_name() == "child:kid/kid-1")
        .count();
    assert_eq!(spawns, 1, "never re-spawned on replay");
    Ok(())
}

async fn child_failure_at_the_ceiling_wakes_the_parent(env: TestEnvBuilder) -> TestResult {
    let env = env
        .registry(family(Ledger::default(), Arc::new(AtomicBool::new(true)))?)
        .resume_options(|options| options.max_attempts = 2)
        .build()?;
    env.start("parent", "p-2", &()).await?;
    env.run_until_idle().await?;
    let child = env.instance(("kid", "kid-1")).await?;
    assert_eq!((child.status, child.attempts), (Status::Failed, 2));
    let parent = env.instance(("parent", "p-2")).await?;
    assert_eq!(parent.status, Status::Completed);
    let out = parent.output.expect("output").to_string();
    assert!(
        out.contains("child failed") && out.contains("kid broke"),
        "{out}"
    );
    Ok(())
}

async fn cancel_child_and_cascade(env: TestEnvBuilder) -> TestResult {
    let mut registry = family(Ledger::default(), Arc::new(AtomicBool::new(false)))?;
    registry.register("canceller", |ctx: Ctx, (): ()| async move {
        ctx.spawn_child("kid", "kid-9", &1u32).await?;
        ctx.cancel_child("kid", "kid-9").await?;
        match ctx.await_child::<u32>("kid", "kid-9").await {
            Err(WorkflowError::ChildCancelled { .. }) => Ok("saw the cancel".to_owned()),
            other => other.map(|v| v.to_string()),
        }
    })?;
    let env = env.registry(registry).build()?;
    env.start("canceller", "c-1", &()).await?;
    env.run_until_idle().await?;
    assert_eq!(env.status(("kid", "kid-9")).await?, Status::Cancelled);
    assert_eq!(
        env.output::<String>(("canceller", "c-1")).await?,
        "saw the cancel"
    );

    // Cascade: cancelling a parent cancels its live child, which in turn reports to nobody live.
    env.start("parent", "p-3", &()).await?;
    env.run_until_idle().await?;
    assert_eq!(env.status(("kid", "kid-1")).await?, Status::Suspended);
    env.keiro().cancel_cascade(("parent", "p-3")).await?;
    assert_eq!(env.status(("parent", "p-3")).await?, Status::Cancelled);
    assert_eq!(env.status(("kid", "kid-1")).await?, Status::Cancelled);
    Ok(())
}

async fn open_ended_park_gets_the_reconcile_deadline(env: TestEnvBuilder) -> TestResult {
    let env = env
        .register("waits", |ctx: Ctx, (): ()| async move {
            let v: u32 = ctx.await_step("x").await?;
            Ok(v)
        })
        .resume_options(|options| options.reconcile = Some(Duration::from_secs(300)))
        .build()?;
    env.start("waits", "w-1", &()).await?;
    let before = OffsetDateTime::now_utc();
    env.worker().resume_once().await?;
    let wake = env
        .instance(("waits", "w-1"))
        .await?
        .wake_after
        .expect("reconcile deadline");
    let ahead = wake - before;
    assert!(
        ahead > time::Duration::seconds(290) && ahead < time::Duration::seconds(310),
        "{ahead}"
    );
    // Due reconcile: a re-drive that finds nothing new costs one pass and parks again.
    let later = OffsetDateTime::now_utc() + time::Duration::seconds(301);
    let store = env.keiro().store();
    assert_eq!(store.instances_runnable(Some(later), None).await?.len(), 1);
    env.move_clock(Duration::from_secs(301)).await?;
    let redrive = env.worker().resume_once().await?;
    assert_eq!(
        (redrive.discovered, redrive.advanced, redrive.sleep_due),
        (1, 0, 0),
        "{redrive:?}"
    );
    assert_eq!(env.status(("waits", "w-1")).await?, Status::Suspended);
    Ok(())
}

async fn push_wakes_a_worker_without_waiting_for_its_poll(h: Harness) -> TestResult {
    // A fallback poll of 30 s: only a push can make this finish within the deadline below.
    let keiro = match h.backend {
        keiro_tests::Backend::Postgres => {
            let db = h.db.as_ref().expect("postgres harness");
            Keiro::builder(db.store()).build()
        }
        keiro_tests::Backend::Sqlite => {
            let dir = h.sqlite_dir.as_ref().expect("sqlite harness");
            Keiro::builder(keiro_sqlite::SqliteStore::open(
                dir.file(),
                keiro_sqlite::Config::default(),
            )?)
            .build()
        }
    };
    let mut registry = Registry::new();
    registry.register("gate", |ctx: Ctx, (): ()| async move {
        let v: u32 = ctx.await_step("open").await?;
        Ok(v)
    })?;
    let worker = keiro
        .worker()
        .registry(registry)
        .fast()
        .poll_interval(Duration::from_secs(30))
        .build()?;
    let running = keiro_tests::spawn_worker(worker);
    keiro.start("gate", "g-1", &()).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while keiro.instance(("gate", "g-1")).await?.expect("row").status != Status::Suspended {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the start notification woke the worker"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    keiro.deliver(("gate", "g-1"), "open", &5).await?;
    while keiro.instance(("gate", "g-1")).await?.expect("row").status != Status::Completed {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the delivery notification woke the worker"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await?;
    Ok(())
}
