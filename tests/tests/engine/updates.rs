//! Updates end to end: a caller's request answered once however often it is retried, a
//! rejection, a finished run's refusal, a caller that times out and gets the answer on retry,
//! a worker killed between the request and the reply with another worker answering it once,
//! an update raced against a sleep, and update-with-start / signal-with-start. Both stores.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::workflow::UpdateCall;
use keiro::{Ctx, Error, Status, WorkflowError};
use keiro_tests::{on_both_stores, spawn_worker, FastWorker, Harness, TestResult};

on_both_stores!(
    an_update_is_answered_once_when_its_caller_retries_with_the_same_id,
    a_caller_gets_one_reply_across_a_worker_killed_between_the_request_and_the_reply,
    an_update_races_a_sleep_and_a_second_answer_is_a_typed_error,
    update_with_start_and_signal_with_start_start_the_run_and_deliver,
    an_update_a_losing_branch_took_goes_back_to_its_queue,
    updates_wait_across_continue_as_new,
);

/// Approves amounts up to 100 (doubling them), rejects the rest, and completes after two
/// approvals with their sum.
async fn approval(ctx: Ctx, (): ()) -> Result<u32, WorkflowError> {
    let mut total = 0;
    let mut approved = 0;
    while approved < 2 {
        let update = ctx.next_update::<u32>("approve").await?;
        if update.request > 100 {
            ctx.reject(&update, "over the limit").await?;
        } else {
            ctx.reply(&update, &(update.request * 2)).await?;
            total += update.request;
            approved += 1;
        }
    }
    Ok(total)
}

async fn an_update_is_answered_once_when_its_caller_retries_with_the_same_id(
    h: Harness,
) -> TestResult {
    let key = ("approval", "a-1");
    h.keiro.start("approval", "a-1", &()).await?;
    // No worker yet: the caller's wait ends at its timeout, and the update stays.
    let early = h
        .keiro
        .update_with::<_, u32>(
            key,
            UpdateCall::new("approve", &5)
                .id("first")
                .timeout(Duration::from_millis(200)),
        )
        .await;
    assert!(
        matches!(&early, Err(Error::UpdateTimeout { id, .. }) if id == "first"),
        "{early:?}"
    );
    let worker = spawn_worker(
        h.keiro
            .worker()
            .fast()
            .register("approval", approval)
            .build()?,
    );
    let call = || {
        UpdateCall::new("approve", &5)
            .id("first")
            .timeout(Duration::from_secs(60))
    };
    // The retry gets the answer to the request the first call left, and so does the next.
    let reply: u32 = h.keiro.update_with(key, call()).await?;
    assert_eq!(reply, 10);
    let again: u32 = h.keiro.update_with(key, call()).await?;
    assert_eq!(again, 10, "the same id, the same reply");
    // Another request under a taken id is a conflict; a rejection is typed.
    let conflict = h
        .keiro
        .update_with::<_, u32>(key, UpdateCall::new("approve", &6).id("first"))
        .await;
    assert!(
        matches!(&conflict, Err(Error::UpdateConflict { .. })),
        "{conflict:?}"
    );
    let rejected = h
        .keiro
        .update::<_, u32>(key, "approve", &500, Duration::from_secs(60))
        .await;
    assert!(
        matches!(&rejected, Err(Error::UpdateRejected { message, .. }) if message == "over the limit"),
        "{rejected:?}"
    );
    let second: u32 = h
        .keiro
        .update(key, "approve", &7, Duration::from_secs(60))
        .await?;
    assert_eq!(second, 14);
    let done = h.keiro.result::<u32>(key, Duration::from_secs(60)).await?;
    assert_eq!(done, 12, "each approval counted once");
    // The run has ended: a new update is refused, a retry still gets its answer.
    let late = h
        .keiro
        .update::<_, u32>(key, "approve", &1, Duration::from_secs(5))
        .await;
    assert!(
        matches!(
            &late,
            Err(Error::RunFinished {
                status: Status::Completed,
                ..
            })
        ),
        "{late:?}"
    );
    let replayed: u32 = h.keiro.update_with(key, call()).await?;
    assert_eq!(replayed, 10);
    // Bad input is typed: an unknown instance, an update name or id no store could take.
    let unknown = h
        .keiro
        .update::<_, u32>(("approval", "nope"), "approve", &1, Duration::from_secs(5))
        .await;
    assert!(
        matches!(&unknown, Err(Error::Store(e)) if e.is_not_found()),
        "{unknown:?}"
    );
    let long = "x".repeat(300);
    let too_long = h
        .keiro
        .update_with::<_, u32>(key, UpdateCall::new("approve", &1).id(long.as_str()))
        .await;
    assert!(
        matches!(&too_long, Err(Error::InvalidId(_))),
        "{too_long:?}"
    );
    let bad_name = h
        .keiro
        .update::<_, u32>(key, "a:b", &1, Duration::from_secs(5))
        .await;
    assert!(
        matches!(&bad_name, Err(Error::InvalidId(_))),
        "{bad_name:?}"
    );
    worker.stop().await?;
    Ok(())
}

async fn a_caller_gets_one_reply_across_a_worker_killed_between_the_request_and_the_reply(
    h: Harness,
) -> TestResult {
    // The first worker takes the update and hangs before it replies; it is killed, and a
    // second worker, replaying the take, answers it.
    let hang = Arc::new(AtomicBool::new(true));
    let checks = Arc::new(AtomicU32::new(0));
    let body = {
        let (hang, checks) = (hang.clone(), checks.clone());
        move |ctx: Ctx, (): ()| {
            let (hang, checks) = (hang.clone(), checks.clone());
            async move {
                let update = ctx.next_update::<u32>("approve").await?;
                if hang.load(Ordering::SeqCst) {
                    checks.fetch_add(1, Ordering::SeqCst);
                    std::future::pending::<()>().await;
                }
                ctx.reply(&update, &(update.request + 1)).await?;
                Ok::<_, WorkflowError>(())
            }
        }
    };
    h.keiro.start("hanging", "h-1", &()).await?;
    let first = spawn_worker(
        h.keiro
            .worker()
            .fast()
            .register("hanging", body.clone())
            .build()?,
    );
    let keiro = h.keiro.clone();
    let caller = tokio::spawn(async move {
        keiro
            .update_with::<_, u32>(
                ("hanging", "h-1"),
                UpdateCall::new("approve", &41)
                    .id("once")
                    .timeout(Duration::from_secs(120)),
            )
            .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while checks.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never took it"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill();
    assert!(!caller.is_finished(), "no reply yet");
    hang.store(false, Ordering::SeqCst);
    h.keiro.force_release(("hanging", "h-1")).await?;
    let second = spawn_worker(h.keiro.worker().fast().register("hanging", body).build()?);
    let reply = tokio::time::timeout(Duration::from_secs(120), caller).await???;
    assert_eq!(reply, 42);
    second.stop().await?;
    // Exactly one take and one reply are journaled.
    let journal = h.keiro.journal(("hanging", "h-1")).await?;
    let steps: Vec<String> = journal
        .iter()
        .filter_map(|entry| match &entry.event {
            keiro::store::Event::StepRecorded { step, .. } if step.starts_with("update:") => {
                Some(step.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(steps, ["update:approve:1", "update:approve#once"]);
    Ok(())
}

async fn an_update_races_a_sleep_and_a_second_answer_is_a_typed_error(h: Harness) -> TestResult {
    // Waits for an update or its input's milliseconds, whichever first; on the update it
    // answers twice.
    let body = |ctx: Ctx, patience: u64| async move {
        enum Next {
            Update(keiro::workflow::Update<u32>),
            Slept,
        }
        let next = ctx
            .select(
                "update-or-timeout",
                vec![
                    Box::pin(async { Ok(Next::Update(ctx.next_update::<u32>("poke").await?)) })
                        as keiro::workflow::BoxFuture<'_, Result<Next, WorkflowError>>,
                    Box::pin(async {
                        ctx.sleep("patience", Duration::from_millis(patience))
                            .await?;
                        Ok(Next::Slept)
                    }),
                ],
            )
            .await?;
        match next {
            Next::Slept => Ok::<_, WorkflowError>("slept".to_owned()),
            Next::Update(update) => {
                ctx.reply(&update, &"first").await?;
                match ctx.reply(&update, &"second").await {
                    Err(WorkflowError::UpdateAnswered { .. }) => Ok("answered once".to_owned()),
                    other => Err(WorkflowError::app(format!("{other:?}"))),
                }
            }
        }
    };
    let worker = spawn_worker(h.keiro.worker().fast().register("poked", body).build()?);
    // Nobody pokes the first run: the sleep wins, and a later update finds it finished.
    h.keiro.start("poked", "p-1", &50u64).await?;
    let slept = h
        .keiro
        .result::<String>(("poked", "p-1"), Duration::from_secs(60))
        .await?;
    assert_eq!(slept, "slept");
    // The second is poked at once: the update wins, and the second reply is refused.
    h.keiro.start("poked", "p-2", &3_600_000u64).await?;
    let reply: String = h
        .keiro
        .update(("poked", "p-2"), "poke", &1, Duration::from_secs(60))
        .await?;
    let outcome = h
        .keiro
        .result::<String>(("poked", "p-2"), Duration::from_secs(60))
        .await?;
    assert_eq!(
        (reply.as_str(), outcome.as_str()),
        ("first", "answered once")
    );
    worker.stop().await?;
    Ok(())
}

async fn update_with_start_and_signal_with_start_start_the_run_and_deliver(
    h: Harness,
) -> TestResult {
    let worker = spawn_worker(
        h.keiro
            .worker()
            .fast()
            .register("approval", approval)
            .register("cart", |ctx: Ctx, (): ()| async move {
                let first: String = ctx.wait_signal("cart-1/add", None).await?;
                let second: String = ctx.wait_signal("cart-1/add", None).await?;
                Ok::<_, WorkflowError>(format!("{first}+{second}"))
            })
            .build()?,
    );
    // The first call starts the run and delivers; the second finds it running.
    let first: u32 = h
        .keiro
        .update_with_start(("approval", "s-1"), &(), UpdateCall::new("approve", &1))
        .await?;
    let second: u32 = h
        .keiro
        .update_with_start(("approval", "s-1"), &(), UpdateCall::new("approve", &2))
        .await?;
    assert_eq!((first, second), (2, 4));
    let total = h
        .keiro
        .result::<u32>(("approval", "s-1"), Duration::from_secs(60))
        .await?;
    assert_eq!(total, 3);

    let sent = h
        .keiro
        .signal_with_start(("cart", "cart-1"), &(), "cart-1/add", &"apple")
        .await?;
    assert!(sent.started);
    let again = h
        .keiro
        .signal_with_start(("cart", "cart-1"), &(), "cart-1/add", &"pear")
        .await?;
    assert!(!again.started);
    let cart = h
        .keiro
        .result::<String>(("cart", "cart-1"), Duration::from_secs(60))
        .await?;
    assert_eq!(cart, "apple+pear");
    worker.stop().await?;
    Ok(())
}

async fn an_update_a_losing_branch_took_goes_back_to_its_queue(h: Harness) -> TestResult {
    // Both updates are waiting when the run first races a take of each: both branches take
    // theirs, the first wins, and the loser's update goes back, so the next take of its name
    // gets it and both callers are answered.
    let body = |ctx: Ctx, (): ()| async move {
        let take = |name: &'static str| {
            let ctx = ctx.clone();
            Box::pin(async move { ctx.next_update::<u32>(name).await })
                as keiro::workflow::BoxFuture<'static, _>
        };
        let first = ctx.select("first", vec![take("a"), take("b")]).await?;
        ctx.reply(&first, &format!("{} first", first.name)).await?;
        let other = if first.name == "a" { "b" } else { "a" };
        let second = ctx.next_update::<u32>(other).await?;
        ctx.reply(&second, &format!("{} second", second.name))
            .await?;
        Ok::<_, WorkflowError>(())
    };
    let key = ("pair", "p-1");
    h.keiro.start("pair", "p-1", &()).await?;
    for name in ["a", "b"] {
        // A zero timeout sends and returns at once: the update waits for the run.
        let sent = h
            .keiro
            .update_with::<_, String>(
                key,
                UpdateCall::new(name, &1).id(name).timeout(Duration::ZERO),
            )
            .await;
        assert!(
            matches!(&sent, Err(Error::UpdateTimeout { .. })),
            "{sent:?}"
        );
    }
    let worker = spawn_worker(h.keiro.worker().fast().register("pair", body).build()?);
    let mut answers = Vec::new();
    for name in ["a", "b"] {
        let answer: String = h
            .keiro
            .update_with(
                key,
                UpdateCall::new(name, &1)
                    .id(name)
                    .timeout(Duration::from_secs(60)),
            )
            .await?;
        answers.push(answer);
    }
    answers.sort();
    assert_eq!(answers, ["a first", "b second"]);
    let done = h.keiro.instance(key).await?.expect("the row");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut status = done.status;
    while status != Status::Completed {
        assert!(tokio::time::Instant::now() < deadline, "{status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        status = h.keiro.instance(key).await?.expect("the row").status;
    }
    worker.stop().await?;
    Ok(())
}

async fn updates_wait_across_continue_as_new(h: Harness) -> TestResult {
    // Each generation answers one update, then continues as new, three times; the updates were
    // all sent before the first generation ran, so two of them wait across generations.
    let body = |ctx: Ctx, generation: u32| async move {
        let update = ctx.next_update::<u32>("add").await?;
        ctx.reply(&update, &(update.request + generation)).await?;
        if generation < 2 {
            return Err(ctx.continue_as_new(&(generation + 1)));
        }
        Ok::<_, WorkflowError>(generation)
    };
    let key = ("chain", "c-1");
    h.keiro.start("chain", "c-1", &0u32).await?;
    for id in ["u-0", "u-1", "u-2"] {
        let sent = h
            .keiro
            .update_with::<_, u32>(
                key,
                UpdateCall::new("add", &10).id(id).timeout(Duration::ZERO),
            )
            .await;
        assert!(
            matches!(&sent, Err(Error::UpdateTimeout { .. })),
            "{sent:?}"
        );
    }
    let worker = spawn_worker(h.keiro.worker().fast().register("chain", body).build()?);
    let mut answers = Vec::new();
    for id in ["u-0", "u-1", "u-2"] {
        let answer: u32 = h
            .keiro
            .update_with(
                key,
                UpdateCall::new("add", &10)
                    .id(id)
                    .timeout(Duration::from_secs(60)),
            )
            .await?;
        answers.push(answer);
    }
    assert_eq!(
        answers,
        [10, 11, 12],
        "first in first out, one per generation"
    );
    let last: u32 = h.keiro.result(key, Duration::from_secs(60)).await?;
    assert_eq!(last, 2);
    worker.stop().await?;
    Ok(())
}
