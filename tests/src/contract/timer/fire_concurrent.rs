//! Concurrent timer workers split the backlog: every due timer fires exactly once and its step
//! is journaled once (`FOR UPDATE SKIP LOCKED`).

use std::collections::BTreeSet;
use std::sync::Arc;

use keiro_lease::LeaseStore;

use crate::contract::support::{key, recorded, start_parked, status, TestResult};
use crate::Harness;
use keiro_journal::{store::TimerArm, InstanceKey, Status, TimerKind};
use serde_json::json;
use time::OffsetDateTime;

const INSTANCES: usize = 40;

/// Fires batches of `limit` until a batch comes back empty; returns what it fired.
async fn worker(
    store: Arc<dyn LeaseStore>,
    limit: i64,
) -> Result<Vec<(InstanceKey, bool)>, keiro_journal::StoreError> {
    let mut fired = Vec::new();
    loop {
        let batch = store.timers_fire_due(None, limit).await?;
        if batch.fired.is_empty() {
            return Ok(fired);
        }
        fired.extend(batch.fired.into_iter().map(|t| (t.key, t.delivered)));
    }
}

pub async fn concurrent_callers_fire_each_timer_once(h: Harness) -> TestResult {
    let store = &*h.store;
    let due = OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let keys: Vec<_> = (0..INSTANCES)
        .map(|n| key("sleeper", &format!("s-{n}")))
        .collect();
    for k in &keys {
        start_parked(store, k).await?;
        store
            .timer_arm(&TimerArm {
                key: k.clone(),
                generation: 0,
                step: "sleep:nap".into(),
                due: keiro_journal::store::TimerDue::At(due),
                kind: TimerKind::Sleep,
            })
            .await?;
    }

    // Two callers with room for everything: between them, each timer once.
    let (a, b) = tokio::join!(
        store.timers_fire_due(None, 1000),
        store.timers_fire_due(None, 1000)
    );
    let (a, b) = (a?, b?);
    assert_eq!(
        a.fired.len() + b.fired.len(),
        INSTANCES,
        "each timer fired by one caller"
    );
    let fired: BTreeSet<_> = a
        .fired
        .iter()
        .chain(&b.fired)
        .map(|t| t.key.clone())
        .collect();
    assert_eq!(fired.len(), INSTANCES, "no timer fired twice");
    assert!(a.fired.iter().chain(&b.fired).all(|t| t.delivered));
    for k in &keys {
        assert_eq!(
            recorded(store, k, "sleep:nap").await?,
            vec![json!(null)],
            "{k}"
        );
        assert_eq!(status(store, k).await?, Status::Running);
    }
    assert!(store.timers_fire_due(None, 1000).await?.fired.is_empty());
    Ok(())
}

pub async fn many_workers_in_small_batches_fire_each_timer_once(h: Harness) -> TestResult {
    let store = &*h.store;
    let due = OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let keys: Vec<_> = (0..INSTANCES)
        .map(|n| key("sleeper", &format!("s-{n}")))
        .collect();
    for k in &keys {
        start_parked(store, k).await?;
        for step in ["sleep:a", "sleep:b"] {
            store
                .timer_arm(&TimerArm {
                    key: k.clone(),
                    generation: 0,
                    step: step.into(),
                    due: keiro_journal::store::TimerDue::At(due),
                    kind: TimerKind::Sleep,
                })
                .await?;
        }
    }
    let workers: Vec<_> = (0..4)
        .map(|_| tokio::spawn(worker(h.store.clone(), 3)))
        .collect();
    let mut fired = Vec::new();
    for handle in workers {
        fired.extend(handle.await??);
    }
    assert_eq!(fired.len(), 2 * INSTANCES);
    assert!(fired.iter().all(|(_, delivered)| *delivered));
    assert_eq!(store.timers_due_count(None).await?, 0);
    for k in &keys {
        for step in ["sleep:a", "sleep:b"] {
            assert_eq!(recorded(store, k, step).await?.len(), 1, "{k} {step}");
        }
    }
    Ok(())
}
