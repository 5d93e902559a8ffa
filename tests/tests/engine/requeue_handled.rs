//! Requeue resets only the failures the run did not handle (issue 12, item 3): a remote
//! failure the body answered with a fallback step stays failed, so the re-driven run takes the
//! same path past its recorded fallback. Both stores.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::{
    operate::RequeueOutcome, remote::RemoteOptions, remote::RemoteWorker,
    remote::RemoteWorkerOptions, remote::TaskContext, remote::TaskError, worker::Registry, Ctx,
    Status, WorkflowError,
};
use keiro_tests::{on_both_stores, Harness, Ledger, TestResult};

on_both_stores!(a_handled_remote_failure_is_not_reset_by_requeue);

/// `quote` may fail, and the body falls back to a local step; `charge` failing fails the run.
fn quoting(ledger: Ledger) -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("quoting", move |ctx: Ctx, id: String| {
        let ledger = ledger.clone();
        async move {
            let options = RemoteOptions::default();
            let price: String = match ctx.remote("quote", &id, &options).await {
                Ok(price) => price,
                Err(WorkflowError::Remote(_)) => {
                    ctx.step("fallback", || async {
                        ledger.bump("fallback");
                        Ok::<_, std::convert::Infallible>("list-price".to_owned())
                    })
                    .await?
                }
                Err(other) => return Err(other),
            };
            let charged: String = ctx.remote("charge", &price, &options).await?;
            Ok(format!("{price} {charged}"))
        }
    })?;
    Ok(registry)
}

fn handlers(h: &Harness, broken: Arc<AtomicBool>, calls: Ledger) -> RemoteWorker {
    let fail = |broken: &Arc<AtomicBool>| broken.load(Ordering::SeqCst);
    let (quote_broken, quote_calls) = (broken.clone(), calls.clone());
    RemoteWorker::builder(h.transport.clone())
        .options(RemoteWorkerOptions {
            poll_interval: Duration::from_millis(20),
            ..RemoteWorkerOptions::default()
        })
        .handle("quote", move |id: String, _task: TaskContext| {
            let (broken, calls) = (quote_broken.clone(), quote_calls.clone());
            async move {
                calls.bump("quote");
                if fail(&broken) {
                    Err(TaskError::fatal("no quote service"))
                } else {
                    Ok(format!("quoted-{id}"))
                }
            }
        })
        .handle("charge", move |price: String, _task: TaskContext| {
            let (broken, calls) = (broken.clone(), calls.clone());
            async move {
                calls.bump("charge");
                if fail(&broken) {
                    Err(TaskError::fatal("card gateway down"))
                } else {
                    Ok(format!("charged {price}"))
                }
            }
        })
        .build()
}

async fn until_status(h: &Harness, registry: &Registry, id: &str, status: Status) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        keiro::worker::resume_once(&h.store, registry, &h.fast_options()).await?;
        let row = h.keiro.instance(("quoting", id)).await?.expect("instance");
        if row.status == status {
            return Ok(());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "quoting/{id} is {:?} ({:?}), never {status:?}",
            row.status,
            row.last_error
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_handled_remote_failure_is_not_reset_by_requeue(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let registry = quoting(ledger.clone())?;
    let broken = Arc::new(AtomicBool::new(true));
    let calls = Ledger::default();
    let worker = handlers(&h, broken.clone(), calls.clone());
    let stop = tokio::sync::oneshot::channel::<()>();
    let (stop_tx, stop_rx) = stop;
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stop_rx.await;
            })
            .await;
    });
    h.keiro.start("quoting", "q-1", &"q-1").await?;
    // `quote` fails and the body falls back; then `charge` fails and fails the run.
    until_status(&h, &registry, "q-1", Status::Failed).await?;
    assert_eq!(ledger.count("fallback"), 1);

    // Both services are back. Only the failure the run failed on is reset.
    broken.store(false, Ordering::SeqCst);
    let outcome = h.keiro.requeue(("quoting", "q-1")).await?;
    assert_eq!(
        outcome,
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: vec![]
        }
    );
    until_status(&h, &registry, "q-1", Status::Completed).await?;
    let _ = stop_tx.send(());
    let _ = running.await;
    let row = h.keiro.instance(("quoting", "q-1")).await?.expect("row");
    assert_eq!(
        row.output,
        Some(serde_json::json!("list-price charged list-price"))
    );
    assert_eq!(
        calls.count("quote"),
        1,
        "the handled quote did not run again"
    );
    assert_eq!(calls.count("charge"), 2);
    assert_eq!(ledger.count("fallback"), 1);
    Ok(())
}
