//! Remote steps on the Postgres store: the task table's arm, claim, heartbeat and reports, the
//! operator's redispatch, requeue and fix-and-replay, and the `remote` notification. The
//! cross-store behaviour is the conformance suite's (`tests/tests/engine/remote.rs`); these tests
//! pin what only Postgres can get wrong: SKIP LOCKED claims under concurrency, the claim
//! order, database-clock expiries, and the rows each transaction leaves.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::{
    backend_pid, blocked_by, claim, key, recorded, remote_arm as arm, sql, start, start_parked,
    status, Listener, TestResult,
};
use keiro_journal::{
    store::child_result_step, store::remote_step_id, store::ChildSpawn, store::Park,
    store::ParkOutcome, store::RemoteArm, store::RemoteArmOutcome, Append, AppendOutcome, Event,
    InstanceKey, JournalStore, Status, StepKind, StoreError,
};
use keiro_postgres::{Config, PgStore};
use keiro_remote::{
    ClaimRequest, ClaimedTask, HeartbeatOutcome, RemoteAdmin, RemoteTask, ReportOutcome,
    RequeueOutcome, RetryOutcome, TaskFailure, TaskStatus, Transport,
};
use keiro_resume::{Notifier, WakeFilter, WakeReason};
use keiro_tests::pg::TestDb;
use serde_json::{json, Value};
use time::OffsetDateTime;
use uuid::Uuid;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn claim_request(groups: &[&str], worker: &str, limit: u32, ttl: Duration) -> ClaimRequest {
    ClaimRequest {
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        worker: worker.into(),
        limit,
        claim_ttl: ttl,
    }
}

/// Claims up to `limit` tasks of `groups` with a one-minute claim.
async fn claim_tasks(
    store: &PgStore,
    groups: &[&str],
    limit: u32,
) -> Result<Vec<ClaimedTask>, Error> {
    Ok(store
        .tasks_claim(&claim_request(
            groups,
            "w-1",
            limit,
            Duration::from_secs(60),
        ))
        .await?)
}

/// Claims exactly one task of `group`.
async fn claim_one(store: &PgStore, group: &str) -> Result<ClaimedTask, Error> {
    let mut tasks = claim_tasks(store, &[group], 1).await?;
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
async fn task(store: &PgStore, k: &InstanceKey, step_id: &str) -> Result<RemoteTask, Error> {
    store
        .remote_tasks(k)
        .await?
        .into_iter()
        .find(|t| t.step_id == step_id)
        .ok_or_else(|| format!("no task {step_id}").into())
}

/// Makes every task claimable now (ends backoffs) through SQL.
async fn end_backoffs(store: &PgStore) -> TestResult {
    sql(store)
        .await?
        .execute(
            "UPDATE remote_tasks SET available_at = now() WHERE status = 'pending'",
            &[],
        )
        .await?;
    Ok(())
}

fn failure(message: &str, code: Option<&str>, retryable: bool) -> TaskFailure {
    TaskFailure {
        message: message.into(),
        code: code.map(str::to_owned),
        retryable,
    }
}

/// Fails `k` with an external `failed` marker.
async fn fail_instance(store: &PgStore, k: &InstanceKey, reason: &str) -> TestResult {
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
async fn complete_instance(store: &PgStore, k: &InstanceKey, output: Value) -> TestResult {
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
async fn spawn(store: &PgStore, parent: &InstanceKey, child: &InstanceKey) -> TestResult {
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
async fn resets(store: &PgStore, k: &InstanceKey) -> Result<Vec<(String, String)>, Error> {
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
async fn resurrections(store: &PgStore, k: &InstanceKey) -> Result<usize, Error> {
    Ok(store
        .journal_history(k)
        .await?
        .into_iter()
        .filter(|e| matches!(e.event, Event::Resurrected))
        .count())
}

/// The `parent_step` column of `k`.
async fn parent_step(store: &PgStore, k: &InstanceKey) -> Result<Option<String>, Error> {
    let row = sql(store)
        .await?
        .query_one(
            "SELECT parent_step::text FROM workflows WHERE workflow_name = $1 AND workflow_id = $2",
            &[&k.name.as_str(), &k.id.as_str()],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn concurrent_claimers_never_take_the_same_task() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
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
            let store = store.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    let request = claim_request(&["label"], worker, 3, Duration::from_secs(60));
                    let tasks = store.tasks_claim(&request).await?;
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

#[tokio::test]
async fn claims_go_by_priority_then_age_across_groups() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
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
    let first = claim_tasks(&store, &["g1", "g2", "g1"], 3).await?;
    let steps: Vec<_> = first.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(steps, ["b", "d", "a"]);
    let rest = claim_tasks(&store, &["g1", "g2"], 10).await?;
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
    assert!(claim_tasks(&store, &["g1", "g2"], 10).await?.is_empty());
    assert!(claim_tasks(&store, &[], 10).await?.is_empty());
    assert!(claim_tasks(&store, &["g3"], 0).await?.is_empty());
    let task = task(&store, &owner, "owner/o-1/0/b").await?;
    assert_eq!(task.status, TaskStatus::Running);
    assert_eq!(task.claimed_by.as_deref(), Some("w-1"));
    Ok(())
}

#[tokio::test]
async fn an_expired_claim_is_claimable_again_and_its_holder_is_stale() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = RemoteArm {
        max_attempts: 3,
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&a).await?;
    let short = claim_request(&["label"], "w-old", 1, Duration::from_millis(50));
    let old = store.tasks_claim(&short).await?.remove(0);
    let fresh = claim_request(&["label"], "w-new", 1, Duration::from_secs(60));
    assert!(
        store.tasks_claim(&fresh).await?.is_empty(),
        "the claim is live"
    );
    tokio::time::sleep(Duration::from_millis(120)).await;
    let new = store.tasks_claim(&fresh).await?.remove(0);
    assert_eq!(new.step_id, old.step_id);
    assert_ne!(new.claim, old.claim);
    assert_eq!(new.attempt, 2, "an expired claim is a failed attempt");
    assert_eq!(
        store
            .task_heartbeat(&old.step_id, old.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost
    );
    // The old holder's failure is ignored; the new claim stands.
    let stale = store
        .task_fail(
            &old.step_id,
            old.claim,
            &failure("late", None, true),
            Duration::ZERO,
        )
        .await?;
    assert_eq!(stale, ReportOutcome::Stale);
    let stored = task(&store, &owner, &a.step_id).await?;
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

#[tokio::test]
async fn the_last_expired_claim_fails_the_step_as_crashed_and_wakes_the_owner() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    start_parked(&store, &owner).await?;
    let a = RemoteArm {
        max_attempts: 2,
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&a).await?;
    let short = claim_request(&["label"], "w-dead", 1, Duration::from_millis(50));
    for attempt in 1..=2 {
        let claimed = store.tasks_claim(&short).await?;
        assert_eq!(
            claimed.iter().map(|t| t.attempt).collect::<Vec<_>>(),
            [attempt]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status(&store, &owner).await?, Status::Suspended);
    let mut listener = Listener::on(&store).await?;
    assert!(claim_tasks(&store, &["label"], 1).await?.is_empty());
    let crashed = json!({"error": {
        "message": "the claim of w-dead expired without a report (attempt 2 of 2)",
        "code": "remote_step_crashed",
        "retryable": true,
        "attempts": 2,
    }});
    assert_eq!(
        recorded(&store, &owner, "remote:label").await?,
        std::slice::from_ref(&crashed)
    );
    assert_eq!(status(&store, &owner).await?, Status::Running);
    let payloads: Vec<_> = listener
        .drain(Duration::from_millis(200))
        .await
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(payloads, ["owner/o-1"]);
    let stored = task(&store, &owner, &a.step_id).await?;
    assert_eq!(
        (stored.status, stored.attempts, stored.claimed_by),
        (TaskStatus::Failed, 2, None)
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

#[tokio::test]
async fn a_heartbeat_extends_only_the_current_claim() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = arm(&owner, "label", json!(1));
    store.remote_arm(&a).await?;
    let short = claim_request(&["label"], "w-1", 1, Duration::from_millis(200));
    let claimed = store.tasks_claim(&short).await?.remove(0);
    assert_eq!(
        store
            .task_heartbeat(&a.step_id, claimed.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Extended
    );
    assert_eq!(
        store
            .task_heartbeat(&a.step_id, Uuid::new_v4(), Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost
    );
    assert_eq!(
        store
            .task_heartbeat("owner/o-1/0/nope", claimed.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        claim_tasks(&store, &["label"], 1).await?.is_empty(),
        "the heartbeat kept the claim past its first ttl"
    );
    store.task_complete(&a.step_id, &json!("done")).await?;
    assert_eq!(
        store
            .task_heartbeat(&a.step_id, claimed.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost,
        "a settled task has no claim"
    );
    Ok(())
}

#[tokio::test]
async fn completion_is_idempotent_and_wakes_a_suspended_owner() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    start_parked(&store, &owner).await?;
    let mut listener = Listener::on(&store).await?;
    let a = arm(&owner, "label", json!({"order": 7}));
    store.remote_arm(&a).await?;
    let payloads: Vec<_> = listener
        .drain(Duration::from_millis(200))
        .await
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        payloads,
        ["remote"],
        "a dispatch notifies remote workers only"
    );
    assert_eq!(status(&store, &owner).await?, Status::Suspended);

    let claimed = claim_one(&store, "label").await?;
    assert_eq!(claimed.input, json!({"order": 7}));
    let done = store.task_complete(&a.step_id, &json!("label-7")).await?;
    assert_eq!(done, ReportOutcome::Delivered);
    assert_eq!(status(&store, &owner).await?, Status::Running);
    assert_eq!(
        recorded(&store, &owner, "remote:label").await?,
        [json!({"ok": "label-7"})]
    );
    let payloads: Vec<_> = listener
        .drain(Duration::from_millis(200))
        .await
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(payloads, ["owner/o-1"], "the owner's wake");

    // Duplicate and late reports change nothing.
    assert_eq!(
        store.task_complete(&a.step_id, &json!("other")).await?,
        ReportOutcome::AlreadySettled
    );
    assert_eq!(
        store
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
        store.task_complete("owner/o-1/0/nope", &json!(1)).await?,
        ReportOutcome::NotFound
    );
    assert_eq!(
        recorded(&store, &owner, "remote:label").await?,
        [json!({"ok": "label-7"})]
    );
    let stored = task(&store, &owner, &a.step_id).await?;
    assert_eq!(stored.status, TaskStatus::Completed);
    assert_eq!(stored.output, Some(json!("label-7")));
    assert_eq!(stored.claimed_by, None);
    Ok(())
}

#[tokio::test]
async fn a_completion_without_a_claim_wins_and_a_gone_owner_is_reported() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = arm(&owner, "label", json!(1));
    store.remote_arm(&a).await?;
    // Pending, never claimed: the first result still wins.
    assert_eq!(
        store.task_complete(&a.step_id, &json!(2)).await?,
        ReportOutcome::Delivered
    );
    let b = arm(&owner, "other", json!(1));
    store.remote_arm(&b).await?;
    // Failed, not cancelled: a cancellation cancels the task instead, and a failed owner's
    // task keeps its result for a requeue.
    fail_instance(&store, &owner, "broken").await?;
    assert_eq!(
        store.task_complete(&b.step_id, &json!(3)).await?,
        ReportOutcome::OwnerGone
    );
    assert_eq!(
        task(&store, &owner, &b.step_id).await?.status,
        TaskStatus::Completed
    );
    assert!(recorded(&store, &owner, "remote:other").await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn retryable_failures_back_off_and_the_last_one_is_journaled() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    start_parked(&store, &owner).await?;
    let a = RemoteArm {
        max_attempts: 3,
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&a).await?;
    for attempt in 1..=2 {
        let claimed = claim_one(&store, "label").await?;
        assert_eq!(claimed.attempt, attempt);
        let before = OffsetDateTime::now_utc();
        let outcome = store
            .task_fail(
                &a.step_id,
                claimed.claim,
                &failure("printer jammed", Some("jam"), true),
                Duration::from_secs(30),
            )
            .await?;
        let ReportOutcome::Retrying { at } = outcome else {
            return Err(format!("expected a retry, got {outcome:?}").into());
        };
        assert!(at >= before + Duration::from_secs(29), "{at} vs {before}");
        let stored = task(&store, &owner, &a.step_id).await?;
        assert_eq!(stored.status, TaskStatus::Pending);
        assert_eq!(stored.attempts, attempt);
        assert_eq!(
            stored.last_error,
            Some(json!({"message": "printer jammed", "code": "jam", "retryable": true}))
        );
        assert!(
            claim_tasks(&store, &["label"], 1).await?.is_empty(),
            "not claimable during its backoff"
        );
        assert_eq!(status(&store, &owner).await?, Status::Suspended, "no wake");
        end_backoffs(&store).await?;
    }
    let claimed = claim_one(&store, "label").await?;
    assert_eq!(claimed.attempt, 3);
    let outcome = store
        .task_fail(
            &a.step_id,
            claimed.claim,
            &failure("printer on fire", Some("fire"), true),
            Duration::from_secs(30),
        )
        .await?;
    assert_eq!(outcome, ReportOutcome::Delivered);
    assert_eq!(status(&store, &owner).await?, Status::Running);
    assert_eq!(
        recorded(&store, &owner, "remote:label").await?,
        [
            json!({"error": {"message": "printer on fire", "code": "fire", "retryable": true, "attempts": 3}})
        ]
    );
    let stored = task(&store, &owner, &a.step_id).await?;
    assert_eq!((stored.status, stored.attempts), (TaskStatus::Failed, 3));
    Ok(())
}

#[tokio::test]
async fn a_failure_that_is_not_retryable_fails_at_once() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = RemoteArm {
        max_attempts: 5,
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&a).await?;
    let claimed = claim_one(&store, "label").await?;
    assert_eq!(
        store
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
        recorded(&store, &owner, "remote:label").await?,
        [
            json!({"error": {"message": "bad address", "code": null, "retryable": false, "attempts": 1}})
        ]
    );
    assert_eq!(
        store
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

#[tokio::test]
async fn a_failure_of_a_pending_task_is_stale() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = arm(&owner, "label", json!(1));
    store.remote_arm(&a).await?;
    let claimed = claim_one(&store, "label").await?;
    // An operator redispatch drops the claim: its holder's report no longer counts.
    assert_eq!(store.remote_redispatch_pending(&owner).await?, Some(1));
    assert_eq!(
        store
            .task_fail(
                &a.step_id,
                claimed.claim,
                &failure("x", None, false),
                Duration::ZERO
            )
            .await?,
        ReportOutcome::Stale
    );
    let stored = task(&store, &owner, &a.step_id).await?;
    assert_eq!((stored.status, stored.attempts), (TaskStatus::Pending, 0));
    Ok(())
}

#[tokio::test]
async fn arming_is_idempotent_and_learns_the_result() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = arm(&owner, "label", json!("first"));
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Dispatched { deadline: None }
    );
    let rearm = RemoteArm {
        input: json!("second"),
        priority: 9,
        group: "elsewhere".into(),
        ..a.clone()
    };
    assert_eq!(
        store.remote_arm(&rearm).await?,
        RemoteArmOutcome::Waiting { deadline: None }
    );
    let claimed = claim_one(&store, "label").await?;
    assert_eq!((claimed.input, claimed.priority), (json!("first"), 0));
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Waiting { deadline: None },
        "a claimed task without a deadline waits"
    );
    store.task_complete(&a.step_id, &json!("out")).await?;
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Settled {
            value: json!({"ok": "out"}),
            lost: false
        }
    );
    assert_eq!(store.remote_tasks(&owner).await?.len(), 1);

    // A stale fence writes nothing; a missing owner is an error.
    let fence = claim(&store, &owner, "runner").await?;
    let stale = RemoteArm {
        fence: Some(keiro_journal::Fence {
            epoch: fence.epoch - 1,
            ..fence.clone()
        }),
        ..arm(&owner, "fenced", json!(1))
    };
    assert!(store.remote_arm(&stale).await.unwrap_err().is_lease_lost());
    let live = RemoteArm {
        fence: Some(fence),
        ..arm(&owner, "fenced", json!(1))
    };
    assert!(matches!(
        store.remote_arm(&live).await?,
        RemoteArmOutcome::Dispatched { .. }
    ));
    let ghost = key("owner", "ghost");
    assert!(store
        .remote_arm(&arm(&ghost, "label", json!(1)))
        .await
        .unwrap_err()
        .is_not_found());

    // Another generation, or a terminal owner: nothing is written.
    let other_generation = RemoteArm {
        generation: 1,
        step_id: remote_step_id(&owner, 1, "label"),
        ..arm(&owner, "label", json!(1))
    };
    assert_eq!(
        store.remote_arm(&other_generation).await?,
        RemoteArmOutcome::Waiting { deadline: None }
    );
    store.instance_cancel(&owner, false).await?;
    assert_eq!(
        store.remote_arm(&arm(&owner, "late", json!(1))).await?,
        RemoteArmOutcome::Waiting { deadline: None }
    );
    assert_eq!(store.remote_tasks(&owner).await?.len(), 2);
    Ok(())
}

#[tokio::test]
async fn concurrent_arms_of_one_step_write_one_task() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    for round in 0..10 {
        let a = arm(&owner, &format!("s{round}"), json!(round));
        let arms: Vec<_> = (0..4)
            .map(|_| {
                let (store, a) = (store.clone(), a.clone());
                tokio::spawn(async move { store.remote_arm(&a).await })
            })
            .collect();
        let mut dispatched = 0;
        for handle in arms {
            match handle.await?? {
                RemoteArmOutcome::Dispatched { .. } => dispatched += 1,
                RemoteArmOutcome::Waiting { deadline: None } => {}
                other => return Err(format!("unexpected {other:?}").into()),
            }
        }
        assert_eq!(dispatched, 1, "round {round}");
    }
    assert_eq!(store.remote_tasks(&owner).await?.len(), 10);
    Ok(())
}

#[tokio::test]
async fn a_passed_deadline_redispatches_until_the_step_is_lost() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = RemoteArm {
        redispatch_after: Some(Duration::from_millis(60)),
        redispatch_max: 2,
        ..arm(&owner, "label", json!(1))
    };
    let before = OffsetDateTime::now_utc();
    let RemoteArmOutcome::Dispatched {
        deadline: Some(first),
    } = store.remote_arm(&a).await?
    else {
        return Err("expected a dispatch with a deadline".into());
    };
    assert!(first > before && first < before + Duration::from_secs(5));
    let claimed = claim_one(&store, "label").await?;
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Waiting {
            deadline: Some(first)
        }
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut listener = Listener::on(&store).await?;
    let RemoteArmOutcome::Redispatched {
        deadline: Some(second),
    } = store.remote_arm(&a).await?
    else {
        return Err("expected a redispatch".into());
    };
    assert!(second > first);
    let payloads: Vec<_> = listener
        .drain(Duration::from_millis(200))
        .await
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(payloads, ["remote"]);
    let stored = task(&store, &owner, &a.step_id).await?;
    assert_eq!((stored.status, stored.dispatches), (TaskStatus::Pending, 2));
    assert_eq!(stored.claimed_by, None);
    assert_eq!(
        store
            .task_heartbeat(&a.step_id, claimed.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost
    );
    let again = claim_one(&store, "label").await?;
    assert_eq!(again.dispatches, 2);

    tokio::time::sleep(Duration::from_millis(100)).await;
    let lost = json!({"error": {
        "message": "no result after 2 dispatch(es)",
        "code": "remote_step_lost",
        "retryable": true,
        "attempts": 0,
    }});
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Settled {
            value: lost.clone(),
            lost: true
        }
    );
    assert_eq!(
        recorded(&store, &owner, "remote:label").await?,
        std::slice::from_ref(&lost)
    );
    let stored = task(&store, &owner, &a.step_id).await?;
    assert_eq!(stored.status, TaskStatus::Failed);
    assert_eq!(
        stored.last_error,
        Some(
            json!({"message": "no result after 2 dispatch(es)", "code": "remote_step_lost", "retryable": true})
        )
    );
    // The late report of the last claimant is too late; a re-arm reads the loss.
    assert_eq!(
        store.task_complete(&a.step_id, &json!(1)).await?,
        ReportOutcome::AlreadySettled
    );
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Settled {
            value: lost,
            lost: false
        }
    );
    Ok(())
}

#[tokio::test]
async fn redispatch_pending_counts_the_open_tasks_of_the_current_generation() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    for step in ["a", "b", "c"] {
        store.remote_arm(&arm(&owner, step, json!(step))).await?;
    }
    store
        .task_complete(&remote_step_id(&owner, 0, "a"), &json!(1))
        .await?;
    let claimed = claim_one(&store, "b").await?;
    let mut listener = Listener::on(&store).await?;
    assert_eq!(store.remote_redispatch_pending(&owner).await?, Some(2));
    let payloads: Vec<_> = listener
        .drain(Duration::from_millis(200))
        .await
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(payloads, ["remote"]);
    let b = task(&store, &owner, &claimed.step_id).await?;
    assert_eq!((b.status, b.dispatches), (TaskStatus::Pending, 2));
    assert_eq!(
        task(&store, &owner, &remote_step_id(&owner, 0, "a"))
            .await?
            .status,
        TaskStatus::Completed
    );
    assert_eq!(
        store
            .remote_redispatch_pending(&key("owner", "ghost"))
            .await?,
        None
    );
    assert_eq!(claim_tasks(&store, &["b"], 5).await?[0].dispatches, 2);
    Ok(())
}

#[tokio::test]
async fn a_requeue_resets_a_failed_remote_step() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = RemoteArm {
        max_attempts: 2,
        redispatch_after: Some(Duration::from_secs(600)),
        ..arm(&owner, "x", json!(1))
    };
    store.remote_arm(&a).await?;
    let ok = arm(&owner, "fine", json!(1));
    store.remote_arm(&ok).await?;
    store.task_complete(&ok.step_id, &json!("good")).await?;

    for revision in 1..=2u32 {
        let claimed = claim_one(&store, "x").await?;
        assert_eq!(
            store
                .task_fail(
                    &a.step_id,
                    claimed.claim,
                    &failure("boom", None, false),
                    Duration::ZERO
                )
                .await?,
            ReportOutcome::Delivered
        );
        fail_instance(&store, &owner, "remote step x failed").await?;
        let mut listener = Listener::on(&store).await?;
        assert_eq!(
            store.instance_requeue(&owner).await?,
            RequeueOutcome::Requeued {
                reset_steps: 1,
                children: Vec::new()
            }
        );
        let mut payloads: Vec<_> = listener
            .drain(Duration::from_millis(200))
            .await
            .into_iter()
            .map(|(_, p)| p)
            .collect();
        payloads.sort();
        assert_eq!(payloads, ["owner/o-1", "remote"]);
        let row = store.instance_get(&owner).await?.ok_or("missing")?;
        assert_eq!(row.status, Status::Running);
        assert_eq!((row.last_error, row.completed_at), (None, None));
        let superseded = if revision == 1 {
            "remote:x".to_owned()
        } else {
            format!("remote:x#{}", revision - 1)
        };
        assert_eq!(
            resets(&store, &owner).await?.last(),
            Some(&("remote:x".to_owned(), superseded))
        );
        assert_eq!(
            resurrections(&store, &owner).await?,
            usize::try_from(revision)?
        );
        let stored = task(&store, &owner, &a.step_id).await?;
        assert_eq!(stored.status, TaskStatus::Pending);
        assert_eq!(stored.journal_step, format!("remote:x#{revision}"));
        assert_eq!((stored.attempts, stored.dispatches), (0, 1));
        assert_eq!((stored.last_error, stored.output), (None, None));
        // The re-armed run waits for the next revision, with a fresh deadline.
        assert!(matches!(
            store.remote_arm(&a).await?,
            RemoteArmOutcome::Waiting { deadline: Some(_) }
        ));
    }
    // The successful step was not touched; the third attempt lands under revision 2.
    assert_eq!(resets(&store, &owner).await?.len(), 2);
    let claimed = claim_one(&store, "x").await?;
    assert_eq!(claimed.attempt, 1);
    assert_eq!(
        store.task_complete(&a.step_id, &json!("fixed")).await?,
        ReportOutcome::Delivered
    );
    assert_eq!(
        recorded(&store, &owner, "remote:x#2").await?,
        [json!({"ok": "fixed"})]
    );
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Settled {
            value: json!({"ok": "fixed"}),
            lost: false
        }
    );
    assert_eq!(
        store.instance_requeue(&owner).await?,
        RequeueOutcome::NotFailed(Status::Running)
    );
    assert_eq!(
        store.instance_requeue(&key("owner", "ghost")).await?,
        RequeueOutcome::NotFound
    );
    Ok(())
}

#[tokio::test]
async fn a_requeue_cascades_to_a_failed_child_which_then_delivers_to_the_next_revision(
) -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    store.instance_start(&start(&parent, Value::Null)).await?;
    spawn(&store, &parent, &child).await?;
    fail_instance(&store, &child, "child broke").await?;
    assert_eq!(
        recorded(&store, &parent, "child:child/c-1:result").await?,
        [json!({"failed": "child broke"})]
    );
    fail_instance(&store, &parent, "child failed").await?;

    assert_eq!(
        store.instance_requeue(&parent).await?,
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: vec![child.clone()]
        }
    );
    assert_eq!(status(&store, &parent).await?, Status::Running);
    assert_eq!(status(&store, &child).await?, Status::Running);
    assert_eq!(resurrections(&store, &child).await?, 1);
    assert_eq!(
        resets(&store, &parent).await?,
        [(
            "child:child/c-1:result".to_owned(),
            "child:child/c-1:result".to_owned()
        )]
    );
    assert_eq!(
        parent_step(&store, &child).await?.as_deref(),
        Some("child:child/c-1:result#1")
    );
    complete_instance(&store, &child, json!("shipped")).await?;
    assert_eq!(
        recorded(&store, &parent, "child:child/c-1:result#1").await?,
        [json!({"ok": "shipped"})]
    );
    Ok(())
}

#[tokio::test]
async fn a_requeue_guards_a_cycle_of_parent_links() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (p, c) = (key("node", "p"), key("node", "c"));
    store.instance_start(&start(&p, Value::Null)).await?;
    spawn(&store, &p, &c).await?;
    // The child adopts its own parent: p -> c -> p.
    spawn(&store, &c, &p).await?;
    for (k, other) in [(&p, &c), (&c, &p)] {
        store
            .journal_append(&crate::common::step(
                k,
                &child_result_step(other),
                StepKind::Child,
                json!({"failed": "boom"}),
            ))
            .await?;
    }
    fail_instance(&store, &p, "p failed").await?;
    fail_instance(&store, &c, "c failed").await?;

    assert_eq!(
        store.instance_requeue(&p).await?,
        RequeueOutcome::Requeued {
            reset_steps: 2,
            children: vec![c.clone()]
        }
    );
    assert_eq!(status(&store, &p).await?, Status::Running);
    assert_eq!(status(&store, &c).await?, Status::Running);
    assert_eq!(resurrections(&store, &p).await?, 1);
    assert_eq!(resurrections(&store, &c).await?, 1);
    assert_eq!(
        parent_step(&store, &p).await?.as_deref(),
        Some("child:node/p:result#1")
    );
    assert_eq!(
        parent_step(&store, &c).await?.as_deref(),
        Some("child:node/c:result#1")
    );
    Ok(())
}

#[tokio::test]
async fn a_fix_copies_the_parent_link_and_delivers_only_its_success() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    store
        .instance_start(&keiro_journal::store::StartRequest {
            priority: 3,
            ..start(&parent, Value::Null)
        })
        .await?;
    spawn(&store, &parent, &child).await?;
    fail_instance(&store, &child, "bad input").await?;
    fail_instance(&store, &parent, "child failed").await?;
    // The parent's requeue requeues the child; both now wait on revision 1.
    store.instance_requeue(&parent).await?;

    let fix = key("child", "c-1~retry~0000aaaa");
    assert_eq!(
        store
            .instance_retry_with_input(&child, &fix, &json!({"fixed": true}))
            .await?,
        RetryOutcome::Started(fix.clone())
    );
    assert_eq!(
        store
            .instance_retry_with_input(&child, &fix, &json!({"other": true}))
            .await?,
        RetryOutcome::Exists(fix.clone())
    );
    assert_eq!(
        store
            .instance_retry_with_input(&key("child", "ghost"), &fix, &json!(1))
            .await?,
        RetryOutcome::OriginNotFound
    );
    let row = store.instance_get(&fix).await?.ok_or("missing")?;
    assert_eq!(row.status, Status::Running);
    assert_eq!(row.input, json!({"fixed": true}));
    assert_eq!(row.parent, Some(parent.clone()));
    assert_eq!(
        parent_step(&store, &fix).await?.as_deref(),
        Some("child:child/c-1:result#1")
    );

    // A failed fix is not the child's result.
    fail_instance(&store, &fix, "still bad").await?;
    assert!(recorded(&store, &parent, "child:child/c-1:result#1")
        .await?
        .is_empty());
    // A cancelled one neither.
    let fix2 = key("child", "c-1~retry~0000bbbb");
    store
        .instance_retry_with_input(&child, &fix2, &json!(2))
        .await?;
    store.instance_cancel(&fix2, false).await?;
    assert!(recorded(&store, &parent, "child:child/c-1:result#1")
        .await?
        .is_empty());
    // A completed one is.
    let fix3 = key("child", "c-1~retry~0000cccc");
    store
        .instance_retry_with_input(&child, &fix3, &json!(3))
        .await?;
    complete_instance(&store, &fix3, json!("fixed output")).await?;
    assert_eq!(
        recorded(&store, &parent, "child:child/c-1:result#1").await?,
        [json!({"ok": "fixed output"})]
    );
    assert_eq!(status(&store, &parent).await?, Status::Running);

    // A fix of a top-level instance has no parent link and keeps the origin's priority.
    let parent_fix = key("parent", "p-1~retry~0000dddd");
    store
        .instance_retry_with_input(&parent, &parent_fix, &json!(4))
        .await?;
    let row = store.instance_get(&parent_fix).await?.ok_or("missing")?;
    assert_eq!((row.parent, row.priority), (None, 3));
    assert_eq!(parent_step(&store, &parent_fix).await?, None);
    Ok(())
}

#[tokio::test]
async fn a_requeue_journals_a_fix_that_already_completed() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (parent, child) = (key("parent", "p-1"), key("child", "c-1"));
    store.instance_start(&start(&parent, Value::Null)).await?;
    spawn(&store, &parent, &child).await?;
    fail_instance(&store, &child, "bad input").await?;
    fail_instance(&store, &parent, "child failed").await?;
    let fix = key("child", "c-1~retry~0000aaaa");
    store
        .instance_retry_with_input(&child, &fix, &json!({"fixed": true}))
        .await?;
    // Its success reaches a failed parent, which refuses it.
    complete_instance(&store, &fix, json!("fixed output")).await?;

    assert_eq!(
        store.instance_requeue(&parent).await?,
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: Vec::new()
        }
    );
    assert_eq!(status(&store, &parent).await?, Status::Running);
    assert_eq!(
        status(&store, &child).await?,
        Status::Failed,
        "a child with a buffered success stays as it is"
    );
    assert_eq!(
        recorded(&store, &parent, "child:child/c-1:result#1").await?,
        [json!({"ok": "fixed output"})]
    );
    // The reset comes before the delivered revision, so replay reads the success.
    let history = store.journal_history(&parent).await?;
    let position = |wanted: &dyn Fn(&Event) -> bool| history.iter().position(|e| wanted(&e.event));
    let reset = position(&|e| matches!(e, Event::StepReset { .. })).ok_or("no reset")?;
    let revision = position(
        &|e| matches!(e, Event::StepRecorded { step, .. } if step == "child:child/c-1:result#1"),
    )
    .ok_or("no revision")?;
    assert!(reset < revision);
    Ok(())
}

#[tokio::test]
async fn remote_workers_are_notified_and_nothing_else_is() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    let mut remote = store.subscribe(WakeFilter::RemoteTasks);
    let mut timers = store.subscribe(WakeFilter::Timers);
    assert_eq!(
        remote.wait(Duration::from_secs(10)).await,
        WakeReason::Reconnected
    );
    assert_eq!(
        timers.wait(Duration::from_secs(10)).await,
        WakeReason::Reconnected
    );
    // An instance wake is not for remote workers.
    store.instance_start(&start(&owner, Value::Null)).await?;
    assert_eq!(
        remote.wait(Duration::from_millis(300)).await,
        WakeReason::Timeout
    );
    store.remote_arm(&arm(&owner, "label", json!(1))).await?;
    assert_eq!(
        remote.wait(Duration::from_secs(10)).await,
        WakeReason::Notified
    );
    assert_eq!(
        timers.wait(Duration::from_millis(300)).await,
        WakeReason::Timeout
    );
    Ok(())
}

/// Runs `operation` twice (the first prepares its statement) and returns the round trips of
/// the second run.
async fn second_run_round_trips<F, Fut>(store: &PgStore, operation: F) -> Result<u64, Error>
where
    F: Fn(u32) -> Fut,
    Fut: std::future::Future<Output = Result<(), StoreError>>,
{
    operation(0).await?;
    let before = store.round_trips();
    operation(1).await?;
    Ok(store.round_trips() - before)
}

#[tokio::test]
async fn each_remote_operation_is_one_round_trip() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let (s, k) = (&store, &owner);

    let arm_step = |n: u32| async move {
        s.remote_arm(&RemoteArm {
            group: "g".into(),
            max_attempts: 3,
            ..arm(k, &format!("s{n}"), json!(n))
        })
        .await
        .map(drop)
    };
    assert_eq!(second_run_round_trips(s, arm_step).await?, 1, "remote_arm");
    let rearm = |_| async move { s.remote_arm(&arm(k, "s0", json!(0))).await.map(drop) };
    assert_eq!(second_run_round_trips(s, rearm).await?, 1, "re-arm");
    let claim = |_| async move {
        let request = claim_request(&["g", "h"], "w", 1, Duration::from_secs(60));
        let claimed = s.tasks_claim(&request).await?;
        assert_eq!(claimed.len(), 1);
        Ok(())
    };
    assert_eq!(second_run_round_trips(s, claim).await?, 1, "tasks_claim");
    let heartbeat = |n: u32| async move {
        s.task_heartbeat(
            &remote_step_id(k, 0, &format!("s{n}")),
            Uuid::new_v4(),
            Duration::from_secs(1),
        )
        .await
        .map(drop)
    };
    assert_eq!(
        second_run_round_trips(s, heartbeat).await?,
        1,
        "task_heartbeat"
    );
    let fail = |n: u32| async move {
        s.task_fail(
            &remote_step_id(k, 0, &format!("s{n}")),
            Uuid::new_v4(),
            &failure("x", None, true),
            Duration::ZERO,
        )
        .await
        .map(drop)
    };
    assert_eq!(second_run_round_trips(s, fail).await?, 1, "task_fail");
    let complete = |n: u32| async move {
        s.task_complete(&remote_step_id(k, 0, &format!("s{n}")), &json!(n))
            .await
            .map(drop)
    };
    assert_eq!(
        second_run_round_trips(s, complete).await?,
        1,
        "task_complete"
    );
    let redispatch = |_| async move { s.remote_redispatch_pending(k).await.map(drop) };
    assert_eq!(
        second_run_round_trips(s, redispatch).await?,
        1,
        "remote_redispatch_pending"
    );
    let requeue = |_| async move { s.instance_requeue(k).await.map(drop) };
    assert_eq!(
        second_run_round_trips(s, requeue).await?,
        1,
        "instance_requeue"
    );
    let retry = |n: u32| async move {
        let fix = key("owner", &format!("o-1~retry~0000000{n}"));
        s.instance_retry_with_input(k, &fix, &json!(n))
            .await
            .map(drop)
    };
    assert_eq!(
        second_run_round_trips(s, retry).await?,
        1,
        "instance_retry_with_input"
    );
    let tasks = |_| async move { s.remote_tasks(k).await.map(drop) };
    assert_eq!(second_run_round_trips(s, tasks).await?, 1, "remote_tasks");
    Ok(())
}

#[tokio::test]
async fn park_dispatch_writes_the_tasks_and_the_park_in_one_round_trip() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "pd-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let park = |awaited: Vec<String>| keiro_journal::store::Park {
        key: owner.clone(),
        generation: 0,
        fence: None,
        awaited,
        wake_after: None,
    };
    // Prepare the statement once, on another instance's run.
    let other = key("owner", "pd-0");
    store.instance_start(&start(&other, Value::Null)).await?;
    let warm = keiro_journal::store::Park {
        key: other.clone(),
        ..park(vec!["remote:w".into()])
    };
    store
        .instance_park_dispatch(&warm, &[arm(&other, "w", json!(0))])
        .await?;

    let arms = [
        RemoteArm {
            redispatch_after: Some(Duration::from_secs(30)),
            ..arm(&owner, "a", json!(1))
        },
        arm(&owner, "b", json!(2)),
    ];
    let before = store.round_trips();
    let (parked, outcomes) = store
        .instance_park_dispatch(&park(vec!["remote:a".into(), "remote:b".into()]), &arms)
        .await?;
    assert_eq!(store.round_trips() - before, 1);
    assert_eq!(parked, keiro_journal::store::ParkOutcome::Suspended);
    assert!(matches!(
        outcomes[0],
        RemoteArmOutcome::Dispatched { deadline: Some(_) }
    ));
    assert_eq!(outcomes[1], RemoteArmOutcome::Dispatched { deadline: None });
    let tasks = store.remote_tasks(&owner).await?;
    assert_eq!(tasks.len(), 2);
    let row = store.instance_get(&owner).await?.expect("row");
    assert_eq!(row.status, Status::Suspended);
    assert_eq!(
        row.wake_after,
        outcomes[0].deadline(),
        "the park wakes by the redispatch deadline"
    );
    Ok(())
}

#[tokio::test]
async fn a_batch_of_reports_answers_each_in_the_callers_order() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
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
    store
        .task_complete(&id(&first, "b"), &json!("early"))
        .await?;
    let reports = vec![
        (id(&first, "c"), json!("C")),
        ("owner/nobody/0/x".to_owned(), json!("?")),
        (id(&second, "a"), json!("A")),
        (id(&first, "b"), json!("late")),
    ];
    let outcomes = store.tasks_complete(&reports).await?;
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
        recorded(&store, &first, "remote:c").await?,
        [json!({"ok": "C"})]
    );
    assert_eq!(
        recorded(&store, &second, "remote:a").await?,
        [json!({"ok": "A"})]
    );
    assert_eq!(
        recorded(&store, &first, "remote:b").await?,
        [json!({"ok": "early"})],
        "first result wins"
    );
    Ok(())
}

#[tokio::test]
async fn parks_of_runs_at_once_share_a_transaction_and_each_gets_its_own_answer() -> TestResult {
    let db = TestDb::new().await;
    // One connection, so the statements the warm-up prepares are prepared wherever the parks
    // below run (a lone park and a batch may otherwise land on connections that never saw
    // their statement, and a preparation counts as a round trip).
    let store = PgStore::connect(Config {
        pool_size: 1,
        ..db.config()
    })
    .await?;
    let park = |owner: &InstanceKey, awaited: &[&str]| keiro_journal::store::Park {
        key: owner.clone(),
        generation: 0,
        fence: None,
        awaited: awaited.iter().map(|s| format!("remote:{s}")).collect(),
        wake_after: None,
    };
    // Prepare the statements first, so the round trips counted below are executions only.
    let warm: Vec<InstanceKey> = (0..3).map(|i| key("warm", &format!("w-{i}"))).collect();
    for owner in &warm {
        store.instance_start(&start(owner, Value::Null)).await?;
    }
    // At once: the first alone, the other two as a batch, so both statements are prepared.
    let mut warming = tokio::task::JoinSet::new();
    for owner in &warm {
        let (store, owner) = (store.clone(), owner.clone());
        warming.spawn(async move {
            store
                .instance_park_dispatch(&park(&owner, &["s"]), &[arm(&owner, "s", json!(0))])
                .await
        });
    }
    while let Some(parked) = warming.join_next().await {
        parked??;
    }

    // Twelve plain parks, listed against their key order (the batch runs them in key order).
    let plain: Vec<InstanceKey> = (0..12)
        .rev()
        .map(|i| key("p", &format!("p-{i:02}")))
        .collect();
    let two = key("p", "two-arms");
    let settled = key("p", "settled");
    let fenced = key("p", "fenced");
    let missing = key("p", "missing");
    for owner in plain.iter().chain([&two, &settled, &fenced]) {
        store.instance_start(&start(owner, Value::Null)).await?;
    }
    // `settled`'s task exists and has its result: the re-arm learns it and the park wakes.
    store.remote_arm(&arm(&settled, "s", json!(1))).await?;
    store
        .task_complete(&remote_step_id(&settled, 0, "s"), &json!("done"))
        .await?;

    let mut requests: Vec<(keiro_journal::store::Park, Vec<RemoteArm>)> = plain
        .iter()
        .enumerate()
        .map(|(i, owner)| (park(owner, &["s"]), vec![arm(owner, "s", json!(i))]))
        .collect();
    requests.push((
        park(&two, &["a", "b"]),
        vec![arm(&two, "a", json!("a")), arm(&two, "b", json!("b"))],
    ));
    requests.push((park(&settled, &["s"]), vec![arm(&settled, "s", json!(1))]));
    requests.push((
        keiro_journal::store::Park {
            fence: Some(keiro_journal::Fence {
                owner: "somebody-else".into(),
                epoch: 7,
            }),
            ..park(&fenced, &["s"])
        },
        vec![arm(&fenced, "s", json!(0))],
    ));
    requests.push((park(&missing, &["s"]), vec![arm(&missing, "s", json!(0))]));

    let before = store.round_trips();
    let mut parking = tokio::task::JoinSet::new();
    for (i, (park, arms)) in requests.iter().cloned().enumerate() {
        let store = store.clone();
        parking.spawn(async move { (i, store.instance_park_dispatch(&park, &arms).await) });
    }
    let mut answers: Vec<Option<_>> = requests.iter().map(|_| None).collect();
    while let Some(answer) = parking.join_next().await {
        let (i, outcome) = answer?;
        answers[i] = Some(outcome);
    }
    let round_trips = store.round_trips() - before;
    // The first park finds the lane idle and goes alone; the others queue behind it and leave
    // together, as one transaction.
    assert!(
        round_trips <= 2,
        "{} parks sent at once took {round_trips} round trips",
        requests.len()
    );

    let mut answers = answers.into_iter().map(|a| a.expect("every park answered"));
    for (i, owner) in plain.iter().enumerate() {
        let (parked, arms) = answers.next().expect("answer")?;
        assert_eq!(
            parked,
            keiro_journal::store::ParkOutcome::Suspended,
            "{owner:?}"
        );
        assert_eq!(arms, [RemoteArmOutcome::Dispatched { deadline: None }]);
        let input: Value = sql(&store)
            .await?
            .query_one(
                "SELECT input FROM remote_tasks WHERE step_id = $1",
                &[&remote_step_id(owner, 0, "s")],
            )
            .await?
            .get(0);
        assert_eq!(input, json!(i), "each park wrote its own task");
        assert_eq!(status(&store, owner).await?, Status::Suspended);
    }
    let (parked, arms) = answers.next().expect("answer")?;
    assert_eq!(parked, keiro_journal::store::ParkOutcome::Suspended);
    assert_eq!(arms.len(), 2);
    assert_eq!(store.remote_tasks(&two).await?.len(), 2);
    let (parked, arms) = answers.next().expect("answer")?;
    assert_eq!(parked, keiro_journal::store::ParkOutcome::WokenBeforePark);
    assert_eq!(
        arms,
        [RemoteArmOutcome::Settled {
            value: json!({"ok": "done"}),
            lost: false
        }]
    );
    let fenced_answer = answers.next().expect("answer");
    assert!(
        matches!(&fenced_answer, Err(e) if e.is_lease_lost()),
        "{fenced_answer:?}"
    );
    assert!(store.remote_tasks(&fenced).await?.is_empty());
    let missing_answer = answers.next().expect("answer");
    assert!(
        matches!(&missing_answer, Err(e) if e.is_not_found()),
        "{missing_answer:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_park_that_fails_does_not_fail_the_parks_sent_with_it() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owners: Vec<InstanceKey> = (0..4).map(|i| key("p", &format!("q-{i}"))).collect();
    for owner in &owners {
        store.instance_start(&start(owner, Value::Null)).await?;
    }
    let park = |owner: &InstanceKey| keiro_journal::store::Park {
        key: owner.clone(),
        generation: 0,
        fence: None,
        awaited: vec!["remote:s".into()],
        wake_after: None,
    };
    // A step id too long for the task table's primary key index (random, so compression
    // cannot shrink it under the limit): its INSERT raises, which rolls back the whole batch
    // statement it rides in. The context never builds one (names are capped at 200 bytes); it
    // stands for any park the database refuses.
    let noise: String = (0..400)
        .map(|_| Uuid::new_v4().simple().to_string())
        .collect();
    let broken = RemoteArm {
        step_id: format!("{}/{noise}", remote_step_id(&owners[0], 0, "s")),
        ..arm(&owners[0], "s", json!(0))
    };
    let mut parking = tokio::task::JoinSet::new();
    for (i, owner) in owners.iter().enumerate() {
        let arms = if i == 0 {
            vec![broken.clone()]
        } else {
            vec![arm(owner, "s", json!(i))]
        };
        let (store, park) = (store.clone(), park(owner));
        parking.spawn(async move { (i, store.instance_park_dispatch(&park, &arms).await) });
    }
    while let Some(answer) = parking.join_next().await {
        let (i, outcome) = answer?;
        if i == 0 {
            assert!(outcome.is_err(), "the broken park fails: {outcome:?}");
            assert_eq!(status(&store, &owners[0]).await?, Status::Running);
        } else {
            let (parked, arms) = outcome?;
            assert_eq!(parked, keiro_journal::store::ParkOutcome::Suspended);
            assert_eq!(arms, [RemoteArmOutcome::Dispatched { deadline: None }]);
            assert_eq!(store.remote_tasks(&owners[i]).await?.len(), 1);
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_hot_remote_functions_keep_generic_index_driven_plans() -> TestResult {
    // A later `CREATE OR REPLACE` of one of these without its SET clauses would silently bring
    // back a plan made on every call (plpgsql keeps custom-planning statements over arrays) or
    // a sequential scan cached while the table was small: see migrations 0005 and 0007.
    let db = TestDb::new().await;
    let store = db.store();
    for function in [
        "keiro_remote_tasks_claim",
        "keiro_remote_tasks_complete",
        "keiro_instances_park_dispatch",
    ] {
        let settings: Vec<String> = sql(&store)
            .await?
            .query_one(
                "SELECT coalesce(p.proconfig, '{}') FROM pg_proc p \
                 WHERE p.proname = $1 AND p.pronamespace = current_schema()::regnamespace",
                &[&function],
            )
            .await?
            .get(0);
        for wanted in ["enable_seqscan=off", "plan_cache_mode=force_generic_plan"] {
            assert!(
                settings.iter().any(|s| s == wanted),
                "{function} lacks {wanted}: {settings:?}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_cancel_cancels_the_live_tasks_of_the_run_and_refuses_their_reports() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
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
    let claim = claim_one(&store, "claimed").await?;
    store.task_complete(&done.step_id, &json!("kept")).await?;

    store.instance_cancel(&owner, false).await?;
    let statuses: Vec<(String, TaskStatus, Option<String>)> = store
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
    let stored: (Option<OffsetDateTime>, Option<Uuid>) = {
        let row = sql(&store)
            .await?
            .query_one(
                "SELECT settled_at, claim FROM remote_tasks WHERE step_id = $1",
                &[&claimed.step_id],
            )
            .await?;
        (row.get(0), row.get(1))
    };
    assert!(stored.0.is_some() && stored.1.is_none(), "{stored:?}");

    // The claimant learns it, whatever claim it holds; nobody claims the tasks again.
    for held in [claim.claim, Uuid::new_v4()] {
        assert_eq!(
            store
                .task_heartbeat(&claimed.step_id, held, Duration::from_secs(60))
                .await?,
            HeartbeatOutcome::Cancelled
        );
    }
    assert!(claim_tasks(&store, &["claimed", "pending"], 10)
        .await?
        .is_empty());
    // Every report is refused: one, a batch, a retryable failure of the claim it had.
    assert_eq!(
        store
            .task_complete(&pending.step_id, &json!("late"))
            .await?,
        ReportOutcome::Cancelled
    );
    assert_eq!(
        store
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
        store
            .task_fail(
                &claimed.step_id,
                claim.claim,
                &failure("declined", None, true),
                Duration::ZERO,
            )
            .await?,
        ReportOutcome::Cancelled
    );
    let after = task(&store, &owner, &claimed.step_id).await?;
    assert_eq!(
        (after.status, after.attempts, after.output, after.last_error),
        (TaskStatus::Cancelled, 0, None, None)
    );
    for step in ["remote:claimed", "remote:pending"] {
        assert!(recorded(&store, &owner, step).await?.is_empty(), "{step}");
    }
    // A re-arm (a stale run's) changes nothing.
    assert_eq!(
        store.remote_arm(&pending).await?,
        RemoteArmOutcome::Waiting { deadline: None }
    );
    assert_eq!(
        task(&store, &owner, &pending.step_id).await?.status,
        TaskStatus::Cancelled
    );
    Ok(())
}

#[tokio::test]
async fn a_continue_as_new_cancels_the_tasks_of_the_generation_it_leaves() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let left = arm(&owner, "label", json!(1));
    store.remote_arm(&left).await?;
    let claim = claim_one(&store, "label").await?;
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
    assert_eq!(status(&store, &owner).await?, Status::Running);
    assert_eq!(
        task(&store, &owner, &left.step_id).await?.status,
        TaskStatus::Cancelled
    );
    assert_eq!(
        store
            .task_heartbeat(&left.step_id, claim.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Cancelled
    );
    assert_eq!(
        store.task_complete(&left.step_id, &json!("late")).await?,
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
    assert_eq!(claim_one(&store, "label").await?.step_id, next.step_id);
    Ok(())
}

const ARM_SQL: &str = "SELECT outcome FROM keiro_remote_arm($1, $2, $3, $4, $5, $6, $7, $8, \
     $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)";

/// Runs `keiro_remote_arm` for `a` (unfenced) on `client`, inside whatever transaction it has
/// open.
async fn arm_on(client: &tokio_postgres::Client, a: &RemoteArm) -> Result<String, Error> {
    let none: Option<&str> = None;
    let (no_ms, no_epoch): (Option<i64>, Option<i64>) = (None, None);
    let row = client
        .query_one(
            ARM_SQL,
            &[
                &a.step_id,
                &a.key.name.as_str(),
                &a.key.id.as_str(),
                &a.generation,
                &a.step,
                &a.journal_step,
                &a.group,
                &a.input,
                &a.priority,
                &none,
                &1i32,
                &1000i64,
                &1000i64,
                &false,
                &no_ms,
                &10i32,
                &none,
                &no_epoch,
            ],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn an_arm_and_a_cancel_at_the_same_moment_leave_no_live_task() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (first, second) = (key("owner", "o-1"), key("owner", "o-2"));
    for k in [&first, &second] {
        store.instance_start(&start(k, Value::Null)).await?;
    }

    // A cancellation in progress: the arm waits for it, then sees the run cancelled.
    let holder = sql(&store).await?;
    holder.batch_execute("BEGIN").await?;
    holder
        .query(
            "SELECT outcome FROM keiro_instance_cancel($1, $2, false)",
            &[&"owner", &"o-1"],
        )
        .await?;
    let arming = tokio::spawn({
        let (store, a) = (store.clone(), arm(&first, "label", json!(1)));
        async move { store.remote_arm(&a).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!arming.is_finished(), "the arm waits for the cancellation");
    holder.batch_execute("COMMIT").await?;
    assert_eq!(arming.await??, RemoteArmOutcome::Waiting { deadline: None });
    assert!(store.remote_tasks(&first).await?.is_empty());

    // An arm in progress: the cancellation waits for it, then cancels the task it wrote.
    let a = arm(&second, "label", json!(2));
    holder.batch_execute("BEGIN").await?;
    assert_eq!(arm_on(&holder, &a).await?, "dispatched");
    let cancelling = tokio::spawn({
        let (store, k) = (store.clone(), second.clone());
        async move { store.instance_cancel(&k, false).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !cancelling.is_finished(),
        "the cancellation waits for the arm"
    );
    holder.batch_execute("COMMIT").await?;
    assert_eq!(cancelling.await??, AppendOutcome::Appended);
    assert_eq!(
        task(&store, &second, &a.step_id).await?.status,
        TaskStatus::Cancelled
    );
    assert!(claim_tasks(&store, &["label"], 10).await?.is_empty());
    Ok(())
}

/// A lone park that re-arms two remote steps, racing a report on the second step's task: the
/// report locks the task and then the owner (as every report does), and the park must not
/// hold the owner while it waits for that task, or the two deadlock (the server aborts one
/// after `deadlock_timeout`, and an aborted park leaves its run leased until the lease ends).
/// The park locks every task it arms before the owner, as the lock order and the batched park
/// do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_park_rearming_two_steps_never_deadlocks_with_a_report() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("fan", "w");
    store.instance_start(&start(&k, json!(null))).await?;
    let arms = [arm(&k, "a", json!(1)), arm(&k, "b", json!(2))];
    let park = Park {
        key: k.clone(),
        generation: 0,
        fence: None,
        awaited: arms.iter().map(|a| a.journal_step.clone()).collect(),
        wake_after: None,
    };
    let (parked, _) = store.instance_park_dispatch(&park, &arms).await?;
    assert_eq!(parked, ParkOutcome::Suspended);

    // The report on the second task: its task row first.
    let mut reporter = sql(&store).await?;
    let report = reporter.transaction().await?;
    let reporter_pid = backend_pid(&report).await?;
    report
        .execute(
            "SELECT 1 FROM remote_tasks WHERE step_id = $1 FOR UPDATE",
            &[&arms[1].step_id],
        )
        .await?;
    // The run is driven again and parks on both steps once more.
    let again = {
        let (store, park, arms) = (store.clone(), park.clone(), arms.clone());
        tokio::spawn(async move { store.instance_park_dispatch(&park, &arms).await })
    };
    blocked_by(&store, reporter_pid, "the park never met the report").await?;
    // The report's second lock: the owner, as its journal append takes it.
    report
        .execute(
            "SELECT 1 FROM workflows WHERE workflow_name = 'fan' AND workflow_id = 'w' FOR UPDATE",
            &[],
        )
        .await?;
    report.commit().await?;
    let (parked, outcomes) = again.await??;
    assert_eq!(parked, ParkOutcome::Suspended);
    assert_eq!(outcomes.len(), 2);
    Ok(())
}
