//! A queue that counts nothing (no limit of any kind, first in first out) keeps no admission
//! state: a run is leased as an ordinary claim leases it, and waits again once its lease is
//! gone. Declared with a limit later, the queue counts the runs it leased.

use keiro::queue::QueueSpec;
use time::Duration as Span;

use super::{admit, declare, ids, start_on, wf};
use crate::contract::support::{append, step_event, TestResult, T0};
use crate::Harness;

pub async fn a_queue_that_counts_nothing_leases_its_runs_and_shows_them_running(
    h: Harness,
) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    for id in ["r-1", "r-2", "r-3"] {
        start_on(&h, "q", id, "").await?;
    }
    let first = admit(&*h.store, "q", "w1", 1, Some(T0)).await?;
    assert_eq!(ids(&first), ["r-1"]);
    // A leased run is not admitted twice, and no ordinary claim takes any of them.
    assert_eq!(
        ids(&admit(&*h.store, "q", "w2", 1, Some(T0)).await?),
        ["r-2"]
    );
    let names = [keiro_journal::WorkflowName::new("wf")?];
    let ordinary = h
        .store
        .instances_claim_batch(&names, "w3", super::TTL, 10, Some(T0))
        .await?;
    assert!(ordinary.is_empty(), "{:?}", ids(&ordinary));
    assert!(h.store.instances_runnable(Some(T0), None).await?.is_empty());

    let info = h.keiro.queue("q").await?.expect("declared");
    assert_eq!((info.waiting, info.running), (1, 2), "{info:?}");
    assert_eq!(info.top_keys, [(String::new(), 1, 2)], "{info:?}");

    // Its lease gone, a run waits again (oldest first) under a new epoch.
    let later = T0 + Span::seconds(61);
    let again = admit(&*h.store, "q", "w2", 1, Some(later)).await?;
    assert_eq!(ids(&again), ["r-1"]);
    assert!(again[0].fence.epoch > first[0].fence.epoch);
    let stale = append(
        &*h.store,
        &wf("r-1"),
        None,
        step_event("late", serde_json::json!(1)),
        Some(&first[0].fence),
    )
    .await;
    assert!(matches!(&stale, Err(e) if e.is_lease_lost()), "{stale:?}");
    Ok(())
}

pub async fn a_limit_declared_later_counts_the_runs_the_queue_leased(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    for id in ["r-1", "r-2", "r-3", "r-4"] {
        start_on(&h, "q", id, "").await?;
    }
    // Leased on the store's clock, so the declaration below sees the lease live.
    assert_eq!(ids(&admit(&*h.store, "q", "w", 1, None).await?), ["r-1"]);
    declare(&h, QueueSpec::new("q")?.concurrency(2)).await?;
    assert_eq!(
        ids(&admit(&*h.store, "q", "w", 10, None).await?),
        ["r-2"],
        "the run leased before the limit holds one of its two slots"
    );
    assert!(admit(&*h.store, "q", "w", 10, None).await?.is_empty());
    let info = h.keiro.queue("q").await?.expect("declared");
    assert_eq!((info.waiting, info.running), (2, 2), "{info:?}");
    // Declared without limits again, it leases the rest without counting.
    declare(&h, QueueSpec::new("q")?).await?;
    assert_eq!(
        ids(&admit(&*h.store, "q", "w", 10, None).await?),
        ["r-3", "r-4"]
    );
    Ok(())
}
