//! Bounded deliveries (journal.sql's `keiro_delivery_append`, and the run's report of what its
//! awaits read), at the store level, with the assertions of the workspace's deliveries
//! scenarios (tests/tests/deliveries.rs).

mod common;

use common::{append, pinned, start};
use keiro_journal::store::{Append, AppendOutcome, DeliveryOutcome, Park};
use keiro_journal::{Deliveries, DeliveryBacklog, Event, InstanceKey, StepKind};
use keiro_sqlite::SqliteStore;
use serde_json::{json, Value};

fn delivery(key: &InstanceKey, name: &str, value: Value) -> Append {
    Append::external(
        key.clone(),
        Event::StepRecorded {
            step: format!("await:{name}"),
            kind: StepKind::Await,
            result: value,
        },
    )
}

async fn deliver(
    store: &SqliteStore,
    key: &InstanceKey,
    name: &str,
    value: Value,
    backlog: &DeliveryBacklog,
) -> DeliveryOutcome {
    store
        .delivery_append(&delivery(key, name, value), backlog)
        .await
        .expect("delivers")
}

fn appended() -> DeliveryOutcome {
    DeliveryOutcome::Append(AppendOutcome::Appended)
}

#[tokio::test]
async fn a_delivery_past_the_unread_bound_is_refused_and_writes_nothing() {
    let (_dir, store) = pinned("d-count");
    let key = start(&store, "a").await;
    let backlog = DeliveryBacklog {
        deliveries: 2,
        ..DeliveryBacklog::default()
    };
    assert_eq!(
        deliver(&store, &key, "x", json!(1), &backlog).await,
        appended()
    );
    assert_eq!(
        deliver(&store, &key, "y", json!(2), &backlog).await,
        appended()
    );
    let refused = deliver(&store, &key, "z", json!(3), &backlog).await;
    assert_eq!(
        refused,
        DeliveryOutcome::Backlog(Deliveries { count: 2, bytes: 2 })
    );
    assert_eq!(
        store.journal_load(&key, 0).await.unwrap().len(),
        2,
        "nothing journaled"
    );
    // A repeat is still idempotent.
    assert_eq!(
        deliver(&store, &key, "x", json!(9), &backlog).await,
        DeliveryOutcome::Append(AppendOutcome::AlreadyPresent(json!(1)))
    );
    // What the run read makes room.
    store
        .deliveries_read(&key, 0, Deliveries { count: 1, bytes: 1 })
        .await
        .unwrap();
    assert_eq!(
        deliver(&store, &key, "z", json!(3), &backlog).await,
        appended()
    );
    // A report for another generation, or a smaller total, changes nothing.
    store
        .deliveries_read(&key, 0, Deliveries { count: 0, bytes: 0 })
        .await
        .unwrap();
    store
        .deliveries_read(&key, 5, Deliveries { count: 9, bytes: 9 })
        .await
        .unwrap();
    let full = deliver(&store, &key, "w", json!(4), &backlog).await;
    assert_eq!(
        full,
        DeliveryOutcome::Backlog(Deliveries { count: 2, bytes: 2 })
    );
}

#[tokio::test]
async fn a_parked_wait_is_always_answered() {
    let (_dir, store) = pinned("d-parked");
    let key = start(&store, "a").await;
    let backlog = DeliveryBacklog {
        deliveries: 1,
        ..DeliveryBacklog::default()
    };
    deliver(&store, &key, "junk", json!(0), &backlog).await;
    let park = Park {
        key: key.clone(),
        generation: 0,
        fence: None,
        awaited: vec!["await:item".into()],
        wake_after: None,
    };
    store.instance_park(&park).await.unwrap();
    assert!(matches!(
        deliver(&store, &key, "more-junk", json!(0), &backlog).await,
        DeliveryOutcome::Backlog(_)
    ));
    assert_eq!(
        deliver(&store, &key, "item", json!(7), &backlog).await,
        appended()
    );
}

#[tokio::test]
async fn the_unread_bytes_are_bounded_too() {
    let (_dir, store) = pinned("d-bytes");
    let key = start(&store, "a").await;
    let backlog = DeliveryBacklog {
        deliveries: 100,
        bytes: 100,
    };
    let sixty = json!("x".repeat(58)); // 60 bytes encoded, with its quotes
    assert_eq!(
        deliver(&store, &key, "a", sixty.clone(), &backlog).await,
        appended()
    );
    assert_eq!(
        deliver(&store, &key, "b", sixty, &backlog).await,
        DeliveryOutcome::Backlog(Deliveries {
            count: 1,
            bytes: 60
        })
    );
    assert_eq!(
        deliver(&store, &key, "c", json!("x".repeat(38)), &backlog).await,
        appended()
    );
}

#[tokio::test]
async fn a_new_generation_starts_with_no_unread_delivery() {
    let (_dir, store) = pinned("d-generation");
    let key = start(&store, "a").await;
    let backlog = DeliveryBacklog {
        deliveries: 1,
        ..DeliveryBacklog::default()
    };
    deliver(&store, &key, "junk", json!(0), &backlog).await;
    assert!(matches!(
        deliver(&store, &key, "more", json!(0), &backlog).await,
        DeliveryOutcome::Backlog(_)
    ));
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!(null),
    };
    append(&store, &key, None, rotate, None).await.unwrap();
    assert_eq!(
        deliver(&store, &key, "junk", json!(0), &backlog).await,
        appended()
    );
    // A closed instance gets the append rules' own answer, never a backlog.
    append(&store, &key, None, Event::WorkflowCancelled, None)
        .await
        .unwrap();
    assert_eq!(
        deliver(&store, &key, "late", json!(0), &backlog).await,
        DeliveryOutcome::Append(AppendOutcome::RefusedTerminal(
            keiro_journal::Marker::Cancelled
        ))
    );
}

#[tokio::test]
async fn only_an_unfenced_await_record_is_a_delivery() {
    let (_dir, store) = pinned("d-shape");
    let key = start(&store, "a").await;
    let step = common::step(&key, "s", json!(1), None);
    let err = store
        .delivery_append(&step, &DeliveryBacklog::default())
        .await
        .unwrap_err();
    assert!(!err.is_retryable() && !err.is_value_refused(), "{err}");
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert!(store
        .delivery_append(
            &delivery(&missing, "x", json!(1)),
            &DeliveryBacklog::default()
        )
        .await
        .unwrap_err()
        .is_not_found());
}
