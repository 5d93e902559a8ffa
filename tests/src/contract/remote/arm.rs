//! Arming a remote step: one task per step, a re-arm learns the result, a passed deadline
//! redispatches until the step is lost, parking and dispatching in one call, and the `remote`
//! notification that wakes remote workers only.

use std::time::Duration;

use super::{arm, claim_one, claim_request, claim_tasks, failure, task};
use crate::contract::support::{
    claim, key, payload, recorded, start, start_parked, status, TestResult, QUIET,
};
use crate::Harness;
use keiro_journal::{
    store::remote_step_id, store::RemoteArm, store::RemoteArmOutcome, InstanceKey, Status,
};
use keiro_remote::{HeartbeatOutcome, RemoteTask, ReportOutcome, TaskStatus};
use serde_json::{json, Value};
use time::OffsetDateTime;

pub async fn arming_is_idempotent_and_learns_the_result(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = arm(&owner, "label", json!("first"));
    let mut listener = h.notifications().await?;
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Dispatched { deadline: None }
    );
    assert_eq!(listener.drain(QUIET).await, ["remote"]);
    // The first arm wins: a re-arm changes nothing and notifies nobody.
    let rearm = RemoteArm {
        input: json!("second"),
        priority: 9,
        group: "elsewhere".into(),
        max_attempts: 5,
        traceparent: Some("00-other".into()),
        ..a.clone()
    };
    assert_eq!(
        store.remote_arm(&rearm).await?,
        RemoteArmOutcome::Waiting { deadline: None }
    );
    assert!(
        listener.drain(QUIET).await.is_empty(),
        "a re-arm notifies nobody"
    );
    assert_eq!(
        h.admin.remote_tasks(&owner).await?,
        [RemoteTask {
            step_id: "owner/o-1/0/label".into(),
            key: owner.clone(),
            generation: 0,
            step: "label".into(),
            journal_step: "remote:label".into(),
            group: "label".into(),
            status: TaskStatus::Pending,
            attempts: 0,
            max_attempts: 1,
            dispatches: 1,
            claimed_by: None,
            last_error: None,
            output: None,
            traceparent: None,
        }]
    );
    let claimed = claim_one(&*h.transport, "label").await?;
    assert_eq!((claimed.input, claimed.priority), (json!("first"), 0));
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Waiting { deadline: None },
        "a claimed task without a deadline waits"
    );
    h.transport.task_complete(&a.step_id, &json!("out")).await?;
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Settled {
            value: json!({"ok": "out"}),
            lost: false
        }
    );
    assert_eq!(h.admin.remote_tasks(&owner).await?.len(), 1);

    // A stale fence writes nothing; a missing owner is an error.
    let fence = claim(store, &owner, "runner").await?;
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
        traceparent: Some("00-trace".into()),
        ..arm(&owner, "fenced", json!(1))
    };
    assert!(matches!(
        store.remote_arm(&live).await?,
        RemoteArmOutcome::Dispatched { .. }
    ));
    // The run's trace context is stored with the task and handed to its claimant.
    assert_eq!(
        task(&*h.admin, &owner, &live.step_id)
            .await?
            .traceparent
            .as_deref(),
        Some("00-trace")
    );
    assert_eq!(
        claim_one(&*h.transport, "fenced")
            .await?
            .traceparent
            .as_deref(),
        Some("00-trace")
    );
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
    assert_eq!(h.admin.remote_tasks(&owner).await?.len(), 2);
    Ok(())
}

pub async fn concurrent_arms_of_one_step_write_one_task(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    for round in 0..10 {
        let a = arm(&owner, &format!("s{round}"), json!(round));
        let arms: Vec<_> = (0..4)
            .map(|_| {
                let (store, a) = (h.store.clone(), a.clone());
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
    assert_eq!(h.admin.remote_tasks(&owner).await?.len(), 10);
    Ok(())
}

/// The redispatch deadline of `a_passed_deadline_redispatches_until_the_step_is_lost`: long
/// enough that the calls before its first wait all come before it on a loaded machine (60 ms
/// did not, under a parallel suite on two cores).
const REDISPATCH_AFTER: Duration = Duration::from_secs(1);

pub async fn a_passed_deadline_redispatches_until_the_step_is_lost(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = RemoteArm {
        redispatch_after: Some(REDISPATCH_AFTER),
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
    let claimed = claim_one(&*h.transport, "label").await?;
    assert_eq!(
        store.remote_arm(&a).await?,
        RemoteArmOutcome::Waiting {
            deadline: Some(first)
        }
    );
    tokio::time::sleep(REDISPATCH_AFTER + Duration::from_millis(100)).await;
    let mut listener = h.notifications().await?;
    let RemoteArmOutcome::Redispatched {
        deadline: Some(second),
    } = store.remote_arm(&a).await?
    else {
        return Err("expected a redispatch".into());
    };
    // The next deadline counts from the redispatch, which came after the first deadline.
    assert!(second >= first + REDISPATCH_AFTER, "{second} vs {first}");
    let payloads = listener.drain(Duration::from_millis(200)).await;
    assert_eq!(payloads, ["remote"]);
    let stored = task(&*h.admin, &owner, &a.step_id).await?;
    assert_eq!((stored.status, stored.dispatches), (TaskStatus::Pending, 2));
    assert_eq!((stored.claimed_by, stored.attempts), (None, 0));
    // The dropped claimant's reports no longer count.
    assert_eq!(
        h.transport
            .task_heartbeat(&a.step_id, claimed.claim, Duration::from_secs(60))
            .await?,
        HeartbeatOutcome::Lost
    );
    assert_eq!(
        h.transport
            .task_fail(
                &a.step_id,
                claimed.claim,
                &failure("jammed", None, true),
                Duration::ZERO
            )
            .await?,
        ReportOutcome::Stale
    );
    // Its claim was live: the redispatch counted no attempt.
    let again = claim_one(&*h.transport, "label").await?;
    assert_eq!((again.dispatches, again.attempt), (2, 1));

    tokio::time::sleep(REDISPATCH_AFTER + Duration::from_millis(100)).await;
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
        recorded(store, &owner, "remote:label").await?,
        std::slice::from_ref(&lost)
    );
    let stored = task(&*h.admin, &owner, &a.step_id).await?;
    assert_eq!(
        (stored.status, stored.claimed_by),
        (TaskStatus::Failed, None)
    );
    assert_eq!(
        stored.last_error,
        Some(
            json!({"message": "no result after 2 dispatch(es)", "code": "remote_step_lost", "retryable": true})
        )
    );
    // The late report of the last claimant is too late; a re-arm reads the loss.
    assert_eq!(
        h.transport.task_complete(&a.step_id, &json!(1)).await?,
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

pub async fn a_lost_step_wakes_its_owner(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    start_parked(store, &owner).await?;
    let once = RemoteArm {
        redispatch_after: Some(Duration::from_millis(50)),
        redispatch_max: 1,
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&once).await?;
    assert_eq!(status(store, &owner).await?, Status::Suspended);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The loss is journaled like any result: the suspended owner is woken by it.
    let mut listener = h.notifications().await?;
    assert!(matches!(
        store.remote_arm(&once).await?,
        RemoteArmOutcome::Settled { lost: true, .. }
    ));
    assert_eq!(status(store, &owner).await?, Status::Running);
    assert_eq!(listener.drain(QUIET).await, [payload(&owner)]);
    Ok(())
}

pub async fn a_passed_deadline_counts_the_expired_claim_it_drops(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let twice = RemoteArm {
        max_attempts: 2,
        redispatch_after: Some(Duration::from_millis(300)),
        ..arm(&owner, "label", json!(1))
    };
    store.remote_arm(&twice).await?;
    // Claims that expire long before the deadline, and no claim of the group in between to
    // count them: the deadline meets the expired claim first.
    let short = claim_request(&["label"], "w-dead", 1, Duration::from_millis(50));
    let first = h.transport.tasks_claim(&short).await?;
    assert_eq!(first.iter().map(|t| t.attempt).collect::<Vec<_>>(), [1]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        store.remote_arm(&twice).await?,
        RemoteArmOutcome::Redispatched { deadline: Some(_) }
    ));
    let redispatched = task(&*h.admin, &owner, &twice.step_id).await?;
    assert_eq!(
        (
            redispatched.status,
            redispatched.attempts,
            redispatched.dispatches
        ),
        (TaskStatus::Pending, 1, 2),
        "the dropped claim is a failed attempt"
    );
    let second = h.transport.tasks_claim(&short).await?;
    assert_eq!(second.iter().map(|t| t.attempt).collect::<Vec<_>>(), [2]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The last attempt's claim expired too: the step fails as crashed, not as lost.
    let crashed = json!({"error": {
        "message": "the claim of w-dead expired without a report (attempt 2 of 2)",
        "code": "remote_step_crashed",
        "retryable": true,
        "attempts": 2,
    }});
    assert_eq!(
        store.remote_arm(&twice).await?,
        RemoteArmOutcome::Settled {
            value: crashed.clone(),
            lost: false
        }
    );
    assert_eq!(
        recorded(store, &owner, "remote:label").await?,
        std::slice::from_ref(&crashed)
    );
    let failed = task(&*h.admin, &owner, &twice.step_id).await?;
    assert_eq!(
        (failed.status, failed.attempts, failed.dispatches),
        (TaskStatus::Failed, 2, 2)
    );
    Ok(())
}

pub async fn a_park_dispatch_writes_its_tasks_and_wakes_by_the_first_deadline(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "pd-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let park = |awaited: Vec<String>| keiro_journal::store::Park {
        key: owner.clone(),
        generation: 0,
        fence: None,
        awaited,
        wake_after: None,
    };
    let arms = [
        RemoteArm {
            redispatch_after: Some(Duration::from_secs(30)),
            ..arm(&owner, "a", json!(1))
        },
        arm(&owner, "b", json!(2)),
    ];
    let (parked, outcomes) = store
        .instance_park_dispatch(&park(vec!["remote:a".into(), "remote:b".into()]), &arms)
        .await?;
    assert_eq!(parked, keiro_journal::store::ParkOutcome::Suspended);
    assert!(matches!(
        outcomes[0],
        RemoteArmOutcome::Dispatched { deadline: Some(_) }
    ));
    assert_eq!(outcomes[1], RemoteArmOutcome::Dispatched { deadline: None });
    let tasks = h.admin.remote_tasks(&owner).await?;
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

pub async fn parks_sent_at_once_each_get_their_own_answer(h: Harness) -> TestResult {
    let store = &*h.store;
    let park = |owner: &InstanceKey, awaited: &[&str]| keiro_journal::store::Park {
        key: owner.clone(),
        generation: 0,
        fence: None,
        awaited: awaited.iter().map(|s| format!("remote:{s}")).collect(),
        wake_after: None,
    };
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
    h.transport
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

    let mut parking = tokio::task::JoinSet::new();
    for (i, (park, arms)) in requests.iter().cloned().enumerate() {
        let store = h.store.clone();
        parking.spawn(async move { (i, store.instance_park_dispatch(&park, &arms).await) });
    }
    let mut answers: Vec<Option<_>> = requests.iter().map(|_| None).collect();
    while let Some(answer) = parking.join_next().await {
        let (i, outcome) = answer?;
        answers[i] = Some(outcome);
    }
    let mut answers = answers.into_iter().map(|a| a.expect("every park answered"));
    for owner in &plain {
        let (parked, arms) = answers.next().expect("answer")?;
        assert_eq!(
            parked,
            keiro_journal::store::ParkOutcome::Suspended,
            "{owner:?}"
        );
        assert_eq!(arms, [RemoteArmOutcome::Dispatched { deadline: None }]);
        assert_eq!(status(store, owner).await?, Status::Suspended);
    }
    // Each park wrote its own task, with its own input.
    let claimed = claim_tasks(&*h.transport, &["s"], 100).await?;
    assert_eq!(claimed.len(), plain.len(), "{claimed:?}");
    for (i, owner) in plain.iter().enumerate() {
        let task = claimed.iter().find(|t| &t.key == owner).ok_or("no task")?;
        assert_eq!(task.input, json!(i), "{owner}");
    }
    let (parked, arms) = answers.next().expect("answer")?;
    assert_eq!(parked, keiro_journal::store::ParkOutcome::Suspended);
    assert_eq!(arms.len(), 2);
    assert_eq!(h.admin.remote_tasks(&two).await?.len(), 2);
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
    assert!(h.admin.remote_tasks(&fenced).await?.is_empty());
    let missing_answer = answers.next().expect("answer");
    assert!(
        matches!(&missing_answer, Err(e) if e.is_not_found()),
        "{missing_answer:?}"
    );
    Ok(())
}

pub async fn an_arm_journals_a_result_its_owner_could_not_take(h: Harness) -> TestResult {
    let store = &*h.store;
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let a = arm(&owner, "label", json!(1));
    store.remote_arm(&a).await?;
    // The owner failed before the result came: the task keeps it, the journal does not.
    super::fail_instance(store, &owner, "broken").await?;
    assert_eq!(
        h.transport
            .task_complete(&a.step_id, &json!("done"))
            .await?,
        ReportOutcome::OwnerGone
    );
    assert!(recorded(store, &owner, "remote:label").await?.is_empty());
    assert_eq!(
        store.instance_resurrect(&owner).await?,
        keiro_lease::ResurrectOutcome::Resurrected
    );

    // The re-driven run's arm learns the result and journals it ...
    let settled = RemoteArmOutcome::Settled {
        value: json!({"ok": "done"}),
        lost: false,
    };
    assert_eq!(store.remote_arm(&a).await?, settled);
    assert_eq!(
        recorded(store, &owner, "remote:label").await?,
        [json!({"ok": "done"})]
    );
    // ... and from then on reads it from the journal.
    assert_eq!(store.remote_arm(&a).await?, settled);
    assert_eq!(recorded(store, &owner, "remote:label").await?.len(), 1);
    assert_eq!(h.admin.remote_tasks(&owner).await?.len(), 1);
    Ok(())
}
