//! Admission under each limit: concurrency fleet-wide, per worker and per key; rate fleet-wide
//! and per key; pause; delay.

use std::time::Duration;

use keiro::queue::{QueueSpec, Rate, StartOptions};
use serde_json::json;
use time::Duration as Span;

use super::{admit, complete, declare, ids, start_on};
use crate::contract::support::{TestResult, T0};
use crate::Harness;

pub async fn concurrency_holds_across_owners_and_a_slot_comes_back_at_the_end(
    h: Harness,
) -> TestResult {
    declare(&h, QueueSpec::new("q")?.concurrency(2)).await?;
    for n in 1..=5 {
        start_on(&h, "q", &format!("r-{n}"), "").await?;
    }
    let first = admit(&*h.store, "q", "w1", 10, None).await?;
    assert_eq!(ids(&first), ["r-1", "r-2"], "oldest first, two slots");
    assert!(admit(&*h.store, "q", "w2", 10, None).await?.is_empty());
    assert!(admit(&*h.store, "q", "w1", 10, None).await?.is_empty());
    complete(&*h.store, &first[0]).await?;
    let next = admit(&*h.store, "q", "w2", 10, None).await?;
    assert_eq!(ids(&next), ["r-3"]);
    let info = h.keiro.queue("q").await?.expect("declared");
    assert_eq!((info.running, info.waiting), (2, 2));
    Ok(())
}

pub async fn worker_concurrency_counts_each_owner_alone(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.worker_concurrency(1)).await?;
    for n in 1..=3 {
        start_on(&h, "q", &format!("r-{n}"), "").await?;
    }
    assert_eq!(ids(&admit(&*h.store, "q", "w1", 10, None).await?), ["r-1"]);
    assert!(admit(&*h.store, "q", "w1", 10, None).await?.is_empty());
    assert_eq!(ids(&admit(&*h.store, "q", "w2", 10, None).await?), ["r-2"]);
    Ok(())
}

pub async fn key_concurrency_admits_other_keys_past_a_busy_one(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.key_concurrency(1)).await?;
    for n in 1..=3 {
        start_on(&h, "q", &format!("a-{n}"), "acme").await?;
    }
    start_on(&h, "q", "b-1", "globex").await?;
    start_on(&h, "q", "n-1", "").await?;
    start_on(&h, "q", "n-2", "").await?;
    let admitted = admit(&*h.store, "q", "w", 10, None).await?;
    let mut got = ids(&admitted);
    got.sort();
    // One per key, and the runs with no key count as one key of their own.
    assert_eq!(got, ["a-1", "b-1", "n-1"]);
    assert!(admit(&*h.store, "q", "w", 10, None).await?.is_empty());
    // Every key with runs waiting or running, most waiting first: a key whose only run holds
    // its slot shows too.
    let info = h.keiro.queue("q").await?.expect("declared");
    assert_eq!(
        info.top_keys,
        [
            ("acme".to_owned(), 2, 1),
            (String::new(), 1, 1),
            ("globex".to_owned(), 0, 1)
        ]
    );
    let acme = admitted
        .iter()
        .find(|c| c.instance.key.id.as_str() == "a-1")
        .expect("a-1");
    complete(&*h.store, acme).await?;
    assert_eq!(ids(&admit(&*h.store, "q", "w", 10, None).await?), ["a-2"]);
    Ok(())
}

pub async fn rate_limits_first_admissions_over_a_sliding_window(h: Harness) -> TestResult {
    let ten_s = Duration::from_secs(10);
    declare(&h, QueueSpec::new("q")?.rate(Rate::new(2, ten_s)?)).await?;
    for n in 1..=5 {
        start_on(&h, "q", &format!("r-{n}"), "").await?;
    }
    let first = admit(&*h.store, "q", "w", 10, Some(T0)).await?;
    assert_eq!(ids(&first), ["r-1", "r-2"]);
    for claim in &first {
        complete(&*h.store, claim).await?;
    }
    // Free slots do not help: the window still holds two admissions.
    assert!(admit(&*h.store, "q", "w", 10, Some(T0 + Span::seconds(5)))
        .await?
        .is_empty());
    assert!(admit(
        &*h.store,
        "q",
        "w",
        10,
        Some(T0 + Span::milliseconds(9_999))
    )
    .await?
    .is_empty());
    let later = admit(&*h.store, "q", "w", 10, Some(T0 + Span::seconds(10))).await?;
    assert_eq!(ids(&later), ["r-3", "r-4"]);
    Ok(())
}

pub async fn key_rate_limits_each_key_alone(h: Harness) -> TestResult {
    let minute = Duration::from_secs(60);
    declare(&h, QueueSpec::new("q")?.key_rate(Rate::new(1, minute)?)).await?;
    for n in 1..=3 {
        start_on(&h, "q", &format!("a-{n}"), "acme").await?;
    }
    start_on(&h, "q", "b-1", "globex").await?;
    let mut got = ids(&admit(&*h.store, "q", "w", 10, Some(T0)).await?);
    got.sort();
    assert_eq!(got, ["a-1", "b-1"]);
    assert!(admit(&*h.store, "q", "w", 10, Some(T0 + Span::seconds(59)))
        .await?
        .is_empty());
    assert_eq!(
        ids(&admit(&*h.store, "q", "w", 10, Some(T0 + Span::seconds(60))).await?),
        ["a-2"]
    );
    Ok(())
}

pub async fn a_paused_queue_admits_nothing_until_resumed(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    start_on(&h, "q", "r-1", "").await?;
    h.keiro.pause_queue("q").await?;
    // Declaring again (a process restart) keeps the pause.
    declare(&h, QueueSpec::new("q")?.concurrency(5)).await?;
    let info = h.keiro.queue("q").await?.expect("declared");
    assert!(info.paused);
    assert_eq!(info.spec.concurrency, Some(5));
    assert!(admit(&*h.store, "q", "w", 10, None).await?.is_empty());
    h.keiro.resume_queue("q").await?;
    assert_eq!(ids(&admit(&*h.store, "q", "w", 10, None).await?), ["r-1"]);
    Ok(())
}

pub async fn a_delayed_start_waits_for_its_time_and_shows_as_delayed(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    let options = StartOptions::on_queue("q").delay(Duration::from_secs(3600));
    let started = h
        .keiro
        .start_with("wf", "later", &json!(null), &options)
        .await?;
    let not_before = started
        .instance
        .next_attempt_at
        .expect("a delayed start has a gate");
    let info = h.keiro.queue("q").await?.expect("declared");
    assert_eq!(info.oldest_waiting, None, "a delayed run is not ready");
    start_on(&h, "q", "now", "").await?;
    let info = h.keiro.queue("q").await?.expect("declared");
    assert_eq!((info.waiting, info.delayed), (2, 1));
    let now_row = h
        .store
        .instance_get(&super::wf("now"))
        .await?
        .expect("started");
    assert_eq!(info.oldest_waiting, Some(now_row.created_at));
    let now = admit(&*h.store, "q", "w", 10, None).await?;
    assert_eq!(ids(&now), ["now"]);
    complete(&*h.store, &now[0]).await?;
    assert!(admit(&*h.store, "q", "w", 10, None).await?.is_empty());
    let due = admit(&*h.store, "q", "w", 10, Some(not_before + Span::seconds(1))).await?;
    assert_eq!(ids(&due), ["later"]);
    Ok(())
}

pub async fn a_workers_claim_takes_ordinary_runs_first_and_admits_with_the_room_left(
    h: Harness,
) -> TestResult {
    declare(&h, QueueSpec::new("q")?.concurrency(2)).await?;
    for n in 1..=3 {
        start_on(&h, "q", &format!("r-{n}"), "").await?;
    }
    for n in 1..=2 {
        h.keiro
            .start_with(
                "wf",
                &format!("p-{n}"),
                &json!(null),
                &StartOptions::default(),
            )
            .await?;
    }
    let names = [keiro_journal::WorkflowName::new("wf")?];
    let queues = ["q".to_owned()];
    let batch = h
        .store
        .claim_and_admit(&names, &queues, "w", super::TTL, 3, None)
        .await?;
    assert_eq!(ids(&batch.claimed), ["p-1", "p-2"]);
    assert_eq!(ids(&batch.admitted), ["r-1"], "one place left of three");
    let batch = h
        .store
        .claim_and_admit(&names, &queues, "w", super::TTL, 10, None)
        .await?;
    assert!(batch.claimed.is_empty());
    assert_eq!(ids(&batch.admitted), ["r-2"], "the queue's second slot");
    // No queue named: the ordinary claim alone.
    assert_eq!(
        h.store
            .claim_and_admit(&names, &[], "w", super::TTL, 10, None)
            .await?,
        keiro_lease::ClaimBatch::default()
    );
    Ok(())
}
