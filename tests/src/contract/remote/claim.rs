//! Claiming remote tasks: no task twice under concurrency, priority then age across groups,
//! expired claims (a failed attempt; the last one fails the step as crashed), heartbeats.

use std::collections::HashSet;
use std::time::Duration;

use super::{arm, claim_request, claim_tasks, failure, task};
use crate::contract::support::{key, recorded, start, start_parked, status, TestResult, SLACK};
use crate::Harness;
use keiro_journal::{store::RemoteArm, store::RemoteArmOutcome, Status, StoreError};
use keiro_remote::{HeartbeatOutcome, ReportOutcome, TaskStatus};
use serde_json::{json, Value};
use time::OffsetDateTime;
use uuid::Uuid;

pub async fn concurrent_claimers_never_take_the_same_task(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    for round in 0..5 {
        let mut armed = HashSet::new();
        for n in 0..60 {
            let a = arm(&owner, &format!("s{round}-{n}"), json!(n));
            let a = RemoteArm {
                group: "label".into(),
                ..a
            };
            store.remote_arm(&a).await?;
            armed.insert(a.step_id);
        }
        let claimer = |worker: &'static str| {
            let transport = h.transport.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let request = claim_request(&["label"], worker, 3, Duration::from_secs(60));
                    let tasks = transport.tasks_claim(&request).await?;
                    if tasks.is_empty() {
                        return Ok::<_, StoreError>(got);
                    }
                    got.extend(tasks.into_iter().map(|t| (t.step_id, t.claim)));
                }
            })
        };
        let (a, b) = (claimer("w-a"), claimer("w-b"));
        let (a, b) = (a.await??, b.await??);
        let mut seen = HashSet::new();
        for (step_id, _) in a.iter().chain(&b) {
            assert!(seen.insert(step_id.clone()), "{step_id} was claimed twice");
        }
        assert_eq!(
            seen, armed,
            "round {round}: every task claimed exactly once"
        );
        let claims: HashSet<Uuid> = a.iter().chain(&b).map(|(_, c)| *c).collect();
        assert_eq!(claims.len(), seen.len(), "every claim id is fresh");
    }
    Ok(())
}

pub async fn claims_go_by_priority_then_age_across_groups(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let before = OffsetDateTime::now_utc();
    for (step, group, priority) in [
        ("a", "g1", 0),
        ("b", "g2", 5),
        ("c", "g1", 0),
        ("d", "g1", 5),
        ("e", "g3", 9),
        ("f", "g2", -1),
    ] {
        let a = RemoteArm {
            group: group.into(),
            priority,
            ..arm(&owner, step, json!(step))
        };
        assert!(matches!(
            store.remote_arm(&a).await?,
            RemoteArmOutcome::Dispatched { deadline: None }
        ));
    }
    // g3 is not asked for; duplicate groups change nothing.
    let first = claim_tasks(&*h.transport, &["g1", "g2", "g1"], 3).await?;
    let steps: Vec<_> = first.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(steps, ["b", "d", "a"]);
    let rest = claim_tasks(&*h.transport, &["g1", "g2"], 10).await?;
    let steps: Vec<_> = rest.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(steps, ["c", "f"]);
    let claimed = &first[0];
    assert_eq!(claimed.key, owner);
    assert_eq!(claimed.group, "g2");
    assert_eq!(claimed.priority, 5);
    assert_eq!(claimed.input, json!("b"));
    assert_eq!(
        (claimed.attempt, claimed.max_attempts, claimed.dispatches),
        (1, 1, 1)
    );
    assert_eq!(claimed.step_id, "owner/o-1/0/b");
    // Available since it was armed.
    assert!(
        claimed.available_at >= before - SLACK && claimed.available_at <= before + SLACK,
        "{} vs {before}",
        claimed.available_at
    );
    assert!(claim_tasks(&*h.transport, &["g1", "g2"], 10)
        .await?
        .is_empty());
    assert!(claim_tasks(&*h.transport, &[], 10).await?.is_empty());
    assert!(claim_tasks(&*h.transport, &["g3"], 0).await?.is_empty());
    let task = task(&*h.admin, &owner, "owner/o-1/0/b").await?;
    assert_eq!(task.status, TaskStatus::Running);
    assert_eq!(task.claimed_by.as_deref(), Some("w-1"));
    Ok(())
}

pub async fn an_expired_claim_is_claimable_again_and_its_holder_is_stale(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = RemoteArm {
        max_attempts: 3,
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&a).await?;
    let short = claim_request(&["label"], "w-old", 1, Duration::from_millis(50));
    let old = h.transport.tasks_claim(&short).await?.remove(0);
    let fresh = claim_request(&["label"], "w-new", 1, Duration::from_secs(60));
    assert!(
        h.transport.tasks_claim(&fresh).await?.is_empty(),
        "the claim is live"
    );
    tokio::time::sleep(Duration::from_millis(120)).await;
    let new = h.transport.tasks_claim(&fresh).await?.remove(0);
    assert_eq!(new.step_id, old.step_id);
    assert_ne!(new.claim, old.claim);
    assert_eq!(new.attempt, 2, "an expired claim is a failed attempt");
    assert_eq!(
        h.transport
            .task_heartbeat(&old.step_id, old.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost
    );
    // The old holder's failure is ignored; the new claim stands.
    let stale = h
        .transport
        .task_fail(
            &old.step_id,
            old.claim,
            &failure("late", None, true),
            Duration::ZERO,
        )
        .await?;
    assert_eq!(stale, ReportOutcome::Stale);
    let stored = task(&*h.admin, &owner, &a.step_id).await?;
    assert_eq!(stored.status, TaskStatus::Running);
    assert_eq!(stored.attempts, 1);
    assert_eq!(stored.claimed_by.as_deref(), Some("w-new"));
    assert_eq!(
        stored.last_error,
        Some(json!({
            "message": "the claim of w-old expired without a report (attempt 1 of 3)",
            "code": "remote_step_crashed",
            "retryable": true,
        }))
    );
    Ok(())
}

pub async fn the_last_expired_claim_fails_the_step_as_crashed_and_wakes_the_owner(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    start_parked(store, &owner).await?;
    let a = RemoteArm {
        max_attempts: 2,
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&a).await?;
    let short = claim_request(&["label"], "w-dead", 1, Duration::from_millis(50));
    let mut last = None;
    for attempt in 1..=2 {
        let claimed = h.transport.tasks_claim(&short).await?;
        assert_eq!(
            claimed.iter().map(|t| t.attempt).collect::<Vec<_>>(),
            [attempt]
        );
        last = claimed.into_iter().next();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let last = last.ok_or("no last claim")?;
    assert_eq!(status(store, &owner).await?, Status::Suspended);
    let mut listener = h.notifications().await?;
    assert!(claim_tasks(&*h.transport, &["label"], 1).await?.is_empty());
    let crashed = json!({"error": {
        "message": "the claim of w-dead expired without a report (attempt 2 of 2)",
        "code": "remote_step_crashed",
        "retryable": true,
        "attempts": 2,
    }});
    assert_eq!(
        recorded(store, &owner, "remote:label").await?,
        std::slice::from_ref(&crashed)
    );
    assert_eq!(status(store, &owner).await?, Status::Running);
    let payloads = listener.drain(Duration::from_millis(200)).await;
    assert_eq!(payloads, ["owner/o-1"]);
    let stored = task(&*h.admin, &owner, &a.step_id).await?;
    assert_eq!(
        (stored.status, stored.attempts, stored.claimed_by),
        (TaskStatus::Failed, 2, None)
    );
    // The dead claimant's late words change nothing; a re-arm reads the failure.
    assert_eq!(
        h.transport
            .task_fail(
                &a.step_id,
                last.claim,
                &failure("late", None, true),
                Duration::ZERO
            )
            .await?,
        ReportOutcome::AlreadySettled
    );
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Settled {
            value: crashed,
            lost: false
        }
    );
    Ok(())
}

pub async fn a_claim_leaves_the_expired_claims_of_other_groups_alone(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let scan = RemoteArm {
        max_attempts: 2,
        ..arm(&owner, "scan", json!(1))
    };
    store.remote_arm(&scan).await?;
    let short = claim_request(&["scan"], "w-dead", 1, Duration::from_millis(50));
    assert_eq!(h.transport.tasks_claim(&short).await?.len(), 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A claimer of another group counts nothing: the expired claim is left to its own.
    assert!(claim_tasks(&*h.transport, &["label"], 1).await?.is_empty());
    let stored = task(&*h.admin, &owner, &scan.step_id).await?;
    assert_eq!(
        (stored.status, stored.attempts, stored.claimed_by.as_deref()),
        (TaskStatus::Running, 0, Some("w-dead"))
    );
    assert_eq!(stored.last_error, None);
    let next = claim_tasks(&*h.transport, &["scan"], 1).await?;
    assert_eq!(next.iter().map(|t| t.attempt).collect::<Vec<_>>(), [2]);
    Ok(())
}

pub async fn a_heartbeat_extends_only_the_current_claim(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = arm(&owner, "label", json!(1));
    store.remote_arm(&a).await?;
    let short = claim_request(&["label"], "w-1", 1, Duration::from_millis(200));
    let claimed = h.transport.tasks_claim(&short).await?.remove(0);
    assert_eq!(
        h.transport
            .task_heartbeat(&a.step_id, claimed.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Extended
    );
    assert_eq!(
        h.transport
            .task_heartbeat(&a.step_id, Uuid::new_v4(), Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost
    );
    assert_eq!(
        h.transport
            .task_heartbeat("owner/o-1/0/nope", claimed.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        claim_tasks(&*h.transport, &["label"], 1).await?.is_empty(),
        "the heartbeat kept the claim past its first ttl"
    );
    h.transport
        .task_complete(&a.step_id, &json!("done"))
        .await?;
    assert_eq!(
        h.transport
            .task_heartbeat(&a.step_id, claimed.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost,
        "a settled task has no claim"
    );

    // A heartbeat sets the claim's expiry from now, even nearer than it was.
    let b = RemoteArm {
        max_attempts: 2,
        ..arm(&owner, "short", json!(1))
    };
    store.remote_arm(&b).await?;
    let long = claim_request(&["short"], "w-1", 1, Duration::from_secs(60));
    let claimed = h.transport.tasks_claim(&long).await?.remove(0);
    assert_eq!(
        h.transport
            .task_heartbeat(&b.step_id, claimed.claim, Duration::from_millis(50))
            .await?,
        HeartbeatOutcome::Extended
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let again = claim_tasks(&*h.transport, &["short"], 1).await?;
    assert_eq!(
        again.iter().map(|t| t.attempt).collect::<Vec<_>>(),
        [2],
        "the claim expired 50 ms after the heartbeat"
    );
    Ok(())
}
