//! Deliveries reach awaits and nothing else (issue 12 item 4, issue 17 item 3). A delivery
//! waits for an `await_step` of its name, so one that names a step the body runs itself, before
//! or after the body gets there, changes nothing; one bound to a generation the run has left is
//! refused, typed, and writes nothing. Both stores.

use std::convert::Infallible;

use keiro::{Ctx, DeliveryRefusal, Status, WorkflowError};
use keiro_tests::{on_both_stores, Harness, Ledger, TestResult};

on_both_stores!(
    a_delivery_before_the_body_runs_a_step_of_that_name_changes_nothing,
    a_delivery_to_a_step_the_body_recorded_changes_nothing,
    an_early_delivery_waits_for_its_await,
    a_value_delivered_under_the_bare_name_is_still_read,
    a_delivery_bound_to_a_left_generation_is_refused,
);

/// A worker for `order`: it charges (each run of the action counted in `ledger`), then awaits
/// an approval, and returns both.
fn charging_worker(h: &Harness, ledger: &Ledger) -> Result<keiro::Worker, keiro::Error> {
    let l = ledger.clone();
    h.keiro
        .worker()
        .options(h.fast_options())
        .register("order", move |ctx: Ctx, (): ()| {
            let l = l.clone();
            async move {
                let charged: u32 = ctx
                    .step("charge", || async {
                        l.bump("charge");
                        Ok::<_, Infallible>(42u32)
                    })
                    .await?;
                let approved: bool = ctx.await_step("approval").await?;
                Ok::<_, WorkflowError>((charged, approved))
            }
        })
        .build()
}

async fn a_delivery_before_the_body_runs_a_step_of_that_name_changes_nothing(
    h: Harness,
) -> TestResult {
    // A caller delivers to "charge" before the body has run its `ctx.step("charge")`: the value
    // waits for an await of that name and never stands in for the step.
    let ledger = Ledger::default();
    let worker = charging_worker(&h, &ledger)?;
    h.keiro.start("order", "o-1", &()).await?;
    h.keiro.deliver(("order", "o-1"), "charge", &7u32).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(row.status, Status::Suspended, "{:?}", row.last_error);
    assert_eq!(ledger.count("charge"), 1, "the step ran, once");
    h.keiro.deliver(("order", "o-1"), "approval", &true).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!([42, true]))),
        "{:?}",
        row.last_error
    );
    assert_eq!(ledger.count("charge"), 1, "the step ran once");
    Ok(())
}

async fn an_early_delivery_waits_for_its_await(h: Harness) -> TestResult {
    // Both deliveries land before the worker ever drives the run; the await reads its own.
    let ledger = Ledger::default();
    let worker = charging_worker(&h, &ledger)?;
    h.keiro.start("order", "o-1", &()).await?;
    h.keiro.deliver(("order", "o-1"), "approval", &true).await?;
    let again = h
        .keiro
        .deliver(("order", "o-1"), "approval", &false)
        .await?;
    assert_eq!(
        again,
        keiro::AppendOutcome::AlreadyPresent(serde_json::json!(true)),
        "the first delivery wins"
    );
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!([42, true]))),
        "{:?}",
        row.last_error
    );
    Ok(())
}

async fn a_delivery_to_a_step_the_body_recorded_changes_nothing(h: Harness) -> TestResult {
    // The body recorded "charge" and parked on "approval"; a delivery to "charge" neither
    // replaces the recorded result nor fails the run (it used to fail it with a kind mismatch).
    let ledger = Ledger::default();
    let worker = charging_worker(&h, &ledger)?;
    h.keiro.start("order", "o-1", &()).await?;
    worker.drain().await?;
    h.keiro.deliver(("order", "o-1"), "charge", &7u32).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(row.status, Status::Suspended, "{:?}", row.last_error);
    h.keiro.deliver(("order", "o-1"), "approval", &true).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!([42, true]))),
        "{:?}",
        row.last_error
    );
    assert_eq!(ledger.count("charge"), 1);
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
        .deliver_to(("billing", "b-1"), 0, "payment", &100u32)
        .await?;
    worker.drain().await?;
    assert_eq!(
        h.keiro
            .instance(("billing", "b-1"))
            .await?
            .expect("row")
            .generation,
        1
    );
    // The retry answers generation 0's await, which already has it: idempotent, and not
    // taken as generation 1's payment.
    let retried = h
        .keiro
        .deliver_to(("billing", "b-1"), 0, "payment", &100u32)
        .await?;
    assert_eq!(
        retried,
        keiro::AppendOutcome::AlreadyPresent(serde_json::json!(100))
    );
    // A delivery for generation 0 that it never got is refused: that await is gone.
    let late = h
        .keiro
        .deliver_to(("billing", "b-1"), 0, "refund", &5u32)
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
        .deliver_to(("billing", "b-1"), 1, "payment", &200u32)
        .await?;
    worker.drain().await?;
    let row = h.keiro.instance(("billing", "b-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(200)))
    );
    Ok(())
}

async fn a_value_delivered_under_the_bare_name_is_still_read(h: Harness) -> TestResult {
    // An older keiro journaled deliveries under the await's bare name; a run parked across the
    // upgrade must still read such a value rather than wait for one under `await:<step>`.
    let ledger = Ledger::default();
    let worker = charging_worker(&h, &ledger)?;
    h.keiro.start("order", "o-1", &()).await?;
    worker.drain().await?;
    let key = keiro::InstanceKey::parse("order", "o-1")?;
    let legacy = keiro::Append::external(
        key,
        keiro::Event::StepRecorded {
            step: "approval".into(),
            kind: keiro::StepKind::Await,
            result: serde_json::json!(true),
        },
    );
    h.keiro.store().journal_append(&legacy).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!([42, true]))),
        "{:?}",
        row.last_error
    );
    Ok(())
}
