//! Reporting a remote task's result: the first result wins and wakes the owner, retryable
//! failures back off until the last is journaled, stale and late reports change nothing, and a
//! batch of reports answers each in the caller's order.

use std::time::Duration;

use super::{arm, claim_one, claim_tasks, fail_instance, failure, task};
use crate::contract::support::{key, recorded, start, start_parked, status, TestResult};
use crate::Harness;
use keiro_journal::{
    store::remote_step_id, store::RemoteArm, store::RemoteArmOutcome, InstanceKey, Status,
};
use keiro_remote::{ReportOutcome, TaskStatus};
use serde_json::{json, Value};
use time::OffsetDateTime;

pub async fn completion_is_idempotent_and_wakes_a_suspended_owner(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    start_parked(store, &owner).await?;
    let mut listener = h.notifications().await?;
    let a = arm(&owner, "label", json!({"order": 7}));
    store.remote_arm(&a).await?;
    let payloads = listener.drain(Duration::from_millis(200)).await;
    assert_eq!(
        payloads,
        ["remote"],
        "a dispatch notifies remote workers only"
    );
    assert_eq!(status(store, &owner).await?, Status::Suspended);

    let claimed = claim_one(&*h.transport, "label").await?;
    assert_eq!(claimed.input, json!({"order": 7}));
    let done = h
        .transport
        .task_complete(&a.step_id, &json!("label-7"))
        .await?;
    assert_eq!(done, ReportOutcome::Delivered);
    assert_eq!(status(store, &owner).await?, Status::Running);
    assert_eq!(
        recorded(store, &owner, "remote:label").await?,
        [json!({"ok": "label-7"})]
    );
    let payloads = listener.drain(Duration::from_millis(200)).await;
    assert_eq!(payloads, ["owner/o-1"], "the owner's wake");

    // Duplicate and late reports change nothing.
    assert_eq!(
        h.transport
            .task_complete(&a.step_id, &json!("other"))
            .await?,
        ReportOutcome::AlreadySettled
    );
    assert_eq!(
        h.transport
            .task_fail(
                &a.step_id,
                claimed.claim,
                &failure("late", None, false),
                Duration::ZERO
            )
            .await?,
        ReportOutcome::AlreadySettled
    );
    assert_eq!(
        h.transport
            .task_complete("owner/o-1/0/nope", &json!(1))
            .await?,
        ReportOutcome::NotFound
    );
    assert_eq!(
        recorded(store, &owner, "remote:label").await?,
        [json!({"ok": "label-7"})]
    );
    let stored = task(&*h.admin, &owner, &a.step_id).await?;
    assert_eq!(stored.status, TaskStatus::Completed);
    assert_eq!(stored.output, Some(json!("label-7")));
    assert_eq!(stored.claimed_by, None);
    Ok(())
}

pub async fn a_completion_without_a_claim_wins_and_a_gone_owner_is_reported(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = arm(&owner, "label", json!(1));
    store.remote_arm(&a).await?;
    // Pending, never claimed: the first result still wins.
    assert_eq!(
        h.transport.task_complete(&a.step_id, &json!(2)).await?,
        ReportOutcome::Delivered
    );
    let b = arm(&owner, "other", json!(1));
    store.remote_arm(&b).await?;
    // Failed, not cancelled: a cancellation cancels the task instead, and a failed owner's
    // task keeps its result for a requeue.
    fail_instance(store, &owner, "broken").await?;
    assert_eq!(
        h.transport.task_complete(&b.step_id, &json!(3)).await?,
        ReportOutcome::OwnerGone
    );
    assert_eq!(
        task(&*h.admin, &owner, &b.step_id).await?.status,
        TaskStatus::Completed
    );
    assert!(recorded(store, &owner, "remote:other").await?.is_empty());
    Ok(())
}

pub async fn retryable_failures_back_off_and_the_last_one_is_journaled(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    start_parked(store, &owner).await?;
    let a = RemoteArm {
        max_attempts: 3,
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&a).await?;
    // A backoff short enough to wait out: the stores share no clock a test could move.
    const BACKOFF: Duration = Duration::from_millis(700);
    const SLACK: Duration = Duration::from_millis(100);
    let mut claimed = claim_one(&*h.transport, "label").await?;
    for attempt in 1..=2 {
        assert_eq!(claimed.attempt, attempt);
        let before = OffsetDateTime::now_utc();
        let outcome = h
            .transport
            .task_fail(
                &a.step_id,
                claimed.claim,
                &failure("printer jammed", Some("jam"), true),
                BACKOFF,
            )
            .await?;
        let ReportOutcome::Retrying { at } = outcome else {
            return Err(format!("expected a retry, got {outcome:?}").into());
        };
        assert!(
            at >= before + BACKOFF - SLACK && at < before + BACKOFF + Duration::from_secs(5),
            "{at} vs {before}"
        );
        let stored = task(&*h.admin, &owner, &a.step_id).await?;
        assert_eq!(
            (stored.status, stored.claimed_by),
            (TaskStatus::Pending, None)
        );
        assert_eq!(stored.attempts, attempt);
        assert_eq!(
            stored.last_error,
            Some(json!({"message": "printer jammed", "code": "jam", "retryable": true}))
        );
        assert!(
            claim_tasks(&*h.transport, &["label"], 1).await?.is_empty(),
            "not claimable during its backoff"
        );
        assert_eq!(status(store, &owner).await?, Status::Suspended, "no wake");
        // Claimable again once the backoff has passed, and not before.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        claimed = loop {
            if let Some(task) = claim_tasks(&*h.transport, &["label"], 1).await?.pop() {
                break task;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "attempt {attempt}: the task never became claimable after its backoff"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            OffsetDateTime::now_utc() + SLACK >= at,
            "claimed before its backoff ended at {at}"
        );
    }
    assert_eq!(claimed.attempt, 3);
    let outcome = h
        .transport
        .task_fail(
            &a.step_id,
            claimed.claim,
            &failure("printer on fire", Some("fire"), true),
            Duration::from_secs(30),
        )
        .await?;
    assert_eq!(outcome, ReportOutcome::Delivered);
    assert_eq!(status(store, &owner).await?, Status::Running);
    assert_eq!(
        recorded(store, &owner, "remote:label").await?,
        [
            json!({"error": {"message": "printer on fire", "code": "fire", "retryable": true, "attempts": 3}})
        ]
    );
    let stored = task(&*h.admin, &owner, &a.step_id).await?;
    assert_eq!((stored.status, stored.attempts), (TaskStatus::Failed, 3));
    Ok(())
}

pub async fn a_retry_counts_the_redispatch_deadline_from_the_end_of_its_backoff(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let redispatch_after = Duration::from_secs(600);
    let a = RemoteArm {
        max_attempts: 3,
        redispatch_after: Some(redispatch_after),
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&a).await?;
    let claimed = claim_one(&*h.transport, "label").await?;
    let outcome = h
        .transport
        .task_fail(
            &a.step_id,
            claimed.claim,
            &failure("jammed", None, true),
            Duration::from_secs(30),
        )
        .await?;
    let ReportOutcome::Retrying { at } = outcome else {
        return Err(format!("expected a retry, got {outcome:?}").into());
    };
    // Waiting out the backoff is not a lost dispatch.
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Waiting {
            deadline: Some(at + redispatch_after)
        }
    );
    Ok(())
}

pub async fn a_failure_that_is_not_retryable_fails_at_once(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = RemoteArm {
        max_attempts: 5,
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&a).await?;
    let claimed = claim_one(&*h.transport, "label").await?;
    assert_eq!(
        h.transport
            .task_fail(
                &a.step_id,
                claimed.claim,
                &failure("bad address", None, false),
                Duration::from_secs(30)
            )
            .await?,
        ReportOutcome::Delivered
    );
    assert_eq!(
        recorded(store, &owner, "remote:label").await?,
        [
            json!({"error": {"message": "bad address", "code": null, "retryable": false, "attempts": 1}})
        ]
    );
    assert_eq!(
        h.transport
            .task_fail(
                "owner/o-1/0/nope",
                claimed.claim,
                &failure("x", None, false),
                Duration::ZERO
            )
            .await?,
        ReportOutcome::NotFound
    );
    Ok(())
}

pub async fn a_failure_of_a_pending_task_is_stale(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = arm(&owner, "label", json!(1));
    store.remote_arm(&a).await?;
    let claimed = claim_one(&*h.transport, "label").await?;
    // An operator redispatch drops the claim: its holder's report no longer counts.
    assert_eq!(h.admin.remote_redispatch_pending(&owner).await?, Some(1));
    assert_eq!(
        h.transport
            .task_fail(
                &a.step_id,
                claimed.claim,
                &failure("x", None, false),
                Duration::ZERO
            )
            .await?,
        ReportOutcome::Stale
    );
    let stored = task(&*h.admin, &owner, &a.step_id).await?;
    assert_eq!((stored.status, stored.attempts), (TaskStatus::Pending, 0));
    Ok(())
}

pub async fn a_batch_of_reports_answers_each_in_the_callers_order(h: Harness) -> TestResult {
    let store = &*h.store;
    let (first, second) = (key("owner", "b-1"), key("owner", "b-2"));
    for owner in [&first, &second] {
        store.instance_start(&start(owner, Value::Null)).await?;
    }
    // Owners in the opposite order of the step ids, so the function's lock order (by owner)
    // differs from the caller's.
    for (owner, step) in [(&second, "a"), (&first, "b"), (&first, "c")] {
        store.remote_arm(&arm(owner, step, json!(step))).await?;
    }
    let id = |owner: &InstanceKey, step: &str| remote_step_id(owner, 0, step);
    h.transport
        .task_complete(&id(&first, "b"), &json!("early"))
        .await?;
    let reports = vec![
        (id(&first, "c"), json!("C")),
        ("owner/nobody/0/x".to_owned(), json!("?")),
        (id(&second, "a"), json!("A")),
        (id(&first, "b"), json!("late")),
    ];
    let outcomes = h.transport.tasks_complete(&reports).await?;
    assert_eq!(
        outcomes,
        [
            ReportOutcome::Delivered,
            ReportOutcome::NotFound,
            ReportOutcome::Delivered,
            ReportOutcome::AlreadySettled
        ]
    );
    assert_eq!(
        recorded(store, &first, "remote:c").await?,
        [json!({"ok": "C"})]
    );
    assert_eq!(
        recorded(store, &second, "remote:a").await?,
        [json!({"ok": "A"})]
    );
    assert_eq!(
        recorded(store, &first, "remote:b").await?,
        [json!({"ok": "early"})],
        "first result wins"
    );
    Ok(())
}
