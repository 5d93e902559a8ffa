//! Events: the latest value under a key, set by the run's fenced step, read at once, waited
//! for with the store's push.

use std::time::Duration;

#[allow(clippy::wildcard_imports)] // the shared tools, some of them per scenario
use crate::contract::support::*;
use crate::{FastWorker, Harness, Ledger};
use keiro::{Ctx, Error, Keiro, WorkflowError};
use keiro_journal::{Append, AppendOutcome, Event, Fence, InstanceKey, Status, StepKind};
use keiro_resume::WakeReason;
use serde_json::{json, Value};

/// The fenced append of the `n`-th write of event `event`, with `value`.
pub(super) fn event_step(
    k: &InstanceKey,
    fence: Option<&Fence>,
    event: &str,
    n: u32,
    value: Value,
) -> Append {
    Append {
        key: k.clone(),
        generation: Some(0),
        event: Event::StepRecorded {
            step: format!("event:{event}#{n}"),
            kind: StepKind::Event,
            result: value,
        },
        fence: fence.cloned(),
        renew: None,
    }
}

pub async fn a_set_event_is_read_at_once_and_the_latest_value_wins(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "e-1").await?;
    let fence = claim(store, &k, "w-1").await?;
    assert_eq!(
        h.inspect.event_get(&k, "status").await?.map(|r| r.event),
        Some(None)
    );
    let first = event_step(&k, Some(&fence), "status", 1, json!("paid"));
    assert_eq!(
        store.event_set(&first, "status").await?,
        AppendOutcome::Appended
    );
    let read = h
        .inspect
        .event_get(&k, "status")
        .await?
        .expect("the instance");
    assert_eq!(read.status, Status::Running);
    let event = read.event.expect("set");
    assert_eq!((event.value, event.version), (json!("paid"), 1));

    let second = event_step(&k, Some(&fence), "status", 2, json!({"shipped": true}));
    assert_eq!(
        store.event_set(&second, "status").await?,
        AppendOutcome::Appended
    );
    // A replay of the first write (another value, as a changed body would send) writes nothing.
    let replayed = event_step(&k, Some(&fence), "status", 1, json!("other"));
    assert_eq!(
        store.event_set(&replayed, "status").await?,
        AppendOutcome::AlreadyPresent(json!("paid"))
    );
    let event = h
        .inspect
        .event_get(&k, "status")
        .await?
        .and_then(|r| r.event)
        .expect("set");
    assert_eq!((event.value, event.version), (json!({"shipped": true}), 2));
    assert_eq!(
        recorded(store, &k, "event:status#2").await?,
        vec![json!({"shipped": true})],
        "the journal entry is the record"
    );

    let latest: Option<Value> = h.keiro.get_event(&k, "status", Duration::ZERO).await?;
    assert_eq!(latest, Some(json!({"shipped": true})));
    let messages = h.keiro.messages(&k).await?;
    assert_eq!(messages.events.len(), 1);
    assert_eq!(messages.events[0].key, "status");
    assert_eq!(messages.events[0].version, 2);
    assert!(messages.streams.is_empty());
    Ok(())
}

pub async fn a_stale_holder_sets_nothing(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "e-2").await?;
    let fence = claim(store, &k, "w-1").await?;
    let stale = Fence {
        owner: "w-0".into(),
        epoch: fence.epoch,
    };
    let write = event_step(&k, Some(&stale), "status", 1, json!("paid"));
    let refused = store.event_set(&write, "status").await;
    assert!(
        matches!(&refused, Err(e) if e.is_lease_lost()),
        "{refused:?}"
    );
    assert_eq!(
        h.inspect
            .event_get(&k, "status")
            .await?
            .and_then(|r| r.event),
        None
    );
    assert!(recorded(store, &k, "event:status#1").await?.is_empty());
    // The holder's own write lands.
    let write = event_step(&k, Some(&fence), "status", 1, json!("paid"));
    assert_eq!(
        store.event_set(&write, "status").await?,
        AppendOutcome::Appended
    );
    Ok(())
}

/// A facade over the harness's store with its push (the harness's own polls).
fn pushing(h: &Harness) -> Keiro {
    match (&h.db, &h.sqlite) {
        (Some(db), _) => Keiro::builder(db.store()).build(),
        (_, Some(sqlite)) => Keiro::builder(sqlite.clone()).build(),
        _ => unreachable!("a harness has a Postgres schema or a SQLite store"),
    }
}

pub async fn a_reader_waiting_for_the_first_value_is_woken_by_push(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "e-3").await?;
    let fence = claim(store, &k, "w-1").await?;
    let keiro = pushing(&h);
    let notifier = keiro.notifier().expect("both stores push").clone();
    let mut wake = notifier.subscribe_messages(&k);
    // Whatever woke it before (the listener's first connection) is drained first.
    while wake.wait(QUIET).await != WakeReason::Timeout {}
    let write = event_step(&k, Some(&fence), "status", 1, json!("paid"));
    store.event_set(&write, "status").await?;
    assert_eq!(
        wake.wait(Duration::from_secs(30)).await,
        WakeReason::Notified,
        "a write wakes its instance's readers"
    );
    // Another instance's write does not. (On Postgres the write wakes this process's readers
    // at once and again when its NOTIFY comes back: drained first.)
    while wake.wait(QUIET).await != WakeReason::Timeout {}
    let other = started(store, "e-3b").await?;
    let other_fence = claim(store, &other, "w-1").await?;
    let write = event_step(&other, Some(&other_fence), "status", 1, json!("paid"));
    store.event_set(&write, "status").await?;
    assert_eq!(wake.wait(QUIET).await, WakeReason::Timeout);

    // A reader blocked in get_event returns with the value once the run sets it.
    let k2 = started(store, "e-4").await?;
    let fence2 = claim(store, &k2, "w-1").await?;
    let reader = {
        let k2 = k2.clone();
        tokio::spawn(async move {
            keiro
                .get_event::<String>(&k2, "status", Duration::from_secs(60))
                .await
        })
    };
    tokio::time::sleep(QUIET).await;
    let write = event_step(&k2, Some(&fence2), "status", 1, json!("paid"));
    store.event_set(&write, "status").await?;
    let got = tokio::time::timeout(Duration::from_secs(30), reader).await???;
    assert_eq!(got.as_deref(), Some("paid"));
    Ok(())
}

pub async fn a_terminal_run_without_the_event_answers_none_at_once(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "e-5").await?;
    append(
        store,
        &k,
        None,
        Event::WorkflowCompleted { output: json!(1) },
        None,
    )
    .await?;
    let started_at = std::time::Instant::now();
    let got: Option<String> = h
        .keiro
        .get_event(&k, "status", Duration::from_secs(600))
        .await?;
    assert_eq!(got, None);
    assert!(
        started_at.elapsed() < Duration::from_secs(300),
        "it did not wait the timeout"
    );
    // Nor does a write land in a terminal run.
    let write = event_step(&k, None, "status", 1, json!("late"));
    assert!(matches!(
        store.event_set(&write, "status").await?,
        AppendOutcome::RefusedTerminal(_)
    ));
    assert_eq!(
        h.inspect
            .event_get(&k, "status")
            .await?
            .and_then(|r| r.event),
        None
    );
    Ok(())
}

pub async fn bad_event_requests_are_typed_errors(h: Harness) -> TestResult {
    let store = &*h.store;
    let missing = key("wf", "nobody");
    let unknown = h
        .keiro
        .get_event::<Value>(&missing, "status", Duration::ZERO)
        .await;
    assert!(
        matches!(&unknown, Err(Error::Store(e)) if e.is_not_found()),
        "{unknown:?}"
    );
    let write = event_step(&missing, None, "status", 1, json!(1));
    let refused = store.event_set(&write, "status").await;
    assert!(
        matches!(&refused, Err(e) if e.is_not_found()),
        "{refused:?}"
    );

    let k = started(store, "e-6").await?;
    let long = "k".repeat(201);
    let too_long = h.keiro.get_event::<Value>(&k, &long, Duration::ZERO).await;
    assert!(matches!(too_long, Err(Error::InvalidId(_))), "{too_long:?}");
    let empty = h.keiro.get_event::<Value>(&k, "", Duration::ZERO).await;
    assert!(matches!(empty, Err(Error::InvalidId(_))), "{empty:?}");

    // A value the store refuses (a NUL in a string) writes nothing, on both stores.
    let write = event_step(&k, None, "status", 1, json!("a\u{0}b"));
    let refused = store.event_set(&write, "status").await;
    assert!(
        matches!(&refused, Err(e) if e.is_value_refused()),
        "{refused:?}"
    );
    assert_eq!(
        h.inspect
            .event_get(&k, "status")
            .await?
            .and_then(|r| r.event),
        None
    );
    assert!(recorded(store, &k, "event:status#1").await?.is_empty());

    // A value that does not decode into the type asked for is a typed error.
    let write = event_step(&k, None, "status", 1, json!("text"));
    store.event_set(&write, "status").await?;
    let wrong = h.keiro.get_event::<u32>(&k, "status", Duration::ZERO).await;
    assert!(matches!(wrong, Err(Error::Decode { .. })), "{wrong:?}");
    Ok(())
}

pub async fn a_body_sets_events_once_whatever_replays_it(h: Harness) -> TestResult {
    // The body sets an event twice, then crashes once after both: the retry replays both
    // writes and writes neither again.
    let ledger = Ledger::default();
    let l = ledger.clone();
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("checkout", move |ctx: Ctx, (): ()| {
            let l = l.clone();
            async move {
                ctx.set_event("stage", &"paid").await?;
                ctx.set_event("stage", &"packed").await?;
                ctx.step("flaky", || async {
                    l.bump("flaky");
                    if l.count("flaky") == 1 {
                        Err("crash once".to_owned())
                    } else {
                        Ok(())
                    }
                })
                .await?;
                ctx.set_event("stage", &"shipped").await?;
                Ok::<_, WorkflowError>(())
            }
        })
        .build()?;
    h.keiro.start("checkout", "c-1", &()).await?;
    for _ in 0..50 {
        worker.drain().await?;
        if h.keiro
            .instance(("checkout", "c-1"))
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
    let k = key("checkout", "c-1");
    let event = h
        .inspect
        .event_get(&k, "stage")
        .await?
        .and_then(|r| r.event)
        .expect("set");
    assert_eq!(
        (event.value, event.version),
        (json!("shipped"), 3),
        "three writes, once each"
    );
    Ok(())
}
