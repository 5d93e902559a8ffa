//! Settling a completed run's leftovers: once its generation has closed, the remote tasks still
//! live and the awakeables still pending are cancelled, once, and never while it runs.

use crate::contract::support::{append, started, step, TestResult};
use crate::Harness;
use keiro_journal::{AwakeableOutcome, AwakeableStatus, Event, StepKind};
use keiro_remote::TaskStatus;
use serde_json::json;
use uuid::Uuid;

pub async fn a_completed_runs_leftovers_are_settled_once_and_only_then(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "a").await?;
    let id = Uuid::from_u128(1);
    let allocation = step(&k, "awkid:a", StepKind::Awakeable, json!(id.to_string()));
    store.awakeable_create(&allocation, id).await?;
    store
        .remote_arm(&crate::contract::remote::arm(&k, "r", json!(null)))
        .await?;
    assert_eq!(
        store.instance_settle_leftovers(&k, 0).await?,
        0,
        "a running generation keeps them"
    );

    // A completion leaves them (the run settles them after): two, settled once.
    let completed = Event::WorkflowCompleted { output: json!(1) };
    append(store, &k, None, completed, None).await?;
    assert_eq!(store.awakeables_pending().await?, 1);
    assert_eq!(store.instance_settle_leftovers(&k, 0).await?, 2);
    assert_eq!(store.instance_settle_leftovers(&k, 0).await?, 0, "once");
    assert_eq!(store.awakeables_pending().await?, 0);
    assert_eq!(
        store.awakeable_complete(id, &json!("late")).await?,
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
    );
    let statuses: Vec<TaskStatus> = h
        .admin
        .remote_tasks(&k)
        .await?
        .iter()
        .map(|t| t.status)
        .collect();
    assert_eq!(statuses, [TaskStatus::Cancelled]);
    Ok(())
}
