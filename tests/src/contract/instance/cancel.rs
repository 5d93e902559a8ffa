//! Cancellation: the marker on the instance itself and, with cascade, on every live
//! descendant, in one transaction; each cancelled child's envelope reaches its parent.

#[allow(clippy::wildcard_imports)] // the shared tools, some of them per scenario
use crate::contract::support::*;
use crate::Harness;
use keiro_journal::{
    store::child_result_step, store::ChildSpawn, store::Park, Append, AppendOutcome, Event,
    InstanceKey, Marker, Status, StepKind,
};
use keiro_lease::LeaseStore;
use keiro_remote::TaskStatus;
use serde_json::json;

async fn spawn(
    store: &dyn LeaseStore,
    parent: &InstanceKey,
    child: &InstanceKey,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let append = Append::external(
        parent.clone(),
        Event::StepRecorded {
            step: format!("child:{}/{}", child.name, child.id),
            kind: StepKind::Child,
            result: json!({"name": child.name.as_str(), "id": child.id.as_str()}),
        },
    );
    let spawn = ChildSpawn {
        child: child.clone(),
        input: json!(null),
        await_step: child_result_step(child),
    };
    assert_eq!(
        store.child_spawn(&append, &spawn).await?,
        AppendOutcome::Appended
    );
    Ok(())
}

/// root → a → a1, root → b, and `done`, a finished child of root.
async fn tree(
    store: &dyn LeaseStore,
) -> Result<[InstanceKey; 5], Box<dyn std::error::Error + Send + Sync>> {
    let [root, a, a1, b, done] = ["root", "a", "a1", "b", "done"].map(|id| key("flow", id));
    start_parked(store, &root).await?;
    spawn(store, &root, &a).await?;
    spawn(store, &a, &a1).await?;
    spawn(store, &root, &b).await?;
    spawn(store, &root, &done).await?;
    store
        .journal_append(&Append::external(
            done.clone(),
            Event::WorkflowCompleted { output: json!(1) },
        ))
        .await?;
    // The spawns woke the root; park it again, waiting for its children, as its run would.
    store
        .instance_park(&Park {
            key: root.clone(),
            generation: 0,
            fence: None,
            awaited: vec![child_result_step(&a), child_result_step(&b)],
            wake_after: None,
        })
        .await?;
    assert_eq!(status(store, &root).await?, Status::Suspended);
    Ok([root, a, a1, b, done])
}

pub async fn a_cascade_cancels_every_live_descendant(h: Harness) -> TestResult {
    let store = &*h.store;
    let [root, a, a1, b, done] = tree(store).await?;
    // A live remote task on each of three levels, and one on the finished child.
    for k in [&root, &a, &a1, &done] {
        store
            .remote_arm(&crate::contract::remote::arm(k, "label", json!(1)))
            .await?;
    }
    assert_eq!(
        store.instance_cancel(&root, true).await?,
        AppendOutcome::Appended
    );
    for k in [&root, &a, &a1, &b] {
        assert_eq!(status(store, k).await?, Status::Cancelled, "{k}");
    }
    // Each cancellation cancelled the tasks of the generation it closed.
    for k in [&root, &a, &a1] {
        let tasks = h.admin.remote_tasks(k).await?;
        let statuses: Vec<_> = tasks.iter().map(|t| t.status).collect();
        assert_eq!(statuses, [TaskStatus::Cancelled], "{k}");
    }
    assert!(
        h.admin.remote_tasks(&done).await?.is_empty(),
        "a finished run writes no task"
    );
    assert_eq!(
        status(store, &done).await?,
        Status::Completed,
        "finished children stay"
    );
    // Each child's delivery into its already cancelled parent was refused and ignored.
    assert!(recorded(store, &root, &child_result_step(&a))
        .await?
        .is_empty());
    assert!(recorded(store, &a, &child_result_step(&a1))
        .await?
        .is_empty());

    assert_eq!(
        store.instance_cancel(&root, true).await?,
        AppendOutcome::AlreadyPresent(json!(null)),
        "a repeat converges"
    );
    Ok(())
}

pub async fn without_cascade_only_the_instance_is_cancelled(h: Harness) -> TestResult {
    let store = &*h.store;
    let [root, a, a1, b, _] = tree(store).await?;
    assert_eq!(
        store.instance_cancel(&root, false).await?,
        AppendOutcome::Appended
    );
    assert_eq!(status(store, &root).await?, Status::Cancelled);
    for k in [&a, &a1, &b] {
        assert_eq!(status(store, k).await?, Status::Running, "{k}");
    }
    Ok(())
}

pub async fn cancelling_a_subtree_notifies_its_parent(h: Harness) -> TestResult {
    let store = &*h.store;
    let [root, a, a1, b, _] = tree(store).await?;
    assert_eq!(
        store.instance_cancel(&a, true).await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        (
            status(store, &a).await?,
            status(store, &a1).await?,
            status(store, &b).await?
        ),
        (Status::Cancelled, Status::Cancelled, Status::Running)
    );
    assert_eq!(
        recorded(store, &root, &child_result_step(&a)).await?,
        vec![json!({"cancelled": true})],
        "the surviving parent learns its child was cancelled"
    );
    assert_eq!(status(store, &root).await?, Status::Running, "and is woken");
    Ok(())
}

pub async fn a_finished_or_missing_instance_is_not_cancelled(h: Harness) -> TestResult {
    let store = &*h.store;
    let [root, a, ..] = tree(store).await?;
    store
        .journal_append(&Append::external(
            root.clone(),
            Event::WorkflowCompleted { output: json!(0) },
        ))
        .await?;
    assert_eq!(
        store.instance_cancel(&root, true).await?,
        AppendOutcome::RefusedTerminal(Marker::Completed)
    );
    assert_eq!(
        status(store, &a).await?,
        Status::Running,
        "no cascade from a refusal"
    );
    assert!(store
        .instance_cancel(&key("flow", "nope"), true)
        .await
        .unwrap_err()
        .is_not_found());
    Ok(())
}

pub async fn a_cycle_of_adoptions_does_not_loop(h: Harness) -> TestResult {
    let store = &*h.store;
    let [x, y] = ["x", "y"].map(|id| key("flow", id));
    store.instance_start(&start(&x, json!(null))).await?;
    spawn(store, &x, &y).await?;
    // y spawns x, which exists without a parent: x adopts y as its parent.
    spawn(store, &y, &x).await?;
    assert_eq!(
        store.instance_get(&x).await?.expect("row").parent,
        Some(y.clone())
    );
    assert_eq!(
        store.instance_cancel(&x, true).await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        (status(store, &x).await?, status(store, &y).await?),
        (Status::Cancelled, Status::Cancelled)
    );
    // x's envelope reached y, still live when x closed; y's reached a cancelled x.
    assert_eq!(
        recorded(store, &y, &child_result_step(&x)).await?,
        [json!({"cancelled": true})]
    );
    assert!(recorded(store, &x, &child_result_step(&y))
        .await?
        .is_empty());
    Ok(())
}

pub async fn a_cascading_cancel_reaches_every_live_descendant_only(h: Harness) -> TestResult {
    let store = &*h.store;
    let root = started(store, "root").await?;
    let (child, child_step, _) = spawn_child(store, &root, "child").await?;
    let (grandchild, _, _) = spawn_child(store, &child, "grandchild").await?;
    let (finished, _, _) = spawn_child(store, &root, "finished").await?;
    let (spared, _, _) = spawn_child(store, &root, "spared").await?;
    let completed = Event::WorkflowCompleted { output: json!(1) };
    append(store, &finished, None, completed, None).await?;

    assert_eq!(
        store.instance_cancel(&child, false).await?,
        AppendOutcome::Appended
    );
    assert_eq!(status(store, &grandchild).await?, Status::Running);
    assert!(journal_rows(store, &root)
        .await?
        .contains(&(child_step, json!({"cancelled": true}))));

    let before = journal_rows(store, &root).await?;
    assert_eq!(
        store.instance_cancel(&root, true).await?,
        AppendOutcome::Appended
    );
    assert_eq!(status(store, &spared).await?, Status::Cancelled);
    assert_eq!(status(store, &finished).await?, Status::Completed);
    // The child was already closed, so its own child was not reached through it.
    assert_eq!(status(store, &grandchild).await?, Status::Running);
    // The descendants' deliveries land on a cancelled parent and are refused.
    let after = journal_rows(store, &root).await?;
    assert_eq!(after.len(), before.len() + 1);
    assert_eq!(
        after.last().map(|(step, _)| step.as_str()),
        Some(Marker::Cancelled.step_name())
    );

    let top = started(store, "top").await?;
    let (middle, _, _) = spawn_child(store, &top, "middle").await?;
    let (bottom, _, _) = spawn_child(store, &middle, "bottom").await?;
    store.instance_cancel(&top, true).await?;
    assert_eq!(status(store, &middle).await?, Status::Cancelled);
    assert_eq!(status(store, &bottom).await?, Status::Cancelled);

    let missing = key("wf", "missing");
    assert!(store
        .instance_cancel(&missing, true)
        .await
        .unwrap_err()
        .is_not_found());
    Ok(())
}
