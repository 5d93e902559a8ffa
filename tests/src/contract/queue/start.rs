//! Starting on a queue: what the store refuses, dedup, and that a run on a queue waits for
//! admission rather than for an ordinary claim.

use std::time::Duration;

use keiro::queue::{DedupPolicy, QueueError, QueueRefusal, QueueSpec, Rate, StartOptions};
use keiro::Error;
use serde_json::json;

use super::{admit, declare, start_on, wf};
use crate::contract::support::{key, TestResult};
use crate::Harness;

pub async fn a_run_on_a_queue_waits_for_admission_not_for_an_ordinary_claim(
    h: Harness,
) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    let k = start_on(&h, "q", "r-1", "acme").await?;
    let row = h.store.instance_get(&k).await?.expect("started");
    assert_eq!(row.queue.as_deref(), Some("q"));
    assert_eq!(row.queue_key.as_deref(), Some("acme"));
    let names = [keiro_journal::WorkflowName::new("wf")?];
    // Neither discovery nor the ordinary claims take a run that holds no slot.
    assert!(h.store.instances_runnable(None, None).await?.is_empty());
    let batch = h
        .store
        .instances_claim_batch(&names, "w", super::TTL, 10, None)
        .await?;
    assert!(batch.is_empty());
    let single = h.store.instance_claim(&k, "w", super::TTL, None).await?;
    assert!(!matches!(single, keiro_lease::ClaimOutcome::Acquired(_)));
    // A queue no worker names admits nothing to it.
    assert!(admit(&*h.store, "other", "w", 10, None).await?.is_empty());
    let admitted = admit(&*h.store, "q", "w", 10, None).await?;
    assert_eq!(super::ids(&admitted), ["r-1"]);
    assert_eq!(admitted[0].fence.owner, "w");
    assert_eq!(admitted[0].instance.lease_owner.as_deref(), Some("w"));
    assert!(admitted[0].journal.is_empty());
    // Starting again is idempotent by key, and keeps the first queue fields.
    let again = h
        .keiro
        .start_with(
            "wf",
            "r-1",
            &json!(2),
            &StartOptions::on_queue("q").key("globex"),
        )
        .await?;
    assert!(!again.created);
    assert_eq!(again.instance.queue_key.as_deref(), Some("acme"));
    Ok(())
}

pub async fn bad_queue_values_are_typed_errors_and_write_nothing(h: Harness) -> TestResult {
    // Refused before the store.
    let zero = h
        .keiro
        .declare_queue(&QueueSpec::new("q")?.concurrency(0))
        .await;
    assert!(matches!(
        zero,
        Err(Error::Queue(QueueError::InvalidLimit { value: 0, .. }))
    ));
    let negative = h
        .keiro
        .declare_queue(&QueueSpec::new("q")?.key_concurrency(-3))
        .await;
    assert!(matches!(
        negative,
        Err(Error::Queue(QueueError::InvalidLimit { value: -3, .. }))
    ));
    assert!(matches!(
        Rate::new(5, Duration::ZERO),
        Err(QueueError::InvalidPeriod { .. })
    ));
    assert!(matches!(
        Rate::new(0, Duration::from_secs(1)),
        Err(QueueError::InvalidLimit { .. })
    ));
    assert!(matches!(
        QueueSpec::new("bad/name"),
        Err(QueueError::InvalidName { .. })
    ));
    assert!(h.keiro.queues().await?.is_empty(), "nothing was declared");

    declare(&h, QueueSpec::new("q")?).await?;
    let long_key = "k".repeat(keiro_journal::ID_LEN_MAX + 1);
    let too_long = h
        .keiro
        .start_with(
            "wf",
            "r-1",
            &json!(null),
            &StartOptions::on_queue("q").key(long_key),
        )
        .await;
    assert!(
        matches!(too_long, Err(Error::Queue(QueueError::InvalidKey { .. }))),
        "{too_long:?}"
    );
    // A queue option on a start that names no queue is refused, not dropped.
    for (option, options) in [
        ("key", StartOptions::default().key("acme")),
        ("dedup id", StartOptions::default().dedup_id("d")),
        ("priority", StartOptions::default().priority(2)),
        (
            "delay",
            StartOptions::default().delay(Duration::from_secs(1)),
        ),
    ] {
        let refused = h
            .keiro
            .start_with("wf", "r-0", &json!(null), &options)
            .await;
        assert!(
            matches!(&refused, Err(Error::Queue(QueueError::NoQueue { option: o })) if *o == option),
            "{option}: {refused:?}"
        );
    }
    // A delay past what a timestamp holds is refused, not taken as no delay.
    let forever = StartOptions::on_queue("q").delay(Duration::MAX);
    let refused = h
        .keiro
        .start_with("wf", "r-0", &json!(null), &forever)
        .await;
    assert!(
        matches!(refused, Err(Error::Queue(QueueError::InvalidDelay { .. }))),
        "{refused:?}"
    );
    assert!(h.store.instance_get(&wf("r-0")).await?.is_none());
    let weight = h.keiro.queue_key_weight("q", "acme", 0).await;
    assert!(matches!(
        weight,
        Err(Error::Queue(QueueError::InvalidWeight { weight: 0 }))
    ));

    // Refused by the store.
    let refusal = |result: Result<keiro::store::Started, Error>| {
        result.expect_err("refused").queue_refusal().cloned()
    };
    let unknown = h
        .keiro
        .start_with("wf", "r-2", &json!(null), &StartOptions::on_queue("nope"))
        .await;
    assert_eq!(refusal(unknown), Some(QueueRefusal::Unknown));
    let dedup = h
        .keiro
        .start_with(
            "wf",
            "r-3",
            &json!(null),
            &StartOptions::on_queue("q").dedup_id("d"),
        )
        .await;
    assert_eq!(refusal(dedup), Some(QueueRefusal::DedupNotEnabled));
    let priority = h
        .keiro
        .start_with(
            "wf",
            "r-4",
            &json!(null),
            &StartOptions::on_queue("q").priority(3),
        )
        .await;
    assert_eq!(refusal(priority), Some(QueueRefusal::PriorityNotEnabled));
    for id in ["r-1", "r-2", "r-3", "r-4"] {
        assert!(
            h.store.instance_get(&wf(id)).await?.is_none(),
            "{id} was written"
        );
    }
    let pause = h.keiro.pause_queue("nope").await.expect_err("unknown");
    assert_eq!(pause.queue_refusal(), Some(&QueueRefusal::Unknown));
    let weight = h
        .keiro
        .queue_key_weight("nope", "k", 2)
        .await
        .expect_err("unknown");
    assert_eq!(weight.queue_refusal(), Some(&QueueRefusal::Unknown));
    Ok(())
}

pub async fn dedup_refuses_or_returns_the_holder_while_it_is_live(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("refuse")?.dedup(DedupPolicy::Refuse)).await?;
    declare(
        &h,
        QueueSpec::new("existing")?.dedup(DedupPolicy::ReturnExisting),
    )
    .await?;
    let with = |queue: &str| StartOptions::on_queue(queue).dedup_id("invoice-7");

    let first = h
        .keiro
        .start_with("wf", "a-1", &json!(1), &with("refuse"))
        .await?;
    assert!(first.created);
    let second = h
        .keiro
        .start_with("wf", "a-2", &json!(2), &with("refuse"))
        .await;
    let error = second.expect_err("a duplicate");
    assert_eq!(
        error.queue_refusal(),
        Some(&QueueRefusal::Duplicate { holder: wf("a-1") })
    );
    assert!(h.store.instance_get(&wf("a-2")).await?.is_none());
    // The same key again is the idempotent start, not a duplicate.
    let same = h
        .keiro
        .start_with("wf", "a-1", &json!(3), &with("refuse"))
        .await?;
    assert!(!same.created);

    let holder = h
        .keiro
        .start_with("wf", "b-1", &json!(1), &with("existing"))
        .await?;
    let returned = h
        .keiro
        .start_with("wf", "b-2", &json!(2), &with("existing"))
        .await?;
    assert!(!returned.created);
    assert_eq!(returned.instance.key, holder.instance.key);
    assert!(h.store.instance_get(&wf("b-2")).await?.is_none());

    // Another queue's dedup ids are its own.
    let other = h
        .keiro
        .start_with("wf", "b-3", &json!(1), &with("refuse"))
        .await;
    assert!(other.is_err(), "refuse holds invoice-7 through a-1");

    // Once the holder is terminal the id is free again.
    h.keiro.cancel(&key("wf", "a-1")).await?;
    let after = h
        .keiro
        .start_with("wf", "a-3", &json!(4), &with("refuse"))
        .await?;
    assert!(after.created);
    Ok(())
}

pub async fn concurrent_starts_with_one_dedup_id_create_one_run(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?.dedup(DedupPolicy::ReturnExisting)).await?;
    let mut starts = tokio::task::JoinSet::new();
    for n in 0..16 {
        let keiro = h.keiro.clone();
        starts.spawn(async move {
            let options = StartOptions::on_queue("q").dedup_id("once");
            keiro
                .start_with("wf", &format!("r-{n}"), &json!(n), &options)
                .await
        });
    }
    let mut created = 0;
    let mut holders = std::collections::BTreeSet::new();
    while let Some(started) = starts.join_next().await {
        let started = started??;
        created += usize::from(started.created);
        holders.insert(started.instance.key.id.as_str().to_owned());
    }
    assert_eq!(created, 1);
    assert_eq!(
        holders.len(),
        1,
        "every start answers the one holder: {holders:?}"
    );
    let live = h.keiro.queue("q").await?.expect("declared").waiting;
    assert_eq!(live, 1);
    Ok(())
}

pub async fn start_many_with_starts_each_item_on_its_queue_and_refuses_alone(
    h: Harness,
) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    let outcomes = h
        .keiro
        .start_many_with(
            "wf",
            [
                ("a", &json!(1), StartOptions::on_queue("q").key("acme")),
                ("b", &json!(2), StartOptions::on_queue("nope")),
                ("c", &json!(3), StartOptions::default()),
                (
                    "d",
                    &json!(4),
                    StartOptions::on_queue("q").key("x".repeat(300)),
                ),
                ("a", &json!(5), StartOptions::on_queue("q")),
            ],
        )
        .await;
    assert_eq!(outcomes.len(), 5);
    let a = outcomes[0].as_ref().expect("started");
    assert!(a.created);
    assert_eq!(a.instance.queue_key.as_deref(), Some("acme"));
    let refusal = outcomes[1]
        .as_ref()
        .expect_err("unknown queue")
        .queue_refusal();
    assert_eq!(refusal, Some(&QueueRefusal::Unknown));
    let plain = outcomes[2].as_ref().expect("started");
    assert!(plain.created && plain.instance.queue.is_none());
    assert!(matches!(
        outcomes[3],
        Err(Error::Queue(QueueError::InvalidKey { .. }))
    ));
    assert!(!outcomes[4].as_ref().expect("the same key").created);
    assert!(h.store.instance_get(&wf("b")).await?.is_none());
    // A worker serving `q` claims its one run `a` (free: `q` counts nothing) and the plain
    // run `c`; nothing else was started.
    let mut claimed = super::ids(&admit(&*h.store, "q", "w", 10, None).await?);
    claimed.sort();
    assert_eq!(claimed, ["a", "c"]);
    Ok(())
}

/// A batch whose items are all on one queue with no dedup id (a producer's usual batch, which
/// the Postgres store inserts without joining each item to its queue) answers each item as a
/// start alone would: a new run, an existing key, a key met twice, a delay, a priority its
/// queue refuses or takes, an unknown queue.
pub async fn a_batch_on_one_queue_answers_each_item_as_a_start_alone(h: Harness) -> TestResult {
    declare(&h, QueueSpec::new("q")?).await?;
    declare(&h, QueueSpec::new("p")?.with_priority()).await?;
    start_on(&h, "q", "x", "").await?;
    let on_q = |key: &str| StartOptions::on_queue("q").key(key);
    let outcomes = h
        .keiro
        .start_many_with(
            "wf",
            [
                ("a", &json!(1), on_q("k1")),
                ("b", &json!(2), on_q("k2").delay(Duration::from_secs(3600))),
                ("x", &json!(3), on_q("k3")),
                ("a", &json!(4), on_q("k4")),
                ("c", &json!(5), on_q("k5").priority(5)),
            ],
        )
        .await;
    assert_eq!(outcomes.len(), 5);
    let a = outcomes[0].as_ref().expect("started");
    assert!(a.created);
    assert_eq!(a.instance.queue.as_deref(), Some("q"));
    assert_eq!(a.instance.queue_key.as_deref(), Some("k1"));
    let b = outcomes[1].as_ref().expect("started");
    assert!(b.created);
    assert!(b.instance.next_attempt_at.is_some(), "{:?}", b.instance);
    let x = outcomes[2].as_ref().expect("the existing run");
    assert!(!x.created);
    assert_eq!(x.instance.queue_key, None);
    let again = outcomes[3].as_ref().expect("the same key");
    assert!(!again.created);
    assert_eq!(again.instance.queue_key.as_deref(), Some("k1"));
    let refusal = outcomes[4]
        .as_ref()
        .expect_err("q takes no priority")
        .queue_refusal();
    assert_eq!(refusal, Some(&QueueRefusal::PriorityNotEnabled));
    assert!(h.store.instance_get(&wf("c")).await?.is_none());

    let prioritized = h
        .keiro
        .start_many_with(
            "wf",
            [
                ("d", &json!(6), StartOptions::on_queue("p").priority(7)),
                ("e", &json!(7), StartOptions::on_queue("p")),
            ],
        )
        .await;
    let d = prioritized[0].as_ref().expect("started");
    let e = prioritized[1].as_ref().expect("started");
    assert!(d.created && e.created);
    assert_eq!((d.instance.priority, e.instance.priority), (7, 0));

    let unknown = h
        .keiro
        .start_many_with(
            "wf",
            [
                ("f", &json!(8), StartOptions::on_queue("nope")),
                ("g", &json!(9), StartOptions::on_queue("nope")),
            ],
        )
        .await;
    for outcome in &unknown {
        let refusal = outcome.as_ref().expect_err("unknown").queue_refusal();
        assert_eq!(refusal, Some(&QueueRefusal::Unknown));
    }
    assert!(h.store.instance_get(&wf("f")).await?.is_none());
    assert!(h.store.instance_get(&wf("g")).await?.is_none());

    // A worker serving `q` takes `x` and `a`; `b` waits out its delay.
    let mut claimed = super::ids(&admit(&*h.store, "q", "w", 10, None).await?);
    claimed.sort();
    assert_eq!(claimed, ["a", "x"]);
    Ok(())
}
