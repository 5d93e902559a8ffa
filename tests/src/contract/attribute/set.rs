//! Writing attributes: at the start that creates the instance, and by the run's journaled
//! sets.

use std::time::Duration;

use super::attrs_step;
#[allow(clippy::wildcard_imports)] // the shared tools, some of them per scenario
use crate::contract::support::*;
use crate::{FastWorker, Harness, Ledger};
use keiro::queue::StartOptions;
use keiro::{Ctx, Error, WorkflowError};
use keiro_journal::attribute::{AttrError, AttrValue, Attributes, ATTRIBUTES_MAX};
use keiro_journal::store::AttributesOutcome;
use keiro_journal::{AppendOutcome, Fence, Status};
use serde_json::json;

pub async fn a_start_writes_its_attributes_only_when_it_creates_the_instance(
    h: Harness,
) -> TestResult {
    let options = StartOptions::default()
        .attribute("customer", "acme")
        .attribute("amount", 1200);
    let started = h.keiro.start_with("order", "o-1", &1, &options).await?;
    assert!(started.created);
    let attrs = h.keiro.attributes(("order", "o-1")).await?;
    assert_eq!(
        attrs,
        Attributes::new()
            .with("customer", "acme")
            .with("amount", 1200)
    );
    // A second start of the key finds the instance and writes nothing.
    let again = StartOptions::default().attribute("customer", "globex");
    let started = h.keiro.start_with("order", "o-1", &1, &again).await?;
    assert!(!started.created);
    assert_eq!(
        h.keiro.attributes(("order", "o-1")).await?.get("customer"),
        Some(&AttrValue::from("acme"))
    );
    // Several starts at once, with and without attributes, each get their own.
    let outcomes = h
        .keiro
        .start_many_with(
            "order",
            [
                ("o-2", &1, StartOptions::default().attribute("region", "eu")),
                ("o-3", &1, StartOptions::default()),
                ("o-4", &1, StartOptions::default().attribute("region", "us")),
            ],
        )
        .await;
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    for (id, region) in [("o-2", Some("eu")), ("o-3", None), ("o-4", Some("us"))] {
        assert_eq!(
            h.keiro.attributes(("order", id)).await?.get("region"),
            region.map(AttrValue::from).as_ref(),
            "{id}"
        );
    }
    // On a queue too.
    h.keiro
        .declare_queue(&keiro::queue::QueueSpec::new("q")?)
        .await?;
    let queued = StartOptions::on_queue("q").attribute("tier", "gold");
    h.keiro.start_with("order", "o-5", &1, &queued).await?;
    assert_eq!(
        h.keiro.attributes(("order", "o-5")).await?.get("tier"),
        Some(&AttrValue::from("gold"))
    );
    assert!(h.keiro.attributes(("order", "nobody")).await?.is_empty());
    Ok(())
}

pub async fn bad_start_attributes_are_typed_errors_and_start_nothing(h: Harness) -> TestResult {
    let too_many = (0..=ATTRIBUTES_MAX).fold(StartOptions::default(), |o, i| {
        o.attribute(format!("a{i}"), 1)
    });
    for (options, what) in [
        (too_many, "too many"),
        (
            StartOptions::default().attribute("bad name", 1),
            "a bad name",
        ),
        (
            StartOptions::default().attribute("note", "x".repeat(257)),
            "a long text",
        ),
        (StartOptions::default().attribute("ratio", f64::NAN), "NaN"),
    ] {
        let refused = h.keiro.start_with("order", "bad-1", &1, &options).await;
        assert!(
            matches!(refused, Err(Error::Attributes(_))),
            "{what}: {refused:?}"
        );
    }
    assert!(h.keiro.instance(("order", "bad-1")).await?.is_none());
    Ok(())
}

pub async fn a_set_is_journaled_once_and_the_latest_value_wins(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "a-1").await?;
    let fence = claim(store, &k, "w-1").await?;
    let first = Attributes::new().with("stage", "paid").with("amount", 10);
    assert_eq!(
        store
            .attributes_set(&attrs_step(&k, Some(&fence), 1, &first), &first)
            .await?,
        AttributesOutcome::Append(AppendOutcome::Appended)
    );
    let second = Attributes::new().with("stage", "shipped");
    assert_eq!(
        store
            .attributes_set(&attrs_step(&k, Some(&fence), 2, &second), &second)
            .await?,
        AttributesOutcome::Append(AppendOutcome::Appended)
    );
    // A replay of the first set (other values, as a changed body would send) writes nothing.
    let other = Attributes::new().with("stage", "other").with("amount", 99);
    assert_eq!(
        store
            .attributes_set(&attrs_step(&k, Some(&fence), 1, &other), &other)
            .await?,
        AttributesOutcome::Append(AppendOutcome::AlreadyPresent(serde_json::to_value(&first)?))
    );
    assert_eq!(
        h.inspect.instance_attributes(&k).await?,
        Attributes::new()
            .with("stage", "shipped")
            .with("amount", 10)
    );
    assert_eq!(
        recorded(store, &k, "attrs:#2").await?,
        vec![json!({"stage": {"type": "text", "value": "shipped"}})],
        "the journal entry is the record"
    );
    // A kind may change: the latest value wins whatever it is.
    let third = Attributes::new().with("amount", 10.5);
    store
        .attributes_set(&attrs_step(&k, Some(&fence), 3, &third), &third)
        .await?;
    assert_eq!(
        h.inspect.instance_attributes(&k).await?.get("amount"),
        Some(&AttrValue::Float(10.5))
    );
    Ok(())
}

pub async fn a_stale_holder_sets_nothing(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "a-2").await?;
    let fence = claim(store, &k, "w-1").await?;
    let stale = Fence {
        owner: "w-0".into(),
        epoch: fence.epoch,
    };
    let attrs = Attributes::new().with("stage", "paid");
    let refused = store
        .attributes_set(&attrs_step(&k, Some(&stale), 1, &attrs), &attrs)
        .await;
    assert!(
        matches!(&refused, Err(e) if e.is_lease_lost()),
        "{refused:?}"
    );
    assert!(h.inspect.instance_attributes(&k).await?.is_empty());
    assert!(recorded(store, &k, "attrs:#1").await?.is_empty());
    Ok(())
}

pub async fn a_set_past_the_bound_is_refused_and_writes_nothing(h: Harness) -> TestResult {
    let store = &*h.store;
    let at_start: Attributes = (0..ATTRIBUTES_MAX - 2)
        .map(|i| (format!("s{i}"), 1))
        .collect();
    let mut request = start(&key("wf", "a-3"), json!(null));
    request.attributes = at_start.clone();
    let k = store.instance_start(&request).await?.instance.key;
    let fence = claim(store, &k, "w-1").await?;
    // Two names carried already and three new ones: 33 names.
    let over = Attributes::new()
        .with("s0", 2)
        .with("s1", 2)
        .with("n0", 1)
        .with("n1", 1)
        .with("n2", 1);
    assert_eq!(
        store
            .attributes_set(&attrs_step(&k, Some(&fence), 1, &over), &over)
            .await?,
        AttributesOutcome::TooMany {
            count: u64::try_from(ATTRIBUTES_MAX + 1)?
        }
    );
    assert!(recorded(store, &k, "attrs:#1").await?.is_empty());
    assert_eq!(h.inspect.instance_attributes(&k).await?, at_start);
    // Up to the bound is fine.
    let fits = Attributes::new().with("s0", 2).with("n0", 1).with("n1", 1);
    assert_eq!(
        store
            .attributes_set(&attrs_step(&k, Some(&fence), 1, &fits), &fits)
            .await?,
        AttributesOutcome::Append(AppendOutcome::Appended)
    );
    assert_eq!(
        h.inspect.instance_attributes(&k).await?.len(),
        ATTRIBUTES_MAX
    );
    Ok(())
}

pub async fn retention_deletes_attributes_with_their_instance(h: Harness) -> TestResult {
    let options = StartOptions::default().attribute("customer", "acme");
    h.keiro.start_with("wf", "a-4", &1, &options).await?;
    let k = key("wf", "a-4");
    append(
        &*h.store,
        &k,
        None,
        keiro_journal::Event::WorkflowCompleted { output: json!(1) },
        None,
    )
    .await?;
    assert_eq!(
        h.keiro
            .gc_batch(&crate::contract::retention::collect::later(2))
            .await?
            .instances,
        1
    );
    assert!(h.inspect.instance_attributes(&k).await?.is_empty());
    // A new instance under the same key starts with none.
    h.keiro.start("wf", "a-4", &1).await?;
    assert!(h.keiro.attributes(&k).await?.is_empty());
    Ok(())
}

pub async fn a_body_sets_attributes_once_whatever_replays_it(h: Harness) -> TestResult {
    // The body sets attributes twice around a step that crashes once: the retry replays the
    // first set, and the refusals of bad sets are typed and write nothing.
    let ledger = Ledger::default();
    let l = ledger.clone();
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("checkout", move |ctx: Ctx, (): ()| {
            let l = l.clone();
            async move {
                ctx.set_attributes(&Attributes::new().with("stage", "paid"))
                    .await?;
                l.bump("set");
                ctx.step("flaky", || async {
                    l.bump("flaky");
                    if l.count("flaky") == 1 {
                        Err("crash once".to_owned())
                    } else {
                        Ok(())
                    }
                })
                .await?;
                let bad = ctx
                    .set_attributes(&Attributes::new().with("no good", 1))
                    .await;
                assert!(matches!(
                    bad,
                    Err(WorkflowError::InvalidAttributes(
                        AttrError::InvalidName { .. }
                    ))
                ));
                ctx.set_attributes(&Attributes::new().with("stage", "shipped").with("n", 2))
                    .await?;
                Ok::<_, WorkflowError>(())
            }
        })
        .build()?;
    let options = StartOptions::default().attribute("customer", "acme");
    h.keiro.start_with("checkout", "c-1", &(), &options).await?;
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
    assert_eq!(ledger.count("flaky"), 2, "the run crashed once");
    let k = key("checkout", "c-1");
    assert_eq!(
        h.keiro.attributes(&k).await?,
        Attributes::new()
            .with("customer", "acme")
            .with("stage", "shipped")
            .with("n", 2)
    );
    assert_eq!(recorded(store_of(&h), &k, "attrs:#1").await?.len(), 1);
    assert_eq!(recorded(store_of(&h), &k, "attrs:#2").await?.len(), 1);
    assert!(recorded(store_of(&h), &k, "attrs:#3").await?.is_empty());
    Ok(())
}

fn store_of(h: &Harness) -> &dyn keiro_lease::LeaseStore {
    &*h.store
}

pub async fn starts_that_keep_no_attributes_refuse_them_and_start_nothing(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let mut request = start(&key("wf", "a-5"), json!(null));
    request.attributes = Attributes::new().with("customer", "acme");
    let direct = store
        .instance_start_claimed(&request, "w-1", Duration::from_secs(60), None)
        .await;
    assert!(
        matches!(&direct, Err(keiro_journal::StoreError::ValueRefused { .. })),
        "{direct:?}"
    );
    let with_signal = store
        .signal_with_start(
            &request,
            "token-a-5",
            &json!(1),
            &keiro_journal::SignalOptions::default(),
        )
        .await;
    assert!(
        matches!(
            &with_signal,
            Err(keiro_journal::StoreError::ValueRefused { .. })
        ),
        "{with_signal:?}"
    );
    assert!(store.instance_get(&request.key).await?.is_none());
    Ok(())
}
