//! Streams: items appended by the run's fenced steps at dense offsets, read from any offset in
//! pages, ended by a close or by the run's end, bounded, deleted with their instance.

use std::time::Duration;

use futures_util::StreamExt;

use crate::contract::retention::collect::later;
#[allow(clippy::wildcard_imports)] // the shared tools, some of them per scenario
use crate::contract::support::*;
use crate::{FastWorker, Harness, Ledger};
use keiro::{Ctx, Error, WorkflowError};
use keiro_journal::store::{StreamOutcome, StreamWrite};
use keiro_journal::{Append, AppendOutcome, Event, Fence, InstanceKey, Status, StepKind};
use serde_json::{json, Value};

use super::event::event_step;

/// The fenced append of the `n`-th item of stream `stream` (`None`: its close).
fn stream_step(
    k: &InstanceKey,
    fence: Option<&Fence>,
    stream: &str,
    n: Option<u32>,
    value: Value,
) -> Append {
    let step = match n {
        Some(n) => format!("stream:{stream}#{n}"),
        None => format!("stream:{stream}#end"),
    };
    Append {
        key: k.clone(),
        generation: Some(0),
        event: Event::StepRecorded {
            step,
            kind: StepKind::Stream,
            result: value,
        },
        fence: fence.cloned(),
        renew: None,
    }
}

/// Bounds no scenario reaches but the one that tests them.
fn roomy(stream: &str) -> StreamWrite {
    StreamWrite {
        key: stream.to_owned(),
        items_max: 1_000,
        bytes_max: 1 << 20,
    }
}

/// Writes items `1..=n` of `stream` (values 0..n) under `fence`.
async fn write_items(
    h: &Harness,
    k: &InstanceKey,
    fence: Option<&Fence>,
    stream: &str,
    n: u32,
) -> Result<()> {
    for i in 1..=n {
        let write = stream_step(k, fence, stream, Some(i), json!(i - 1));
        let outcome = h.store.stream_write(&write, &roomy(stream)).await?;
        assert_eq!(outcome, StreamOutcome::Append(AppendOutcome::Appended));
    }
    Ok(())
}

/// Every item of the stream from `from`, by the facade, to its end.
async fn read_all(
    h: &Harness,
    k: &InstanceKey,
    stream: &str,
    from: u64,
) -> Result<Vec<(u64, Value)>> {
    let items = h.keiro.read_stream::<Value>(k, stream, from)?;
    let read = tokio::time::timeout(Duration::from_secs(30), items.collect::<Vec<_>>()).await?;
    Ok(read.into_iter().collect::<Result<Vec<_>, Error>>()?)
}

pub async fn appends_are_numbered_without_gaps_and_read_from_any_offset(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "s-1").await?;
    let fence = claim(store, &k, "w-1").await?;
    write_items(&h, &k, Some(&fence), "log", 5).await?;
    // A replayed append writes nothing, whatever value it carries.
    let replayed = stream_step(&k, Some(&fence), "log", Some(2), json!("other"));
    assert_eq!(
        store.stream_write(&replayed, &roomy("log")).await?,
        StreamOutcome::Append(AppendOutcome::AlreadyPresent(json!(1)))
    );
    let page = h
        .inspect
        .stream_read(&k, "log", 0, 10)
        .await?
        .expect("the instance");
    assert_eq!(page.status, Status::Running);
    assert!(!page.closed);
    let offsets: Vec<(u64, Value)> = page
        .items
        .into_iter()
        .map(|i| (i.offset, i.value))
        .collect();
    assert_eq!(offsets, (0..5).map(|i| (i, json!(i))).collect::<Vec<_>>());
    let page = h
        .inspect
        .stream_read(&k, "log", 3, 10)
        .await?
        .expect("the instance");
    assert_eq!(
        page.items.iter().map(|i| i.offset).collect::<Vec<_>>(),
        [3, 4]
    );
    let page = h
        .inspect
        .stream_read(&k, "log", 1, 2)
        .await?
        .expect("the instance");
    assert_eq!(
        page.items.iter().map(|i| i.offset).collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(!page.ends(2), "an open stream of a live run does not end");
    // An unknown stream of a known instance reads as empty and open.
    let page = h
        .inspect
        .stream_read(&k, "other", 0, 10)
        .await?
        .expect("the instance");
    assert!(page.items.is_empty() && !page.closed);
    let heads = h.keiro.messages(&k).await?.streams;
    assert_eq!(heads.len(), 1);
    assert_eq!(
        (heads[0].key.as_str(), heads[0].items, heads[0].closed),
        ("log", 5, false)
    );
    Ok(())
}

pub async fn a_close_ends_readers_and_refuses_later_appends(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "s-2").await?;
    let fence = claim(store, &k, "w-1").await?;
    write_items(&h, &k, Some(&fence), "log", 3).await?;
    let close = stream_step(&k, Some(&fence), "log", None, Value::Null);
    assert_eq!(
        store.stream_close(&close, "log").await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        store.stream_close(&close, "log").await?,
        AppendOutcome::AlreadyPresent(Value::Null)
    );
    let late = stream_step(&k, Some(&fence), "log", Some(4), json!(3));
    assert_eq!(
        store.stream_write(&late, &roomy("log")).await?,
        StreamOutcome::Closed
    );
    assert!(
        recorded(store, &k, "stream:log#4").await?.is_empty(),
        "nothing journaled"
    );
    let page = h
        .inspect
        .stream_read(&k, "log", 0, 10)
        .await?
        .expect("the instance");
    assert!(page.closed && page.ends(10));
    assert_eq!(page.items.len(), 3);
    // The reader gets every item from its offset, then the end, though the run lives on.
    assert_eq!(
        read_all(&h, &k, "log", 1).await?,
        [(1, json!(1)), (2, json!(2))]
    );
    assert!(read_all(&h, &k, "log", 3).await?.is_empty());
    // Closing a stream never written closes it empty.
    let close = stream_step(&k, Some(&fence), "quiet", None, Value::Null);
    assert_eq!(
        store.stream_close(&close, "quiet").await?,
        AppendOutcome::Appended
    );
    assert!(read_all(&h, &k, "quiet", 0).await?.is_empty());
    Ok(())
}

pub async fn a_run_that_ends_ends_its_streams(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "s-3").await?;
    write_items(&h, &k, None, "log", 2).await?;
    // A reader following the live stream gets both items, then waits; the completion ends it.
    let items = h.keiro.read_stream::<Value>(k.clone(), "log", 0)?;
    let reader = tokio::spawn(items.collect::<Vec<_>>());
    tokio::time::sleep(QUIET).await;
    append(
        store,
        &k,
        None,
        Event::WorkflowCompleted {
            output: json!(null),
        },
        None,
    )
    .await?;
    let read = tokio::time::timeout(Duration::from_secs(30), reader).await??;
    let read = read.into_iter().collect::<Result<Vec<_>, Error>>()?;
    assert_eq!(read, [(0, json!(0)), (1, json!(1))]);
    // Nothing lands after the end.
    let late = stream_step(&k, None, "log", Some(3), json!(2));
    assert!(matches!(
        store.stream_write(&late, &roomy("log")).await?,
        StreamOutcome::Append(AppendOutcome::RefusedTerminal(_))
    ));
    Ok(())
}

pub async fn budgets_refuse_with_typed_outcomes_and_write_nothing(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "s-4").await?;
    let tight = StreamWrite {
        key: "log".into(),
        items_max: 2,
        bytes_max: 1 << 20,
    };
    for i in 1..=2 {
        let write = stream_step(&k, None, "log", Some(i), json!(i));
        assert_eq!(
            store.stream_write(&write, &tight).await?,
            StreamOutcome::Append(AppendOutcome::Appended)
        );
    }
    let third = stream_step(&k, None, "log", Some(3), json!(3));
    assert_eq!(
        store.stream_write(&third, &tight).await?,
        StreamOutcome::Full { items: 2, bytes: 2 }
    );
    assert!(recorded(store, &k, "stream:log#3").await?.is_empty());
    // A write already journaled is answered as such, full or not.
    let again = stream_step(&k, None, "log", Some(2), json!(2));
    assert_eq!(
        store.stream_write(&again, &tight).await?,
        StreamOutcome::Append(AppendOutcome::AlreadyPresent(json!(2)))
    );
    // The bytes bound: "12345" is 7 encoded bytes.
    let small = StreamWrite {
        key: "bytes".into(),
        items_max: 100,
        bytes_max: 10,
    };
    let write = stream_step(&k, None, "bytes", Some(1), json!("12345"));
    assert_eq!(
        store.stream_write(&write, &small).await?,
        StreamOutcome::Append(AppendOutcome::Appended)
    );
    let write = stream_step(&k, None, "bytes", Some(2), json!("12345"));
    assert_eq!(
        store.stream_write(&write, &small).await?,
        StreamOutcome::Full { items: 1, bytes: 7 }
    );
    let page = h
        .inspect
        .stream_read(&k, "bytes", 0, 10)
        .await?
        .expect("the instance");
    assert_eq!(page.items.len(), 1);

    // In a body, a write past the run's budget is WorkflowError::StreamFull, which it may
    // handle: nothing was written and the run goes on.
    let worker = h
        .keiro
        .worker()
        .fast()
        .tuning(keiro::worker::Tuning {
            stream_budget: keiro::workflow::StreamBudget {
                generation_items: 3,
                ..Default::default()
            },
            ..h.fast_tuning()
        })
        .register("chatty", |ctx: Ctx, (): ()| async move {
            let mut refused = None;
            for i in 0..5u32 {
                match ctx.write_stream("log", &i).await {
                    Ok(()) => {}
                    Err(WorkflowError::StreamFull { scope, items, .. }) => {
                        refused = Some((i, scope.to_owned(), items));
                        break;
                    }
                    Err(other) => return Err(other),
                }
            }
            Ok::<_, WorkflowError>(refused)
        })
        .build()?;
    h.keiro.start("chatty", "c-1", &()).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("chatty", "c-1")).await?.expect("the row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(json!([3, "generation", 4]))),
        "{:?}",
        row.last_error
    );
    let written = read_all(&h, &key("chatty", "c-1"), "log", 0).await?;
    assert_eq!(written.len(), 3);
    Ok(())
}

pub async fn a_stale_holder_appends_nothing(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "s-5").await?;
    let fence = claim(store, &k, "w-1").await?;
    let stale = Fence {
        owner: "w-0".into(),
        epoch: fence.epoch,
    };
    let write = stream_step(&k, Some(&stale), "log", Some(1), json!(0));
    let refused = store.stream_write(&write, &roomy("log")).await;
    assert!(
        matches!(&refused, Err(e) if e.is_lease_lost()),
        "{refused:?}"
    );
    let close = stream_step(&k, Some(&stale), "log", None, Value::Null);
    let refused = store.stream_close(&close, "log").await;
    assert!(
        matches!(&refused, Err(e) if e.is_lease_lost()),
        "{refused:?}"
    );
    let page = h
        .inspect
        .stream_read(&k, "log", 0, 10)
        .await?
        .expect("the instance");
    assert!(page.items.is_empty() && !page.closed);
    write_items(&h, &k, Some(&fence), "log", 1).await?;
    Ok(())
}

pub async fn retention_deletes_events_and_streams_with_their_instance(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "s-6").await?;
    write_items(&h, &k, None, "log", 3).await?;
    store
        .event_set(&event_step(&k, None, "status", 1, json!("done")), "status")
        .await?;
    append(
        store,
        &k,
        None,
        Event::WorkflowCompleted {
            output: json!(null),
        },
        None,
    )
    .await?;
    assert_eq!(h.keiro.gc_batch(&later(2)).await?.instances, 1);
    assert_eq!(h.inspect.stream_read(&k, "log", 0, 10).await?, None);
    assert_eq!(h.inspect.event_get(&k, "status").await?, None);
    let messages = h.keiro.messages(&k).await?;
    assert!(messages.events.is_empty() && messages.streams.is_empty());
    // A new instance under the same key starts with no stream.
    let k = started(store, "s-6").await?;
    let page = h
        .inspect
        .stream_read(&k, "log", 0, 10)
        .await?
        .expect("the instance");
    assert!(page.items.is_empty());
    Ok(())
}

pub async fn bad_stream_requests_are_typed_errors(h: Harness) -> TestResult {
    let store = &*h.store;
    let missing = key("wf", "nobody");
    assert_eq!(h.inspect.stream_read(&missing, "log", 0, 10).await?, None);
    let read = read_all(&h, &missing, "log", 0).await;
    assert!(read.is_err(), "an unknown instance is an error: {read:?}");
    let mut items = h.keiro.read_stream::<Value>(&missing, "log", 0)?;
    let first = items.next().await;
    assert!(
        matches!(&first, Some(Err(Error::Store(e))) if e.is_not_found()),
        "{first:?}"
    );
    assert!(items.next().await.is_none(), "the error ends the stream");
    let write = stream_step(&missing, None, "log", Some(1), json!(0));
    let refused = store.stream_write(&write, &roomy("log")).await;
    assert!(
        matches!(&refused, Err(e) if e.is_not_found()),
        "{refused:?}"
    );

    let k = started(store, "s-7").await?;
    let long = "k".repeat(201);
    assert!(matches!(
        h.keiro.read_stream::<Value>(&k, &long, 0).err(),
        Some(Error::InvalidId(_))
    ));
    let write = stream_step(&k, None, "log", Some(1), json!({"text": "a\u{0}b"}));
    let refused = store.stream_write(&write, &roomy("log")).await;
    assert!(
        matches!(&refused, Err(e) if e.is_value_refused()),
        "{refused:?}"
    );
    let page = h
        .inspect
        .stream_read(&k, "log", 0, 10)
        .await?
        .expect("the instance");
    assert!(page.items.is_empty());

    // In a body: a key over the limit is refused before anything is written.
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("badkey", |ctx: Ctx, (): ()| async move {
            let refused = ctx.write_stream(&"k".repeat(201), &1).await;
            Ok::<_, WorkflowError>(matches!(refused, Err(WorkflowError::InvalidStep(_))))
        })
        .build()?;
    h.keiro.start("badkey", "b-1", &()).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("badkey", "b-1")).await?.expect("the row");
    assert_eq!(row.output, Some(json!(true)), "{:?}", row.last_error);
    Ok(())
}

pub async fn a_body_appends_each_item_once_whatever_replays_it(h: Harness) -> TestResult {
    // The body streams 5 items, crashes once after the third, and is retried: the retry
    // replays the first three and writes each item once.
    let ledger = Ledger::default();
    let l = ledger.clone();
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("progress", move |ctx: Ctx, (): ()| {
            let l = l.clone();
            async move {
                for i in 0..5u32 {
                    ctx.write_stream("pct", &(i * 25)).await?;
                    if i == 2 {
                        ctx.step("flaky", || async {
                            l.bump("flaky");
                            if l.count("flaky") == 1 {
                                Err("crash once".to_owned())
                            } else {
                                Ok(())
                            }
                        })
                        .await?;
                    }
                }
                ctx.close_stream("pct").await?;
                Ok::<_, WorkflowError>(())
            }
        })
        .build()?;
    h.keiro.start("progress", "p-1", &()).await?;
    for _ in 0..50 {
        worker.drain().await?;
        if h.keiro
            .instance(("progress", "p-1"))
            .await?
            .map(|r| r.status)
            == Some(Status::Completed)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        ledger.count("flaky"),
        2,
        "the run crashed once and was retried"
    );
    let read = read_all(&h, &key("progress", "p-1"), "pct", 0).await?;
    assert_eq!(read, (0..5).map(|i| (i, json!(i * 25))).collect::<Vec<_>>());
    Ok(())
}
