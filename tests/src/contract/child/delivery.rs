//! A child's terminal transaction journals its result envelope into the parent's spawning
//! generation under the awaited step and wakes the parent: on completion, failure, the crash
//! ceiling, divergence and cancellation, but not on continue-as-new.

#[allow(clippy::wildcard_imports)] // the shared tools, some of them per scenario
use crate::contract::support::*;
use crate::Harness;
use keiro_journal::{
    store::child_result_step, store::ChildSpawn, Append, AppendOutcome, Event, InstanceKey, Status,
    StepKind,
};
use keiro_lease::{Crash, CrashOutcome, LeaseStore};
use serde_json::{json, Value};
use std::time::Duration;

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

/// Starts a parked parent and spawns `child` from it.
async fn family(
    store: &dyn LeaseStore,
    parent: &InstanceKey,
    child: &InstanceKey,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    start_parked(store, parent).await?;
    assert_eq!(
        store
            .child_spawn(&spawn_step(parent, child), &spawn_of(child))
            .await?,
        AppendOutcome::Appended
    );
    // The spawn step itself woke the parent; park it again, as its run would.
    store
        .instance_park(&keiro_journal::store::Park {
            key: parent.clone(),
            generation: 0,
            fence: None,
            awaited: vec![child_result_step(child)],
            wake_after: None,
        })
        .await?;
    assert_eq!(status(store, parent).await?, Status::Suspended);
    Ok(())
}

/// What the parent has journaled under the child's result step.
async fn delivered(
    store: &dyn LeaseStore,
    parent: &InstanceKey,
    child: &InstanceKey,
) -> Result<Vec<Value>, Box<dyn std::error::Error + Send + Sync>> {
    recorded(store, parent, &child_result_step(child)).await
}

pub async fn a_spawn_creates_the_linked_child_once(h: Harness) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(store, &parent, &child).await?;

    let row = store.instance_get(&child).await?.expect("spawned");
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
    // A replayed spawn converges on the recorded step and creates nothing.
    let other = key("child", "c-other");
    let replay = ChildSpawn {
        child: other.clone(),
        ..spawn_of(&child)
    };
    assert!(matches!(
        store
            .child_spawn(&spawn_step(&parent, &child), &replay)
            .await?,
        AppendOutcome::AlreadyPresent(_)
    ));
    assert!(store.instance_get(&other).await?.is_none());
    Ok(())
}

pub async fn completion_delivers_the_output(h: Harness) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(store, &parent, &child).await?;
    store
        .journal_append(&Append::external(
            child.clone(),
            Event::WorkflowCompleted {
                output: json!({"total": 3}),
            },
        ))
        .await?;
    assert_eq!(
        delivered(store, &parent, &child).await?,
        vec![json!({"ok": {"total": 3}})]
    );
    assert_eq!(
        status(store, &parent).await?,
        Status::Running,
        "the parent was woken"
    );
    Ok(())
}

pub async fn failure_delivers_the_reason(h: Harness) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(store, &parent, &child).await?;
    store
        .journal_append(&Append::external(
            child.clone(),
            Event::WorkflowFailed {
                reason: "card declined".into(),
            },
        ))
        .await?;
    assert_eq!(
        delivered(store, &parent, &child).await?,
        vec![json!({"failed": "card declined"})]
    );
    assert_eq!(status(store, &parent).await?, Status::Running);
    Ok(())
}

pub async fn the_crash_ceiling_delivers_the_last_error(h: Harness) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(store, &parent, &child).await?;
    let crash = Crash {
        error: "panicked".into(),
        retry_delay: Duration::ZERO,
        max_attempts: 2,
    };
    let fence = claim(store, &child, "w").await?;
    assert!(matches!(
        store.instance_record_crash(&child, &fence, &crash).await?,
        CrashOutcome::Retrying { .. }
    ));
    assert!(
        delivered(store, &parent, &child).await?.is_empty(),
        "a retry delivers nothing"
    );
    let fence = claim(store, &child, "w").await?;
    assert_eq!(
        store.instance_record_crash(&child, &fence, &crash).await?,
        CrashOutcome::Failed { attempts: 2 }
    );
    assert_eq!(
        delivered(store, &parent, &child).await?,
        vec![json!({"failed": "panicked"})]
    );
    assert_eq!(status(store, &parent).await?, Status::Running);
    Ok(())
}

pub async fn divergence_delivers_the_reason(h: Harness) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(store, &parent, &child).await?;
    let fence = claim(store, &child, "w").await?;
    assert!(
        store
            .instance_fail_diverged(&child, Some(&fence), "step b moved")
            .await?
    );
    assert_eq!(
        delivered(store, &parent, &child).await?,
        vec![json!({"failed": "step b moved"})]
    );
    Ok(())
}

pub async fn cancellation_delivers_the_cancelled_envelope(h: Harness) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(store, &parent, &child).await?;
    assert_eq!(
        store.instance_cancel(&child, false).await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        delivered(store, &parent, &child).await?,
        vec![json!({"cancelled": true})]
    );
    assert_eq!(status(store, &parent).await?, Status::Running);
    Ok(())
}

pub async fn continue_as_new_delivers_nothing_until_the_run_ends(h: Harness) -> TestResult {
    let store = &*h.store;
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(store, &parent, &child).await?;
    store
        .journal_append(&Append::external(
            child.clone(),
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!(2),
            },
        ))
        .await?;
    assert!(delivered(store, &parent, &child).await?.is_empty());
    assert_eq!(status(store, &parent).await?, Status::Suspended);
    store
        .journal_append(&Append::external(
            child.clone(),
            Event::WorkflowCompleted {
                output: json!("done"),
            },
        ))
        .await?;
    assert_eq!(
        delivered(store, &parent, &child).await?,
        vec![json!({"ok": "done"})]
    );
    Ok(())
}

pub async fn a_parent_that_cannot_take_the_result_is_ignored(h: Harness) -> TestResult {
    let store = &*h.store;

    // A finished parent: the child still completes, and nothing lands in the parent.
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(store, &parent, &child).await?;
    store
        .journal_append(&Append::external(parent.clone(), Event::WorkflowCancelled))
        .await?;
    let completed = store
        .journal_append(&Append::external(
            child.clone(),
            Event::WorkflowCompleted { output: json!(1) },
        ))
        .await?;
    assert_eq!(completed, AppendOutcome::Appended);
    assert_eq!(status(store, &child).await?, Status::Completed);
    assert!(delivered(store, &parent, &child).await?.is_empty());

    // A parent that moved on to another generation: the old generation takes nothing.
    let (parent, child) = (key("parent", "p-2"), key("child", "c-2"));
    family(store, &parent, &child).await?;
    store
        .journal_append(&Append::external(
            parent.clone(),
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!(null),
            },
        ))
        .await?;
    store
        .journal_append(&Append::external(
            child.clone(),
            Event::WorkflowCompleted { output: json!(1) },
        ))
        .await?;
    assert_eq!(status(store, &child).await?, Status::Completed);
    assert!(delivered(store, &parent, &child).await?.is_empty());
    Ok(())
}

pub async fn spawning_an_existing_instance_adopts_it_or_delivers_its_result(
    h: Harness,
) -> TestResult {
    let store = &*h.store;

    // Already finished: its result reaches the spawner in the spawn's transaction.
    let (parent, done) = (key("parent", "p-1"), key("child", "done"));
    store.instance_start(&start(&done, json!(null))).await?;
    store
        .journal_append(&Append::external(
            done.clone(),
            Event::WorkflowCompleted {
                output: json!("early"),
            },
        ))
        .await?;
    start_parked(store, &parent).await?;
    store
        .child_spawn(&spawn_step(&parent, &done), &spawn_of(&done))
        .await?;
    assert_eq!(
        delivered(store, &parent, &done).await?,
        vec![json!({"ok": "early"})]
    );
    let row = store.instance_get(&done).await?.expect("row");
    assert_eq!(
        (row.input, row.parent),
        (json!(null), Some(parent.clone())),
        "adopted, input untouched"
    );

    // Still running and unlinked: adopted, and its completion is delivered later.
    let live = key("child", "live");
    store
        .instance_start(&start(&live, json!("own input")))
        .await?;
    store
        .child_spawn(&spawn_step(&parent, &live), &spawn_of(&live))
        .await?;
    assert!(delivered(store, &parent, &live).await?.is_empty());
    store
        .journal_append(&Append::external(
            live.clone(),
            Event::WorkflowCompleted {
                output: json!("late"),
            },
        ))
        .await?;
    assert_eq!(
        delivered(store, &parent, &live).await?,
        vec![json!({"ok": "late"})]
    );
    Ok(())
}

pub async fn every_terminal_path_of_a_child_journals_its_envelope_into_the_parent(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let parent = started(store, "parent").await?;
    let mut notifications = h.notifications().await?;
    let (done, done_step, outcome) = spawn_child(store, &parent, "done").await?;
    assert_eq!(outcome, AppendOutcome::Appended);
    assert_eq!(notifications.drain(QUIET).await, [payload(&done)]);
    let row = store.instance_get(&done).await?.unwrap();
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
            json!({"from": "parent"}),
            Some(parent.clone()),
            0
        )
    );
    // A replayed spawn creates nothing and moves nothing.
    assert!(matches!(
        spawn_child(store, &parent, "done").await?.2,
        AppendOutcome::AlreadyPresent(_)
    ));
    assert!(notifications.drain(QUIET).await.is_empty());

    let (crashed, crashed_step, _) = spawn_child(store, &parent, "crashed").await?;
    let (diverged, diverged_step, _) = spawn_child(store, &parent, "diverged").await?;
    let (cancelled, cancelled_step, _) = spawn_child(store, &parent, "cancelled").await?;
    let (rotated, _, _) = spawn_child(store, &parent, "rotated").await?;
    park_on(store, &parent, &done_step).await?;

    let completed = Event::WorkflowCompleted { output: json!(42) };
    append(store, &done, None, completed, None).await?;
    assert_eq!(status(store, &parent).await?, Status::Running);
    let fence = claim(store, &crashed, "w").await?;
    let crash = Crash {
        error: "boom".into(),
        retry_delay: TTL,
        max_attempts: 1,
    };
    assert_eq!(
        store
            .instance_record_crash(&crashed, &fence, &crash)
            .await?,
        CrashOutcome::Failed { attempts: 1 }
    );
    store
        .instance_fail_diverged(&diverged, None, "code changed")
        .await?;
    store.instance_cancel(&cancelled, false).await?;
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!(null),
    };
    append(store, &rotated, None, rotate, None).await?;

    let results: Vec<_> = journal_rows(store, &parent)
        .await?
        .into_iter()
        .filter(|(step, _)| step.ends_with(":result"))
        .collect();
    assert_eq!(
        results,
        [
            (done_step, json!({"ok": 42})),
            (crashed_step, json!({"failed": "boom"})),
            (diverged_step, json!({"failed": "code changed"})),
            (cancelled_step, json!({"cancelled": true})),
        ]
    );
    let kinds = store.journal_history(&parent).await?;
    assert!(kinds.iter().all(|entry| matches!(
        entry.event,
        Event::StepRecorded {
            kind: StepKind::Child,
            ..
        }
    )));
    Ok(())
}

pub async fn a_spawn_adopts_an_existing_instance_and_a_closed_parent_refuses_quietly(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let parent = started(store, "parent").await?;
    let orphan = InstanceKey::parse("child", "orphan").unwrap();
    let request = keiro_journal::store::StartRequest {
        attributes: Default::default(),
        key: orphan.clone(),
        input: json!("own input"),
        parent: None,
        priority: 3,
        queue: None,
    };
    store.instance_start(&request).await?;
    append(
        store,
        &orphan,
        None,
        Event::WorkflowCompleted {
            output: json!("early"),
        },
        None,
    )
    .await?;
    let (_, await_step, _) = spawn_child(store, &parent, "orphan").await?;
    let row = store.instance_get(&orphan).await?.unwrap();
    assert_eq!(
        (row.input, row.priority, row.parent),
        (json!("own input"), 3, Some(parent.clone()))
    );
    assert!(journal_rows(store, &parent)
        .await?
        .contains(&(await_step, json!({"ok": "early"}))));

    let (late, _, _) = spawn_child(store, &parent, "late").await?;
    store.instance_cancel(&parent, false).await?;
    let before = journal_rows(store, &parent).await?;
    let completed = Event::WorkflowCompleted { output: json!(1) };
    assert_eq!(
        append(store, &late, None, completed, None).await?,
        AppendOutcome::Appended
    );
    assert_eq!(journal_rows(store, &parent).await?, before);
    assert_eq!(
        store.instance_cancel(&parent, true).await?,
        AppendOutcome::AlreadyPresent(Value::Null)
    );
    Ok(())
}
