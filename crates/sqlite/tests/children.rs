//! Child spawns (child.sql's `keiro_child_spawn`) and the delivery of every terminal path into
//! the parent. The assertions of crates/postgres/tests/child_delivery.rs, of the memory store's
//! tests (crates/memory/src/sources.rs) and of the suite's custody scenarios (wake_edges.rs)
//! on the store operation under them.

mod common;

use common::{claim, pinned, start, T0, TTL};
use keiro_journal::store::{Append, AppendOutcome, Park};
use keiro_journal::{
    store::child_result_step, store::ChildSpawn, store::StartRequest, Event, InstanceKey, Status,
    StepKind,
};
use keiro_lease::{Crash, CrashOutcome};
use keiro_sqlite::SqliteStore;
use serde_json::{json, Value};

fn child_key(id: &str) -> InstanceKey {
    InstanceKey::parse("child", id).unwrap()
}

/// The parent's spawn-step append for `child`.
fn spawn_step(parent: &InstanceKey, child: &InstanceKey) -> Append {
    Append::external(
        parent.clone(),
        Event::StepRecorded {
            step: format!("child:{}/{}", child.name, child.id),
            kind: StepKind::Child,
            result: json!({"name": child.name.as_str(), "id": child.id.as_str()}),
        },
    )
}

fn spawn_of(child: &InstanceKey) -> ChildSpawn {
    ChildSpawn {
        child: child.clone(),
        input: json!({"for": child.id.as_str()}),
        await_step: child_result_step(child),
    }
}

async fn park(store: &SqliteStore, key: &InstanceKey, awaited: &str) {
    store
        .instance_park(&Park {
            key: key.clone(),
            generation: 0,
            fence: None,
            awaited: vec![awaited.to_owned()],
            wake_after: Some(T0 + time::Duration::hours(1)),
        })
        .await
        .unwrap();
}

async fn status(store: &SqliteStore, key: &InstanceKey) -> Status {
    store.instance_get(key).await.unwrap().unwrap().status
}

/// What `parent` has journaled under `child`'s result step.
async fn delivered(store: &SqliteStore, parent: &InstanceKey, child: &InstanceKey) -> Vec<Value> {
    let step = child_result_step(child);
    store
        .journal_history(parent)
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

/// Spawns `child` from a started `parent` and parks the parent on its result.
async fn family(store: &SqliteStore, parent: &InstanceKey, child: &InstanceKey) {
    assert_eq!(
        store
            .child_spawn(&spawn_step(parent, child), &spawn_of(child))
            .await
            .unwrap(),
        AppendOutcome::Appended
    );
    park(store, parent, &child_result_step(child)).await;
    assert_eq!(status(store, parent).await, Status::Suspended);
}

async fn complete(store: &SqliteStore, key: &InstanceKey, output: Value) -> AppendOutcome {
    store
        .journal_append(&Append::external(
            key.clone(),
            Event::WorkflowCompleted { output },
        ))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_spawn_creates_the_linked_child_once() {
    let (_dir, store) = pinned("c-once");
    let parent = start(&store, "p-1").await;
    let child = child_key("c-1");
    family(&store, &parent, &child).await;
    let row = store.instance_get(&child).await.unwrap().expect("spawned");
    assert_eq!(
        (
            row.status,
            row.generation,
            row.input,
            row.parent,
            row.priority
        ),
        (
            Status::Running,
            0,
            json!({"for": "c-1"}),
            Some(parent.clone()),
            0
        )
    );
    let conn = rusqlite::Connection::open(store.path()).unwrap();
    let link: (Option<i32>, Option<String>) = conn
        .query_row(
            "SELECT parent_generation, parent_step FROM workflows \
             WHERE workflow_name = 'child' AND workflow_id = 'c-1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(link, (Some(0), Some(child_result_step(&child))));

    // A replayed spawn converges on the recorded step and creates nothing.
    let other = child_key("c-other");
    let replay = ChildSpawn {
        child: other.clone(),
        ..spawn_of(&child)
    };
    assert!(matches!(
        store
            .child_spawn(&spawn_step(&parent, &child), &replay)
            .await
            .unwrap(),
        AppendOutcome::AlreadyPresent(_)
    ));
    assert!(store.instance_get(&other).await.unwrap().is_none());
}

#[tokio::test]
async fn every_terminal_path_of_a_child_journals_its_envelope_into_the_parent() {
    let (_dir, store) = pinned("c-paths");
    let parent = start(&store, "parent").await;
    let [done, crashed, diverged, cancelled, rotated] =
        ["done", "crashed", "diverged", "cancelled", "rotated"].map(child_key);
    for child in [&done, &crashed, &diverged, &cancelled, &rotated] {
        assert_eq!(
            store
                .child_spawn(&spawn_step(&parent, child), &spawn_of(child))
                .await
                .unwrap(),
            AppendOutcome::Appended
        );
    }
    park(&store, &parent, &child_result_step(&done)).await;

    complete(&store, &done, json!(42)).await;
    assert_eq!(status(&store, &parent).await, Status::Running);
    let fence = claim(&store, &crashed, "w").await;
    let crash = Crash {
        error: "boom".into(),
        retry_delay: TTL,
        max_attempts: 1,
    };
    assert_eq!(
        store
            .instance_record_crash(&crashed, &fence, &crash)
            .await
            .unwrap(),
        CrashOutcome::Failed { attempts: 1 }
    );
    store
        .instance_fail_diverged(&diverged, None, "code changed")
        .await
        .unwrap();
    store.instance_cancel(&cancelled, false).await.unwrap();
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!(null),
    };
    store
        .journal_append(&Append::external(rotated.clone(), rotate))
        .await
        .unwrap();

    let results: Vec<_> = store
        .journal_history(&parent)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event.encode())
        .filter(|e| e.step_name.ends_with(":result"))
        .map(|e| (e.step_name, e.payload))
        .collect();
    assert_eq!(
        results,
        [
            (child_result_step(&done), json!({"ok": 42})),
            (child_result_step(&crashed), json!({"failed": "boom"})),
            (
                child_result_step(&diverged),
                json!({"failed": "code changed"})
            ),
            (child_result_step(&cancelled), json!({"cancelled": true})),
        ]
    );
    let kinds = store.journal_history(&parent).await.unwrap();
    assert!(kinds.iter().all(|entry| matches!(
        entry.event,
        Event::StepRecorded {
            kind: StepKind::Child,
            ..
        }
    )));
    // The continued child delivers once its run ends.
    complete(&store, &rotated, json!("done")).await;
    assert_eq!(
        delivered(&store, &parent, &rotated).await,
        vec![json!({"ok": "done"})]
    );
}

#[tokio::test]
async fn a_parent_that_cannot_take_the_result_is_ignored() {
    let (_dir, store) = pinned("c-ignored");
    // A finished parent: the child still completes, and nothing lands in the parent.
    let (parent, child) = (start(&store, "p-1").await, child_key("c-1"));
    family(&store, &parent, &child).await;
    store
        .journal_append(&Append::external(parent.clone(), Event::WorkflowCancelled))
        .await
        .unwrap();
    assert_eq!(
        complete(&store, &child, json!(1)).await,
        AppendOutcome::Appended
    );
    assert_eq!(status(&store, &child).await, Status::Completed);
    assert!(delivered(&store, &parent, &child).await.is_empty());

    // A parent that moved on to another generation: the old generation takes nothing.
    let (parent, child) = (start(&store, "p-2").await, child_key("c-2"));
    family(&store, &parent, &child).await;
    store
        .journal_append(&Append::external(
            parent.clone(),
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!(null),
            },
        ))
        .await
        .unwrap();
    complete(&store, &child, json!(1)).await;
    assert_eq!(status(&store, &child).await, Status::Completed);
    assert!(delivered(&store, &parent, &child).await.is_empty());
}

#[tokio::test]
async fn spawning_an_existing_instance_adopts_it_or_delivers_its_result() {
    let (_dir, store) = pinned("c-adopt");
    // Already finished: its result reaches the spawner in the spawn's transaction.
    let parent = start(&store, "p-1").await;
    let done = child_key("done");
    store
        .instance_start(&StartRequest {
            key: done.clone(),
            input: json!("own input"),
            parent: None,
            priority: 3,
        })
        .await
        .unwrap();
    complete(&store, &done, json!("early")).await;
    store
        .child_spawn(&spawn_step(&parent, &done), &spawn_of(&done))
        .await
        .unwrap();
    assert_eq!(
        delivered(&store, &parent, &done).await,
        vec![json!({"ok": "early"})]
    );
    let row = store.instance_get(&done).await.unwrap().expect("row");
    assert_eq!(
        (row.input, row.priority, row.parent),
        (json!("own input"), 3, Some(parent.clone())),
        "adopted, input untouched"
    );

    // Still running and unlinked: adopted, and its completion is delivered later.
    let live = child_key("live");
    store
        .instance_start(&StartRequest {
            key: live.clone(),
            input: json!("own input"),
            parent: None,
            priority: 0,
        })
        .await
        .unwrap();
    store
        .child_spawn(&spawn_step(&parent, &live), &spawn_of(&live))
        .await
        .unwrap();
    assert!(delivered(&store, &parent, &live).await.is_empty());
    complete(&store, &live, json!("late")).await;
    assert_eq!(
        delivered(&store, &parent, &live).await,
        vec![json!({"ok": "late"})]
    );

    // A closed parent refuses a result quietly, and a cascading cancel of it is a repeat.
    let late = child_key("late-child");
    family(&store, &parent, &late).await;
    store.instance_cancel(&parent, false).await.unwrap();
    let before = store.journal_history(&parent).await.unwrap().len();
    assert_eq!(
        complete(&store, &late, json!(1)).await,
        AppendOutcome::Appended
    );
    assert_eq!(store.journal_history(&parent).await.unwrap().len(), before);
    assert_eq!(
        store.instance_cancel(&parent, true).await.unwrap(),
        AppendOutcome::AlreadyPresent(Value::Null)
    );
}

#[tokio::test]
async fn a_running_child_of_another_parent_refuses_the_spawn() {
    let (_dir, store) = pinned("c-taken");
    let (first, second) = (start(&store, "o-1").await, start(&store, "o-2").await);
    let child = child_key("tenant-1");
    family(&store, &first, &child).await;

    let step = spawn_step(&second, &child);
    let outcome = store.child_spawn(&step, &spawn_of(&child)).await.unwrap();
    let taken = json!({"name": "wf", "id": "o-1"});
    assert_eq!(
        outcome,
        AppendOutcome::AlreadyPresent(json!({
            "name": "child", "id": "tenant-1", "taken": taken
        }))
    );
    // The spawn row holds the refusal, and the awaited step is answered with it.
    let rows: Vec<_> = store
        .journal_history(&second)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event.encode())
        .map(|e| (e.step_name, e.payload))
        .collect();
    assert_eq!(
        rows,
        [
            (
                "child:child/tenant-1".to_owned(),
                json!({"name": "child", "id": "tenant-1", "taken": taken})
            ),
            (child_result_step(&child), json!({ "taken": taken })),
        ]
    );
    // The child still answers its own parent, and only it.
    let row = store.instance_get(&child).await.unwrap().unwrap();
    assert_eq!(row.parent, Some(first.clone()));
    complete(&store, &child, json!(7)).await;
    assert_eq!(
        delivered(&store, &first, &child).await,
        vec![json!({"ok": 7})]
    );
    assert_eq!(delivered(&store, &second, &child).await.len(), 1);

    // Once the child has finished, a spawn reads its result, whoever its parent was.
    let third = start(&store, "o-3").await;
    store
        .child_spawn(&spawn_step(&third, &child), &spawn_of(&child))
        .await
        .unwrap();
    assert_eq!(
        delivered(&store, &third, &child).await,
        vec![json!({"ok": 7})]
    );
    let row = store.instance_get(&child).await.unwrap().unwrap();
    assert_eq!(row.parent, Some(first), "a linked child keeps its parent");
}

#[tokio::test]
async fn a_parent_that_continued_as_new_takes_its_running_child_back() {
    let (_dir, store) = pinned("c-rotor");
    let rotor = start(&store, "r-1").await;
    let child = child_key("tenant-2");
    family(&store, &rotor, &child).await;
    store
        .journal_append(&Append::external(
            rotor.clone(),
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!(1),
            },
        ))
        .await
        .unwrap();
    // Generation 1 spawns the same child again: the link moves to it.
    let again = Append {
        generation: Some(1),
        ..spawn_step(&rotor, &child)
    };
    assert_eq!(
        store.child_spawn(&again, &spawn_of(&child)).await.unwrap(),
        AppendOutcome::Appended
    );
    complete(&store, &child, json!(5)).await;
    let history = store.journal_history(&rotor).await.unwrap();
    let results: Vec<_> = history
        .iter()
        .filter(|e| e.event.step_name() == child_result_step(&child))
        .map(|e| e.generation)
        .collect();
    assert_eq!(results, [1], "delivered to generation 1 only");
}
