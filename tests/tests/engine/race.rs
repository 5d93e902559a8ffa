//! Races between awaits (`Ctx::select`): the journaled winner decides every replay, and a
//! losing signal wait is withdrawn. Both stores.

use std::convert::Infallible;
use std::time::Duration;

use keiro::{workflow::SignalSendOutcome, Ctx, Status, WorkflowError};
use keiro_tests::{key, on_both_stores, FastWorker, Harness, Ledger, TestResult};

on_both_stores!(
    the_recorded_winner_decides_after_the_loser_arrives_too,
    a_losing_signal_wait_leaves_the_next_signal_to_the_next_waiter,
    an_undecided_race_parks_on_every_branch,
    a_signal_journaled_before_the_timeout_wins_and_the_next_signal_reaches_the_next_wait,
    a_signal_a_losing_wait_took_goes_back_to_its_token,
    a_signal_a_losing_wait_takes_in_the_deciding_drive_goes_back_too,
    signal_return_gives_signals_back_only_with_the_decision,
);

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Decision {
    Approved(bool),
    TimedOut,
}

fn approval_or_timeout(
    ledger: Ledger,
) -> impl Fn(Ctx, u64) -> keiro::workflow::BoxFuture<'static, Result<String, WorkflowError>>
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
        .fast()
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
        .fast()
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
        .fast()
        .build()?;
    h.keiro.start("race", "r-2", &3_600_000u64).await?;
    worker.drain().await?;
    h.keiro.deliver(("race", "r-2"), "approval", &false).await?;
    worker.drain().await?;
    assert_eq!(ledger.count("Approved(false)"), 1);
    let journal = h.keiro.journal(("race", "r-2")).await?;
    assert!(
        journal.iter().any(|e| matches!(&e.event,
            keiro::store::Event::StepRecorded { step, result, .. }
                if step == "race:approval-or-timeout" && result["winner"] == 0)),
        "{journal:?}"
    );
    Ok(())
}

/// What `timeout_or_signal` ends with: the race's signal (`None` for the timeout) and the
/// later waits' signals.
type Signals = (Option<u32>, Vec<u32>);

/// `select([sleep("timeout"), wait_signal("tok")])`, then `waits` more waits on `tok`.
fn timeout_or_signal(
    waits: usize,
) -> impl Fn(Ctx, ()) -> keiro::workflow::BoxFuture<'static, Result<Signals, WorkflowError>>
       + Send
       + Sync
       + Clone
       + 'static {
    move |ctx: Ctx, (): ()| {
        Box::pin(async move {
            let first = ctx
                .select(
                    "timeout-or-signal",
                    vec![
                        Box::pin(async {
                            ctx.sleep("timeout", Duration::from_millis(50)).await?;
                            Ok(None)
                        }),
                        Box::pin(async { ctx.wait_signal::<u32>("tok", None).await.map(Some) }),
                    ],
                )
                .await?;
            let mut later = Vec::new();
            for _ in 0..waits {
                later.push(ctx.wait_signal::<u32>("tok", None).await?);
            }
            Ok((first, later))
        })
    }
}

/// The run's status and output.
async fn outcome(
    h: &Harness,
    id: &str,
) -> Result<(Status, Option<serde_json::Value>), keiro::Error> {
    let row = h.keiro.instance(("race", id)).await?.expect("row");
    Ok((row.status, row.output))
}

/// The interleaving of issue 33: the signal lands, then the timer fires, before the next drive.
/// Both branches are resolved when the drive sees them, and the one journaled first wins: the
/// signal, though the timeout comes first in the race. The next signal reaches the next wait.
async fn a_signal_journaled_before_the_timeout_wins_and_the_next_signal_reaches_the_next_wait(
    h: Harness,
) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .register("race", timeout_or_signal(1))
        .fast()
        .build()?;
    h.keiro.start("race", "r-1", &()).await?;
    worker.drain().await?;
    assert_eq!(outcome(&h, "r-1").await?.0, Status::Suspended);
    assert!(matches!(
        h.keiro.signal("tok", &1u32).await?,
        SignalSendOutcome::Delivered { .. }
    ));
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(worker.fire_due_timers().await?.fired.len(), 1);
    worker.drain().await?;
    assert_eq!(
        outcome(&h, "r-1").await?.0,
        Status::Suspended,
        "on the next wait"
    );
    assert!(matches!(
        h.keiro.signal("tok", &2u32).await?,
        SignalSendOutcome::Delivered { .. }
    ));
    worker.drain().await?;
    assert_eq!(
        outcome(&h, "r-1").await?,
        (Status::Completed, Some(serde_json::json!([1, [2]])))
    );
    Ok(())
}

/// The other order: the timer fires, then the signal lands in the wait still registered, before
/// the next drive. The timeout was journaled first and wins; the signal the losing wait took
/// goes back to its token, ahead of any signal sent since, so no signal is lost: the next wait
/// takes it, and the one after the next signal. A replay of the decided race returns nothing
/// more.
async fn a_signal_a_losing_wait_took_goes_back_to_its_token(h: Harness) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .register("race", timeout_or_signal(2))
        .register("take", |ctx: Ctx, (): ()| async move {
            ctx.wait_signal::<u32>("tok", None).await
        })
        .fast()
        .build()?;
    h.keiro.start("race", "r-1", &()).await?;
    worker.drain().await?;
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert_eq!(worker.fire_due_timers().await?.fired.len(), 1);
    assert!(matches!(
        h.keiro.signal("tok", &1u32).await?,
        SignalSendOutcome::Delivered { .. }
    ));
    worker.drain().await?;
    assert_eq!(
        outcome(&h, "r-1").await?.0,
        Status::Suspended,
        "on the third wait"
    );
    assert!(matches!(
        h.keiro.signal("tok", &2u32).await?,
        SignalSendOutcome::Delivered { .. }
    ));
    worker.drain().await?;
    assert_eq!(
        outcome(&h, "r-1").await?,
        (Status::Completed, Some(serde_json::json!([null, [1, 2]])))
    );
    // Nothing is left on the token: the next signal is the next wait's.
    assert_eq!(
        h.keiro.signal("tok", &3u32).await?,
        SignalSendOutcome::Buffered
    );
    h.keiro.start("take", "t-1", &()).await?;
    worker.drain().await?;
    let taker = h.keiro.instance(("take", "t-1")).await?.expect("row");
    assert_eq!(
        (taker.status, taker.output),
        (Status::Completed, Some(serde_json::json!(3)))
    );
    Ok(())
}

/// A losing wait that takes a buffered signal in the very drive that decides the race (the
/// winner was journaled before the drive, the signal was sent while nobody waited) gives it
/// back as well: the next wait on the token takes it.
async fn a_signal_a_losing_wait_takes_in_the_deciding_drive_goes_back_too(
    h: Harness,
) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .register("race", |ctx: Ctx, (): ()| async move {
            ctx.await_step::<()>("go").await?;
            let first = ctx
                .select(
                    "approval-or-signal",
                    vec![
                        Box::pin(async { ctx.await_step::<bool>("approval").await.map(|_| None) }),
                        Box::pin(async { ctx.wait_signal::<u32>("tok", None).await.map(Some) }),
                    ],
                )
                .await?;
            let next: u32 = ctx.wait_signal("tok", None).await?;
            Ok((first, next))
        })
        .fast()
        .build()?;
    h.keiro.start("race", "r-1", &()).await?;
    worker.drain().await?;
    h.keiro.deliver(("race", "r-1"), "approval", &true).await?;
    assert_eq!(
        h.keiro.signal("tok", &1u32).await?,
        SignalSendOutcome::Buffered
    );
    h.keiro.deliver(("race", "r-1"), "go", &()).await?;
    worker.drain().await?;
    assert_eq!(
        outcome(&h, "r-1").await?,
        (Status::Completed, Some(serde_json::json!([null, 1])))
    );
    Ok(())
}

/// The store operation under the race (`signal_return`): the decision lands, and with it each
/// signal goes back to its token: to a waiter if one waits, else ahead of what the token's
/// buffer holds, in the order given. A decision that does not land (recorded before, a
/// terminal instance) gives nothing back, and a bad token is refused before anything lands.
async fn signal_return_gives_signals_back_only_with_the_decision(h: Harness) -> TestResult {
    use keiro::{
        store::Append, store::AppendOutcome, store::Event, store::JournalStore, store::StepKind,
    };
    use keiro_journal::{
        store::ReturnedSignal, store::SignalWait, store::SignalWaitOutcome, store::StartRequest,
    };
    let store: &dyn JournalStore = h.store.as_ref();
    let (racer, waiter) = (key("race", "r-1"), key("take", "w-1"));
    for k in [&racer, &waiter] {
        let request = StartRequest {
            attributes: Default::default(),
            key: k.clone(),
            input: serde_json::Value::Null,
            parent: None,
            priority: 0,
            queue: None,
        };
        store.instance_start(&request).await?;
    }
    let decision = |race: &str| Append {
        key: racer.clone(),
        generation: Some(0),
        event: Event::StepRecorded {
            step: format!("race:{race}"),
            kind: StepKind::Race,
            result: serde_json::json!({ "winner": 0 }),
        },
        fence: None,
        renew: None,
    };
    let returned = |token: &str, n: u32| ReturnedSignal {
        token: token.into(),
        payload: serde_json::json!(n),
    };
    let wait = |step: &str, token: &str| SignalWait {
        key: waiter.clone(),
        generation: 0,
        step: step.into(),
        token: token.into(),
        fence: None,
    };
    let delivered = |n: u32| SignalWaitOutcome::Delivered(serde_json::json!({ "ok": n }));

    // Ahead of a signal buffered since, in the order given, on each token.
    assert_eq!(
        store.signal_send("t", &serde_json::json!(10)).await?,
        SignalSendOutcome::Buffered
    );
    assert_eq!(
        store
            .signal_return(
                &decision("a"),
                &[returned("t", 1), returned("u", 7), returned("t", 2)]
            )
            .await?,
        AppendOutcome::Appended
    );
    for (step, token, n) in [
        ("signal:t:1", "t", 1),
        ("signal:t:2", "t", 2),
        ("signal:t:3", "t", 10),
        ("signal:u:1", "u", 7),
    ] {
        assert_eq!(
            store.signal_wait(&wait(step, token)).await?,
            delivered(n),
            "{step}"
        );
    }
    // Recorded before: nothing goes back.
    assert!(matches!(
        store
            .signal_return(&decision("a"), &[returned("t", 3)])
            .await?,
        AppendOutcome::AlreadyPresent(_)
    ));
    assert_eq!(
        store.signal_wait(&wait("signal:t:4", "t")).await?,
        SignalWaitOutcome::Waiting
    );
    // A waiter takes a returned signal, as it would a sent one.
    assert_eq!(
        store
            .signal_return(&decision("b"), &[returned("t", 4)])
            .await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        store.signal_wait(&wait("signal:t:4", "t")).await?,
        delivered(4)
    );
    // A bad token is refused before the decision lands.
    let refused = store
        .signal_return(&decision("c"), &[returned("", 5)])
        .await;
    assert!(
        matches!(&refused, Err(e) if e.is_value_refused()),
        "{refused:?}"
    );
    // A terminal instance takes no decision, and nothing goes back.
    store.instance_cancel(&racer, false).await?;
    assert!(matches!(
        store
            .signal_return(&decision("c"), &[returned("t", 5)])
            .await?,
        AppendOutcome::RefusedTerminal(_)
    ));
    assert_eq!(
        store.signal_wait(&wait("signal:t:5", "t")).await?,
        SignalWaitOutcome::Waiting
    );
    let journal = store.journal_history(&racer).await?;
    assert!(
        !journal.iter().any(|e| e.event.step_name() == "race:c"),
        "{journal:?}"
    );
    Ok(())
}
