//! Arming remote steps and parking with dispatches (remote.sql's arm, claims expiry, deliver
//! and park-with-dispatches), with the assertions of the memory store's tests
//! (crates/memory/src/remote.rs) and crates/postgres/tests/remote_tasks.rs that need no worker.
//! The worker side (claim, heartbeat, reports) is not in this store yet, so a claim or a
//! report is written to the task row by hand, as the worker's statement would leave it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{append, claim, pinned, start, T0};
use keiro_journal::store::{AppendOutcome, Park, ParkOutcome};
use keiro_journal::{
    store::remote_step_id, store::RemoteArm, store::RemoteArmOutcome, Backoff, Event, Fence,
    InstanceKey, JournalStore, RemoteStepError, Status, REDISPATCH_MAX_DEFAULT,
};
use keiro_lease::LeaseStore;
use keiro_sqlite::SqliteStore;
use rusqlite::Connection;
use serde_json::{json, Value};
use time::Duration as Span;

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

fn sql(store: &SqliteStore, statement: &str) {
    Connection::open(store.path())
        .unwrap()
        .execute_batch(statement)
        .unwrap();
}

/// `(step, status, attempts, dispatches, claimed_by, last_error, traceparent, input, priority,
/// max_attempts)` of `key`'s tasks, oldest first.
type TaskRow = (
    String,
    String,
    i32,
    i32,
    Option<String>,
    Option<Value>,
    Option<String>,
    Value,
    i32,
    i32,
);

fn tasks(store: &SqliteStore, key: &InstanceKey) -> Vec<TaskRow> {
    let conn = Connection::open(store.path()).unwrap();
    let mut statement = conn
        .prepare(
            "SELECT step, status, attempts, dispatches, claimed_by, last_error, traceparent, \
             input, priority, max_attempts FROM remote_tasks \
             WHERE workflow_name = ?1 AND workflow_id = ?2 ORDER BY created_at, step_id",
        )
        .unwrap();
    statement
        .query_map([key.name.as_str(), key.id.as_str()], |r| {
            let json = |text: Option<String>| text.map(|t| serde_json::from_str(&t).unwrap());
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                json(r.get(5)?),
                r.get(6)?,
                json(Some(r.get(7)?)).unwrap(),
                r.get(8)?,
                r.get(9)?,
            ))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Claims the task of `step` for `worker` until `until` microseconds, as the worker's claim
/// statement leaves it.
fn claim_task(store: &SqliteStore, key: &InstanceKey, step: &str, worker: &str, until: i64) {
    sql(
        store,
        &format!(
            "UPDATE remote_tasks SET status = 'running', claim = 'c-{worker}', \
             claimed_by = '{worker}', claim_expires_at = {until} WHERE step_id = '{}'",
            remote_step_id(key, 0, step)
        ),
    );
}

fn micros(at: time::OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1000).unwrap()
}

/// `(stored name, payload)` of every journal row of `key`, in order.
async fn journal(store: &SqliteStore, key: &InstanceKey) -> Vec<(String, Value)> {
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

async fn status(store: &SqliteStore, key: &InstanceKey) -> Status {
    store.instance_get(key).await.unwrap().unwrap().status
}

#[tokio::test]
async fn an_arm_writes_the_task_once_and_only_for_a_live_current_owner() {
    let (_dir, store) = pinned("r-once");
    let key = start(&store, "a").await;
    assert_eq!(
        store.remote_arm(&arm(&key, "label")).await.unwrap(),
        RemoteArmOutcome::Dispatched { deadline: None }
    );
    // First arm wins: a re-arm changes nothing.
    let rearm = RemoteArm {
        input: json!("other"),
        priority: 9,
        max_attempts: 5,
        ..arm(&key, "label")
    };
    assert_eq!(
        store.remote_arm(&rearm).await.unwrap(),
        RemoteArmOutcome::Waiting { deadline: None }
    );
    assert_eq!(
        tasks(&store, &key),
        [(
            "label".to_owned(),
            "pending".to_owned(),
            0,
            1,
            None,
            None,
            None,
            json!({"step": "label"}),
            0,
            1
        )]
    );

    let fence = claim(&store, &key, "w").await;
    let fenced = RemoteArm {
        fence: Some(fence.clone()),
        traceparent: Some("00-trace".into()),
        ..arm(&key, "print")
    };
    assert!(matches!(
        store.remote_arm(&fenced).await.unwrap(),
        RemoteArmOutcome::Dispatched { .. }
    ));
    assert_eq!(tasks(&store, &key)[1].6.as_deref(), Some("00-trace"));
    let stale = RemoteArm {
        fence: Some(Fence {
            epoch: fence.epoch - 1,
            ..fence
        }),
        ..arm(&key, "stale")
    };
    assert!(store.remote_arm(&stale).await.unwrap_err().is_lease_lost());

    let next_generation = RemoteArm {
        step_id: remote_step_id(&key, 1, "next"),
        generation: 1,
        ..arm(&key, "next")
    };
    assert_eq!(
        store.remote_arm(&next_generation).await.unwrap(),
        RemoteArmOutcome::Waiting { deadline: None }
    );
    append(&store, &key, None, Event::WorkflowCancelled, None)
        .await
        .unwrap();
    assert_eq!(
        store.remote_arm(&arm(&key, "late")).await.unwrap(),
        RemoteArmOutcome::Waiting { deadline: None }
    );
    let steps: Vec<_> = tasks(&store, &key)
        .into_iter()
        .map(|t| (t.0, t.1))
        .collect();
    assert_eq!(
        steps,
        [
            ("label".to_owned(), "cancelled".to_owned()),
            ("print".to_owned(), "cancelled".to_owned())
        ],
        "the cancel cancelled the live tasks"
    );
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert!(store
        .remote_arm(&arm(&missing, "label"))
        .await
        .unwrap_err()
        .is_not_found());
    let refused = RemoteArm {
        input: json!("\u{0}"),
        ..arm(&key, "nul")
    };
    assert!(store
        .remote_arm(&refused)
        .await
        .unwrap_err()
        .is_value_refused());
}

#[tokio::test]
async fn a_lost_dispatch_is_redispatched_at_its_deadline_until_redispatch_max() {
    let (_dir, store) = pinned("r-lost");
    let key = start(&store, "a").await;
    let lossy = RemoteArm {
        redispatch_after: Some(TEN_MINUTES),
        redispatch_max: 2,
        ..arm(&key, "label")
    };
    assert_eq!(
        store.remote_arm(&lossy).await.unwrap(),
        RemoteArmOutcome::Dispatched {
            deadline: Some(T0 + Span::minutes(10))
        }
    );
    // A claimant that stays alive (its claim outlasts the test) and never reports: the
    // deadline redispatches without counting an attempt.
    claim_task(&store, &key, "label", "w1", micros(T0 + Span::hours(1)));
    store.pin_clock(Some(T0 + Span::minutes(5)));
    assert_eq!(
        store.remote_arm(&lossy).await.unwrap(),
        RemoteArmOutcome::Waiting {
            deadline: Some(T0 + Span::minutes(10))
        }
    );
    store.pin_clock(Some(T0 + Span::minutes(10)));
    assert_eq!(
        store.remote_arm(&lossy).await.unwrap(),
        RemoteArmOutcome::Redispatched {
            deadline: Some(T0 + Span::minutes(20))
        }
    );
    let redispatched = &tasks(&store, &key)[0];
    assert_eq!(
        (
            redispatched.1.as_str(),
            redispatched.2,
            redispatched.3,
            redispatched.4.clone()
        ),
        ("pending", 0, 2, None)
    );
    claim_task(&store, &key, "label", "w1", micros(T0 + Span::hours(1)));

    store.pin_clock(Some(T0 + Span::minutes(20)));
    let lost = json!({"error": {
        "message": "no result after 2 dispatch(es)",
        "code": "remote_step_lost",
        "retryable": true,
        "attempts": 0,
    }});
    assert_eq!(
        store.remote_arm(&lossy).await.unwrap(),
        RemoteArmOutcome::Settled {
            value: lost.clone(),
            lost: true
        }
    );
    assert_eq!(
        journal(&store, &key).await,
        [("remote:label".to_owned(), lost.clone())]
    );
    let failed = &tasks(&store, &key)[0];
    assert_eq!(
        (failed.1.as_str(), failed.4.clone(), failed.5.clone()),
        (
            "failed",
            None,
            Some(json!({
                "message": "no result after 2 dispatch(es)",
                "code": "remote_step_lost",
                "retryable": true
            }))
        )
    );
    assert_eq!(
        store.remote_arm(&lossy).await.unwrap(),
        RemoteArmOutcome::Settled {
            value: lost,
            lost: false
        }
    );

    // The failure is journaled like any result: a suspended owner is woken by it.
    let parked = start(&store, "parked").await;
    let once = RemoteArm {
        redispatch_after: Some(TEN_MINUTES),
        redispatch_max: 1,
        ..arm(&parked, "label")
    };
    store.remote_arm(&once).await.unwrap();
    store
        .instance_park(&Park {
            key: parked.clone(),
            generation: 0,
            fence: None,
            awaited: vec!["remote:label".into()],
            wake_after: None,
        })
        .await
        .unwrap();
    assert_eq!(status(&store, &parked).await, Status::Suspended);
    store.pin_clock(Some(T0 + Span::minutes(40)));
    assert!(matches!(
        store.remote_arm(&once).await.unwrap(),
        RemoteArmOutcome::Settled { lost: true, .. }
    ));
    assert_eq!(status(&store, &parked).await, Status::Running);
}

#[tokio::test]
async fn a_passed_deadline_counts_the_expired_claim_it_drops() {
    let (_dir, store) = pinned("r-expired");
    let key = start(&store, "a").await;
    let twice = RemoteArm {
        max_attempts: 2,
        redispatch_after: Some(TEN_MINUTES),
        ..arm(&key, "label")
    };
    store.remote_arm(&twice).await.unwrap();
    claim_task(&store, &key, "label", "w1", micros(T0 + Span::minutes(1)));
    store.pin_clock(Some(T0 + Span::minutes(10)));
    assert_eq!(
        store.remote_arm(&twice).await.unwrap(),
        RemoteArmOutcome::Redispatched {
            deadline: Some(T0 + Span::minutes(20))
        }
    );
    let redispatched = &tasks(&store, &key)[0];
    assert_eq!(
        (redispatched.1.as_str(), redispatched.2, redispatched.3),
        ("pending", 1, 2)
    );
    claim_task(&store, &key, "label", "w1", micros(T0 + Span::minutes(11)));
    store.pin_clock(Some(T0 + Span::minutes(20)));
    let crashed = json!({"error": {
        "message": "the claim of w1 expired without a report (attempt 2 of 2)",
        "code": RemoteStepError::CRASHED,
        "retryable": true,
        "attempts": 2,
    }});
    assert_eq!(
        store.remote_arm(&twice).await.unwrap(),
        RemoteArmOutcome::Settled {
            value: crashed.clone(),
            lost: false
        }
    );
    assert_eq!(
        journal(&store, &key).await,
        [("remote:label".to_owned(), crashed)]
    );
    let failed = &tasks(&store, &key)[0];
    assert_eq!((failed.1.as_str(), failed.2, failed.3), ("failed", 2, 2));
}

#[tokio::test]
async fn an_arm_learns_a_result_and_journals_one_the_owner_could_not_take() {
    let (_dir, store) = pinned("r-settled");
    let key = start(&store, "a").await;
    store.remote_arm(&arm(&key, "label")).await.unwrap();
    // Completed while the owner could not take it (as after a requeue): journaled by the arm.
    sql(
        &store,
        &format!(
            "UPDATE remote_tasks SET status = 'completed', output = '\"done\"', settled_at = 0 \
             WHERE step_id = '{}'",
            remote_step_id(&key, 0, "label")
        ),
    );
    let settled = RemoteArmOutcome::Settled {
        value: json!({"ok": "done"}),
        lost: false,
    };
    assert_eq!(
        store.remote_arm(&arm(&key, "label")).await.unwrap(),
        settled
    );
    assert_eq!(
        journal(&store, &key).await,
        [("remote:label".to_owned(), json!({"ok": "done"}))]
    );
    // From then on it reads the journal.
    assert_eq!(
        store.remote_arm(&arm(&key, "label")).await.unwrap(),
        settled
    );
    assert_eq!(journal(&store, &key).await.len(), 1);
}

#[tokio::test]
async fn park_dispatch_writes_the_tasks_and_the_park_in_one_transaction() {
    let (_dir, store) = pinned("r-park");
    let key = start(&store, "a").await;
    let fence = claim(&store, &key, "w").await;
    let arms: Vec<RemoteArm> = ["one", "two"]
        .into_iter()
        .map(|step| RemoteArm {
            fence: Some(fence.clone()),
            redispatch_after: Some(TEN_MINUTES),
            ..arm(&key, step)
        })
        .collect();
    let park = Park {
        key: key.clone(),
        generation: 0,
        fence: Some(fence.clone()),
        awaited: vec!["remote:one".into(), "remote:two".into()],
        wake_after: Some(T0 + Span::hours(1)),
    };
    let commits = store.commits();
    let (parked, outcomes) = store.instance_park_dispatch(&park, &arms).await.unwrap();
    assert_eq!(store.commits(), commits + 1, "one transaction");
    assert_eq!(parked, ParkOutcome::Suspended);
    let deadline = Some(T0 + Span::minutes(10));
    assert_eq!(
        outcomes,
        [
            RemoteArmOutcome::Dispatched { deadline },
            RemoteArmOutcome::Dispatched { deadline }
        ]
    );
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.wake_after, row.lease_owner),
        (Status::Suspended, deadline, None),
        "parked, waking by the earliest deadline"
    );
    assert_eq!(tasks(&store, &key).len(), 2);

    // A stale fence writes nothing: no task, no park.
    let other = start(&store, "b").await;
    let stale = Fence {
        owner: "nobody".into(),
        epoch: 1,
    };
    let stale_arms = [RemoteArm {
        fence: Some(stale.clone()),
        ..arm(&other, "one")
    }];
    let stale_park = Park {
        key: other.clone(),
        fence: Some(stale),
        ..park.clone()
    };
    assert!(store
        .instance_park_dispatch(&stale_park, &stale_arms)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert!(tasks(&store, &other).is_empty());
    assert_eq!(status(&store, &other).await, Status::Running);
}

#[tokio::test]
async fn the_store_answers_through_its_traits_as_through_its_methods() {
    let (_dir, store) = pinned("r-traits");
    let leases: Arc<dyn LeaseStore> = Arc::new(store.clone());
    let journal_store: &dyn JournalStore = leases.as_ref();
    assert!(journal_store
        .as_any()
        .and_then(|any| any.downcast_ref::<SqliteStore>())
        .is_some());
    let key = start(&store, "t").await;
    let claimed = leases
        .instance_claim(&key, "w", common::TTL, None)
        .await
        .unwrap();
    assert!(matches!(claimed, keiro_lease::ClaimOutcome::Acquired(_)));
    assert_eq!(
        journal_store
            .journal_append(&common::step(&key, "s", json!(1), None))
            .await
            .unwrap(),
        AppendOutcome::Appended
    );
    assert_eq!(
        journal_store.signal_send("t", &json!(1)).await.unwrap(),
        keiro_journal::SignalSendOutcome::Buffered
    );
    assert!(matches!(
        journal_store.remote_arm(&arm(&key, "r")).await.unwrap(),
        RemoteArmOutcome::Dispatched { .. }
    ));
    assert_eq!(journal_store.journal_history(&key).await.unwrap().len(), 1);
}

#[tokio::test]
async fn redispatch_pending_counts_the_live_tasks_of_the_current_generation() {
    use keiro_remote::{RemoteAdmin, RemoteTask, TaskStatus};
    let (_dir, store) = pinned("r-redispatch");
    let admin: &dyn RemoteAdmin = &store;
    let key = start(&store, "a").await;
    for step in ["x", "y", "done"] {
        store.remote_arm(&arm(&key, step)).await.unwrap();
    }
    claim_task(&store, &key, "x", "w1", micros(T0 + Span::hours(1)));
    sql(
        &store,
        &format!(
            "UPDATE remote_tasks SET status = 'completed', output = '1', settled_at = 0 \
             WHERE step_id = '{}'",
            remote_step_id(&key, 0, "done")
        ),
    );
    store.pin_clock(Some(T0 + Span::minutes(1)));

    assert_eq!(
        admin.remote_redispatch_pending(&key).await.unwrap(),
        Some(2)
    );
    let listed = admin.remote_tasks(&key).await.unwrap();
    let task = |step: &str| -> RemoteTask {
        listed
            .iter()
            .find(|t| t.step == step)
            .cloned()
            .expect("the task exists")
    };
    let x = task("x");
    assert_eq!(
        (x.status, x.dispatches, x.claimed_by),
        (TaskStatus::Pending, 2, None)
    );
    assert_eq!(task("y").dispatches, 2);
    let done = task("done");
    assert_eq!(
        (done.status, done.dispatches, done.output),
        (TaskStatus::Completed, 1, Some(json!(1)))
    );
    assert_eq!(
        listed,
        // Armed at one instant of the pinned clock: oldest first, then by step id.
        ["done", "x", "y"].map(|step| RemoteTask {
            step_id: remote_step_id(&key, 0, step),
            key: key.clone(),
            generation: 0,
            step: step.to_owned(),
            journal_step: format!("remote:{step}"),
            group: step.to_owned(),
            max_attempts: 1,
            attempts: 0,
            last_error: None,
            traceparent: None,
            ..task(step)
        }),
        "listed oldest first, every column read back"
    );

    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert_eq!(
        admin.remote_redispatch_pending(&missing).await.unwrap(),
        None
    );
    // The tasks belong to generation 0; generation 1 has none.
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!(null),
    };
    append(&store, &key, None, rotate, None).await.unwrap();
    assert_eq!(
        admin.remote_redispatch_pending(&key).await.unwrap(),
        Some(0)
    );
}
