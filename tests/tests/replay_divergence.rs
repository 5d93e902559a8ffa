//! Replay against changed code, on the memory and Postgres stores: a renamed or removed remote
//! step is a divergence like a local one.

use std::convert::Infallible;
use std::sync::Arc;

use keiro::{workflow_fn, Ctx, RemoteOptions, RunError, RunOutcome, Status};
use keiro_tests::{key, on_both_stores, run_inline, Harness, Ledger, TestResult};
use serde_json::json;

on_both_stores!(
    a_renamed_remote_step_is_caught_as_non_determinism,
    a_removed_remote_step_is_caught_when_the_body_returns,
    a_pending_remote_step_renamed_is_no_divergence,
);

/// A remote step `remote` (the label printer), then a local step.
fn labelled(remote: &'static str, ledger: Ledger) -> Arc<dyn keiro::Workflow> {
    workflow_fn(move |ctx: Ctx, order: String| {
        let ledger = ledger.clone();
        async move {
            let label: String = ctx
                .remote(remote, &order, &RemoteOptions::default())
                .await?;
            ctx.step("after", || async {
                ledger.bump("after");
                Ok::<_, Infallible>(())
            })
            .await?;
            Ok(label)
        }
    })
}

/// Starts `labelled("label")` as `id`, drives it until it parks on its remote step, and
/// reports the step's result as a worker would.
async fn journal_a_label(h: &Harness, id: &str) -> TestResult {
    h.keiro.start("label", id, &"order-1").await?;
    let k = key("label", id);
    let v1 = labelled("label", Ledger::default());
    assert_eq!(run_inline(h, &k, v1.as_ref()).await?, RunOutcome::Suspended);
    let tasks = h.admin.remote_tasks(&k).await?;
    assert_eq!(tasks.len(), 1);
    h.transport
        .task_complete(&tasks[0].step_id, &json!("L-1"))
        .await?;
    Ok(())
}

async fn assert_failed_diverged(h: &Harness, k: &keiro::InstanceKey) -> TestResult {
    let row = h.store.instance_get(k).await?.expect("row");
    assert_eq!(row.status, Status::Failed);
    assert!(
        row.last_error
            .as_deref()
            .is_some_and(|e| e.contains("non-determinism")),
        "{:?}",
        row.last_error
    );
    Ok(())
}

async fn a_renamed_remote_step_is_caught_as_non_determinism(h: Harness) -> TestResult {
    journal_a_label(&h, "l-1").await?;
    let k = key("label", "l-1");
    let before = h.store.journal_history(&k).await?;

    let ledger = Ledger::default();
    let v2 = labelled("print-label", ledger.clone());
    let out = run_inline(&h, &k, v2.as_ref()).await;
    assert!(
        matches!(&out, Err(RunError::NonDeterminism { step, detail, .. })
            if step == "remote:print-label" && detail.contains("remote:label")),
        "{out:?}"
    );
    assert_failed_diverged(&h, &k).await?;
    let tasks = h.admin.remote_tasks(&k).await?;
    assert_eq!(
        tasks.iter().map(|t| t.step.as_str()).collect::<Vec<_>>(),
        ["label"],
        "no task was written for the renamed step"
    );
    assert_eq!(ledger.count("after"), 0);
    assert_eq!(
        h.store.journal_history(&k).await?,
        before,
        "nothing was appended"
    );
    Ok(())
}

async fn a_removed_remote_step_is_caught_when_the_body_returns(h: Harness) -> TestResult {
    journal_a_label(&h, "l-2").await?;
    let k = key("label", "l-2");
    let v2 = workflow_fn(|_ctx: Ctx, _order: String| async move { Ok("no label") });
    let out = run_inline(&h, &k, v2.as_ref()).await;
    assert!(
        matches!(&out, Err(RunError::NonDeterminism { step, .. }) if step == "remote:label"),
        "{out:?}"
    );
    assert_failed_diverged(&h, &k).await?;
    Ok(())
}

async fn a_pending_remote_step_renamed_is_no_divergence(h: Harness) -> TestResult {
    // No result is journaled yet, so nothing records that the old name was reached.
    h.keiro.start("label", "l-3", &"order-3").await?;
    let k = key("label", "l-3");
    let v1 = labelled("label", Ledger::default());
    assert_eq!(
        run_inline(&h, &k, v1.as_ref()).await?,
        RunOutcome::Suspended
    );
    let v2 = labelled("print-label", Ledger::default());
    assert_eq!(
        run_inline(&h, &k, v2.as_ref()).await?,
        RunOutcome::Suspended
    );
    let mut steps: Vec<_> = h
        .admin
        .remote_tasks(&k)
        .await?
        .into_iter()
        .map(|t| t.step)
        .collect();
    steps.sort();
    assert_eq!(steps, ["label", "print-label"]);
    Ok(())
}
