//! A queue that counts nothing (no limit of any kind, first in first out) keeps no admission
//! state: its runs start free, a worker serving the queue claims them as it claims runs with no
//! queue, and one whose lease is gone is claimed again. Declared with a limit later, the queue
//! counts the runs it leased and the others wait; paused, its runs wait until it is resumed; a
//! run back from its end waits for admission under the limits of that moment.

use std::time::Duration;

use keiro::queue::QueueSpec;
use keiro_journal::Event;
use keiro_lease::{Crash, CrashOutcome, ResurrectOutcome};
use time::Duration as Span;

use super::{admit, complete, declare, ids, start_on, wf};
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

pub async fn only_a_worker_serving_the_queue_claims_its_free_runs(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    declare(&h, QueueSpec::new("other")?).await?;
    start_on(&h, "q", "r-1", "").await?;
    assert!(admit(&*h.store, "other", "w", 10, Some(T0))
        .await?
        .is_empty());
    let names = [keiro_journal::WorkflowName::new("wf")?];
    let unserved = h
        .store
        .claim_and_admit(&names, &[], "w", super::TTL, 10, Some(T0))
        .await?;
    assert!(unserved.claimed.is_empty() && unserved.admitted.is_empty());
    assert_eq!(
        ids(&admit(&*h.store, "q", "w", 10, Some(T0)).await?),
        ["r-1"]
    );
    Ok(())
}

pub async fn a_paused_queue_that_counts_nothing_holds_its_runs_until_resumed(
    h: Harness,
) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    for id in ["r-1", "r-2", "r-3"] {
        start_on(&h, "q", id, "").await?;
    }
    let first = admit(&*h.store, "q", "w", 1, Some(T0)).await?;
    assert_eq!(ids(&first), ["r-1"]);
    h.keiro.pause_queue("q").await?;
    // Started while paused, a run waits too.
    start_on(&h, "q", "r-4", "").await?;
    assert!(admit(&*h.store, "q", "w", 10, Some(T0)).await?.is_empty());
    // The run leased before the pause goes on; once its lease is gone it waits as well.
    let later = T0 + Span::seconds(61);
    assert!(admit(&*h.store, "q", "w", 10, Some(later))
        .await?
        .is_empty());
    // Read on the store's clock, before T0: r-1's lease is live there.
    let info = h.keiro.queue("q").await?.expect("declared");
    assert_eq!((info.waiting, info.running), (3, 1), "{info:?}");
    h.keiro.resume_queue("q").await?;
    assert_eq!(
        ids(&admit(&*h.store, "q", "w", 10, Some(later)).await?),
        ["r-1", "r-2", "r-3", "r-4"]
    );
    // Resumed, the queue starts its runs free again.
    start_on(&h, "q", "r-5", "").await?;
    assert_eq!(
        ids(&admit(&*h.store, "q", "w", 10, Some(later)).await?),
        ["r-5"]
    );
    Ok(())
}

pub async fn a_run_back_from_its_end_waits_under_the_limits_of_its_return(
    h: Harness,
) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    start_on(&h, "q", "r-1", "").await?;
    let first = admit(&*h.store, "q", "w", 1, None).await?;
    assert_eq!(ids(&first), ["r-1"]);
    let crash = Crash {
        error: "boom".into(),
        retry_delay: Duration::from_secs(1),
        max_attempts: 1,
    };
    assert_eq!(
        h.store
            .instance_record_crash(&wf("r-1"), &first[0].fence, &crash)
            .await?,
        CrashOutcome::Failed { attempts: 1 }
    );
    declare(&h, QueueSpec::new("q")?.concurrency(1)).await?;
    start_on(&h, "q", "r-2", "").await?;
    let second = admit(&*h.store, "q", "w", 10, None).await?;
    assert_eq!(ids(&second), ["r-2"]);
    assert_eq!(
        h.store.instance_resurrect(&wf("r-1")).await?,
        ResurrectOutcome::Resurrected
    );
    assert!(
        admit(&*h.store, "q", "w", 10, None).await?.is_empty(),
        "the resurrected run waits for the one slot r-2 holds"
    );
    complete(&*h.store, &second[0]).await?;
    let back = admit(&*h.store, "q", "w", 10, None).await?;
    assert_eq!(ids(&back), ["r-1"]);
    let history = h.store.journal_history(&wf("r-1")).await?;
    assert!(history.iter().any(|e| e.event == Event::Resurrected));
    Ok(())
}
