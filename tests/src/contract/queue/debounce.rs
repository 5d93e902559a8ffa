//! Debounce: one run per burst of calls with a key, started after the burst goes quiet (or
//! its maximum wait is up), with the last call's input.

use std::time::Duration;

use keiro::queue::{Debounce, DebounceRequest};
use keiro_journal::{Started, WorkflowId, WorkflowName};
use serde_json::json;
use time::Duration as Span;

use crate::contract::support::{Result, TestResult, T0};
use crate::Harness;

async fn call(
    h: &Harness,
    n: u32,
    input: serde_json::Value,
    at: time::OffsetDateTime,
    delay_s: u64,
    max_wait_s: u64,
) -> Result<Started> {
    let request = DebounceRequest {
        name: WorkflowName::new("wf")?,
        key: "doc-7".to_owned(),
        id: WorkflowId::new(format!("doc-7~{n}"))?,
        input,
        delay: Duration::from_secs(delay_s),
        max_wait: Duration::from_secs(max_wait_s),
        now: Some(at),
    };
    Ok(h.queues.queue_debounce(&request).await?)
}

async fn claimable(h: &Harness, at: time::OffsetDateTime) -> Result<Vec<String>> {
    let names = [WorkflowName::new("wf")?];
    let claims = h
        .store
        .instances_claim_batch(&names, "w", super::TTL, 10, Some(at))
        .await?;
    Ok(super::ids(&claims))
}

pub async fn calls_in_a_burst_share_one_run_that_starts_quiet_with_the_last_input(
    h: Harness,
) -> TestResult {
    let first = call(&h, 1, json!("a"), T0, 5, 60).await?;
    assert!(first.created);
    assert_eq!(first.instance.key.id.as_str(), "doc-7~1");
    let second = call(&h, 2, json!("b"), T0 + Span::seconds(2), 5, 60).await?;
    let third = call(&h, 3, json!("c"), T0 + Span::seconds(4), 5, 60).await?;
    for later in [&second, &third] {
        assert!(!later.created);
        assert_eq!(later.instance.key, first.instance.key, "one run per burst");
    }
    assert_eq!(third.instance.input, json!("c"));
    assert_eq!(third.instance.next_attempt_at, Some(T0 + Span::seconds(9)));
    // Not before the burst has been quiet for the delay.
    assert!(claimable(&h, T0 + Span::seconds(8)).await?.is_empty());
    let started = claimable(&h, T0 + Span::seconds(9)).await?;
    assert_eq!(started, ["doc-7~1"]);
    let row = h
        .store
        .instance_get(&first.instance.key)
        .await?
        .expect("started");
    assert_eq!(row.input, json!("c"), "the last input wins");
    // Once the run started, a call begins a new burst.
    let next = call(&h, 4, json!("d"), T0 + Span::seconds(10), 5, 60).await?;
    assert!(next.created);
    assert_eq!(next.instance.key.id.as_str(), "doc-7~4");
    Ok(())
}

pub async fn the_maximum_wait_starts_a_burst_however_often_it_is_pushed(h: Harness) -> TestResult {
    let mut last = None;
    for n in 0..6_u32 {
        let at = T0 + Span::seconds(i64::from(n) * 3);
        last = Some(call(&h, n, json!(n), at, 5, 12).await?);
        assert_eq!(
            last.as_ref().expect("called").instance.key.id.as_str(),
            "doc-7~0"
        );
    }
    // Called every 3 s with a 5 s delay it would never go quiet; 12 s after the first call it
    // starts anyway, with the input of the last call before that.
    let last = last.expect("called");
    assert_eq!(last.instance.next_attempt_at, Some(T0 + Span::seconds(12)));
    assert!(claimable(&h, T0 + Span::seconds(11)).await?.is_empty());
    assert_eq!(claimable(&h, T0 + Span::seconds(12)).await?, ["doc-7~0"]);
    Ok(())
}

pub async fn concurrent_calls_of_one_key_make_one_run(h: Harness) -> TestResult {
    let debounce = Debounce::new(Duration::from_secs(60));
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..16 {
        let keiro = h.keiro.clone();
        calls.spawn(async move { keiro.debounce("wf", "doc-7", &json!(n), &debounce).await });
    }
    let mut runs = std::collections::BTreeSet::new();
    let mut created = 0;
    while let Some(started) = calls.join_next().await {
        let started = started??;
        created += usize::from(started.created);
        runs.insert(started.instance.key.id.as_str().to_owned());
    }
    assert_eq!((created, runs.len()), (1, 1), "{runs:?}");
    // Another key is another burst.
    let other = h
        .keiro
        .debounce("wf", "doc-8", &json!(0), &debounce)
        .await?;
    assert!(other.created);
    let bad = h.keiro.debounce("wf", "doc/8", &json!(0), &debounce).await;
    assert!(matches!(bad, Err(keiro::Error::InvalidId(_))), "{bad:?}");
    Ok(())
}
