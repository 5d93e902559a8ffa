//! The SQLite store's own side of remote steps: a park with its dispatches is one commit of
//! the writer, tasks armed at one instant of a pinned clock are claimed in the order they were
//! written, and the store answers through its traits as through its inherent methods (none
//! recurses). What an arm and a park answer is the contract suite's
//! (`keiro_tests::contract::remote`).

use std::sync::Arc;
use std::time::Duration;

use crate::common::{claim, pinned, remote_arm, start, T0};
use keiro_journal::store::{AppendOutcome, Park, ParkOutcome};
use keiro_journal::{
    store::RemoteArm, store::RemoteArmOutcome, Fence, InstanceKey, JournalStore, Status,
};
use keiro_lease::LeaseStore;
use keiro_remote::{ClaimRequest, Transport};
use keiro_sqlite::SqliteStore;
use rusqlite::Connection;
use serde_json::{json, Value};
use time::Duration as Span;

const TEN_MINUTES: Duration = Duration::from_secs(600);

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

async fn status(store: &SqliteStore, key: &InstanceKey) -> Status {
    store.instance_get(key).await.unwrap().unwrap().status
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
            ..remote_arm(&key, step)
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
        ..remote_arm(&other, "one")
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
        .instance_claim(&key, "w", crate::common::TTL, None)
        .await
        .unwrap();
    assert!(matches!(claimed, keiro_lease::ClaimOutcome::Acquired(_)));
    assert_eq!(
        journal_store
            .journal_append(&crate::common::step(&key, "s", json!(1), None))
            .await
            .unwrap(),
        AppendOutcome::Appended
    );
    assert_eq!(
        journal_store.signal_send("t", &json!(1)).await.unwrap(),
        keiro_journal::SignalSendOutcome::Buffered
    );
    assert!(matches!(
        journal_store
            .remote_arm(&remote_arm(&key, "r"))
            .await
            .unwrap(),
        RemoteArmOutcome::Dispatched { .. }
    ));
    assert_eq!(journal_store.journal_history(&key).await.unwrap().len(), 1);
}

/// SQLite's own tie order, not a contract rule: the store contract promises no order among
/// tasks equal in priority, availability and creation (PostgreSQL leaves it to the plan). This
/// pins what this store does so a change to it is a decision, not an accident.
#[tokio::test]
async fn tasks_armed_at_one_instant_are_claimed_in_the_order_they_were_written() {
    let (_dir, store) = pinned("r-same-instant");
    let key = start(&store, "a").await;
    // One instant of the pinned clock, one group, one priority; the step ids sort the other way.
    for step in ["b-first", "a-second"] {
        let in_labels = RemoteArm {
            group: "labels".into(),
            ..remote_arm(&key, step)
        };
        store.remote_arm(&in_labels).await.unwrap();
    }
    let request = ClaimRequest {
        groups: vec!["labels".to_owned()],
        worker: "w".into(),
        limit: 2,
        claim_ttl: Duration::from_secs(60),
    };
    let claimed = Transport::tasks_claim(&store, &request).await.unwrap();
    let steps: Vec<&str> = claimed.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(steps, ["b-first", "a-second"]);
}
