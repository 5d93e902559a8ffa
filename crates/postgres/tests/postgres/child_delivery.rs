//! A child's terminal transaction journals its result envelope into the parent's spawning
//! generation under the awaited step and wakes the parent: on completion, failure, the crash
//! ceiling, divergence and cancellation, but not on continue-as-new.

use std::time::Duration;

use crate::common::{
    backend_pid, blocked_by, claim, key, recorded, sql, start, start_parked, status, TestResult,
};
use keiro_journal::{
    store::child_result_step, store::ChildSpawn, Append, AppendOutcome, Event, InstanceKey,
    JournalStore, Status, StepKind,
};
use keiro_lease::{Crash, CrashOutcome, LeaseStore};
use keiro_postgres::PgStore;
use keiro_tests::pg::TestDb;
use serde_json::{json, Value};

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
    store: &PgStore,
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
    store: &PgStore,
    parent: &InstanceKey,
    child: &InstanceKey,
) -> Result<Vec<Value>, Box<dyn std::error::Error + Send + Sync>> {
    recorded(store, parent, &child_result_step(child)).await
}

#[tokio::test]
async fn a_spawn_creates_the_linked_child_once() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(&store, &parent, &child).await?;

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
    let link = sql(&store)
        .await?
        .query_one(
            "SELECT parent_generation, parent_step FROM workflows \
             WHERE workflow_name = 'child' AND workflow_id = 'c-1'",
            &[],
        )
        .await?;
    assert_eq!(
        (
            link.get::<_, Option<i32>>(0),
            link.get::<_, Option<String>>(1)
        ),
        (Some(0), Some(child_result_step(&child)))
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

#[tokio::test]
async fn completion_delivers_the_output() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(&store, &parent, &child).await?;
    store
        .journal_append(&Append::external(
            child.clone(),
            Event::WorkflowCompleted {
                output: json!({"total": 3}),
            },
        ))
        .await?;
    assert_eq!(
        delivered(&store, &parent, &child).await?,
        vec![json!({"ok": {"total": 3}})]
    );
    assert_eq!(
        status(&store, &parent).await?,
        Status::Running,
        "the parent was woken"
    );
    Ok(())
}

#[tokio::test]
async fn failure_delivers_the_reason() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(&store, &parent, &child).await?;
    store
        .journal_append(&Append::external(
            child.clone(),
            Event::WorkflowFailed {
                reason: "card declined".into(),
            },
        ))
        .await?;
    assert_eq!(
        delivered(&store, &parent, &child).await?,
        vec![json!({"failed": "card declined"})]
    );
    assert_eq!(status(&store, &parent).await?, Status::Running);
    Ok(())
}

#[tokio::test]
async fn the_crash_ceiling_delivers_the_last_error() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(&store, &parent, &child).await?;
    let crash = Crash {
        error: "panicked".into(),
        retry_delay: Duration::ZERO,
        max_attempts: 2,
    };
    let fence = claim(&store, &child, "w").await?;
    assert!(matches!(
        store.instance_record_crash(&child, &fence, &crash).await?,
        CrashOutcome::Retrying { .. }
    ));
    assert!(
        delivered(&store, &parent, &child).await?.is_empty(),
        "a retry delivers nothing"
    );
    let fence = claim(&store, &child, "w").await?;
    assert_eq!(
        store.instance_record_crash(&child, &fence, &crash).await?,
        CrashOutcome::Failed { attempts: 2 }
    );
    assert_eq!(
        delivered(&store, &parent, &child).await?,
        vec![json!({"failed": "panicked"})]
    );
    assert_eq!(status(&store, &parent).await?, Status::Running);
    Ok(())
}

#[tokio::test]
async fn divergence_delivers_the_reason() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(&store, &parent, &child).await?;
    let fence = claim(&store, &child, "w").await?;
    assert!(
        store
            .instance_fail_diverged(&child, Some(&fence), "step b moved")
            .await?
    );
    assert_eq!(
        delivered(&store, &parent, &child).await?,
        vec![json!({"failed": "step b moved"})]
    );
    Ok(())
}

#[tokio::test]
async fn cancellation_delivers_the_cancelled_envelope() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(&store, &parent, &child).await?;
    assert_eq!(
        store.instance_cancel(&child, false).await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        delivered(&store, &parent, &child).await?,
        vec![json!({"cancelled": true})]
    );
    assert_eq!(status(&store, &parent).await?, Status::Running);
    Ok(())
}

#[tokio::test]
async fn continue_as_new_delivers_nothing_until_the_run_ends() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(&store, &parent, &child).await?;
    store
        .journal_append(&Append::external(
            child.clone(),
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!(2),
            },
        ))
        .await?;
    assert!(delivered(&store, &parent, &child).await?.is_empty());
    assert_eq!(status(&store, &parent).await?, Status::Suspended);
    store
        .journal_append(&Append::external(
            child.clone(),
            Event::WorkflowCompleted {
                output: json!("done"),
            },
        ))
        .await?;
    assert_eq!(
        delivered(&store, &parent, &child).await?,
        vec![json!({"ok": "done"})]
    );
    Ok(())
}

#[tokio::test]
async fn a_parent_that_cannot_take_the_result_is_ignored() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();

    // A finished parent: the child still completes, and nothing lands in the parent.
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    family(&store, &parent, &child).await?;
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
    assert_eq!(status(&store, &child).await?, Status::Completed);
    assert!(delivered(&store, &parent, &child).await?.is_empty());

    // A parent that moved on to another generation: the old generation takes nothing.
    let (parent, child) = (key("parent", "p-2"), key("child", "c-2"));
    family(&store, &parent, &child).await?;
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
    assert_eq!(status(&store, &child).await?, Status::Completed);
    assert!(delivered(&store, &parent, &child).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn spawning_an_existing_instance_adopts_it_or_delivers_its_result() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();

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
    start_parked(&store, &parent).await?;
    store
        .child_spawn(&spawn_step(&parent, &done), &spawn_of(&done))
        .await?;
    assert_eq!(
        delivered(&store, &parent, &done).await?,
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
    assert!(delivered(&store, &parent, &live).await?.is_empty());
    store
        .journal_append(&Append::external(
            live.clone(),
            Event::WorkflowCompleted {
                output: json!("late"),
            },
        ))
        .await?;
    assert_eq!(
        delivered(&store, &parent, &live).await?,
        vec![json!({"ok": "late"})]
    );
    Ok(())
}

/// A spawn that meets a finished, parentless instance with the child's key while retention
/// deletes it: once the deletion commits the key is free, and the spawn creates the child
/// afresh, rather than journaling a spawn with no child behind it (the parent would wait for
/// a result forever). Retention is played by a transaction that locks the row as its
/// candidates query does, then deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spawn_racing_the_deletion_of_its_finished_child_creates_it_afresh() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, old) = (key("parent", "p-1"), key("child", "old"));
    store.instance_start(&start(&old, json!(null))).await?;
    store
        .journal_append(&Append::external(
            old.clone(),
            Event::WorkflowCompleted {
                output: json!("long ago"),
            },
        ))
        .await?;
    start_parked(&store, &parent).await?;

    let mut collector = sql(&store).await?;
    let collecting = collector.transaction().await?;
    let collector_pid = backend_pid(&collecting).await?;
    collecting
        .execute(
            "SELECT 1 FROM workflows WHERE workflow_name = 'child' AND workflow_id = 'old' \
             FOR UPDATE",
            &[],
        )
        .await?;
    let spawn = {
        let (store, parent, old) = (store.clone(), parent.clone(), old.clone());
        tokio::spawn(async move {
            store
                .child_spawn(&spawn_step(&parent, &old), &spawn_of(&old))
                .await
        })
    };
    blocked_by(&store, collector_pid, "the spawn never met the lock").await?;
    collecting
        .batch_execute(
            "DELETE FROM journal WHERE workflow_name = 'child' AND workflow_id = 'old'; \
             DELETE FROM workflows WHERE workflow_name = 'child' AND workflow_id = 'old'",
        )
        .await?;
    collecting.commit().await?;

    assert_eq!(spawn.await??, AppendOutcome::Appended);
    let row = store
        .instance_get(&old)
        .await?
        .ok_or("the spawn was journaled, but no child row stands behind it")?;
    assert_eq!(
        (row.status, row.input, row.parent),
        (Status::Running, json!({"for": "old"}), Some(parent.clone()))
    );
    assert!(delivered(&store, &parent, &old).await?.is_empty());
    Ok(())
}
