//! When a slot comes back: a park (as the queue says), a recorded crash, an expired lease.

use keiro::queue::QueueSpec;
use keiro_journal::store::Park;
use keiro_lease::Crash;
use time::Duration as Span;

use super::{admit, complete, declare, ids, start_on, wf};
use crate::contract::support::{append, step_event, TestResult, T0};
use crate::Harness;

async fn park(h: &Harness, claim: &keiro_lease::Claim) -> super::super::support::Result<()> {
    let park = Park {
        key: claim.instance.key.clone(),
        generation: 0,
        fence: Some(claim.fence.clone()),
        awaited: vec!["event".to_owned()],
        wake_after: None,
    };
    h.store.instance_park(&park).await?;
    Ok(())
}

pub async fn a_parked_run_gives_its_slot_back_or_keeps_it_as_its_queue_says(
    h: Harness,
) -> TestResult {
    declare(&h, QueueSpec::new("q")?.concurrency(1)).await?;
    start_on(&h, "q", "r-1", "").await?;
    start_on(&h, "q", "r-2", "").await?;
    let first = admit(&*h.store, "q", "w", 10, None).await?;
    assert_eq!(ids(&first), ["r-1"]);
    park(&h, &first[0]).await?;
    // Released: the next run takes the slot, and the woken one waits for admission again.
    let second = admit(&*h.store, "q", "w", 10, None).await?;
    assert_eq!(ids(&second), ["r-2"]);
    append(
        &*h.store,
        &wf("r-1"),
        None,
        step_event("event", serde_json::json!(1)),
        None,
    )
    .await?;
    let names = [keiro_journal::WorkflowName::new("wf")?];
    let ordinary = h
        .store
        .instances_claim_batch(&names, "w", super::TTL, 10, None)
        .await?;
    assert!(
        ordinary.is_empty(),
        "a woken run without a slot is not claimed"
    );
    assert!(admit(&*h.store, "q", "w", 10, None).await?.is_empty());
    complete(&*h.store, &second[0]).await?;
    assert_eq!(ids(&admit(&*h.store, "q", "w", 10, None).await?), ["r-1"]);

    declare(
        &h,
        QueueSpec::new("keep")?
            .concurrency(1)
            .release_on_park(false),
    )
    .await?;
    start_on(&h, "keep", "k-1", "").await?;
    start_on(&h, "keep", "k-2", "").await?;
    let kept = admit(&*h.store, "keep", "w", 10, None).await?;
    assert_eq!(ids(&kept), ["k-1"]);
    park(&h, &kept[0]).await?;
    assert!(
        admit(&*h.store, "keep", "w", 10, None).await?.is_empty(),
        "the slot is kept"
    );
    // Woken, the run that kept its slot is claimed the ordinary way.
    append(
        &*h.store,
        &wf("k-1"),
        None,
        step_event("event", serde_json::json!(1)),
        None,
    )
    .await?;
    let again = h
        .store
        .instances_claim_batch(&names, "w", super::TTL, 10, None)
        .await?;
    assert_eq!(ids(&again), ["k-1"]);
    assert!(admit(&*h.store, "keep", "w", 10, None).await?.is_empty());
    Ok(())
}

pub async fn a_recorded_crash_gives_the_slot_back(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.concurrency(1)).await?;
    start_on(&h, "q", "r-1", "").await?;
    start_on(&h, "q", "r-2", "").await?;
    let first = admit(&*h.store, "q", "w", 10, None).await?;
    let crash = Crash {
        error: "boom".to_owned(),
        retry_delay: std::time::Duration::from_secs(3600),
        max_attempts: 5,
    };
    h.store
        .instance_record_crash(&first[0].instance.key, &first[0].fence, &crash)
        .await?;
    assert_eq!(ids(&admit(&*h.store, "q", "w", 10, None).await?), ["r-2"]);
    Ok(())
}

pub async fn an_expired_lease_gives_the_slot_back_and_fences_the_old_holder(
    h: Harness,
) -> TestResult {
    declare(&h, QueueSpec::new("q")?.concurrency(1)).await?;
    start_on(&h, "q", "r-1", "").await?;
    start_on(&h, "q", "r-2", "").await?;
    let first = admit(&*h.store, "q", "w1", 10, Some(T0)).await?;
    assert_eq!(ids(&first), ["r-1"]);
    // Before expiry the slot is held.
    assert!(
        admit(&*h.store, "q", "w2", 10, Some(T0 + Span::seconds(30)))
            .await?
            .is_empty()
    );
    // After it, the run waits again (oldest first, so it is taken again) under a new epoch.
    let taken = admit(&*h.store, "q", "w2", 10, Some(T0 + Span::seconds(61))).await?;
    assert_eq!(ids(&taken), ["r-1"]);
    assert!(taken[0].fence.epoch > first[0].fence.epoch);
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

pub async fn an_ended_run_frees_its_slot_and_dedup_id_and_a_resurrected_one_waits_again(
    h: Harness,
) -> TestResult {
    use keiro::queue::{DedupPolicy, StartOptions};
    declare(
        &h,
        QueueSpec::new("q")?
            .concurrency(1)
            .dedup(DedupPolicy::Refuse),
    )
    .await?;
    let with_id = StartOptions::on_queue("q").dedup_id("invoice-7");
    h.keiro
        .start_with("wf", "r-1", &serde_json::json!(1), &with_id)
        .await?;
    let first = admit(&*h.store, "q", "w", 10, None).await?;
    let crash = Crash {
        error: "no".to_owned(),
        retry_delay: std::time::Duration::from_secs(1),
        max_attempts: 1,
    };
    h.store
        .instance_record_crash(&first[0].instance.key, &first[0].fence, &crash)
        .await?;
    assert_eq!(
        crate::contract::support::status(&*h.store, &wf("r-1")).await?,
        keiro::Status::Failed
    );
    // The failed run holds neither its slot nor its dedup id.
    let second = h
        .keiro
        .start_with("wf", "r-2", &serde_json::json!(2), &with_id)
        .await?;
    assert!(second.created);
    let admitted = admit(&*h.store, "q", "w", 10, None).await?;
    assert_eq!(ids(&admitted), ["r-2"]);
    // Resurrected, the failed run waits for a slot like any other.
    h.store.instance_resurrect(&wf("r-1")).await?;
    let names = [keiro_journal::WorkflowName::new("wf")?];
    let ordinary = h
        .store
        .instances_claim_batch(&names, "w", super::TTL, 10, None)
        .await?;
    assert!(ordinary.is_empty(), "{:?}", ids(&ordinary));
    assert!(admit(&*h.store, "q", "w", 10, None).await?.is_empty());
    complete(&*h.store, &admitted[0]).await?;
    assert_eq!(ids(&admit(&*h.store, "q", "w", 10, None).await?), ["r-1"]);
    Ok(())
}
