//! Awakeables (awakeable.sql): created with their allocation step, settled once, never
//! journaled into a terminal owner. The assertions of crates/postgres/tests/awakeables.rs and
//! of the memory store's test (crates/memory/src/sources.rs).

mod common;

use common::{claim, pinned, start, T0};
use keiro_journal::store::{Append, AppendOutcome, Park};
use keiro_journal::{
    store::awakeable_step, AwakeableOutcome, AwakeableStatus, Event, InstanceKey, Marker, Status,
    StepKind,
};
use keiro_sqlite::SqliteStore;
use serde_json::{json, Value};
use uuid::Uuid;

/// The allocation append of awakeable `name`, whose value is `id`.
fn allocation(k: &InstanceKey, name: &str, id: Uuid) -> Append {
    Append::external(
        k.clone(),
        Event::StepRecorded {
            step: format!("awkid:{name}"),
            kind: StepKind::Awakeable,
            result: json!(id.to_string()),
        },
    )
}

async fn recorded(store: &SqliteStore, key: &InstanceKey, step: &str) -> Vec<Value> {
    store
        .journal_history(key)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event.step_name() == step)
        .filter_map(|e| match e.event {
            Event::StepRecorded { result, .. } => Some(result),
            _ => None,
        })
        .collect()
}

/// `(step name, payload)` of every journal row of `key`, in order.
async fn journal(store: &SqliteStore, key: &InstanceKey) -> Vec<(String, Value)> {
    store
        .journal_history(key)
        .await
        .unwrap()
        .into_iter()
        .map(|entry| {
            let encoded = entry.event.encode();
            (encoded.step_name, encoded.payload)
        })
        .collect()
}

async fn status(store: &SqliteStore, key: &InstanceKey) -> Status {
    store.instance_get(key).await.unwrap().unwrap().status
}

async fn park(store: &SqliteStore, key: &InstanceKey, awaited: &str) {
    store
        .instance_park(&Park {
            key: key.clone(),
            generation: 0,
            fence: None,
            awaited: vec![awaited.to_owned()],
            wake_after: Some(T0 + time::Duration::hours(1)),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn completion_delivers_once_and_repeats_are_idempotent() {
    let (_dir, store) = pinned("a-once");
    let k = start(&store, "a-1").await;
    let id = Uuid::new_v4();
    assert_eq!(
        store
            .awakeable_create(&allocation(&k, "approval", id), id)
            .await
            .unwrap(),
        AppendOutcome::Appended
    );
    park(&store, &k, &awakeable_step(id)).await;
    assert_eq!(store.awakeables_pending().await.unwrap(), 1);

    // A replayed allocation keeps the first id and registers nothing.
    let other = Uuid::new_v4();
    assert_eq!(
        store
            .awakeable_create(&allocation(&k, "approval", other), other)
            .await
            .unwrap(),
        AppendOutcome::AlreadyPresent(json!(id.to_string()))
    );
    assert_eq!(store.awakeables_pending().await.unwrap(), 1);
    assert_eq!(
        store.awakeable_complete(other, &json!("x")).await.unwrap(),
        AwakeableOutcome::NotFound
    );
    // An id registered twice is refused, and its allocation step is not journaled.
    assert!(store
        .awakeable_create(&allocation(&k, "again", id), id)
        .await
        .is_err());
    assert!(recorded(&store, &k, "awkid:again").await.is_empty());

    assert_eq!(
        store.awakeable_complete(id, &json!("ada")).await.unwrap(),
        AwakeableOutcome::Delivered
    );
    assert_eq!(store.awakeables_pending().await.unwrap(), 0);
    assert_eq!(
        recorded(&store, &k, &awakeable_step(id)).await,
        vec![json!({"ok": "ada"})]
    );
    assert_eq!(
        status(&store, &k).await,
        Status::Running,
        "the owner was woken"
    );
    for repeat in [
        store.awakeable_complete(id, &json!("bob")).await.unwrap(),
        store.awakeable_cancel(id).await.unwrap(),
    ] {
        assert_eq!(
            repeat,
            AwakeableOutcome::AlreadySettled(AwakeableStatus::Completed)
        );
    }
    assert_eq!(
        recorded(&store, &k, &awakeable_step(id)).await,
        vec![json!({"ok": "ada"})],
        "the first value stands"
    );
    assert_eq!(
        store
            .awakeable_complete(Uuid::new_v4(), &json!(1))
            .await
            .unwrap(),
        AwakeableOutcome::NotFound
    );
    let err = store
        .awakeable_complete(Uuid::new_v4(), &json!("\u{0}"))
        .await
        .unwrap_err();
    assert!(err.is_value_refused(), "{err}");
}

#[tokio::test]
async fn cancellation_delivers_the_cancelled_envelope() {
    let (_dir, store) = pinned("a-cancel");
    let k = start(&store, "a-2").await;
    let id = Uuid::new_v4();
    store
        .awakeable_create(&allocation(&k, "approval", id), id)
        .await
        .unwrap();
    assert_eq!(
        store.awakeable_cancel(id).await.unwrap(),
        AwakeableOutcome::Delivered
    );
    assert_eq!(
        recorded(&store, &k, &awakeable_step(id)).await,
        vec![json!({"cancelled": true})]
    );
    assert_eq!(
        store.awakeable_complete(id, &json!(1)).await.unwrap(),
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
    );
}

#[tokio::test]
async fn racing_completions_settle_once() {
    let (_dir, store) = pinned("a-race");
    let k = start(&store, "a-3").await;
    for n in 0..20 {
        let id = Uuid::new_v4();
        store
            .awakeable_create(&allocation(&k, &format!("a{n}"), id), id)
            .await
            .unwrap();
        let payload = json!("a");
        let (a, b) = tokio::join!(
            store.awakeable_complete(id, &payload),
            store.awakeable_cancel(id)
        );
        let outcomes = [a.unwrap(), b.unwrap()];
        let delivered = outcomes
            .iter()
            .filter(|o| **o == AwakeableOutcome::Delivered)
            .count();
        assert_eq!(delivered, 1, "{outcomes:?}");
        assert_eq!(recorded(&store, &k, &awakeable_step(id)).await.len(), 1);
    }
}

#[tokio::test]
async fn a_terminal_owner_gets_nothing_journaled() {
    let (_dir, store) = pinned("a-terminal");
    let k = start(&store, "a-4").await;
    let id = Uuid::new_v4();
    store
        .awakeable_create(&allocation(&k, "approval", id), id)
        .await
        .unwrap();
    store
        .journal_append(&Append::external(
            k.clone(),
            Event::WorkflowCompleted { output: json!(7) },
        ))
        .await
        .unwrap();
    assert_eq!(
        store.awakeable_complete(id, &json!("late")).await.unwrap(),
        AwakeableOutcome::OwnerGone
    );
    assert!(recorded(&store, &k, &awakeable_step(id)).await.is_empty());
    assert_eq!(status(&store, &k).await, Status::Completed);
    // Settled all the same: it is not pending, and a repeat says so.
    assert_eq!(store.awakeables_pending().await.unwrap(), 0);
    assert_eq!(
        store.awakeable_cancel(id).await.unwrap(),
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Completed)
    );
}

#[tokio::test]
async fn creation_is_fenced_and_refused_on_a_terminal_owner() {
    let (_dir, store) = pinned("a-fenced");
    let k = start(&store, "a-5").await;
    let fence = claim(&store, &k, "w1").await;
    let stale = keiro_journal::Fence {
        epoch: fence.epoch - 1,
        ..fence.clone()
    };
    let id = Uuid::new_v4();
    let fenced = |fence| Append {
        fence: Some(fence),
        ..allocation(&k, "approval", id)
    };
    assert!(store
        .awakeable_create(&fenced(stale), id)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(
        store.awakeables_pending().await.unwrap(),
        0,
        "a refused append registers nothing"
    );
    assert_eq!(
        store.awakeable_create(&fenced(fence), id).await.unwrap(),
        AppendOutcome::Appended
    );
    store
        .journal_append(&Append::external(k.clone(), Event::WorkflowCancelled))
        .await
        .unwrap();
    let late = Uuid::new_v4();
    assert_eq!(
        store
            .awakeable_create(&allocation(&k, "second", late), late)
            .await
            .unwrap(),
        AppendOutcome::RefusedTerminal(Marker::Cancelled)
    );
    assert_eq!(
        store.awakeable_complete(late, &json!(1)).await.unwrap(),
        AwakeableOutcome::NotFound
    );
    // The cancel settled the one it had: nothing will await it any more.
    assert_eq!(
        store.awakeable_cancel(id).await.unwrap(),
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
    );
}

#[tokio::test]
async fn a_cancel_settles_the_pending_awakeables_and_journals_nothing_more() {
    let (_dir, store) = pinned("a-orphaned");
    let owner = start(&store, "owner").await;
    let (paid, orphaned) = (Uuid::from_u128(1), Uuid::from_u128(3));
    store
        .awakeable_create(&allocation(&owner, "a", paid), paid)
        .await
        .unwrap();
    park(&store, &owner, &awakeable_step(paid)).await;
    assert_eq!(
        store
            .awakeable_complete(paid, &json!("paid"))
            .await
            .unwrap(),
        AwakeableOutcome::Delivered
    );
    store
        .awakeable_create(&allocation(&owner, "c", orphaned), orphaned)
        .await
        .unwrap();
    store.instance_cancel(&owner, false).await.unwrap();
    let before = journal(&store, &owner).await;
    assert_eq!(
        store.awakeable_cancel(orphaned).await.unwrap(),
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
    );
    assert_eq!(journal(&store, &owner).await, before);
    assert_eq!(
        store.awakeable_complete(orphaned, &json!(1)).await.unwrap(),
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
    );
    assert_eq!(store.awakeables_pending().await.unwrap(), 0);
    assert_eq!(
        before,
        [
            ("awkid:a".to_owned(), json!(paid.to_string())),
            (awakeable_step(paid), json!({"ok": "paid"})),
            ("awkid:c".to_owned(), json!(orphaned.to_string())),
            (Marker::Cancelled.step_name().to_owned(), Value::Null),
        ]
    );
}
