//! Deliveries that would change nothing a run awaits are refused, typed, and write nothing
//! (issue 12 item 4, issue 17 item 3). Both stores.

use std::convert::Infallible;

use keiro::{Ctx, DeliveryRefusal, Status, WorkflowError};
use keiro_tests::{on_both_stores, Harness, Ledger, TestResult};

on_both_stores!(
    a_delivery_to_a_step_the_body_recorded_is_refused,
    a_delivery_bound_to_a_left_generation_is_refused,
);

async fn a_delivery_to_a_step_the_body_recorded_is_refused(h: Harness) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .options(h.fast_options())
        .register("order", |ctx: Ctx, (): ()| async move {
            ctx.step("charge", || async { Ok::<_, Infallible>(42u32) })
                .await?;
            ctx.await_step::<bool>("approval").await
        })
        .build()?;
    h.keiro.start("order", "o-1", &()).await?;
    worker.drain().await?;
    let before = h.keiro.journal("order", "o-1").await?;
    let refused = h.keiro.deliver("order", "o-1", "charge", &7u32).await;
    assert!(
        matches!(
            &refused,
            Err(keiro::Error::DeliveryRefused {
                reason: DeliveryRefusal::KindMismatch,
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(
        h.keiro.journal("order", "o-1").await?,
        before,
        "nothing written"
    );
    h.keiro.deliver("order", "o-1", "approval", &true).await?;
    worker.drain().await?;
    let row = h.keiro.instance("order", "o-1").await?.expect("row");
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);
    Ok(())
}

async fn a_delivery_bound_to_a_left_generation_is_refused(h: Harness) -> TestResult {
    // A loop: await a payment, ship, continue as new. A webhook retry of generation 0's payment
    // arrives after the run moved on: bound to its generation, it is refused instead of being
    // taken as generation 1's payment (which would ship twice).
    let ledger = Ledger::default();
    let l = ledger.clone();
    let worker = h
        .keiro
        .worker()
        .options(h.fast_options())
        .register("billing", move |ctx: Ctx, round: u32| {
            let l = l.clone();
            async move {
                let paid: u32 = ctx.await_step("payment").await?;
                ctx.step("ship", || async {
                    l.bump(&format!("ship-{paid}"));
                    Ok::<_, Infallible>(())
                })
                .await?;
                if round < 1 {
                    return Err(ctx.continue_as_new(&(round + 1)));
                }
                Ok::<_, WorkflowError>(paid)
            }
        })
        .build()?;
    h.keiro.start("billing", "b-1", &0u32).await?;
    worker.drain().await?;
    h.keiro
        .deliver_to("billing", "b-1", 0, "payment", &100u32)
        .await?;
    worker.drain().await?;
    assert_eq!(
        h.keiro
            .instance("billing", "b-1")
            .await?
            .expect("row")
            .generation,
        1
    );
    // The retry answers generation 0's await, which already has it: idempotent, and not
    // taken as generation 1's payment.
    let retried = h
        .keiro
        .deliver_to("billing", "b-1", 0, "payment", &100u32)
        .await?;
    assert_eq!(
        retried,
        keiro::AppendOutcome::AlreadyPresent(serde_json::json!(100))
    );
    // A delivery for generation 0 that it never got is refused: that await is gone.
    let late = h
        .keiro
        .deliver_to("billing", "b-1", 0, "refund", &5u32)
        .await;
    assert!(
        matches!(
            &late,
            Err(keiro::Error::DeliveryRefused {
                reason: DeliveryRefusal::StaleGeneration {
                    generation: 0,
                    current: 1
                },
                ..
            })
        ),
        "{late:?}"
    );
    worker.drain().await?;
    assert_eq!(ledger.count("ship-100"), 1, "shipped once");
    // Generation 1's own payment is accepted.
    h.keiro
        .deliver_to("billing", "b-1", 1, "payment", &200u32)
        .await?;
    worker.drain().await?;
    let row = h.keiro.instance("billing", "b-1").await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(200)))
    );
    Ok(())
}
