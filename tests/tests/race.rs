//! Races between awaits (`Ctx::select`): the journaled winner decides every replay, and a
//! losing signal wait is withdrawn. Both stores.

use std::convert::Infallible;
use std::time::Duration;

use keiro::{Ctx, SignalSendOutcome, Status, WorkflowError};
use keiro_tests::{on_both_stores, Harness, Ledger, TestResult};

on_both_stores!(
    the_recorded_winner_decides_after_the_loser_arrives_too,
    a_losing_signal_wait_leaves_the_next_signal_to_the_next_waiter,
    an_undecided_race_parks_on_every_branch,
);

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Decision {
    Approved(bool),
    TimedOut,
}

fn approval_or_timeout(
    ledger: Ledger,
) -> impl Fn(Ctx, u64) -> keiro::BoxFuture<'static, Result<String, WorkflowError>>
       + Send
       + Sync
       + Clone
       + 'static {
    move |ctx: Ctx, timeout_ms: u64| {
        let ledger = ledger.clone();
        Box::pin(async move {
            let decision = ctx
                .select(
                    "approval-or-timeout",
                    vec![
                        Box::pin(async {
                            ctx.await_step::<bool>("approval")
                                .await
                                .map(Decision::Approved)
                        }),
                        Box::pin(async {
                            ctx.sleep("timeout", Duration::from_millis(timeout_ms))
                                .await?;
                            Ok(Decision::TimedOut)
                        }),
                    ],
                )
                .await?;
            let branch = format!("{decision:?}");
            let taken: String = ctx
                .step("act", || async {
                    ledger.bump(&branch);
                    Ok::<_, Infallible>(branch.clone())
                })
                .await?;
            ctx.await_step::<()>("finish").await?;
            Ok(taken)
        })
    }
}

async fn the_recorded_winner_decides_after_the_loser_arrives_too(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let worker = h
        .keiro
        .worker()
        .register("race", approval_or_timeout(ledger.clone()))
        .options(h.fast_options())
        .build()?;
    h.keiro.start("race", "r-1", &100u64).await?;
    worker.drain().await?;
    assert_eq!(
        h.keiro
            .instance(("race", "r-1"))
            .await?
            .expect("row")
            .status,
        Status::Suspended,
        "parked on both branches"
    );
    // The timeout wins, and the run acts on it.
    tokio::time::sleep(Duration::from_millis(150)).await;
    worker.fire_due_timers().await?;
    worker.drain().await?;
    assert_eq!(ledger.count("TimedOut"), 1);
    // The approval arrives late; the run is re-driven (as after a crash) with both branches
    // journaled: the recorded winner still decides, with no NonDeterminism.
    h.keiro.deliver(("race", "r-1"), "approval", &true).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("race", "r-1")).await?.expect("row");
    assert_eq!(row.status, Status::Suspended, "{:?}", row.last_error);
    h.keiro.deliver(("race", "r-1"), "finish", &()).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("race", "r-1")).await?.expect("row");
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);
    assert_eq!(row.output, Some(serde_json::json!("TimedOut")));
    assert_eq!(
        ledger.all().len(),
        1,
        "one branch ever acted: {:?}",
        ledger.all()
    );
    Ok(())
}

async fn a_losing_signal_wait_leaves_the_next_signal_to_the_next_waiter(h: Harness) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .register("lose", |ctx: Ctx, (): ()| async move {
            let won = ctx
                .select(
                    "signal-or-timeout",
                    vec![
                        Box::pin(async { ctx.wait_signal::<u32>("tok", None).await.map(Some) }),
                        Box::pin(async {
                            ctx.sleep("timeout", Duration::from_millis(50)).await?;
                            Ok(None)
                        }),
                    ],
                )
                .await?;
            ctx.await_step::<()>("finish").await?;
            Ok(won)
        })
        .register("take", |ctx: Ctx, (): ()| async move {
            ctx.wait_signal::<u32>("tok", None).await
        })
        .options(h.fast_options())
        .build()?;
    h.keiro.start("lose", "l-1", &()).await?;
    worker.drain().await?;
    tokio::time::sleep(Duration::from_millis(80)).await;
    worker.fire_due_timers().await?;
    worker.drain().await?;
    // The wait lost the race: a signal sent now must not be swallowed by it.
    let sent = h.keiro.signal("tok", &7u32).await?;
    assert_eq!(sent, SignalSendOutcome::Buffered);
    h.keiro.start("take", "t-1", &()).await?;
    worker.drain().await?;
    let taker = h.keiro.instance(("take", "t-1")).await?.expect("row");
    assert_eq!(
        (taker.status, taker.output),
        (Status::Completed, Some(serde_json::json!(7)))
    );
    h.keiro.deliver(("lose", "l-1"), "finish", &()).await?;
    worker.drain().await?;
    let loser = h.keiro.instance(("lose", "l-1")).await?.expect("row");
    assert_eq!(
        (loser.status, loser.output),
        (Status::Completed, Some(serde_json::Value::Null))
    );
    Ok(())
}

async fn an_undecided_race_parks_on_every_branch(h: Harness) -> TestResult {
    // Either branch wakes the run: here the approval does, and wins.
    let ledger = Ledger::default();
    let worker = h
        .keiro
        .worker()
        .register("race", approval_or_timeout(ledger.clone()))
        .options(h.fast_options())
        .build()?;
    h.keiro.start("race", "r-2", &3_600_000u64).await?;
    worker.drain().await?;
    h.keiro.deliver(("race", "r-2"), "approval", &false).await?;
    worker.drain().await?;
    assert_eq!(ledger.count("Approved(false)"), 1);
    let journal = h.keiro.journal(("race", "r-2")).await?;
    assert!(
        journal.iter().any(|e| matches!(&e.event,
            keiro::Event::StepRecorded { step, result, .. }
                if step == "race:approval-or-timeout" && result["winner"] == 0)),
        "{journal:?}"
    );
    Ok(())
}
