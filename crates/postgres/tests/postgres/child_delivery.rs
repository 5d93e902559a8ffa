//! A spawn racing retention's deletion of the finished instance it would adopt, the deletion
//! held by a test transaction. What a spawn and a child's end deliver is the contract suite's
//! (`keiro_tests::contract::child::delivery`).

use crate::common::{backend_pid, blocked_by, key, recorded, sql, start, start_parked, TestResult};
use keiro_journal::{
    store::child_result_step, store::ChildSpawn, Append, AppendOutcome, Event, InstanceKey,
    JournalStore, Status, StepKind,
};
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

/// What the parent has journaled under the child's result step.
async fn delivered(
    store: &PgStore,
    parent: &InstanceKey,
    child: &InstanceKey,
) -> Result<Vec<Value>, Box<dyn std::error::Error + Send + Sync>> {
    recorded(store, parent, &child_result_step(child)).await
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
