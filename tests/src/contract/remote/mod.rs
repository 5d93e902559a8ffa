//! `sql/functions/remote.sql`: remote steps through the task table. Arming a task (once per
//! step, dispatch and redispatch by deadline, park-and-dispatch), claims (priority then age,
//! expiry, heartbeats), reports (first result wins, retries with backoff, batches), what a
//! cancellation or a continue-as-new does to live tasks, the operator's redispatch,
//! requeue and fix-and-replay, and tasks claimed under a queue's limits.
//!
//! The scenarios share the small tools below; each file depends on them, none on another.

pub mod arm;
pub mod cancel;
pub mod claim;
pub mod queue;
pub mod report;
pub mod requeue;

use std::time::Duration;

use keiro_journal::{
    store::child_result_step, store::ChildSpawn, store::RemoteArm, Append, AppendOutcome, Event,
    InstanceKey, StepKind,
};
use keiro_lease::LeaseStore;
use keiro_remote::{ClaimRequest, ClaimedTask, RemoteAdmin, RemoteTask, TaskFailure, Transport};
use serde_json::{json, Value};

use crate::contract::support::{Result, TestResult};

/// The arm of remote step `step` of `k`'s generation 0, one attempt, no redispatch.
pub fn arm(k: &InstanceKey, step: &str, input: Value) -> RemoteArm {
    RemoteArm {
        step_id: keiro_journal::store::remote_step_id(k, 0, step),
        key: k.clone(),
        generation: 0,
        step: step.into(),
        journal_step: format!("remote:{step}"),
        group: step.into(),
        input,
        priority: 0,
        traceparent: None,
        max_attempts: 1,
        backoff: keiro_journal::Backoff::default(),
        redispatch_after: None,
        redispatch_max: 10,
        queue: None,
        queue_key: None,
        fence: None,
    }
}

/// A claim of up to `limit` tasks of `groups` by `worker` for `ttl`.
pub fn claim_request(groups: &[&str], worker: &str, limit: u32, ttl: Duration) -> ClaimRequest {
    ClaimRequest {
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        worker: worker.into(),
        limit,
        claim_ttl: ttl,
    }
}

/// Claims up to `limit` tasks of `groups` as `w-1` with a one-minute claim.
pub async fn claim_tasks(
    transport: &dyn Transport,
    groups: &[&str],
    limit: u32,
) -> Result<Vec<ClaimedTask>> {
    let request = claim_request(groups, "w-1", limit, Duration::from_secs(60));
    Ok(transport.tasks_claim(&request).await?)
}

/// Claims exactly one task of `group`.
pub async fn claim_one(transport: &dyn Transport, group: &str) -> Result<ClaimedTask> {
    let mut tasks = claim_tasks(transport, &[group], 1).await?;
    if tasks.len() != 1 {
        return Err(format!(
            "expected one claimable task of {group}, got {}",
            tasks.len()
        )
        .into());
    }
    Ok(tasks.remove(0))
}

/// The stored task `step_id` of `k`.
pub async fn task(admin: &dyn RemoteAdmin, k: &InstanceKey, step_id: &str) -> Result<RemoteTask> {
    admin
        .remote_tasks(k)
        .await?
        .into_iter()
        .find(|t| t.step_id == step_id)
        .ok_or_else(|| format!("no task {step_id}").into())
}

/// A failure report.
pub fn failure(message: &str, code: Option<&str>, retryable: bool) -> TaskFailure {
    TaskFailure {
        message: message.into(),
        code: code.map(str::to_owned),
        retryable,
    }
}

/// Fails `k` with an external `failed` marker.
pub async fn fail_instance(store: &dyn LeaseStore, k: &InstanceKey, reason: &str) -> TestResult {
    let outcome = store
        .journal_append(&Append::external(
            k.clone(),
            Event::WorkflowFailed {
                reason: reason.into(),
            },
        ))
        .await?;
    assert_eq!(outcome, AppendOutcome::Appended, "failing {k}");
    Ok(())
}

/// Completes `k` with an external `completed` marker.
pub async fn complete_instance(
    store: &dyn LeaseStore,
    k: &InstanceKey,
    output: Value,
) -> TestResult {
    let outcome = store
        .journal_append(&Append::external(
            k.clone(),
            Event::WorkflowCompleted { output },
        ))
        .await?;
    assert_eq!(outcome, AppendOutcome::Appended, "completing {k}");
    Ok(())
}

/// `parent` spawns `child` (journaling the spawn step, creating or adopting the child).
pub async fn spawn(
    store: &dyn LeaseStore,
    parent: &InstanceKey,
    child: &InstanceKey,
) -> TestResult {
    let append = Append::external(
        parent.clone(),
        Event::StepRecorded {
            step: format!("child:{}/{}", child.name, child.id),
            kind: StepKind::Child,
            result: json!({"name": child.name.as_str(), "id": child.id.as_str()}),
        },
    );
    let spawned = ChildSpawn {
        child: child.clone(),
        input: json!({"for": child.id.as_str()}),
        await_step: child_result_step(child),
    };
    assert_eq!(
        store.child_spawn(&append, &spawned).await?,
        AppendOutcome::Appended
    );
    Ok(())
}

/// The `(step, superseded)` of every `StepReset` in `k`'s history.
pub async fn resets(store: &dyn LeaseStore, k: &InstanceKey) -> Result<Vec<(String, String)>> {
    Ok(store
        .journal_history(k)
        .await?
        .into_iter()
        .filter_map(|e| match e.event {
            Event::StepReset { step, superseded } => Some((step, superseded)),
            _ => None,
        })
        .collect())
}

/// How many `Resurrected` events `k`'s history holds.
pub async fn resurrections(store: &dyn LeaseStore, k: &InstanceKey) -> Result<usize> {
    Ok(store
        .journal_history(k)
        .await?
        .into_iter()
        .filter(|e| matches!(e.event, Event::Resurrected))
        .count())
}
