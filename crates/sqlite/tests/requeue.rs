//! The operator's recovery (instance.sql's requeue and fix-and-replay), with the assertions of
//! the memory store's tests (crates/memory/src/remote.rs). A remote step's failure is made by
//! its loss at its redispatch deadline, since the worker side is not in this store yet.

mod common;

use std::time::Duration;

use common::{append, pinned, start, T0};
use keiro_journal::store::{Append, AppendOutcome, Park};
use keiro_journal::{
    store::child_result_step, store::marker_name, store::remote_step_id, store::ChildSpawn,
    store::RemoteArm, Backoff, Event, InstanceKey, Status, StepKind,
};
use keiro_remote::{RequeueOutcome, RetryOutcome};
use keiro_sqlite::SqliteStore;
use rusqlite::Connection;
use serde_json::{json, Value};

/// `(stored name, kind, payload)` of every row of generation 0 of `key`, in order.
fn rows(store: &SqliteStore, key: &InstanceKey) -> Vec<(String, String, Value)> {
    let conn = Connection::open(store.path()).unwrap();
    let mut statement = conn
        .prepare(
            "SELECT step_name, kind, payload FROM journal WHERE workflow_name = ?1 \
             AND workflow_id = ?2 AND generation = 0 ORDER BY seq",
        )
        .unwrap();
    statement
        .query_map([key.name.as_str(), key.id.as_str()], |r| {
            let payload: String = r.get(2)?;
            Ok((
                r.get(0)?,
                r.get(1)?,
                serde_json::from_str(&payload).unwrap(),
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn row(step_name: &str, kind: &str, payload: Value) -> (String, String, Value) {
    (step_name.to_owned(), kind.to_owned(), payload)
}

fn link_step(store: &SqliteStore, key: &InstanceKey) -> Option<String> {
    Connection::open(store.path())
        .unwrap()
        .query_row(
            "SELECT parent_step FROM workflows WHERE workflow_name = ?1 AND workflow_id = ?2",
            [key.name.as_str(), key.id.as_str()],
            |r| r.get(0),
        )
        .unwrap()
}

async fn status(store: &SqliteStore, key: &InstanceKey) -> Status {
    store.instance_get(key).await.unwrap().unwrap().status
}

async fn fail(store: &SqliteStore, key: &InstanceKey, reason: &str) {
    let failed = Event::WorkflowFailed {
        reason: reason.to_owned(),
    };
    let outcome = append(store, key, None, failed, None).await.unwrap();
    assert_eq!(outcome, AppendOutcome::Appended);
}

async fn complete(store: &SqliteStore, key: &InstanceKey, output: Value) {
    let completed = Event::WorkflowCompleted { output };
    let outcome = append(store, key, None, completed, None).await.unwrap();
    assert_eq!(outcome, AppendOutcome::Appended);
}

/// Spawns `child/<id>` from `parent`; returns the child and the step its result goes to.
async fn spawn(store: &SqliteStore, parent: &InstanceKey, id: &str) -> (InstanceKey, String) {
    let child = InstanceKey::parse("child", id).unwrap();
    let await_step = child_result_step(&child);
    let append = Append::external(
        parent.clone(),
        Event::StepRecorded {
            step: format!("child:{}/{}", child.name, child.id),
            kind: StepKind::Child,
            result: json!({"name": child.name, "id": child.id}),
        },
    );
    let spawn = ChildSpawn {
        child: child.clone(),
        input: json!(null),
        await_step: await_step.clone(),
    };
    store.child_spawn(&append, &spawn).await.unwrap();
    (child, await_step)
}

async fn park(store: &SqliteStore, key: &InstanceKey, awaited: &str) {
    store
        .instance_park(&Park {
            key: key.clone(),
            generation: 0,
            fence: None,
            awaited: vec![awaited.to_owned()],
            wake_after: None,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_requeue_resets_failures_in_journal_order_and_redispatches_the_task() {
    let (_dir, store) = pinned("q-order");
    let key = start(&store, "a").await;
    // The child is gone (never existed here): its failure is reset all the same.
    let gone = InstanceKey::parse("child", "gone").unwrap();
    let child_step = child_result_step(&gone);
    let failed_child = Event::StepRecorded {
        step: child_step.clone(),
        kind: StepKind::Child,
        result: json!({"failed": "boom"}),
    };
    append(&store, &key, None, failed_child, None)
        .await
        .unwrap();
    let once = RemoteArm {
        step_id: remote_step_id(&key, 0, "label"),
        key: key.clone(),
        generation: 0,
        step: "label".into(),
        journal_step: "remote:label".into(),
        group: "label".into(),
        input: json!(null),
        priority: 0,
        traceparent: None,
        max_attempts: 1,
        backoff: Backoff::default(),
        redispatch_after: Some(Duration::from_secs(600)),
        redispatch_max: 1,
        fence: None,
    };
    store.remote_arm(&once).await.unwrap();
    store.advance_clock(Duration::from_secs(600));
    store.remote_arm(&once).await.unwrap();
    fail(&store, &key, "failed").await;

    assert_eq!(
        store.instance_requeue(&key).await.unwrap(),
        RequeueOutcome::Requeued {
            reset_steps: 2,
            children: vec![]
        }
    );
    let resets: Vec<_> = rows(&store, &key)
        .into_iter()
        .filter(|(_, kind, _)| kind == "reset")
        .map(|(step, _, _)| step)
        .collect();
    assert_eq!(
        resets,
        [
            format!("__workflow_step_reset__:{child_step}"),
            "__workflow_step_reset__:remote:label".to_owned(),
        ]
    );
    let task: (String, i32, i32, String, Option<i64>) = Connection::open(store.path())
        .unwrap()
        .query_row(
            "SELECT status, attempts, dispatches, journal_step, deadline_at FROM remote_tasks",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    let deadline = (T0 + time::Duration::minutes(20)).unix_timestamp() * 1_000_000;
    assert_eq!(
        task,
        (
            "pending".to_owned(),
            0,
            1,
            "remote:label#1".to_owned(),
            Some(deadline)
        )
    );
    assert_eq!(status(&store, &key).await, Status::Running);
    assert_eq!(
        store.instance_requeue(&key).await.unwrap(),
        RequeueOutcome::NotFailed(Status::Running)
    );
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert_eq!(
        store.instance_requeue(&missing).await.unwrap(),
        RequeueOutcome::NotFound
    );
}

#[tokio::test]
async fn a_requeue_cascades_to_failed_children_and_relinks_them() {
    let (_dir, store) = pinned("q-cascade");
    let root = start(&store, "root").await;
    let (child, child_step) = spawn(&store, &root, "c").await;
    let (grandchild, grandchild_step) = spawn(&store, &child, "g").await;
    park(&store, &root, &child_step).await;
    fail(&store, &grandchild, "boom").await;
    fail(&store, &child, "grandchild failed").await;
    fail(&store, &root, "child failed").await;
    assert_eq!(
        rows(&store, &root)[1],
        row(&child_step, "child", json!({"failed": "grandchild failed"}))
    );

    assert_eq!(
        store.instance_requeue(&root).await.unwrap(),
        RequeueOutcome::Requeued {
            reset_steps: 2,
            children: vec![child.clone(), grandchild.clone()]
        }
    );
    for key in [&root, &child, &grandchild] {
        assert_eq!(status(&store, key).await, Status::Running);
        assert_eq!(
            rows(&store, key).pop(),
            Some(row(marker_name::RESURRECTED, "resurrected", Value::Null))
        );
    }
    assert!(rows(&store, &root).contains(&row(
        &format!("__workflow_step_reset__:{child_step}"),
        "reset",
        json!({"step": child_step, "superseded": child_step})
    )));
    assert_eq!(link_step(&store, &child), Some(format!("{child_step}#1")));
    assert_eq!(
        link_step(&store, &grandchild),
        Some(format!("{grandchild_step}#1"))
    );

    complete(&store, &grandchild, json!("g")).await;
    complete(&store, &child, json!("c")).await;
    let child_rows = rows(&store, &child);
    assert_eq!(
        child_rows[child_rows.len() - 2..],
        [
            row(&format!("{grandchild_step}#1"), "child", json!({"ok": "g"})),
            row(marker_name::COMPLETED, "completed", json!("c")),
        ]
    );
    assert_eq!(
        rows(&store, &root).pop(),
        Some(row(&format!("{child_step}#1"), "child", json!({"ok": "c"})))
    );
}

#[tokio::test]
async fn a_requeue_delivers_a_success_the_failed_parent_could_not_take() {
    let (_dir, store) = pinned("q-success");
    let parent = start(&store, "parent").await;
    let (child, child_step) = spawn(&store, &parent, "c").await;
    fail(&store, &child, "boom").await;
    fail(&store, &parent, "child failed").await;
    store.instance_resurrect(&child).await.unwrap();
    complete(&store, &child, json!("fixed")).await;
    let before = rows(&store, &parent);

    assert_eq!(
        store.instance_requeue(&parent).await.unwrap(),
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: vec![]
        }
    );
    let after = rows(&store, &parent);
    assert_eq!(after[..before.len()], before[..]);
    assert_eq!(
        after[before.len()..],
        [
            row(
                &format!("__workflow_step_reset__:{child_step}"),
                "reset",
                json!({"step": child_step, "superseded": child_step})
            ),
            row(marker_name::RESURRECTED, "resurrected", Value::Null),
            row(&format!("{child_step}#1"), "child", json!({"ok": "fixed"})),
        ]
    );
    assert_eq!(status(&store, &parent).await, Status::Running);
    assert_eq!(status(&store, &child).await, Status::Completed);
}

#[tokio::test]
async fn a_requeue_reaches_each_instance_of_a_cycle_once() {
    let (_dir, store) = pinned("q-cycle");
    let a = start(&store, "a").await;
    let b = start(&store, "b").await;
    for (key, other) in [(&a, &b), (&b, &a)] {
        let result = Event::StepRecorded {
            step: child_result_step(other),
            kind: StepKind::Child,
            result: json!({"failed": "x"}),
        };
        append(&store, key, None, result, None).await.unwrap();
    }
    fail(&store, &a, "b failed").await;
    fail(&store, &b, "a failed").await;

    assert_eq!(
        store.instance_requeue(&a).await.unwrap(),
        RequeueOutcome::Requeued {
            reset_steps: 2,
            children: vec![b.clone()]
        }
    );
    for key in [&a, &b] {
        assert_eq!(status(&store, key).await, Status::Running);
        let resets = rows(&store, key)
            .iter()
            .filter(|(_, kind, _)| kind == "reset")
            .count();
        assert_eq!(resets, 1);
    }
}

#[tokio::test]
async fn a_handled_failure_is_not_reset_unless_the_run_failed_on_it() {
    let (_dir, store) = pinned("q-handled");
    let key = start(&store, "a").await;
    let gone = InstanceKey::parse("child", "gone").unwrap();
    let failed_child = |key: &InstanceKey| {
        Append::external(
            key.clone(),
            Event::StepRecorded {
                step: child_result_step(&gone),
                kind: StepKind::Child,
                result: json!({"failed": "boom"}),
            },
        )
    };
    store.journal_append(&failed_child(&key)).await.unwrap();
    // The body went on past it (a fallback ran), and failed for another reason.
    store
        .journal_append(&common::step(&key, "fallback", json!(1), None))
        .await
        .unwrap();
    fail(&store, &key, "something else").await;
    assert_eq!(
        store.instance_requeue(&key).await.unwrap(),
        RequeueOutcome::Requeued {
            reset_steps: 0,
            children: vec![]
        }
    );
    // The same, but the run failed on the child after all: it is reset.
    let other = start(&store, "b").await;
    store.journal_append(&failed_child(&other)).await.unwrap();
    store
        .journal_append(&common::step(&other, "fallback", json!(1), None))
        .await
        .unwrap();
    fail(&store, &other, "child workflow child/gone failed: boom").await;
    assert_eq!(
        store.instance_requeue(&other).await.unwrap(),
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: vec![]
        }
    );
}

#[tokio::test]
async fn a_retry_with_input_takes_the_origins_link_and_delivers_only_its_success() {
    let (_dir, store) = pinned("q-retry");
    let parent = start(&store, "parent").await;
    let (child, child_step) = spawn(&store, &parent, "c").await;
    fail(&store, &child, "bad input").await;
    fail(&store, &parent, "child failed").await;
    store.instance_requeue(&parent).await.unwrap();
    let revised = format!("{child_step}#1");
    let fix = |hex: &str| InstanceKey::parse("child", &format!("c~retry~{hex}")).unwrap();

    let missing = InstanceKey::parse("child", "missing").unwrap();
    assert_eq!(
        store
            .instance_retry_with_input(&missing, &fix("00000000"), &json!(1))
            .await
            .unwrap(),
        RetryOutcome::OriginNotFound
    );
    let first = fix("0000000a");
    assert_eq!(
        store
            .instance_retry_with_input(&child, &first, &json!("good"))
            .await
            .unwrap(),
        RetryOutcome::Started(first.clone())
    );
    assert_eq!(
        store
            .instance_retry_with_input(&child, &first, &json!("other"))
            .await
            .unwrap(),
        RetryOutcome::Exists(first.clone())
    );
    let started = store.instance_get(&first).await.unwrap().unwrap();
    assert_eq!(
        (
            started.status,
            started.input,
            started.parent,
            started.priority
        ),
        (Status::Running, json!("good"), Some(parent.clone()), 0)
    );
    assert_eq!(link_step(&store, &first), Some(revised.clone()));

    // A fix's failure or cancellation is not its origin's result.
    fail(&store, &first, "still bad").await;
    let second = fix("0000000b");
    store
        .instance_retry_with_input(&child, &second, &json!("better"))
        .await
        .unwrap();
    store.instance_cancel(&second, false).await.unwrap();
    assert!(rows(&store, &parent)
        .iter()
        .all(|(step, _, _)| *step != revised));

    let third = fix("0000000c");
    store
        .instance_retry_with_input(&child, &third, &json!("best"))
        .await
        .unwrap();
    complete(&store, &third, json!("done")).await;
    assert_eq!(
        rows(&store, &parent).pop(),
        Some(row(&revised, "child", json!({"ok": "done"})))
    );
    // The origin's own late result finds the step taken.
    fail(&store, &child, "late").await;
    assert_eq!(
        rows(&store, &parent).pop(),
        Some(row(&revised, "child", json!({"ok": "done"})))
    );

    // Priority and parent (none here) come from the origin.
    let lone = keiro_journal::store::StartRequest {
        key: InstanceKey::parse("wf", "lone").unwrap(),
        input: json!(null),
        parent: None,
        priority: 4,
    };
    store.instance_start(&lone).await.unwrap();
    let lone_fix = InstanceKey::parse("wf", "lone~retry~00000001").unwrap();
    store
        .instance_retry_with_input(&lone.key, &lone_fix, &json!(2))
        .await
        .unwrap();
    let row_fix = store.instance_get(&lone_fix).await.unwrap().unwrap();
    assert_eq!((row_fix.priority, row_fix.parent), (4, None));
    let err = store
        .instance_retry_with_input(&lone.key, &lone_fix, &json!("\u{0}"))
        .await
        .unwrap_err();
    assert!(err.is_value_refused(), "{err}");
}

#[tokio::test]
async fn a_requeue_delivers_the_success_of_a_fix_made_while_the_parent_was_failed() {
    let (_dir, store) = pinned("q-fix");
    let parent = start(&store, "parent").await;
    let (child, child_step) = spawn(&store, &parent, "c").await;
    fail(&store, &child, "bad input").await;
    fail(&store, &parent, "child failed").await;
    let fix = InstanceKey::parse("child", "c~retry~0000000a").unwrap();
    store
        .instance_retry_with_input(&child, &fix, &json!("good"))
        .await
        .unwrap();
    assert_eq!(link_step(&store, &fix), Some(child_step.clone()));
    complete(&store, &fix, json!("done")).await;

    assert_eq!(
        store.instance_requeue(&parent).await.unwrap(),
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: vec![]
        }
    );
    assert_eq!(
        rows(&store, &parent).pop(),
        Some(row(
            &format!("{child_step}#1"),
            "child",
            json!({"ok": "done"})
        ))
    );
    // The failed origin was not requeued: the fix answered for it.
    assert_eq!(status(&store, &child).await, Status::Failed);
}
