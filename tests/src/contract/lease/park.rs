//! Parking a run: a park never masks a wake that landed first (it answers woken and leaves the
//! run runnable), a stale fence or a terminal row refuses it, and so they do a divergence.

use crate::contract::support::{append, claim, payload, started, step_event, TestResult, QUIET};
use crate::Harness;
use keiro_journal::{store::Park, store::ParkOutcome, Status};
use serde_json::json;
use time::OffsetDateTime;

pub async fn a_park_never_masks_a_wake_that_landed_first(h: Harness) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    let fence = claim(store, &key, "w").await?;
    append(
        store,
        &key,
        None,
        step_event("sleep:nap", json!(null)),
        None,
    )
    .await?;
    let mut wakes = h.notifications().await?;
    // Whole seconds: Postgres keeps microseconds.
    let wake_after =
        (OffsetDateTime::now_utc() + time::Duration::hours(1)).replace_nanosecond(0)?;
    let park = Park {
        key: key.clone(),
        generation: 0,
        fence: Some(fence),
        awaited: vec!["awk:x".into(), "sleep:nap".into()],
        wake_after: Some(wake_after),
    };
    assert_eq!(
        store.instance_park(&park).await?,
        ParkOutcome::WokenBeforePark
    );
    assert_eq!(wakes.drain(QUIET).await, [payload(&key)]);
    let row = store.instance_get(&key).await?.unwrap();
    assert_eq!(
        (row.status, row.lease_owner, row.wake_after),
        (Status::Running, None, None)
    );

    let fence = claim(store, &key, "w").await?;
    let park = Park {
        awaited: vec!["awk:x".into()],
        fence: Some(fence),
        ..park
    };
    assert_eq!(store.instance_park(&park).await?, ParkOutcome::Suspended);
    let row = store.instance_get(&key).await?.unwrap();
    assert_eq!(
        (row.status, row.wake_after),
        (Status::Suspended, Some(wake_after))
    );
    assert!(store.instances_runnable(None, None).await?.is_empty());

    append(store, &key, None, step_event("awk:x", json!("paid")), None).await?;
    assert_eq!(wakes.drain(QUIET).await, [payload(&key)]);
    assert_eq!(
        store.instance_get(&key).await?.unwrap().status,
        Status::Running
    );

    let stale_generation = Park {
        generation: 7,
        fence: None,
        ..park
    };
    assert_eq!(
        store.instance_park(&stale_generation).await?,
        ParkOutcome::WokenBeforePark
    );
    Ok(())
}

pub async fn parks_and_divergence_respect_terminal_rows_and_fences(h: Harness) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    let stale = claim(store, &key, "w").await?;
    store.instance_lease_force_release(&key).await?;
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
    assert!(store.instance_fail_diverged(&key, None, "r").await?);
    assert!(!store.instance_fail_diverged(&key, None, "again").await?);
    assert_eq!(
        store.instance_park(&park).await?,
        ParkOutcome::Terminal(Status::Failed)
    );
    let row = store.instance_get(&key).await?.ok_or("missing")?;
    assert_eq!(row.last_error.as_deref(), Some("r"));
    assert!(row.completed_at.is_some());
    assert!(store.journal_history(&key).await?.is_empty());
    let missing = keiro_journal::InstanceKey::parse("wf", "missing")?;
    assert!(store
        .instance_fail_diverged(&missing, None, "r")
        .await
        .unwrap_err()
        .is_not_found());
    Ok(())
}
