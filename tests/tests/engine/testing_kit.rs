//! The test kit (issue 14 item 3): `TestEnv` on both stores drives workflows inline, skips time,
//! injects crashes after a step, and verifies recorded histories against changed code.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use keiro::testing::{verify_replay, ReplayMismatch, TestEnv, TestEnvBuilder};
use keiro::{workflow::workflow_fn, Ctx, InstanceKey, Status, WorkflowError};
use keiro_tests::{on_both_envs, Ledger, TestResult};

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

on_both_envs!(
    a_seven_day_trial_runs_in_milliseconds,
    a_crash_after_a_step_replays_it_and_runs_the_tail,
    deliveries_and_signals_reach_the_workflow,
    a_signal_timeout_fires_when_time_is_advanced,
    a_parked_wait_stays_parked_when_time_passes_its_reconcile_window,
    the_worker_reads_deadlines_on_the_moved_clock,
    a_history_verifies_against_the_code_that_made_it,
);

async fn trial(ctx: Ctx, user: String) -> Result<String, WorkflowError> {
    ctx.sleep("trial-period", WEEK).await?;
    ctx.step("remind", || async move {
        Ok::<_, Infallible>(format!("reminded {user}"))
    })
    .await
}

async fn a_seven_day_trial_runs_in_milliseconds(env: TestEnvBuilder) -> TestResult {
    let env = env.register("trial", trial).build()?;
    let began = Instant::now();
    env.start("trial", "ada", &"ada").await?;
    env.run_until_idle().await?;
    assert_eq!(env.status(("trial", "ada")).await?, Status::Suspended);
    // Six days are not enough.
    env.advance(WEEK - Duration::from_secs(24 * 3600)).await?;
    assert_eq!(env.status(("trial", "ada")).await?, Status::Suspended);
    env.advance(Duration::from_secs(24 * 3600)).await?;
    assert_eq!(
        env.output::<String>(("trial", "ada")).await?,
        "reminded ada"
    );
    assert_eq!(
        env.steps(("trial", "ada")).await?,
        ["sleep:trial-period", "remind"]
    );
    assert!(
        began.elapsed() < Duration::from_secs(60),
        "no week was waited"
    );
    Ok(())
}

async fn a_crash_after_a_step_replays_it_and_runs_the_tail(env: TestEnvBuilder) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let env = env
        .register("order", move |ctx: Ctx, (): ()| {
            let l = l.clone();
            async move {
                for step in ["charge", "ship"] {
                    let l = l.clone();
                    ctx.step(step, || async move {
                        l.bump(step);
                        Ok::<_, Infallible>(())
                    })
                    .await?;
                }
                Ok::<_, WorkflowError>(())
            }
        })
        .build()?;
    env.crash_after("charge");
    env.start("order", "o-1", &()).await?;
    env.run_until_idle().await?;
    assert_eq!(env.crashes_pending(), 0, "the crash happened");
    let row = env.instance(("order", "o-1")).await?;
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);
    assert_eq!(row.attempts, 0, "completion resets the attempts");
    assert_eq!(
        ledger.count("charge"),
        1,
        "the journaled step is not run again"
    );
    assert_eq!(ledger.count("ship"), 1);
    let crashed = env.journal(("order", "o-1")).await?.len();
    assert!(
        crashed >= 3,
        "charge, ship and the completion are journaled"
    );
    Ok(())
}

async fn deliveries_and_signals_reach_the_workflow(env: TestEnvBuilder) -> TestResult {
    let env = env
        .register("approval", |ctx: Ctx, (): ()| async move {
            let approved: bool = ctx.await_step("approved").await?;
            let note: String = ctx.wait_signal("note-1", None).await?;
            Ok::<_, WorkflowError>(format!("{approved} {note}"))
        })
        .build()?;
    env.start("approval", "a-1", &()).await?;
    env.run_until_idle().await?;
    env.deliver(("approval", "a-1"), "approved", &true).await?;
    env.run_until_idle().await?;
    assert_eq!(env.status(("approval", "a-1")).await?, Status::Suspended);
    env.signal("note-1", &"ok").await?;
    env.run_until_idle().await?;
    assert_eq!(env.output::<String>(("approval", "a-1")).await?, "true ok");
    Ok(())
}

async fn a_signal_timeout_fires_when_time_is_advanced(env: TestEnvBuilder) -> TestResult {
    let env = env
        .register("reminder", |ctx: Ctx, (): ()| async move {
            match ctx
                .wait_signal::<String>("answer-1", Some(Duration::from_secs(3600)))
                .await
            {
                Ok(answer) => Ok(answer),
                Err(WorkflowError::SignalTimeout { .. }) => Ok("timed out".to_owned()),
                Err(other) => Err(other),
            }
        })
        .build()?;
    env.start("reminder", "r-1", &()).await?;
    env.run_until_idle().await?;
    assert_eq!(env.status(("reminder", "r-1")).await?, Status::Suspended);
    env.advance(Duration::from_secs(3601)).await?;
    assert_eq!(
        env.output::<String>(("reminder", "r-1")).await?,
        "timed out"
    );
    Ok(())
}

/// An open-ended wait's reconcile deadline is on the store's clock, which `advance` moves: a
/// day later the run is due once (the reconcile re-drive), then parked again for five
/// minutes of the moved clock, not due on every pass.
async fn a_parked_wait_stays_parked_when_time_passes_its_reconcile_window(
    env: TestEnvBuilder,
) -> TestResult {
    let env = env
        .register("gate", |ctx: Ctx, (): ()| async move {
            ctx.await_step::<bool>("open").await
        })
        .build()?;
    env.start("gate", "g-1", &()).await?;
    env.run_until_idle().await?;
    env.advance(Duration::from_secs(24 * 3600)).await?;
    assert_eq!(env.status(("gate", "g-1")).await?, Status::Suspended);
    let pass = env.worker().resume_once().await?;
    assert_eq!(pass.discovered, 0, "a parked run costs nothing: {pass:?}");
    let wake_after = env.instance(("gate", "g-1")).await?.wake_after;
    env.move_clock(Duration::from_secs(4 * 60)).await?;
    assert_eq!(env.worker().resume_once().await?.discovered, 0);
    env.move_clock(Duration::from_secs(2 * 60)).await?;
    let pass = env.worker().resume_once().await?;
    assert_eq!(pass.discovered, 1, "the reconcile re-drive: {pass:?}");
    assert_ne!(env.instance(("gate", "g-1")).await?.wake_after, wake_after);
    env.deliver(("gate", "g-1"), "open", &true).await?;
    env.run_until_idle().await?;
    assert!(env.output::<bool>(("gate", "g-1")).await?);
    Ok(())
}

/// A sleep due on the moved clock but not yet fired is what a pass reports as `sleep_due`.
async fn the_worker_reads_deadlines_on_the_moved_clock(env: TestEnvBuilder) -> TestResult {
    let env = env
        .register("nap", |ctx: Ctx, (): ()| async move {
            ctx.sleep("nap", Duration::from_secs(3600)).await
        })
        .build()?;
    env.start("nap", "n-1", &()).await?;
    env.worker().resume_once().await?;
    env.move_clock(Duration::from_secs(3601)).await?;
    let pass = env.worker().resume_once().await?;
    assert_eq!((pass.discovered, pass.sleep_due), (1, 1), "{pass:?}");
    assert_eq!(env.worker().fire_due_timers().await?.fired.len(), 1);
    env.run_until_idle().await?;
    assert_eq!(env.status(("nap", "n-1")).await?, Status::Completed);
    Ok(())
}

async fn a_history_verifies_against_the_code_that_made_it(env: TestEnvBuilder) -> TestResult {
    let env = env
        .register("order", |ctx: Ctx, n: u32| async move {
            let a: u32 = ctx
                .step("a", || async move { Ok::<_, Infallible>(n + 1) })
                .await?;
            let b: u32 = ctx
                .step("b", || async move { Ok::<_, Infallible>(a * 2) })
                .await?;
            Ok::<_, WorkflowError>(b)
        })
        .build()?;
    env.start("order", "o-1", &3u32).await?;
    env.run_until_idle().await?;
    assert_eq!(env.output::<u32>(("order", "o-1")).await?, 8);
    assert_eq!(env.verify_replay(("order", "o-1")).await?, Ok(()));
    Ok(())
}

/// Histories recorded by one version, checked against others, without running any action.
#[tokio::test]
async fn changed_code_is_caught_by_replay_verification() -> TestResult {
    let env = TestEnv::sqlite()?
        .register("order", |ctx: Ctx, n: u32| async move {
            let a: u32 = ctx
                .step("a", || async move { Ok::<_, Infallible>(n + 1) })
                .await?;
            let b: u32 = ctx
                .step("b", || async move { Ok::<_, Infallible>(a * 2) })
                .await?;
            Ok::<_, WorkflowError>(b)
        })
        .build()?;
    env.start("order", "o-1", &3u32).await?;
    env.run_until_idle().await?;
    let history = env.journal(("order", "o-1")).await?;
    let key = InstanceKey::parse("order", "o-1")?;
    let input = serde_json::json!(3);
    let ledger = Ledger::default();

    // Step "b" renamed: the recorded "b" is never reached.
    let l = ledger.clone();
    let renamed = workflow_fn(move |ctx: Ctx, n: u32| {
        let l = l.clone();
        async move {
            let a: u32 = ctx
                .step("a", || async move { Ok::<_, Infallible>(n + 1) })
                .await?;
            let b: u32 = ctx
                .step("double", || async move {
                    l.bump("double ran");
                    Ok::<_, Infallible>(a * 2)
                })
                .await?;
            Ok::<_, WorkflowError>(b)
        }
    });
    let found = verify_replay(renamed.as_ref(), &key, &input, &history).await;
    assert!(
        matches!(&found, Err(ReplayMismatch::NonDeterminism { step, .. }) if step == "double"),
        "{found:?}"
    );
    // A step added at the end is fresh work the history does not hold.
    let l = ledger.clone();
    let grown = workflow_fn(move |ctx: Ctx, n: u32| {
        let l = l.clone();
        async move {
            let a: u32 = ctx
                .step("a", || async move { Ok::<_, Infallible>(n + 1) })
                .await?;
            let b: u32 = ctx
                .step("b", || async move { Ok::<_, Infallible>(a * 2) })
                .await?;
            ctx.step("audit", || async move {
                l.bump("audit ran");
                Ok::<_, Infallible>(())
            })
            .await?;
            Ok::<_, WorkflowError>(b)
        }
    });
    let found = verify_replay(grown.as_ref(), &key, &input, &history).await;
    assert!(
        matches!(&found, Err(ReplayMismatch::NonDeterminism { step, .. }) if step == "audit"),
        "{found:?}"
    );
    // Same steps, another output.
    let other_output = workflow_fn(|ctx: Ctx, n: u32| async move {
        let a: u32 = ctx
            .step("a", || async move { Ok::<_, Infallible>(n + 1) })
            .await?;
        let b: u32 = ctx
            .step("b", || async move { Ok::<_, Infallible>(a * 2) })
            .await?;
        Ok::<_, WorkflowError>(b + 1)
    });
    let found = verify_replay(other_output.as_ref(), &key, &input, &history).await;
    assert!(
        matches!(&found, Err(ReplayMismatch::Ending { .. })),
        "{found:?}"
    );
    assert!(ledger.all().is_empty(), "no action ran: {:?}", ledger.all());
    Ok(())
}
