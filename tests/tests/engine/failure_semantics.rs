//! Failure semantics (DESIGN §10): a long step keeps its lease, a queued claim confirms its
//! lease before acting, values a store refuses fail a run once, business failures are final,
//! and steps can retry in place under their own policy. Each scenario runs on both stores.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::{worker::Registry, workflow::RunOutcome, Ctx, Status, StepOptions, WorkflowError};
use keiro_tests::{key, on_both_stores, run_inline, Harness, Ledger, TestResult};

on_both_stores!(
    a_step_longer_than_its_lease_runs_once,
    a_run_queued_behind_a_long_one_confirms_its_lease_before_acting,
    a_step_result_the_store_refuses_fails_the_run_once,
    an_output_the_store_refuses_fails_the_run_once,
    a_failure_reason_with_a_nul_is_kept_storable,
    a_crash_message_with_a_nul_still_counts_an_attempt,
    an_oversized_step_result_fails_the_run_without_running_the_action_again,
    the_facades_payload_limit_reaches_its_workers,
    an_application_error_fails_the_run_at_once,
    a_step_with_a_policy_retries_in_place,
    a_step_with_spent_attempts_gives_the_body_step_failed,
    a_replay_past_a_journaled_final_failure_does_not_run_the_step_again,
    a_step_whose_error_is_not_retryable_fails_after_one_attempt,
    a_crash_during_step_retries_keeps_the_attempt_count,
    refused_inputs_and_deliveries_are_typed_errors,
);

/// Starts each worker after its delay and runs them all until every instance `name`/`ids` is
/// terminal (or `within` passes); returns the rows.
async fn run_until_terminal(
    h: &Harness,
    workers: Vec<(Duration, keiro::Worker)>,
    name: &str,
    ids: &[&str],
    within: Duration,
) -> Result<Vec<keiro::store::Instance>, Box<dyn std::error::Error + Send + Sync>> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut handles = Vec::new();
    for (delay, worker) in workers {
        let mut rx = stop_rx.clone();
        handles.push(tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            worker
                .run_until(async move {
                    let _ = rx.wait_for(|s| *s).await;
                })
                .await
        }));
    }
    let deadline = tokio::time::Instant::now() + within;
    let rows = loop {
        let mut rows = Vec::new();
        for id in ids {
            rows.push(h.keiro.instance((name, id)).await?.expect("started"));
        }
        if rows.iter().all(|r| r.status.is_terminal()) || tokio::time::Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = stop_tx.send(true);
    for handle in handles {
        handle.await?;
    }
    Ok(rows)
}

/// A workflow whose single step sleeps for its input (milliseconds), counted per instance id.
fn sleeper(
    ledger: &Ledger,
) -> impl Fn(Ctx, u64) -> keiro::workflow::BoxFuture<'static, Result<u64, WorkflowError>>
       + Send
       + Sync
       + Clone
       + 'static {
    let ledger = ledger.clone();
    move |ctx: Ctx, millis: u64| {
        let ledger = ledger.clone();
        Box::pin(async move {
            let id = ctx.key().id.to_string();
            ctx.step("work", || async {
                ledger.bump(&id);
                tokio::time::sleep(Duration::from_millis(millis)).await;
                Ok::<_, Infallible>(millis)
            })
            .await
        })
    }
}

async fn a_step_longer_than_its_lease_runs_once(h: Harness) -> TestResult {
    // A 2.5 s action under a 1 s lease, and a second worker polling every 50 ms: without a
    // heartbeat the second worker takes the run over mid-action and runs the action again.
    let ledger = Ledger::default();
    h.keiro.start("long", "l-1", &2500u64).await?;
    let worker = || {
        h.keiro
            .worker()
            .register("long", sleeper(&ledger))
            .lease_ttl(Duration::from_secs(1))
            .poll_interval(Duration::from_millis(50))
            .build()
    };
    // The first worker has the run; the second starts while the action runs.
    let workers = vec![
        (Duration::ZERO, worker()?),
        (Duration::from_millis(200), worker()?),
    ];
    let rows = run_until_terminal(&h, workers, "long", &["l-1"], Duration::from_secs(15)).await?;
    assert_eq!(rows[0].status, Status::Completed);
    assert_eq!(ledger.count("l-1"), 1, "the action ran exactly once");
    Ok(())
}

async fn a_run_queued_behind_a_long_one_confirms_its_lease_before_acting(h: Harness) -> TestResult {
    // Concurrency 1 and a 1 s lease: one batch claim takes A (1.5 s) and B (1 s); B waits in
    // the queue past its lease, a second worker takes B over at 1.15 s, and when the first
    // worker finally starts B it must find its lease lost instead of running B's action too.
    let ledger = Ledger::default();
    h.keiro.start("queued", "a", &1500u64).await?;
    h.keiro.start("queued", "b", &1000u64).await?;
    let worker = || {
        h.keiro
            .worker()
            .register("queued", sleeper(&ledger))
            .lease_ttl(Duration::from_secs(1))
            .poll_interval(Duration::from_millis(50))
            .concurrency(1)
            .build()
    };
    let workers = vec![
        (Duration::ZERO, worker()?),
        (Duration::from_millis(1150), worker()?),
    ];
    let rows =
        run_until_terminal(&h, workers, "queued", &["a", "b"], Duration::from_secs(15)).await?;
    assert!(
        rows.iter().all(|r| r.status == Status::Completed),
        "{rows:?}"
    );
    assert_eq!(ledger.count("b"), 1, "B's action ran exactly once");
    assert_eq!(ledger.count("a"), 1, "A's action ran exactly once");
    Ok(())
}

/// Drives passes until the instance is terminal (or `passes` run), returning its row.
async fn drive_passes(
    h: &Harness,
    registry: &Registry,
    options: &keiro::worker::ResumeOptions,
    name: &str,
    id: &str,
    passes: usize,
) -> Result<keiro::store::Instance, Box<dyn std::error::Error + Send + Sync>> {
    for _ in 0..passes {
        keiro::worker::resume_once(&h.store, registry, options).await?;
        let row = h.keiro.instance((name, id)).await?.expect("started");
        if row.status.is_terminal() {
            return Ok(row);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(h.keiro.instance((name, id)).await?.expect("started"))
}

/// The reason of the failed marker of the instance's journal.
async fn failure_reason(h: &Harness, name: &str, id: &str) -> Result<String, keiro::Error> {
    Ok(h.keiro
        .journal((name, id))
        .await?
        .into_iter()
        .find_map(|e| match e.event {
            keiro::store::Event::WorkflowFailed { reason } => Some(reason),
            _ => None,
        })
        .unwrap_or_default())
}

async fn a_step_result_the_store_refuses_fails_the_run_once(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let mut registry = Registry::new();
    registry.register("nul", move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            let value: String = ctx
                .step("poison", || async {
                    l.bump("poison");
                    Ok::<_, Infallible>("a\u{0}b".to_owned())
                })
                .await?;
            Ok(value)
        }
    })?;
    h.keiro.start("nul", "n-1", &()).await?;
    let row = drive_passes(&h, &registry, &h.fast_options(), "nul", "n-1", 5).await?;
    assert_eq!(row.status, Status::Failed);
    assert_eq!(ledger.count("poison"), 1, "the action ran once");
    let reason = failure_reason(&h, "nul", "n-1").await?;
    assert!(
        reason.contains("\"poison\"") && reason.contains("NUL"),
        "{reason}"
    );
    Ok(())
}

async fn an_output_the_store_refuses_fails_the_run_once(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let mut registry = Registry::new();
    registry.register("out", move |_ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            l.bump("body");
            Ok("x\u{0}".to_owned())
        }
    })?;
    h.keiro.start("out", "o-1", &()).await?;
    let row = drive_passes(&h, &registry, &h.fast_options(), "out", "o-1", 5).await?;
    assert_eq!(row.status, Status::Failed);
    assert_eq!(ledger.count("body"), 1);
    let reason = failure_reason(&h, "out", "o-1").await?;
    assert!(
        reason.contains("<output>") && reason.contains("NUL"),
        "{reason}"
    );
    Ok(())
}

async fn a_failure_reason_with_a_nul_is_kept_storable(h: Harness) -> TestResult {
    let mut registry = Registry::new();
    registry.register("why", |_ctx: Ctx, (): ()| async move {
        Err::<(), _>(WorkflowError::app("card\u{0}declined"))
    })?;
    h.keiro.start("why", "w-1", &()).await?;
    let row = drive_passes(&h, &registry, &h.fast_options(), "why", "w-1", 5).await?;
    assert_eq!(row.status, Status::Failed);
    assert_eq!(
        failure_reason(&h, "why", "w-1").await?,
        "card\u{FFFD}declined"
    );
    Ok(())
}

async fn a_crash_message_with_a_nul_still_counts_an_attempt(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let mut registry = Registry::new();
    registry.register("crashy", move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            ctx.step("flaky", || async {
                l.bump("flaky");
                Err::<(), _>("bad\u{0}byte")
            })
            .await?;
            Ok(())
        }
    })?;
    let mut options = h.fast_options();
    options.max_attempts = 2;
    h.keiro.start("crashy", "c-1", &()).await?;
    let row = drive_passes(&h, &registry, &options, "crashy", "c-1", 10).await?;
    assert_eq!(
        row.status,
        Status::Failed,
        "the attempt ceiling was reached"
    );
    assert_eq!(ledger.count("flaky"), 2);
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("bad\u{FFFD}byte"), "{error}");
    Ok(())
}

async fn an_oversized_step_result_fails_the_run_without_running_the_action_again(
    h: Harness,
) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let mut registry = Registry::new();
    registry.register("big", move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            let big: String = ctx
                .step("big", || async {
                    l.bump("big");
                    Ok::<_, Infallible>("x".repeat(2048))
                })
                .await?;
            Ok(big.len())
        }
    })?;
    let mut options = h.fast_options();
    options.payload_len_max = 1024;
    h.keiro.start("big", "b-1", &()).await?;
    let row = drive_passes(&h, &registry, &options, "big", "b-1", 5).await?;
    assert_eq!(row.status, Status::Failed);
    assert_eq!(row.attempts, 0, "no crash was counted");
    assert_eq!(ledger.count("big"), 1, "the action ran once");
    let reason = failure_reason(&h, "big", "b-1").await?;
    assert!(
        reason.contains("\"big\"") && reason.contains("1024"),
        "{reason}"
    );
    Ok(())
}

async fn the_facades_payload_limit_reaches_its_workers(h: Harness) -> TestResult {
    let keiro = h.keiro.clone().with_payload_len_max(1024);
    keiro.start("wide", "w-1", &()).await?;
    let worker = keiro
        .worker()
        .register("wide", |_ctx: Ctx, (): ()| async move {
            Ok::<_, WorkflowError>("y".repeat(2048))
        })
        .build()?;
    worker.drain().await?;
    let row = keiro.instance(("wide", "w-1")).await?.expect("started");
    assert_eq!(
        row.status,
        Status::Failed,
        "the output was over the facade's limit"
    );
    // The limit can still be raised for one worker.
    keiro.start("wide", "w-2", &()).await?;
    let roomy = keiro
        .worker()
        .payload_len_max(4096)
        .register("wide", |_ctx: Ctx, (): ()| async move {
            Ok::<_, WorkflowError>("y".repeat(2048))
        })
        .build()?;
    roomy.drain().await?;
    let row = keiro.instance(("wide", "w-2")).await?.expect("started");
    assert_eq!(row.status, Status::Completed);
    Ok(())
}

async fn an_application_error_fails_the_run_at_once(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let mut registry = Registry::new();
    registry.register("reject", move |_ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            l.bump("body");
            Err::<(), _>(WorkflowError::app("rejected"))
        }
    })?;
    h.keiro.start("reject", "r-1", &()).await?;
    let row = drive_passes(&h, &registry, &h.fast_options(), "reject", "r-1", 5).await?;
    assert_eq!((row.status, row.attempts), (Status::Failed, 0));
    assert_eq!(ledger.count("body"), 1, "a business failure is not retried");
    assert_eq!(failure_reason(&h, "reject", "r-1").await?, "rejected");
    Ok(())
}

fn quick_policy(attempts: u32) -> StepOptions {
    StepOptions::new(attempts)
        .initial_interval(Duration::from_millis(10))
        .jitter(0.0)
}

async fn a_step_with_a_policy_retries_in_place(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let mut registry = Registry::new();
    registry.register("retry", move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            l.bump("body");
            let tries = Arc::new(AtomicU32::new(0));
            let value: u32 = ctx
                .step_with("charge", &quick_policy(3), || {
                    let (l, tries) = (l.clone(), tries.clone());
                    async move {
                        l.bump("charge");
                        match tries.fetch_add(1, Ordering::SeqCst) {
                            0 | 1 => Err("gateway timeout"),
                            n => Ok(n + 1),
                        }
                    }
                })
                .await?;
            Ok(value)
        }
    })?;
    h.keiro.start("retry", "r-1", &()).await?;
    let summary = keiro::worker::resume_once(&h.store, &registry, &h.fast_options()).await?;
    assert_eq!(summary.completed, 1, "{summary:?}");
    assert_eq!(ledger.count("charge"), 3);
    assert_eq!(
        ledger.count("body"),
        1,
        "retries ran in place, not by re-driving"
    );
    let row = h.keiro.instance(("retry", "r-1")).await?.expect("started");
    assert_eq!(row.output, Some(serde_json::json!(3)));
    Ok(())
}

async fn a_step_with_spent_attempts_gives_the_body_step_failed(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let mut registry = Registry::new();
    registry.register("spent", move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            let charged = ctx
                .step_with("charge", &quick_policy(3), || {
                    let l = l.clone();
                    async move {
                        l.bump("charge");
                        Err::<u32, _>("declined")
                    }
                })
                .await;
            match charged {
                Err(WorkflowError::StepFailed {
                    attempts, message, ..
                }) => {
                    ctx.step("fallback", || async {
                        Ok::<_, Infallible>(format!("{attempts}: {message}"))
                    })
                    .await
                }
                other => Ok(format!("unexpected: {other:?}")),
            }
        }
    })?;
    h.keiro.start("spent", "s-1", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &h.fast_options()).await?;
    let row = h.keiro.instance(("spent", "s-1")).await?.expect("started");
    assert_eq!(row.status, Status::Completed);
    assert_eq!(row.output, Some(serde_json::json!("3: declined")));
    assert_eq!(ledger.count("charge"), 3);
    Ok(())
}

async fn a_replay_past_a_journaled_final_failure_does_not_run_the_step_again(
    h: Harness,
) -> TestResult {
    // `charge` spends its attempts and its final failure is journaled; the step after it
    // crashes the run on its first try (a plain step's error). The next drive replays the
    // body from the start: it must get the journaled failure back, not run `charge` again.
    let ledger = Ledger::default();
    let l = ledger.clone();
    let workflow = keiro::workflow::workflow_fn(move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            l.bump("body");
            let charged = ctx
                .step_with("charge", &quick_policy(3), || {
                    let l = l.clone();
                    async move {
                        l.bump("charge");
                        Err::<u32, _>("declined")
                    }
                })
                .await;
            let Err(WorkflowError::StepFailed {
                attempts, message, ..
            }) = charged
            else {
                return Ok(format!("unexpected: {charged:?}"));
            };
            ctx.step("fallback", || {
                let l = l.clone();
                async move {
                    l.bump("fallback");
                    if l.count("fallback") == 1 {
                        return Err("the fallback is down".to_owned());
                    }
                    Ok(format!("{attempts}: {message}"))
                }
            })
            .await
        }
    });
    h.keiro.start("spent", "s-2", &()).await?;
    let k = key("spent", "s-2");
    let crashed = run_inline(&h, &k, workflow.as_ref()).await;
    assert!(
        matches!(crashed, Err(keiro::workflow::RunError::Crashed { .. })),
        "{crashed:?}"
    );
    assert_eq!(
        (ledger.count("charge"), ledger.count("fallback")),
        (3, 1),
        "the attempts were spent, then the fallback crashed the run"
    );
    let row = h.keiro.instance(("spent", "s-2")).await?.expect("started");
    assert_eq!(row.status, Status::Running, "live, to be driven again");

    let outcome = run_inline(&h, &k, workflow.as_ref()).await?;
    assert_eq!(
        outcome,
        RunOutcome::Completed(serde_json::json!("3: declined")),
        "the body got the journaled failure back"
    );
    assert_eq!(ledger.count("body"), 2, "the body was replayed");
    assert_eq!(ledger.count("fallback"), 2);
    assert_eq!(
        ledger.count("charge"),
        3,
        "the journaled final failure was replayed, not run again"
    );
    Ok(())
}

async fn a_step_whose_error_is_not_retryable_fails_after_one_attempt(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let mut registry = Registry::new();
    registry.register("fatal", move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            let policy = quick_policy(5)
                .retry_if(|e: &std::io::Error| e.kind() != std::io::ErrorKind::PermissionDenied);
            ctx.step_with("charge", &policy, || {
                let l = l.clone();
                async move {
                    l.bump("charge");
                    Err::<u32, _>(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        "card blocked",
                    ))
                }
            })
            .await?;
            Ok(())
        }
    })?;
    h.keiro.start("fatal", "f-1", &()).await?;
    let row = drive_passes(&h, &registry, &h.fast_options(), "fatal", "f-1", 5).await?;
    assert_eq!(
        (row.status, row.attempts),
        (Status::Failed, 0),
        "final, not a crash"
    );
    assert_eq!(ledger.count("charge"), 1);
    let reason = failure_reason(&h, "fatal", "f-1").await?;
    assert!(
        reason.contains("1 attempt") && reason.contains("card blocked"),
        "{reason}"
    );
    Ok(())
}

async fn a_crash_during_step_retries_keeps_the_attempt_count(h: Harness) -> TestResult {
    // Attempt 1 fails and is journaled; the run dies during the wait that follows. The next
    // drive makes attempts 2 and 3 only: the budget of 3 is not reset by the crash.
    let ledger = Ledger::default();
    let l = ledger.clone();
    let workflow = keiro::workflow::workflow_fn(move |ctx: Ctx, (): ()| {
        let l = l.clone();
        async move {
            let policy = StepOptions::new(3)
                .initial_interval(Duration::from_millis(400))
                .jitter(0.0);
            ctx.step_with("charge", &policy, || {
                let l = l.clone();
                async move {
                    l.bump("charge");
                    Err::<u32, _>("declined")
                }
            })
            .await?;
            Ok(())
        }
    });
    h.keiro.start("budget", "b-1", &()).await?;
    let k = key("budget", "b-1");
    let crashed = tokio::time::timeout(
        Duration::from_millis(200),
        run_inline(&h, &k, workflow.as_ref()),
    )
    .await;
    assert!(crashed.is_err(), "the first drive died mid-wait");
    assert_eq!(ledger.count("charge"), 1);
    let outcome = run_inline(&h, &k, workflow.as_ref()).await?;
    assert_eq!(outcome, RunOutcome::Failed);
    assert_eq!(ledger.count("charge"), 3, "three attempts in all");
    Ok(())
}

async fn refused_inputs_and_deliveries_are_typed_errors(h: Harness) -> TestResult {
    fn refused<T>(r: &Result<T, keiro::Error>) -> bool {
        matches!(
            r,
            Err(keiro::Error::Payload(WorkflowError::PayloadRefused { .. }))
        )
    }
    let start = h.keiro.start("typed", "t-1", &"a\u{0}").await;
    assert!(refused(&start), "{start:?}");
    assert!(
        h.keiro.instance(("typed", "t-1")).await?.is_none(),
        "nothing was written"
    );
    h.keiro.start("typed", "t-2", &()).await?;
    let delivered = h
        .keiro
        .deliver(("typed", "t-2"), "approval", &"no\u{0}")
        .await;
    assert!(refused(&delivered), "{delivered:?}");
    let signalled = h.keiro.signal("tok", &"no\u{0}").await;
    assert!(refused(&signalled), "{signalled:?}");
    assert!(
        h.keiro.journal(("typed", "t-2")).await?.is_empty(),
        "nothing was journaled"
    );
    Ok(())
}
