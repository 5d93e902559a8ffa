//! Cancellation, plain and cascading, and the settling of a completed run's leftovers
//! (instance.sql), with the assertions of crates/postgres/tests/cancel_cascade.rs. The parent
//! links a spawn writes are written directly: child_spawn is not in this store yet.

mod common;

use std::path::Path;

use common::{append, pinned, start};
use keiro_journal::store::{AppendOutcome, Park};
use keiro_journal::{Event, InstanceKey, Marker, Status};
use keiro_sqlite::SqliteStore;
use rusqlite::Connection;
use serde_json::{json, Value};

fn result_step(child: &InstanceKey) -> String {
    format!("child:{}", child.id)
}

/// Starts `child` linked to `parent`'s generation 0, its result awaited under
/// [`result_step`].
async fn link(store: &SqliteStore, path: &Path, parent: &InstanceKey, child: &str) -> InstanceKey {
    let child = start(store, child).await;
    let raw = Connection::open(path).unwrap();
    raw.execute(
        "UPDATE workflows SET parent_name = ?1, parent_id = ?2, parent_generation = 0, \
         parent_step = ?3 WHERE workflow_name = ?4 AND workflow_id = ?5",
        [
            parent.name.as_str(),
            parent.id.as_str(),
            &result_step(&child),
            child.name.as_str(),
            child.id.as_str(),
        ],
    )
    .unwrap();
    child
}

async fn status(store: &SqliteStore, key: &InstanceKey) -> Status {
    store.instance_get(key).await.unwrap().unwrap().status
}

async fn recorded(store: &SqliteStore, key: &InstanceKey, step: &str) -> Vec<Value> {
    store
        .journal_load(key, 0)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event.step_name() == step)
        .filter_map(|e| match e.event {
            Event::StepRecorded { result, .. } => Some(result),
            _ => None,
        })
        .collect()
}

/// root → a → a1, root → b, and `done`, a finished child of root; root parked on a and b.
async fn tree(store: &SqliteStore, path: &Path) -> [InstanceKey; 5] {
    let root = start(store, "root").await;
    let a = link(store, path, &root, "a").await;
    let a1 = link(store, path, &a, "a1").await;
    let b = link(store, path, &root, "b").await;
    let done = link(store, path, &root, "done").await;
    append(
        store,
        &done,
        None,
        Event::WorkflowCompleted { output: json!(1) },
        None,
    )
    .await
    .unwrap();
    store
        .instance_park(&Park {
            key: root.clone(),
            generation: 0,
            fence: None,
            awaited: vec![result_step(&a), result_step(&b)],
            wake_after: None,
        })
        .await
        .unwrap();
    assert_eq!(status(store, &root).await, Status::Suspended);
    [root, a, a1, b, done]
}

#[tokio::test]
async fn a_cascade_cancels_every_live_descendant() {
    let (dir, store) = pinned("c-cascade");
    let [root, a, a1, b, done] = tree(&store, &dir.file("keiro.db")).await;
    assert_eq!(
        store.instance_cancel(&root, true).await.unwrap(),
        AppendOutcome::Appended
    );
    for k in [&root, &a, &a1, &b] {
        assert_eq!(status(&store, k).await, Status::Cancelled, "{k}");
    }
    assert_eq!(
        status(&store, &done).await,
        Status::Completed,
        "finished children stay"
    );
    // Each child's delivery into its already cancelled parent was refused and ignored.
    assert!(recorded(&store, &root, &result_step(&a)).await.is_empty());
    assert!(recorded(&store, &a, &result_step(&a1)).await.is_empty());
    assert_eq!(
        store.instance_cancel(&root, true).await.unwrap(),
        AppendOutcome::AlreadyPresent(json!(null)),
        "a repeat converges"
    );
}

#[tokio::test]
async fn without_cascade_only_the_instance_is_cancelled() {
    let (dir, store) = pinned("c-plain");
    let [root, a, a1, b, _] = tree(&store, &dir.file("keiro.db")).await;
    assert_eq!(
        store.instance_cancel(&root, false).await.unwrap(),
        AppendOutcome::Appended
    );
    assert_eq!(status(&store, &root).await, Status::Cancelled);
    for k in [&a, &a1, &b] {
        assert_eq!(status(&store, k).await, Status::Running, "{k}");
    }
}

#[tokio::test]
async fn cancelling_a_subtree_tells_its_parent() {
    let (dir, store) = pinned("c-subtree");
    let [root, a, a1, b, _] = tree(&store, &dir.file("keiro.db")).await;
    assert_eq!(
        store.instance_cancel(&a, true).await.unwrap(),
        AppendOutcome::Appended
    );
    assert_eq!(
        (
            status(&store, &a).await,
            status(&store, &a1).await,
            status(&store, &b).await
        ),
        (Status::Cancelled, Status::Cancelled, Status::Running)
    );
    assert_eq!(
        recorded(&store, &root, &result_step(&a)).await,
        vec![json!({"cancelled": true})],
        "the surviving parent learns its child was cancelled"
    );
    assert_eq!(status(&store, &root).await, Status::Running, "and is woken");
}

#[tokio::test]
async fn a_finished_or_missing_instance_is_not_cancelled() {
    let (dir, store) = pinned("c-finished");
    let [root, a, ..] = tree(&store, &dir.file("keiro.db")).await;
    append(
        &store,
        &root,
        None,
        Event::WorkflowCompleted { output: json!(0) },
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        store.instance_cancel(&root, true).await.unwrap(),
        AppendOutcome::RefusedTerminal(Marker::Completed)
    );
    assert_eq!(
        status(&store, &a).await,
        Status::Running,
        "no cascade from a refusal"
    );
    let missing = InstanceKey::parse("wf", "nope").unwrap();
    assert!(store
        .instance_cancel(&missing, true)
        .await
        .unwrap_err()
        .is_not_found());
}

#[tokio::test]
async fn a_cycle_of_parent_links_does_not_loop() {
    let (dir, store) = pinned("c-cycle");
    let path = dir.file("keiro.db");
    let x = start(&store, "x").await;
    let y = link(&store, &path, &x, "y").await;
    // x adopted by y, as a spawn of x by y would.
    let raw = Connection::open(&path).unwrap();
    raw.execute(
        "UPDATE workflows SET parent_name = 'wf', parent_id = 'y', parent_generation = 0, \
         parent_step = 'child:x' WHERE workflow_id = 'x'",
        [],
    )
    .unwrap();
    assert_eq!(
        store.instance_cancel(&x, true).await.unwrap(),
        AppendOutcome::Appended
    );
    assert_eq!(
        (status(&store, &x).await, status(&store, &y).await),
        (Status::Cancelled, Status::Cancelled)
    );
}

#[tokio::test]
async fn a_completed_runs_leftovers_are_settled_and_only_then() {
    let (dir, store) = pinned("c-leftovers");
    let key = start(&store, "a").await;
    let raw = Connection::open(dir.file("keiro.db")).unwrap();
    raw.execute_batch(
        "INSERT INTO awakeables (id, workflow_name, workflow_id, generation, created_at) \
             VALUES ('00000000-0000-0000-0000-000000000001', 'wf', 'a', 0, 0); \
         INSERT INTO remote_tasks (step_id, workflow_name, workflow_id, generation, step, \
             journal_step, grp, input, max_attempts, backoff_initial_ms, backoff_max_ms, \
             backoff_jitter, redispatch_max, available_at, created_at, updated_at) \
             VALUES ('t1', 'wf', 'a', 0, 'r', 'remote:r', 'r', 'null', 1, 1, 1, 0, 1, 0, 0, 0);",
    )
    .unwrap();
    assert_eq!(
        store.instance_settle_leftovers(&key, 0).await.unwrap(),
        0,
        "running"
    );
    append(
        &store,
        &key,
        None,
        Event::WorkflowCompleted { output: json!(1) },
        None,
    )
    .await
    .unwrap();
    assert_eq!(store.instance_settle_leftovers(&key, 0).await.unwrap(), 2);
    assert_eq!(
        store.instance_settle_leftovers(&key, 0).await.unwrap(),
        0,
        "once"
    );
}
