//! Wake sources are bound to the generation that armed them (issue 17, item 3): after a run
//! continues as new, an awakeable or a signal wait of the generation it left takes nothing
//! meant for the new one. Both stores.

use std::time::Duration;

use keiro::{workflow::AwakeableOutcome, workflow::SignalSendOutcome, Ctx, Status, WorkflowError};
use keiro_tests::{on_both_stores, FastWorker, Harness, TestResult};

on_both_stores!(
    an_awakeable_of_a_left_generation_journals_nothing_into_the_new_one,
    a_signal_wait_of_a_left_generation_does_not_swallow_the_next_signal,
);

async fn an_awakeable_of_a_left_generation_journals_nothing_into_the_new_one(
    h: Harness,
) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("loop", |ctx: Ctx, round: u32| async move {
            let awakeable = ctx.awakeable::<u32>("a").await?;
            if round == 0 {
                // Hand out the id, then leave the generation without awaiting it.
                ctx.step("announce", || async move {
                    Ok::<_, std::convert::Infallible>(awakeable.id())
                })
                .await?;
                return Err(ctx.continue_as_new(&1u32));
            }
            awakeable.value().await
        })
        .build()?;
    h.keiro.start("loop", "l-1", &0u32).await?;
    worker.drain().await?;
    let old_id: uuid::Uuid = h
        .keiro
        .journal(("loop", "l-1"))
        .await?
        .into_iter()
        .find_map(|e| match e.event {
            keiro::store::Event::StepRecorded { step, result, .. } if step == "announce" => {
                serde_json::from_value(result).ok()
            }
            _ => None,
        })
        .expect("announced");
    let outcome = h.keiro.complete_awakeable(old_id, &7u32).await?;
    assert!(
        !matches!(outcome, AwakeableOutcome::Delivered),
        "{outcome:?}"
    );
    worker.drain().await?;
    let row = h.keiro.instance(("loop", "l-1")).await?.expect("row");
    assert_eq!(
        (row.generation, row.status),
        (1, Status::Suspended),
        "generation 1 still waits on its own awakeable"
    );
    Ok(())
}

async fn a_signal_wait_of_a_left_generation_does_not_swallow_the_next_signal(
    h: Harness,
) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("loop", |ctx: Ctx, round: u32| async move {
            if round == 0 {
                // Generation 0 registers a signal wait, then continues as new beside it.
                let wait = ctx.wait_signal::<u32>("tok", None);
                let leave = async { Err::<u32, _>(ctx.continue_as_new(&1u32)) };
                let (_, left) = tokio::join!(wait, leave);
                return left;
            }
            ctx.wait_signal::<u32>("tok", Some(Duration::from_secs(3600)))
                .await
                .map_err(|e| match e {
                    WorkflowError::SignalTimeout { .. } => WorkflowError::app("timed out"),
                    other => other,
                })
        })
        .build()?;
    h.keiro.start("loop", "l-1", &0u32).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("loop", "l-1")).await?.expect("row");
    assert_eq!((row.generation, row.status), (1, Status::Suspended));
    let sent = h.keiro.signal("tok", &9u32).await?;
    assert!(
        matches!(&sent, SignalSendOutcome::Delivered { .. }),
        "{sent:?}"
    );
    worker.drain().await?;
    let row = h.keiro.instance(("loop", "l-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(9))),
        "generation 1 got the signal"
    );
    Ok(())
}
