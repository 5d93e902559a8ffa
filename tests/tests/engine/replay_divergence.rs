//! Replay against changed code, on the SQLite and Postgres stores: a renamed or removed remote
//! step is a divergence like a local one, and a patch decides per position whether the old
//! code already ran past it.

use std::convert::Infallible;
use std::sync::Arc;

use keiro::{
    remote::RemoteOptions, store::StepKind, workflow::workflow_fn, workflow::RunError,
    workflow::RunOutcome, Ctx, Status,
};
use keiro_tests::{key, on_both_stores, run_inline, Harness, Ledger, TestResult};
use serde_json::{json, Value};

on_both_stores!(
    a_renamed_remote_step_is_caught_as_non_determinism,
    a_removed_remote_step_is_caught_when_the_body_returns,
    a_pending_remote_step_renamed_is_no_divergence,
    a_patch_after_the_first_park_takes_the_new_branch,
    a_run_that_recorded_past_the_patch_takes_the_old_branch,
    a_run_parked_past_the_patch_takes_the_new_branch,
    a_patch_beside_a_replaying_sibling_takes_the_new_branch,
);

/// A remote step `remote` (the label printer), then a local step.
fn labelled(remote: &'static str, ledger: Ledger) -> Arc<dyn keiro::workflow::Workflow> {
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

/// The recorded value of `step` in the instance's journal, if any.
async fn recorded(
    h: &Harness,
    k: &keiro::InstanceKey,
    step: &str,
) -> Result<Option<Value>, Box<dyn std::error::Error + Send + Sync>> {
    Ok(h.store
        .journal_history(k)
        .await?
        .into_iter()
        .find_map(|e| match e.event {
            keiro::store::Event::StepRecorded {
                step: s, result, ..
            } if s == step => Some(result),
            _ => None,
        }))
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

/// Step `a`, the await `go`, then `old_tail` past it; with `patch`, the patch `p` sits between
/// `go` and the tail and its new branch runs the step `fix`.
fn around_a_park(
    patch: bool,
    old_tail: bool,
    ledger: Ledger,
) -> Arc<dyn keiro::workflow::Workflow> {
    workflow_fn(move |ctx: Ctx, (): ()| {
        let ledger = ledger.clone();
        async move {
            ctx.step("a", || async { Ok::<_, Infallible>(1) }).await?;
            let _: bool = ctx.await_step("go").await?;
            let new = if patch {
                ctx.patched("p").await?
            } else {
                false
            };
            if new {
                ctx.step("fix", || async {
                    ledger.bump("fix");
                    Ok::<_, Infallible>(())
                })
                .await?;
            }
            if old_tail {
                ctx.step("b", || async { Ok::<_, Infallible>(2) }).await?;
                let _: bool = ctx.await_step("done").await?;
            }
            Ok(new)
        }
    })
}

async fn a_patch_after_the_first_park_takes_the_new_branch(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let wf = around_a_park(true, false, ledger.clone());
    h.keiro.start("park", "new", &()).await?;
    let k = key("park", "new");
    assert_eq!(
        run_inline(&h, &k, wf.as_ref()).await?,
        RunOutcome::Suspended
    );
    h.keiro.deliver(("park", "new"), "go", &true).await?;
    assert_eq!(
        run_inline(&h, &k, wf.as_ref()).await?,
        RunOutcome::Completed(json!(true))
    );
    assert_eq!(ledger.count("fix"), 1);
    assert_eq!(recorded(&h, &k, "patch:p").await?, Some(json!(true)));
    Ok(())
}

async fn a_run_that_recorded_past_the_patch_takes_the_old_branch(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    h.keiro.start("park", "old", &()).await?;
    let k = key("park", "old");
    // The old code (no patch) passes the patch's place and records `b` before it parks again.
    let old = around_a_park(false, true, ledger.clone());
    assert_eq!(
        run_inline(&h, &k, old.as_ref()).await?,
        RunOutcome::Suspended
    );
    h.keiro.deliver(("park", "old"), "go", &true).await?;
    assert_eq!(
        run_inline(&h, &k, old.as_ref()).await?,
        RunOutcome::Suspended
    );

    let new = around_a_park(true, true, ledger.clone());
    h.keiro.deliver(("park", "old"), "done", &true).await?;
    assert_eq!(
        run_inline(&h, &k, new.as_ref()).await?,
        RunOutcome::Completed(json!(false))
    );
    assert_eq!(ledger.count("fix"), 0);
    assert_eq!(recorded(&h, &k, "patch:p").await?, Some(json!(false)));
    Ok(())
}

async fn a_run_parked_past_the_patch_takes_the_new_branch(h: Harness) -> TestResult {
    // The old code parked on `go` with nothing recorded past the patch's place: the new branch
    // runs before `go` is read, which the journal does not contradict.
    let ledger = Ledger::default();
    let old = workflow_fn(|ctx: Ctx, (): ()| async move {
        ctx.step("a", || async { Ok::<_, Infallible>(1) }).await?;
        let _: bool = ctx.await_step("go").await?;
        Ok(false)
    });
    let new = workflow_fn({
        let ledger = ledger.clone();
        move |ctx: Ctx, (): ()| {
            let ledger = ledger.clone();
            async move {
                ctx.step("a", || async { Ok::<_, Infallible>(1) }).await?;
                let new = ctx.patched("p").await?;
                if new {
                    ctx.step("fix", || async {
                        ledger.bump("fix");
                        Ok::<_, Infallible>(())
                    })
                    .await?;
                }
                let _: bool = ctx.await_step("go").await?;
                Ok(new)
            }
        }
    });
    h.keiro.start("park", "parked", &()).await?;
    let k = key("park", "parked");
    assert_eq!(
        run_inline(&h, &k, old.as_ref()).await?,
        RunOutcome::Suspended
    );
    h.keiro.deliver(("park", "parked"), "go", &true).await?;
    assert_eq!(
        run_inline(&h, &k, new.as_ref()).await?,
        RunOutcome::Completed(json!(true))
    );
    assert_eq!(ledger.count("fix"), 1);
    Ok(())
}

async fn a_patch_beside_a_replaying_sibling_takes_the_new_branch(h: Harness) -> TestResult {
    // A sibling's step recorded beside the patch's branch is not "past" the patch: the
    // decision waits for the siblings polled with it to replay their recorded steps.
    let wf = workflow_fn(|ctx: Ctx, (): ()| async move {
        let (new, side) = tokio::join!(
            async {
                let _: bool = ctx.await_step("go").await?;
                ctx.patched("p").await
            },
            ctx.step("side", || async { Ok::<_, Infallible>(3) })
        );
        let (new, side): (bool, u32) = (new?, side?);
        Ok(json!([new, side]))
    });
    h.keiro.start("join", "j-1", &()).await?;
    let k = key("join", "j-1");
    assert_eq!(
        run_inline(&h, &k, wf.as_ref()).await?,
        RunOutcome::Suspended
    );
    h.keiro.deliver(("join", "j-1"), "go", &true).await?;
    assert_eq!(
        run_inline(&h, &k, wf.as_ref()).await?,
        RunOutcome::Completed(json!([true, 3]))
    );
    let kinds: Vec<_> = h
        .store
        .journal_history(&k)
        .await?
        .into_iter()
        .filter_map(|e| match e.event {
            keiro::store::Event::StepRecorded { step, kind, .. } => Some((step, kind)),
            _ => None,
        })
        .collect();
    assert!(
        kinds.contains(&("patch:p".into(), StepKind::Patch)),
        "{kinds:?}"
    );
    Ok(())
}
