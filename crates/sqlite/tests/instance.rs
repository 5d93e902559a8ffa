//! Start, confirm, park and the divergence failure (instance.sql), with the assertions of the
//! memory store's tests (crates/memory/src/journal.rs), minus their notifications.

mod common;

use common::{append, claim, event_step as step, pinned, start, T0, TTL};
use keiro_journal::store::{Park, ParkOutcome};
use keiro_journal::{store::StartRequest, Fence, InstanceKey, Status};
use rusqlite::Connection;
use serde_json::{json, Value};
use time::Duration as Span;

#[tokio::test]
async fn start_is_idempotent() {
    let (_dir, store) = pinned("i-start");
    let key = start(&store, "a").await;
    store.pin_clock(Some(T0 + Span::minutes(1)));
    let again = StartRequest {
        key: key.clone(),
        input: json!("other"),
        parent: None,
        priority: 9,
    };
    let started = store.instance_start(&again).await.unwrap();
    assert!(!started.created);
    assert_eq!(
        (started.instance.input, started.instance.priority),
        (Value::Null, 0)
    );
    assert_eq!(started.instance.created_at, T0);
    assert_eq!(started.instance.status, Status::Running);
    assert_eq!(started.instance.generation, 0);
}

#[tokio::test]
async fn a_started_child_names_its_parent_and_many_starts_answer_in_order() {
    let (_dir, store) = pinned("i-many");
    let parent = start(&store, "p").await;
    let request = |id: &str, input: Value| StartRequest {
        key: InstanceKey::parse("wf", id).unwrap(),
        input,
        parent: Some(parent.clone()),
        priority: 1,
    };
    let answers = store
        .instances_start(&[
            request("x", json!(1)),
            request("x", json!(2)),
            request("y", json!("\u{0}")),
            request("z", json!(3)),
        ])
        .await;
    let created: Vec<_> = answers
        .iter()
        .map(|a| {
            a.as_ref()
                .map(|s| s.created)
                .map_err(|e| e.is_value_refused())
        })
        .collect();
    assert_eq!(created, [Ok(true), Ok(false), Err(true), Ok(true)]);
    let x = answers[1].as_ref().unwrap();
    assert_eq!(x.instance.input, json!(1));
    assert_eq!(x.instance.parent.as_ref(), Some(&parent));
}

#[tokio::test]
async fn confirm_renews_reports_terminal_rows_and_refuses_a_stale_fence() {
    let (_dir, store) = pinned("i-confirm");
    let key = start(&store, "a").await;
    let fence = claim(&store, &key, "w").await;
    store.pin_clock(Some(T0 + Span::seconds(30)));
    assert_eq!(
        store.instance_confirm(&key, &fence, TTL).await.unwrap(),
        Status::Running
    );
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(row.lease_expires_at, Some(T0 + Span::seconds(90)));
    let stale = Fence {
        epoch: fence.epoch + 1,
        ..fence.clone()
    };
    assert!(store
        .instance_confirm(&key, &stale, TTL)
        .await
        .unwrap_err()
        .is_lease_lost());
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert!(store
        .instance_confirm(&missing, &fence, TTL)
        .await
        .unwrap_err()
        .is_not_found());
}

#[tokio::test]
async fn a_park_never_masks_a_wake_that_landed_first() {
    let (dir, store) = pinned("i-park");
    let key = start(&store, "a").await;
    let fence = claim(&store, &key, "w").await;
    append(&store, &key, None, step("sleep:nap", json!(null)), None)
        .await
        .unwrap();
    let park = Park {
        key: key.clone(),
        generation: 0,
        fence: Some(fence),
        awaited: vec!["awk:x".into(), "sleep:nap".into()],
        wake_after: Some(T0 + Span::hours(1)),
    };
    assert_eq!(
        store.instance_park(&park).await.unwrap(),
        ParkOutcome::WokenBeforePark
    );
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.lease_owner, row.wake_after),
        (Status::Running, None, None)
    );

    let fence = claim(&store, &key, "w").await;
    let park = Park {
        awaited: vec!["awk:x".into(), "await:order".into()],
        fence: Some(fence),
        ..park
    };
    assert_eq!(
        store.instance_park(&park).await.unwrap(),
        ParkOutcome::Suspended
    );
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.wake_after),
        (Status::Suspended, Some(T0 + Span::hours(1)))
    );
    // The deliveries the park waits on, for the bound on unread deliveries.
    let raw = Connection::open(dir.file("keiro.db")).unwrap();
    let parked_on: Option<String> = raw
        .query_row("SELECT parked_on FROM workflows", [], |r| r.get(0))
        .unwrap();
    assert_eq!(parked_on.as_deref(), Some(r#"["await:order"]"#));
    assert!(store
        .instances_runnable(None, None)
        .await
        .unwrap()
        .is_empty());

    append(&store, &key, None, step("awk:x", json!("paid")), None)
        .await
        .unwrap();
    assert_eq!(
        store.instance_get(&key).await.unwrap().unwrap().status,
        Status::Running
    );

    let stale_generation = Park {
        generation: 7,
        fence: None,
        ..park
    };
    assert_eq!(
        store.instance_park(&stale_generation).await.unwrap(),
        ParkOutcome::WokenBeforePark
    );
}

#[tokio::test]
async fn parks_and_divergence_respect_terminal_rows_and_fences() {
    let (_dir, store) = pinned("i-diverged");
    let key = start(&store, "a").await;
    let stale = claim(&store, &key, "w").await;
    store.instance_lease_force_release(&key).await.unwrap();
    let park = Park {
        key: key.clone(),
        generation: 0,
        fence: Some(stale.clone()),
        awaited: vec!["awk:x".into()],
        wake_after: None,
    };
    assert!(store
        .instance_park(&park)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert!(store
        .instance_fail_diverged(&key, Some(&stale), "r")
        .await
        .unwrap_err()
        .is_lease_lost());
    assert!(store.instance_fail_diverged(&key, None, "r").await.unwrap());
    assert!(!store
        .instance_fail_diverged(&key, None, "again")
        .await
        .unwrap());
    assert_eq!(
        store.instance_park(&park).await.unwrap(),
        ParkOutcome::Terminal(Status::Failed)
    );
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.last_error.as_deref(), row.completed_at),
        (Some("r"), Some(T0))
    );
    assert!(store.journal_history(&key).await.unwrap().is_empty());
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert!(store
        .instance_fail_diverged(&missing, None, "r")
        .await
        .unwrap_err()
        .is_not_found());
    assert!(store
        .instance_fail_diverged(&key, None, "a\u{0}")
        .await
        .unwrap_err()
        .is_value_refused());
}
