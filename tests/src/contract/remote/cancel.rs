//! What ending a run's generation does to its remote tasks: a cancellation cancels the live
//! ones and refuses their reports, a continue-as-new cancels those of the generation it leaves.

use std::time::Duration;

use super::{arm, claim_one, claim_tasks, failure, task};
use crate::contract::support::{key, recorded, start, status, TestResult};
use crate::Harness;
use keiro_journal::{
    store::remote_step_id, store::RemoteArm, store::RemoteArmOutcome, Append, AppendOutcome, Event,
    Status,
};
use keiro_remote::{HeartbeatOutcome, ReportOutcome, TaskStatus};
use serde_json::{json, Value};
use uuid::Uuid;

pub async fn a_cancel_cancels_the_live_tasks_of_the_run_and_refuses_their_reports(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let (claimed, pending, done) = (
        arm(&owner, "claimed", json!(1)),
        arm(&owner, "pending", json!(2)),
        arm(&owner, "done", json!(3)),
    );
    for a in [&claimed, &pending, &done] {
        store.remote_arm(a).await?;
    }
    let claim = claim_one(&*h.transport, "claimed").await?;
    h.transport
        .task_complete(&done.step_id, &json!("kept"))
        .await?;

    store.instance_cancel(&owner, false).await?;
    let statuses: Vec<(String, TaskStatus, Option<String>)> = h
        .admin
        .remote_tasks(&owner)
        .await?
        .into_iter()
        .map(|t| (t.step, t.status, t.claimed_by))
        .collect();
    assert_eq!(
        statuses,
        [
            ("claimed".to_owned(), TaskStatus::Cancelled, None),
            ("pending".to_owned(), TaskStatus::Cancelled, None),
            ("done".to_owned(), TaskStatus::Completed, None),
        ]
    );
    // The claimant learns it, whatever claim it holds; nobody claims the tasks again.
    for held in [claim.claim, Uuid::new_v4()] {
        assert_eq!(
            h.transport
                .task_heartbeat(&claimed.step_id, held, Duration::from_secs(60))
                .await?,
            HeartbeatOutcome::Cancelled
        );
    }
    assert!(claim_tasks(&*h.transport, &["claimed", "pending"], 10)
        .await?
        .is_empty());
    // Every report is refused: one, a batch, a retryable failure of the claim it had.
    assert_eq!(
        h.transport
            .task_complete(&pending.step_id, &json!("late"))
            .await?,
        ReportOutcome::Cancelled
    );
    assert_eq!(
        h.transport
            .tasks_complete(&[
                (claimed.step_id.clone(), json!("late")),
                (done.step_id.clone(), json!("again")),
                ("owner/o-1/0/nope".to_owned(), json!(0)),
            ])
            .await?,
        [
            ReportOutcome::Cancelled,
            ReportOutcome::AlreadySettled,
            ReportOutcome::NotFound
        ]
    );
    assert_eq!(
        h.transport
            .task_fail(
                &claimed.step_id,
                claim.claim,
                &failure("declined", None, true),
                Duration::ZERO,
            )
            .await?,
        ReportOutcome::Cancelled
    );
    let after = task(&*h.admin, &owner, &claimed.step_id).await?;
    assert_eq!(
        (after.status, after.attempts, after.output, after.last_error),
        (TaskStatus::Cancelled, 0, None, None)
    );
    for step in ["remote:claimed", "remote:pending"] {
        assert!(recorded(store, &owner, step).await?.is_empty(), "{step}");
    }
    // A re-arm (a stale run's) changes nothing, nor does an operator's redispatch.
    assert_eq!(
        store.remote_arm(&pending).await?,
        RemoteArmOutcome::Waiting { deadline: None }
    );
    assert_eq!(h.admin.remote_redispatch_pending(&owner).await?, Some(0));
    assert_eq!(
        task(&*h.admin, &owner, &pending.step_id).await?.status,
        TaskStatus::Cancelled
    );
    Ok(())
}

pub async fn a_continue_as_new_cancels_the_tasks_of_the_generation_it_leaves(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let left = arm(&owner, "label", json!(1));
    store.remote_arm(&left).await?;
    let claim = claim_one(&*h.transport, "label").await?;
    let continued = store
        .journal_append(&Append::external(
            owner.clone(),
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!("next"),
            },
        ))
        .await?;
    assert_eq!(continued, AppendOutcome::Appended);
    assert_eq!(status(store, &owner).await?, Status::Running);
    assert_eq!(
        task(&*h.admin, &owner, &left.step_id).await?.status,
        TaskStatus::Cancelled
    );
    assert_eq!(
        h.transport
            .task_heartbeat(&left.step_id, claim.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Cancelled
    );
    assert_eq!(
        h.transport
            .task_complete(&left.step_id, &json!("late"))
            .await?,
        ReportOutcome::Cancelled
    );
    // The new generation's tasks are its own.
    let next = RemoteArm {
        step_id: remote_step_id(&owner, 1, "label"),
        generation: 1,
        ..arm(&owner, "label", json!(2))
    };
    assert_eq!(
        store.remote_arm(&next).await?,
        RemoteArmOutcome::Dispatched { deadline: None }
    );
    assert_eq!(
        claim_one(&*h.transport, "label").await?.step_id,
        next.step_id
    );
    Ok(())
}
