//! The worker side of remote steps (remote.sql's claim, heartbeat and reports) through the
//! `Transport` trait, with the assertions of the memory store's tests
//! (crates/memory/src/remote.rs).

mod common;

use std::time::Duration;

use common::{append, pinned, start, T0, TTL};
use keiro_journal::store::Park;
use keiro_journal::{
    store::marker_name, store::remote_step_id, store::RemoteArm, store::RemoteArmOutcome, Backoff,
    Event, InstanceKey, Status, REDISPATCH_MAX_DEFAULT,
};
use keiro_remote::{
    ClaimRequest, ClaimedTask, HeartbeatOutcome, RemoteAdmin, RemoteTask, ReportOutcome,
    TaskFailure, TaskStatus, Transport,
};
use keiro_sqlite::SqliteStore;
use serde_json::{json, Value};
use time::Duration as Span;
use uuid::Uuid;

const TEN_MINUTES: Duration = Duration::from_secs(600);

fn arm(key: &InstanceKey, step: &str) -> RemoteArm {
    RemoteArm {
        step_id: remote_step_id(key, 0, step),
        key: key.clone(),
        generation: 0,
        step: step.to_owned(),
        journal_step: format!("remote:{step}"),
        group: step.to_owned(),
        input: json!({ "step": step }),
        priority: 0,
        traceparent: None,
        max_attempts: 1,
        backoff: Backoff::default(),
        redispatch_after: None,
        redispatch_max: REDISPATCH_MAX_DEFAULT,
        fence: None,
    }
}

fn request(groups: &[&str], worker: &str, limit: u32) -> ClaimRequest {
    ClaimRequest {
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        worker: worker.to_owned(),
        limit,
        claim_ttl: TTL,
    }
}

fn failure(message: &str, code: Option<&str>, retryable: bool) -> TaskFailure {
    TaskFailure {
        message: message.to_owned(),
        code: code.map(str::to_owned),
        retryable,
    }
}

fn id(key: &InstanceKey, step: &str) -> String {
    remote_step_id(key, 0, step)
}

async fn rows(store: &SqliteStore, key: &InstanceKey) -> Vec<(String, Value)> {
    store
        .journal_history(key)
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            let encoded = e.event.encode();
            (encoded.step_name, encoded.payload)
        })
        .collect()
}

fn row(step: &str, payload: Value) -> (String, Value) {
    (step.to_owned(), payload)
}

async fn task(store: &SqliteStore, key: &InstanceKey, step: &str) -> RemoteTask {
    let step_id = id(key, step);
    RemoteAdmin::remote_tasks(store, key)
        .await
        .unwrap()
        .into_iter()
        .find(|task| task.step_id == step_id)
        .expect("the task exists")
}

async fn claim_one(store: &SqliteStore, group: &str) -> ClaimedTask {
    let mut claimed = Transport::tasks_claim(store, &request(&[group], "w1", 1))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "one task of {group} is claimable");
    claimed.remove(0)
}

async fn status(store: &SqliteStore, key: &InstanceKey) -> Status {
    store.instance_get(key).await.unwrap().unwrap().status
}

#[tokio::test]
async fn claims_take_the_highest_priority_then_the_oldest() {
    let (_dir, store) = pinned("w-claims");
    let key = start(&store, "a").await;
    let in_labels = |step: &str, priority: i32| RemoteArm {
        group: "labels".into(),
        priority,
        ..arm(&key, step)
    };
    // Written at the same instant: the earlier write is the older task.
    store.remote_arm(&in_labels("b-first", 0)).await.unwrap();
    store.remote_arm(&in_labels("a-second", 0)).await.unwrap();
    store.pin_clock(Some(T0 + Span::seconds(1)));
    store.remote_arm(&in_labels("young", 0)).await.unwrap();
    store.remote_arm(&in_labels("urgent", 5)).await.unwrap();
    let elsewhere = RemoteArm {
        group: "other".into(),
        priority: 9,
        ..arm(&key, "elsewhere")
    };
    store.remote_arm(&elsewhere).await.unwrap();
    store.pin_clock(Some(T0 + Span::seconds(2)));

    let steps = |claimed: Vec<ClaimedTask>| -> Vec<String> {
        claimed.into_iter().map(|task| task.step).collect()
    };
    let first = store
        .tasks_claim(&request(&["labels"], "w1", 3))
        .await
        .unwrap();
    let urgent = first[0].clone();
    assert_eq!(steps(first), ["urgent", "b-first", "a-second"]);
    assert_eq!(
        steps(
            store
                .tasks_claim(&request(&["labels"], "w1", 10))
                .await
                .unwrap()
        ),
        ["young"]
    );
    assert!(store
        .tasks_claim(&request(&["labels"], "w1", 10))
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        steps(
            store
                .tasks_claim(&request(&["labels", "other"], "w2", 10))
                .await
                .unwrap()
        ),
        ["elsewhere"]
    );
    assert_eq!(
        (
            urgent.step_id.as_str(),
            &urgent.key,
            urgent.group.as_str(),
            urgent.priority,
            urgent.attempt,
            urgent.max_attempts,
            urgent.dispatches,
            urgent.available_at,
        ),
        (
            "wf/a/0/urgent",
            &key,
            "labels",
            5,
            1,
            1,
            1,
            T0 + Span::seconds(1)
        )
    );
    let urgent = task(&store, &key, "urgent").await;
    assert_eq!(
        (urgent.status, urgent.claimed_by.as_deref()),
        (TaskStatus::Running, Some("w1"))
    );
}

#[tokio::test]
async fn an_expired_claim_is_claimable_again_and_heartbeats_extend_only_the_current_claim() {
    let (_dir, store) = pinned("w-heartbeat");
    let key = start(&store, "a").await;
    let twice = RemoteArm {
        max_attempts: 2,
        ..arm(&key, "label")
    };
    store.remote_arm(&twice).await.unwrap();
    let step_id = id(&key, "label");
    let first = claim_one(&store, "label").await;
    store.pin_clock(Some(T0 + Span::seconds(30)));
    assert_eq!(
        store
            .task_heartbeat(&step_id, first.claim, TTL)
            .await
            .unwrap(),
        HeartbeatOutcome::Extended
    );
    assert_eq!(
        store
            .task_heartbeat(&step_id, Uuid::nil(), TTL)
            .await
            .unwrap(),
        HeartbeatOutcome::Lost
    );
    // Extended to T0 + 90 s: not claimable at T0 + 60 s, claimable (and counted) after.
    store.pin_clock(Some(T0 + Span::seconds(60)));
    assert!(store
        .tasks_claim(&request(&["label"], "w2", 1))
        .await
        .unwrap()
        .is_empty());
    store.pin_clock(Some(T0 + Span::seconds(90)));
    let second = claim_one(&store, "label").await;
    assert_eq!(second.attempt, 2, "the expired claim counted an attempt");
    assert_eq!(
        store
            .task_heartbeat(&step_id, first.claim, TTL)
            .await
            .unwrap(),
        HeartbeatOutcome::Lost,
        "the old claim is stale"
    );
    assert_eq!(
        store
            .task_fail(&step_id, first.claim, &failure("x", None, true), TTL)
            .await
            .unwrap(),
        ReportOutcome::Stale
    );
    // A cancelled owner cancels the task: its heartbeat and reports learn it.
    store.instance_cancel(&key, false).await.unwrap();
    assert_eq!(
        store
            .task_heartbeat(&step_id, second.claim, TTL)
            .await
            .unwrap(),
        HeartbeatOutcome::Cancelled
    );
    assert_eq!(
        store.task_complete(&step_id, &json!(1)).await.unwrap(),
        ReportOutcome::Cancelled
    );
    assert_eq!(
        store
            .task_fail(&step_id, second.claim, &failure("x", None, true), TTL)
            .await
            .unwrap(),
        ReportOutcome::Cancelled
    );
}

#[tokio::test]
async fn a_completion_settles_once_and_journals_into_the_owner_waking_it() {
    let (_dir, store) = pinned("w-complete");
    let key = start(&store, "a").await;
    store.remote_arm(&arm(&key, "label")).await.unwrap();
    store
        .instance_park(&Park {
            key: key.clone(),
            generation: 0,
            fence: None,
            awaited: vec!["remote:label".into()],
            wake_after: None,
        })
        .await
        .unwrap();
    assert_eq!(status(&store, &key).await, Status::Suspended);
    let step_id = id(&key, "label");

    // Unclaimed, even: the first result wins.
    assert_eq!(
        store.task_complete(&step_id, &json!("L-1")).await.unwrap(),
        ReportOutcome::Delivered
    );
    let delivered = vec![row("remote:label", json!({"ok": "L-1"}))];
    assert_eq!(rows(&store, &key).await, delivered);
    assert_eq!(status(&store, &key).await, Status::Running);
    let settled = task(&store, &key, "label").await;
    assert_eq!(
        (settled.status, settled.output, settled.claimed_by),
        (TaskStatus::Completed, Some(json!("L-1")), None)
    );
    assert_eq!(
        store.task_complete(&step_id, &json!("L-2")).await.unwrap(),
        ReportOutcome::AlreadySettled
    );
    let late = failure("late", None, true);
    assert_eq!(
        store
            .task_fail(&step_id, Uuid::nil(), &late, TTL)
            .await
            .unwrap(),
        ReportOutcome::AlreadySettled
    );
    assert_eq!(rows(&store, &key).await, delivered);
    assert_eq!(
        store.remote_arm(&arm(&key, "label")).await.unwrap(),
        RemoteArmOutcome::Settled {
            value: json!({"ok": "L-1"}),
            lost: false
        }
    );
    assert_eq!(
        store
            .task_complete("wf/a/0/missing", &json!(1))
            .await
            .unwrap(),
        ReportOutcome::NotFound
    );
    assert_eq!(
        store
            .task_fail("wf/a/0/missing", Uuid::nil(), &late, TTL)
            .await
            .unwrap(),
        ReportOutcome::NotFound
    );

    // An owner that failed meanwhile takes nothing; the task still settles.
    let gone = start(&store, "gone").await;
    store.remote_arm(&arm(&gone, "label")).await.unwrap();
    append(
        &store,
        &gone,
        None,
        Event::WorkflowFailed {
            reason: "broken".into(),
        },
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        store
            .task_complete(&id(&gone, "label"), &json!("L"))
            .await
            .unwrap(),
        ReportOutcome::OwnerGone
    );
    assert_eq!(
        task(&store, &gone, "label").await.status,
        TaskStatus::Completed
    );
    assert_eq!(
        rows(&store, &gone).await,
        [row(marker_name::FAILED, json!("broken"))]
    );

    // A batch: one outcome per report in the callers' order, the first result winning.
    let batch = start(&store, "batch").await;
    for step in ["p", "q"] {
        store.remote_arm(&arm(&batch, step)).await.unwrap();
    }
    let reports = vec![
        (id(&batch, "q"), json!("q1")),
        (id(&batch, "p"), json!("p1")),
        (id(&batch, "q"), json!("q2")),
        (id(&key, "label"), json!("x")),
        ("wf/batch/0/missing".to_owned(), json!(0)),
    ];
    assert_eq!(
        Transport::tasks_complete(&store, &reports).await.unwrap(),
        [
            ReportOutcome::Delivered,
            ReportOutcome::Delivered,
            ReportOutcome::AlreadySettled,
            ReportOutcome::AlreadySettled,
            ReportOutcome::NotFound
        ]
    );
    assert_eq!(
        rows(&store, &batch).await,
        [
            row("remote:p", json!({"ok": "p1"})),
            row("remote:q", json!({"ok": "q1"}))
        ],
        "journaled in step id order of one owner"
    );
}

#[tokio::test]
async fn failures_retry_with_backoff_then_fail_for_good_and_stale_ones_are_ignored() {
    let (_dir, store) = pinned("w-fail");
    let key = start(&store, "a").await;
    let retried = RemoteArm {
        max_attempts: 3,
        redispatch_after: Some(TEN_MINUTES),
        ..arm(&key, "label")
    };
    store.remote_arm(&retried).await.unwrap();
    let step_id = id(&key, "label");
    let jammed = failure("jammed", Some("printer"), true);
    let first = claim_one(&store, "label").await;
    assert_eq!(
        store
            .task_fail(&step_id, Uuid::nil(), &jammed, TTL)
            .await
            .unwrap(),
        ReportOutcome::Stale
    );
    let delay = Duration::from_secs(30);
    assert_eq!(
        store
            .task_fail(&step_id, first.claim, &jammed, delay)
            .await
            .unwrap(),
        ReportOutcome::Retrying {
            at: T0 + Span::seconds(30)
        }
    );
    let pending = task(&store, &key, "label").await;
    let last_error = json!({"message": "jammed", "code": "printer", "retryable": true});
    assert_eq!(
        (
            pending.status,
            pending.attempts,
            pending.claimed_by,
            pending.last_error
        ),
        (TaskStatus::Pending, 1, None, Some(last_error.clone()))
    );
    // A pending task has no claim a report could carry.
    assert_eq!(
        store
            .task_fail(&step_id, first.claim, &jammed, delay)
            .await
            .unwrap(),
        ReportOutcome::Stale
    );
    // The redispatch deadline counts from the end of the backoff.
    assert_eq!(
        store.remote_arm(&retried).await.unwrap(),
        RemoteArmOutcome::Waiting {
            deadline: Some(T0 + Span::seconds(30) + Span::minutes(10))
        }
    );
    assert!(store
        .tasks_claim(&request(&["label"], "w1", 1))
        .await
        .unwrap()
        .is_empty());

    store.pin_clock(Some(T0 + Span::seconds(30)));
    let second = claim_one(&store, "label").await;
    assert_eq!(second.attempt, 2);
    assert_eq!(
        store
            .task_fail(&step_id, second.claim, &jammed, delay)
            .await
            .unwrap(),
        ReportOutcome::Retrying {
            at: T0 + Span::seconds(60)
        }
    );
    store.pin_clock(Some(T0 + Span::seconds(60)));
    let third = claim_one(&store, "label").await;
    assert_eq!(third.attempt, 3);
    assert_eq!(
        store
            .task_fail(&step_id, third.claim, &jammed, delay)
            .await
            .unwrap(),
        ReportOutcome::Delivered
    );
    let final_error = json!({"error": {"message": "jammed", "code": "printer", "retryable": true, "attempts": 3}});
    assert_eq!(
        rows(&store, &key).await,
        [row("remote:label", final_error.clone())]
    );
    let failed = task(&store, &key, "label").await;
    assert_eq!(
        (failed.status, failed.attempts, failed.last_error),
        (TaskStatus::Failed, 3, Some(last_error))
    );
    assert_eq!(
        store
            .task_fail(&step_id, third.claim, &jammed, delay)
            .await
            .unwrap(),
        ReportOutcome::AlreadySettled
    );
    assert_eq!(
        store.remote_arm(&retried).await.unwrap(),
        RemoteArmOutcome::Settled {
            value: final_error,
            lost: false
        }
    );

    // Not retryable: failed at once, whatever attempts remain.
    let scan = RemoteArm {
        max_attempts: 5,
        ..arm(&key, "scan")
    };
    store.remote_arm(&scan).await.unwrap();
    let claimed = claim_one(&store, "scan").await;
    assert_eq!(
        store
            .task_fail(
                &id(&key, "scan"),
                claimed.claim,
                &failure("bad input", None, false),
                delay
            )
            .await
            .unwrap(),
        ReportOutcome::Delivered
    );
    assert_eq!(
        rows(&store, &key).await.pop(),
        Some(row(
            "remote:scan",
            json!({"error": {"message": "bad input", "code": null, "retryable": false, "attempts": 1}})
        ))
    );
}
