//! Admission order: priority, and fairness across keys.

use keiro::queue::{Fairness, QueueSpec, StartOptions};
use serde_json::json;

use super::{admit, complete, declare, start_on};
use crate::contract::support::TestResult;
use crate::Harness;

pub async fn priority_orders_admission_when_the_queue_takes_it(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.with_priority().concurrency(1)).await?;
    for (id, priority) in [("low", 0), ("high", 5), ("mid", 2)] {
        let options = StartOptions::on_queue("q").priority(priority);
        h.keiro.start_with("wf", id, &json!(null), &options).await?;
    }
    let mut order = Vec::new();
    for _ in 0..3 {
        let claims = admit(&*h.store, "q", "w", 10, None).await?;
        assert_eq!(claims.len(), 1);
        order.push(claims[0].instance.key.id.as_str().to_owned());
        complete(&*h.store, &claims[0]).await?;
    }
    assert_eq!(order, ["high", "mid", "low"]);
    Ok(())
}

/// Admits in batches of `batch` until `total` were admitted; the keys in admission order.
async fn admitted_keys(
    h: &Harness,
    batch: i64,
    total: usize,
) -> super::super::support::Result<Vec<String>> {
    let mut keys = Vec::new();
    while keys.len() < total {
        let claims = admit(&*h.store, "q", "w", batch, None).await?;
        assert!(!claims.is_empty(), "ran dry after {keys:?}");
        for claim in &claims {
            keys.push(claim.instance.queue_key.clone().unwrap_or_default());
            complete(&*h.store, claim).await?;
        }
    }
    Ok(keys)
}

pub async fn round_robin_serves_a_small_key_behind_a_large_backlog(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.fairness(Fairness::Weighted)).await?;
    for n in 0..60 {
        start_on(&h, "q", &format!("a-{n:03}"), "big").await?;
    }
    for n in 0..5 {
        start_on(&h, "q", &format!("b-{n}"), "small").await?;
    }
    let keys = admitted_keys(&h, 4, 12).await?;
    let small = keys.iter().filter(|k| *k == "small").count();
    // Taking turns, the five small runs are all in within the first ten or so admissions.
    assert_eq!(small, 5, "{keys:?}");
    // A key that starts waiting later joins level with the others, not ahead of them.
    for n in 0..3 {
        start_on(&h, "q", &format!("c-{n}"), "late").await?;
    }
    let next = admitted_keys(&h, 2, 4).await?;
    assert_eq!(next.iter().filter(|k| *k == "late").count(), 2, "{next:?}");
    Ok(())
}

pub async fn weighted_fairness_shares_admissions_by_weight(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.fairness(Fairness::Weighted)).await?;
    h.keiro.queue_key_weight("q", "gold", 3).await?;
    for n in 0..40 {
        start_on(&h, "q", &format!("s-{n:03}"), "silver").await?;
    }
    for n in 0..40 {
        start_on(&h, "q", &format!("g-{n:03}"), "gold").await?;
    }
    let keys = admitted_keys(&h, 4, 40).await?;
    let gold = keys.iter().filter(|k| *k == "gold").count();
    assert!((29..=31).contains(&gold), "gold got {gold} of 40: {keys:?}");
    // The share holds at every point, not just at the end.
    for (n, window) in keys.chunks(8).enumerate() {
        let gold = window.iter().filter(|k| *k == "gold").count();
        assert!((5..=7).contains(&gold), "window {n}: {window:?}");
    }
    Ok(())
}

pub async fn a_small_key_is_served_by_its_share_behind_ten_thousand_runs_of_another(
    h: Harness,
) -> TestResult {
    declare(&h, QueueSpec::new("q")?.fairness(Fairness::Weighted)).await?;
    let big: Vec<String> = (0..10_000).map(|n| format!("a-{n:05}")).collect();
    for chunk in big.chunks(500) {
        let outcomes = h
            .keiro
            .start_many_with(
                "wf",
                chunk.iter().map(|id| {
                    (
                        id.as_str(),
                        &json!(null),
                        StartOptions::on_queue("q").key("big"),
                    )
                }),
            )
            .await;
        for outcome in outcomes {
            outcome?;
        }
    }
    for n in 0..10 {
        start_on(&h, "q", &format!("b-{n}"), "small").await?;
    }
    // Equal weights: each batch of 8 is shared half and half while both keys wait, however deep
    // the other key's backlog (which was there first), so the small key's ten are in within
    // three batches (FIFO would admit the 10,000 first). A batch comes back in claim order, so
    // its shares are counted per batch.
    let keys = admitted_keys(&h, 8, 24).await?;
    let small = |batch: &[String]| batch.iter().filter(|k| *k == "small").count();
    let per_batch: Vec<usize> = keys.chunks(8).map(small).collect();
    assert_eq!(per_batch, [4, 4, 2], "{keys:?}");
    Ok(())
}
