//! Typed workflows and handles (issue 14, item 1): a `WorkflowDef` fixes a workflow's name,
//! input and output; `start_workflow::<W>` returns a `Handle<W>` whose result, cancel, deliver,
//! signal and instance act on that instance; workers register it with `register_workflow`, and
//! the stringly API addresses the same instances. Both stores.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::{
    worker::Tuning, workflow::SignalSendOutcome, Ctx, ResultError, Status, WorkflowDef,
    WorkflowError,
};
use keiro_tests::{on_both_stores, FastWorker, Harness, TestResult};
use serde::{Deserialize, Serialize};

on_both_stores!(
    a_typed_workflow_starts_runs_and_answers_through_its_handle,
    a_handle_cancels_signals_and_reads_its_instance,
    typed_and_stringly_calls_address_the_same_instances,
    a_definition_with_state_is_shared_by_its_runs,
    bad_input_gets_typed_errors,
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    sku: String,
    quantity: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    line: String,
    approved_by: String,
}

/// Charges, waits for an approval delivered to `approval`, then answers a receipt.
#[derive(Default)]
struct Checkout;

impl WorkflowDef for Checkout {
    const NAME: &'static str = "checkout";
    type Input = Order;
    type Output = Receipt;

    async fn run(&self, ctx: Ctx, order: Order) -> Result<Receipt, WorkflowError> {
        let line: String = ctx
            .step("charge", || async move {
                Ok::<_, std::convert::Infallible>(format!("{} x{}", order.sku, order.quantity))
            })
            .await?;
        let approved_by: String = ctx.await_step("approval").await?;
        Ok(Receipt { line, approved_by })
    }
}

/// Waits for a signal on `<id>/nudge` and answers it.
#[derive(Default)]
struct Nudged;

impl WorkflowDef for Nudged {
    const NAME: &'static str = "nudged";
    type Input = String;
    type Output = u32;

    async fn run(&self, ctx: Ctx, token: String) -> Result<u32, WorkflowError> {
        ctx.wait_signal(&token, None).await
    }
}

async fn a_typed_workflow_starts_runs_and_answers_through_its_handle(h: Harness) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .fast()
        .register_workflow::<Checkout>()
        .build()?;
    let order = Order {
        sku: "tea".into(),
        quantity: 2,
    };
    let handle = h.keiro.start_workflow::<Checkout>("c-1", &order).await?;
    assert!(handle.created());
    assert_eq!(handle.id(), "c-1");
    assert_eq!(handle.key().to_string(), "checkout/c-1");
    worker.drain().await?;
    let parked = handle.instance().await?.expect("started");
    assert_eq!(parked.status, Status::Suspended);

    handle.deliver("approval", &"ada").await?;
    worker.drain().await?;
    let receipt = handle.result_within(Duration::from_secs(10)).await?;
    assert_eq!(
        receipt,
        Receipt {
            line: "tea x2".into(),
            approved_by: "ada".into()
        }
    );
    // No timeout: answers from the terminal row.
    assert_eq!(handle.result().await?, receipt);

    // Idempotent by id: a second start is a handle on the same instance, its input unchanged.
    let again = h
        .keiro
        .start_workflow::<Checkout>(
            "c-1",
            &Order {
                sku: "coffee".into(),
                quantity: 9,
            },
        )
        .await?;
    assert!(!again.created());
    assert_eq!(again.result().await?, receipt);
    Ok(())
}

async fn a_handle_cancels_signals_and_reads_its_instance(h: Harness) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .fast()
        .register_workflow::<Checkout>()
        .register_workflow::<Nudged>()
        .build()?;
    let order = Order {
        sku: "tea".into(),
        quantity: 1,
    };
    let cancelled = h.keiro.start_workflow::<Checkout>("c-2", &order).await?;
    let nudged = h
        .keiro
        .start_workflow::<Nudged>("n-1", &"n-1/nudge".to_owned())
        .await?;
    worker.drain().await?;

    cancelled.cancel().await?;
    let outcome = cancelled.result_within(Duration::from_secs(10)).await;
    assert!(
        matches!(outcome, Err(ResultError::Cancelled { .. })),
        "{outcome:?}"
    );
    assert_eq!(
        cancelled.instance().await?.expect("row").status,
        Status::Cancelled
    );

    let sent = nudged.signal("n-1/nudge", &7_u32).await?;
    assert!(
        matches!(sent, SignalSendOutcome::Delivered { .. }),
        "{sent:?}"
    );
    worker.drain().await?;
    assert_eq!(nudged.result_within(Duration::from_secs(10)).await?, 7);

    // A handle for an instance never started reads nothing and waits on nothing.
    let ghost = h.keiro.handle::<Checkout>("never")?;
    assert!(ghost.instance().await?.is_none());
    let missing = ghost.result_within(Duration::from_secs(1)).await;
    assert!(
        matches!(missing, Err(ResultError::NotFound { .. })),
        "{missing:?}"
    );
    Ok(())
}

async fn typed_and_stringly_calls_address_the_same_instances(h: Harness) -> TestResult {
    // Started by name (a dynamic caller), run by the typed registration, read through a handle.
    let worker = h
        .keiro
        .worker()
        .fast()
        .register_workflow::<Checkout>()
        .build()?;
    h.keiro
        .start(
            "checkout",
            "c-3",
            &serde_json::json!({"sku": "jam", "quantity": 3}),
        )
        .await?;
    h.keiro
        .deliver(("checkout", "c-3"), "approval", &"bo")
        .await?;
    worker.drain().await?;
    let receipt = h
        .keiro
        .handle::<Checkout>("c-3")?
        .result_within(Duration::from_secs(10))
        .await?;
    assert_eq!(receipt.line, "jam x3");
    // And the other way round: a typed start, a stringly result.
    h.keiro
        .start_workflow::<Checkout>(
            "c-4",
            &Order {
                sku: "oat".into(),
                quantity: 1,
            },
        )
        .await?;
    h.keiro
        .deliver(("checkout", "c-4"), "approval", &"cy")
        .await?;
    worker.drain().await?;
    let value: serde_json::Value = h
        .keiro
        .result(("checkout", "c-4"), Duration::from_secs(10))
        .await?;
    assert_eq!(value["approved_by"], "cy");
    Ok(())
}

/// A definition with state of its own: counts its runs' fresh steps.
struct Counted {
    runs: Arc<AtomicU32>,
}

impl WorkflowDef for Counted {
    const NAME: &'static str = "counted";
    type Input = ();
    type Output = u32;

    async fn run(&self, ctx: Ctx, (): ()) -> Result<u32, WorkflowError> {
        let runs = self.runs.clone();
        ctx.step("count", || async move {
            Ok::<_, std::convert::Infallible>(runs.fetch_add(1, Ordering::SeqCst) + 1)
        })
        .await
    }
}

async fn a_definition_with_state_is_shared_by_its_runs(h: Harness) -> TestResult {
    let runs = Arc::new(AtomicU32::new(0));
    let worker = h
        .keiro
        .worker()
        .fast()
        .register_workflow_with(Counted { runs: runs.clone() })
        .build()?;
    let first = h.keiro.start_workflow::<Counted>("k-1", &()).await?;
    let second = h.keiro.start_workflow::<Counted>("k-2", &()).await?;
    worker.drain().await?;
    let mut answers = vec![first.result().await?, second.result().await?];
    answers.sort_unstable();
    assert_eq!(answers, [1, 2]);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    Ok(())
}

/// A definition whose name no instance may have.
#[derive(Default)]
struct BadName;

impl WorkflowDef for BadName {
    const NAME: &'static str = "bad:name";
    type Input = ();
    type Output = ();

    async fn run(&self, _ctx: Ctx, (): ()) -> Result<(), WorkflowError> {
        Ok(())
    }
}

async fn bad_input_gets_typed_errors(h: Harness) -> TestResult {
    let started = h.keiro.start_workflow::<BadName>("b-1", &()).await;
    assert!(
        matches!(started, Err(keiro::Error::InvalidId(_))),
        "{started:?}"
    );
    assert!(matches!(
        h.keiro.handle::<Checkout>("has/slash"),
        Err(keiro::Error::InvalidId(_))
    ));
    let built = h.keiro.worker().register_workflow::<BadName>().build();
    assert!(matches!(built, Err(keiro::Error::Registry(_))), "{built:?}");
    let twice = h
        .keiro
        .worker()
        .register_workflow::<Checkout>()
        .register("checkout", |_ctx: Ctx, (): ()| async { Ok(()) })
        .build();
    assert!(matches!(twice, Err(keiro::Error::Registry(_))), "{twice:?}");

    // An instance started by name with an input that is no `Order` fails its run with a
    // decode error (a crash: at once with a ceiling of one attempt), and its typed result
    // says so.
    let worker = h
        .keiro
        .worker()
        .fast()
        .tuning(Tuning {
            max_attempts: 1,
            ..h.fast_tuning()
        })
        .register_workflow::<Checkout>()
        .build()?;
    h.keiro.start("checkout", "c-bad", &"not an order").await?;
    worker.drain().await?;
    let handle = h.keiro.handle::<Checkout>("c-bad")?;
    let outcome = handle.result_within(Duration::from_secs(10)).await;
    assert!(
        matches!(&outcome, Err(ResultError::Failed { reason, .. }) if reason.contains("<input>")),
        "{outcome:?}"
    );
    Ok(())
}
