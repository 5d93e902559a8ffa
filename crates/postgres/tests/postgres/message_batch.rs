//! Group commit of event and stream writes (message.sql's `keiro_messages_write`, the store's
//! message lane): concurrent runs' writes share statements and commits, each answered exactly
//! as its own function would answer it, and a write whose instance row another transaction
//! holds never holds up the others.

use std::time::Duration;

use crate::common::{claim, key, sql, start, TestResult};
use keiro_journal::store::{StreamOutcome, StreamWrite};
use keiro_journal::{
    Append, AppendOutcome, Event, Fence, InspectStore, InstanceKey, JournalStore, StepKind,
};
use keiro_postgres::PgStore;
use keiro_tests::pg::TestDb;
use serde_json::json;

const RUNS: usize = 48;

/// A fenced stream item of `k` under `step`.
fn item(k: &InstanceKey, fence: &Fence, step: &str, value: serde_json::Value) -> Append {
    Append {
        key: k.clone(),
        generation: Some(0),
        event: Event::StepRecorded {
            step: step.into(),
            kind: StepKind::Stream,
            result: value,
        },
        fence: Some(fence.clone()),
        renew: Some(Duration::from_secs(60)),
    }
}

fn bounds(items_max: u64) -> StreamWrite {
    StreamWrite {
        key: "log".into(),
        items_max,
        bytes_max: 1 << 20,
    }
}

async fn claimed_runs(
    store: &PgStore,
    n: usize,
) -> Result<Vec<(InstanceKey, Fence)>, Box<dyn std::error::Error + Send + Sync>> {
    let mut runs = Vec::with_capacity(n);
    for i in 0..n {
        let k = key("streamer", &format!("r{i:02}"));
        store.instance_start(&start(&k, json!(null))).await?;
        let fence = claim(store, &k, "w").await?;
        runs.push((k, fence));
    }
    Ok(runs)
}

/// Every run writes at once, one task each: a third of them to a stream they closed, a third
/// to a full one (no room at all), a third an item that lands. Each outcome is the one a write
/// alone gets, and the writes shared batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_batches_and_each_gets_its_own_outcome() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let runs = claimed_runs(&store, RUNS).await?;
    for (i, (k, fence)) in runs.iter().enumerate() {
        if i % 3 == 0 {
            let close = Append {
                event: Event::StepRecorded {
                    step: "stream:log#end".into(),
                    kind: StepKind::Stream,
                    result: json!(null),
                },
                ..item(k, fence, "unused", json!(null))
            };
            assert_eq!(
                store.stream_close(&close, "log").await?,
                AppendOutcome::Appended
            );
        }
    }
    let before = store.batch_stats();
    for round in 0..3 {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, (k, fence)) in runs.iter().enumerate() {
            let store = store.clone();
            let append = item(k, fence, &format!("stream:log#{round}"), json!([i, round]));
            let room = if i % 3 == 1 { 0 } else { 100 };
            tasks.spawn(async move { (i, store.stream_write(&append, &bounds(room)).await) });
        }
        while let Some(joined) = tasks.join_next().await {
            let (i, outcome) = joined?;
            let expected = match i % 3 {
                0 => StreamOutcome::Closed,
                1 => StreamOutcome::Full { items: 0, bytes: 0 },
                _ => StreamOutcome::Append(AppendOutcome::Appended),
            };
            assert_eq!(outcome?, expected, "run {i}, round {round}");
        }
    }
    let sent = store.batch_stats().since(&before).messages;
    assert_eq!(sent.requests, 3 * u64::try_from(RUNS)?);
    assert!(
        sent.batches < sent.requests,
        "{} writes in {} batches",
        sent.requests,
        sent.batches
    );
    for (i, (k, _)) in runs.iter().enumerate().filter(|(i, _)| i % 3 == 2) {
        let page = store
            .stream_read(k, "log", 0, 10)
            .await?
            .ok_or("an unknown instance")?;
        let items: Vec<(u64, serde_json::Value)> = page
            .items
            .into_iter()
            .map(|it| (it.offset, it.value))
            .collect();
        assert_eq!(
            items,
            [(0, json!([i, 0])), (1, json!([i, 1])), (2, json!([i, 2]))]
        );
    }
    Ok(())
}

/// The batch function itself, called with a batch that holds every outcome: each row answers
/// as the request's own function would, a replay writes nothing twice, a stale fence nothing
/// at all, and a row held elsewhere answers `busy` at once instead of waiting.
#[tokio::test]
async fn the_batch_function_answers_each_request_as_its_own_function() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let runs = claimed_runs(&store, 4).await?;
    let (a, b, c, held) = (&runs[0], &runs[1], &runs[2], &runs[3]);
    // c already has item 0 journaled: its request again is a replay.
    store
        .stream_write(&item(&c.0, &c.1, "stream:log#0", json!("c0")), &bounds(9))
        .await?;
    let other = sql(&store).await?;
    let mut hold = other;
    let tx = hold.transaction().await?;
    tx.execute(
        "SELECT 1 FROM workflows WHERE workflow_name = $1 AND workflow_id = $2 FOR UPDATE",
        &[&held.0.name.as_str(), &held.0.id.as_str()],
    )
    .await?;
    let client = sql(&store).await?;
    let rows = client
        .query(
            "SELECT n, outcome, stream_items FROM keiro_messages_write(\
               $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) ORDER BY n",
            &[
                &vec!["event", "stream", "stream", "close", "stream", "stream"],
                &vec![
                    a.0.name.as_str(),
                    a.0.name.as_str(),
                    b.0.name.as_str(),
                    b.0.name.as_str(),
                    c.0.name.as_str(),
                    held.0.name.as_str(),
                ],
                &vec![
                    a.0.id.as_str(),
                    a.0.id.as_str(),
                    b.0.id.as_str(),
                    b.0.id.as_str(),
                    c.0.id.as_str(),
                    held.0.id.as_str(),
                ],
                &vec![0i32; 6],
                &vec![
                    "event:done#1",
                    "stream:log#0",
                    "stream:log#0",
                    "stream:log#end",
                    "stream:log#0",
                    "stream:log#0",
                ],
                &vec!["event", "stream", "stream", "stream", "stream", "stream"],
                &vec![
                    json!("yes"),
                    json!("a0"),
                    json!("b0"),
                    json!(null),
                    json!("c0"),
                    json!("h0"),
                ],
                &vec!["w"; 6],
                &vec![
                    a.1.epoch,
                    a.1.epoch,
                    // b's item is written by a stale holder: nothing of it lands.
                    b.1.epoch - 1,
                    b.1.epoch,
                    c.1.epoch,
                    held.1.epoch,
                ],
                &vec![60_000i64; 6],
                &vec!["done", "log", "log", "log", "log", "log"],
                &vec![None, Some(4i64), Some(4), None, Some(4), Some(4)],
                &vec![None, Some(9i64), Some(9), None, Some(9), Some(9)],
                &vec![
                    None,
                    Some(1_000i64),
                    Some(1_000),
                    None,
                    Some(1_000),
                    Some(1_000),
                ],
            ],
        )
        .await?;
    let answers: Vec<(i32, String, Option<i64>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        answers,
        [
            (1, "appended".into(), None),
            (2, "appended".into(), Some(1)),
            (3, "lease_lost".into(), Some(0)),
            (4, "appended".into(), None),
            (5, "already_present".into(), None),
            (6, "busy".into(), None),
        ]
    );
    tx.rollback().await?;
    let event = store.event_get(&a.0, "done").await?.ok_or("unknown")?;
    assert_eq!(event.event.map(|e| e.value), Some(json!("yes")));
    let b_page = store
        .stream_read(&b.0, "log", 0, 10)
        .await?
        .ok_or("unknown")?;
    assert!(b_page.items.is_empty() && b_page.closed, "{b_page:?}");
    let c_page = store
        .stream_read(&c.0, "log", 0, 10)
        .await?
        .ok_or("unknown")?;
    assert_eq!(c_page.items.len(), 1, "a replay writes nothing twice");
    let held_page = store
        .stream_read(&held.0, "log", 0, 10)
        .await?
        .ok_or("unknown")?;
    assert!(held_page.items.is_empty(), "a busy request wrote nothing");
    Ok(())
}

/// A run whose row another transaction holds: its write waits alone, and the writes of other
/// runs sent beside it commit meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_held_elsewhere_never_holds_up_the_other_writes() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let runs = claimed_runs(&store, 8).await?;
    let held = runs[0].clone();
    let mut other = sql(&store).await?;
    let tx = other.transaction().await?;
    tx.execute(
        "SELECT 1 FROM workflows WHERE workflow_name = $1 AND workflow_id = $2 FOR UPDATE",
        &[&held.0.name.as_str(), &held.0.id.as_str()],
    )
    .await?;
    let mut tasks = tokio::task::JoinSet::new();
    for (k, fence) in &runs {
        let store = store.clone();
        let append = item(k, fence, "stream:log#0", json!(k.id));
        tasks.spawn(async move { store.stream_write(&append, &bounds(9)).await });
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    for (k, _) in &runs[1..] {
        loop {
            let page = store.stream_read(k, "log", 0, 1).await?.ok_or("unknown")?;
            if page.items.len() == 1 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{k}'s write waited for another run's row"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let page = store
        .stream_read(&held.0, "log", 0, 1)
        .await?
        .ok_or("unknown")?;
    assert!(page.items.is_empty());
    tx.commit().await?;
    while let Some(joined) = tasks.join_next().await {
        assert_eq!(joined??, StreamOutcome::Append(AppendOutcome::Appended));
    }
    Ok(())
}
