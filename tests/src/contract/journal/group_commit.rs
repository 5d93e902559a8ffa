//! Group commit conformance: appends and starts made together (`journal_append_batch`,
//! `instances_start`, `Keiro::start_many`, and concurrent single calls) give each request the
//! outcome it would have had alone, on SQLite (the writer's shared transaction) and on Postgres
//! with batching on and off.

use std::time::Duration;

use crate::{journal_steps, key, Harness, TestResult};
use keiro::{
    store::Append, store::AppendOutcome, store::Event, store::Fence, store::Marker,
    store::StepKind, Status,
};
use keiro_journal::store::ClosingOutcome;
use keiro_journal::{store::ChildSpawn, store::Park, store::StartRequest, InstanceKey, StoreError};
use keiro_lease::ClaimOutcome;
use serde_json::{json, Value};

const TTL: Duration = Duration::from_secs(60);

fn step(name: &str, result: Value) -> Event {
    Event::StepRecorded {
        step: name.to_owned(),
        kind: StepKind::Step,
        result,
    }
}

fn fenced(k: &InstanceKey, fence: &Fence, event: Event) -> Append {
    Append {
        key: k.clone(),
        generation: Some(0),
        event,
        fence: Some(fence.clone()),
        renew: Some(TTL),
    }
}

async fn started(h: &Harness, name: &str, id: &str) -> Result<InstanceKey, StoreError> {
    let k = key(name, id);
    h.store
        .instance_start(&StartRequest {
            attributes: Default::default(),
            key: k.clone(),
            input: json!(id),
            parent: None,
            priority: 0,
            queue: None,
        })
        .await?;
    Ok(k)
}

/// Starts `id` and claims it for `owner`.
async fn claimed(h: &Harness, id: &str, owner: &str) -> Result<(InstanceKey, Fence), StoreError> {
    let k = started(h, "gc", id).await?;
    match h.store.instance_claim(&k, owner, TTL, None).await? {
        ClaimOutcome::Acquired(claim) => Ok((k, claim.fence)),
        other => panic!("claim of {k} refused: {other:?}"),
    }
}

async fn status(h: &Harness, k: &InstanceKey) -> Result<Status, StoreError> {
    Ok(h.store.instance_get(k).await?.expect("instance row").status)
}

pub async fn each_append_of_a_batch_keeps_its_own_outcome(h: Harness) -> TestResult {
    let (good, good_fence) = claimed(&h, "good", "w").await?;
    let (stale, stale_fence) = claimed(&h, "stale", "w").await?;
    // Another worker took `stale` over: the first holder's fence is stale.
    h.store.instance_lease_force_release(&stale).await?;
    let ClaimOutcome::Acquired(_) = h.store.instance_claim(&stale, "other", TTL, None).await?
    else {
        panic!("takeover refused")
    };
    let cancelled = started(&h, "gc", "cancelled").await?;
    h.keiro.cancel(("gc", "cancelled")).await?;
    let (recorded, recorded_fence) = claimed(&h, "recorded", "w").await?;
    h.store
        .journal_append(&fenced(&recorded, &recorded_fence, step("s", json!(1))))
        .await?;
    let (kinds, kinds_fence) = claimed(&h, "kinds", "w").await?;
    h.store
        .journal_append(&fenced(&kinds, &kinds_fence, step("s", json!(1))))
        .await?;
    let (done, done_fence) = claimed(&h, "done", "w").await?;
    let missing = key("gc", "missing");
    let (after, after_fence) = claimed(&h, "after", "w").await?;

    let appends = [
        fenced(&good, &good_fence, step("s", json!("good"))),
        fenced(&stale, &stale_fence, step("s", json!("stale"))),
        Append::external(cancelled.clone(), step("s", json!("late"))),
        fenced(&recorded, &recorded_fence, step("s", json!(2))),
        fenced(
            &kinds,
            &kinds_fence,
            Event::StepRecorded {
                step: "s".into(),
                kind: StepKind::Sleep,
                result: Value::Null,
            },
        ),
        fenced(
            &done,
            &done_fence,
            Event::WorkflowCompleted {
                output: json!("out"),
            },
        ),
        Append::external(missing.clone(), step("s", json!(0))),
        fenced(&after, &after_fence, step("s", json!("after"))),
    ];
    let outcomes = h.store.journal_append_batch(&appends).await;
    assert_eq!(outcomes.len(), appends.len());
    let mut outcomes = outcomes.into_iter();
    let mut next = || outcomes.next().expect("one outcome per append");
    assert_eq!(next()?, AppendOutcome::Appended);
    assert!(matches!(next(), Err(e) if e.is_lease_lost()));
    assert_eq!(next()?, AppendOutcome::RefusedTerminal(Marker::Cancelled));
    assert_eq!(next()?, AppendOutcome::AlreadyPresent(json!(1)));
    assert_eq!(next()?, AppendOutcome::Conflict);
    assert_eq!(next()?, AppendOutcome::Appended);
    assert!(matches!(next(), Err(e) if e.is_not_found()));
    assert_eq!(next()?, AppendOutcome::Appended);

    assert_eq!(
        journal_steps(&h, &good).await?,
        [("s".into(), json!("good"))]
    );
    assert_eq!(journal_steps(&h, &stale).await?, []);
    assert_eq!(status(&h, &cancelled).await?, Status::Cancelled);
    assert_eq!(
        journal_steps(&h, &recorded).await?,
        [("s".into(), json!(1))]
    );
    assert_eq!(journal_steps(&h, &kinds).await?, [("s".into(), json!(1))]);
    let row = h.store.instance_get(&done).await?.expect("row");
    assert_eq!(
        (row.status, row.output, row.lease_owner),
        (Status::Completed, Some(json!("out")), None)
    );
    assert!(h.store.instance_get(&missing).await?.is_none());
    assert_eq!(
        journal_steps(&h, &after).await?,
        [("s".into(), json!("after"))]
    );
    // The fenced appends renewed their leases: the holder still holds them.
    h.store
        .instance_lease_renew(&good, &good_fence, TTL)
        .await?;
    Ok(())
}

/// Completions are the other half of every run's appends: a batch closes the rows it may close
/// and answers the others as they would be answered alone.
pub async fn each_completion_of_a_batch_keeps_its_own_outcome(h: Harness) -> TestResult {
    let completed = |output: Value| Event::WorkflowCompleted { output };
    let (live, live_fence) = claimed(&h, "live", "w").await?;
    let (stale, stale_fence) = claimed(&h, "stale", "w").await?;
    h.store.instance_lease_force_release(&stale).await?;
    let ClaimOutcome::Acquired(_) = h.store.instance_claim(&stale, "other", TTL, None).await?
    else {
        panic!("takeover refused")
    };
    // A parked row: the park released the lease, so its holder's fence is stale; an unfenced
    // completion (an operator's) lands.
    let (parked, parked_fence) = claimed(&h, "parked", "w").await?;
    h.store
        .instance_park(&Park {
            key: parked.clone(),
            generation: 0,
            fence: Some(parked_fence.clone()),
            awaited: vec!["never".to_owned()],
            wake_after: None,
        })
        .await?;
    let unfenced = started(&h, "gc", "unfenced").await?;
    let (closed, closed_fence) = claimed(&h, "closed", "w").await?;
    h.store
        .journal_append(&fenced(&closed, &closed_fence, completed(json!("first"))))
        .await?;
    // A child whose completion is journaled into its parent, in the same transaction.
    let parent = started(&h, "gc", "parent").await?;
    let child = key("gc", "child");
    let spawned = h
        .store
        .child_spawn(
            &Append::external(
                parent.clone(),
                Event::StepRecorded {
                    step: "child:c".into(),
                    kind: StepKind::Child,
                    result: json!({"name": "gc", "id": "child"}),
                },
            ),
            &ChildSpawn {
                child: child.clone(),
                input: json!(null),
                await_step: "child:c:result".into(),
            },
        )
        .await?;
    assert_eq!(spawned, AppendOutcome::Appended);
    let ClaimOutcome::Acquired(child_claim) =
        h.store.instance_claim(&child, "w", TTL, None).await?
    else {
        panic!("child claim refused")
    };

    let appends = [
        fenced(&live, &live_fence, completed(json!("live"))),
        fenced(&stale, &stale_fence, completed(json!("stale"))),
        fenced(
            &parked,
            &parked_fence,
            completed(json!("stale after the park")),
        ),
        Append::external(parked.clone(), completed(json!("parked"))),
        Append::external(unfenced.clone(), completed(json!("unfenced"))),
        fenced(&closed, &closed_fence, completed(json!("second"))),
        fenced(
            &child,
            &child_claim.fence,
            completed(json!("from the child")),
        ),
    ];
    let outcomes = h.store.journal_append_batch(&appends).await;
    assert_eq!(outcomes.len(), appends.len());
    let mut outcomes = outcomes.into_iter();
    let mut next = || outcomes.next().expect("one outcome per append");
    assert_eq!(next()?, AppendOutcome::Appended);
    assert!(matches!(next(), Err(e) if e.is_lease_lost()));
    assert!(matches!(next(), Err(e) if e.is_lease_lost()));
    assert_eq!(next()?, AppendOutcome::Appended);
    assert_eq!(next()?, AppendOutcome::Appended);
    assert_eq!(next()?, AppendOutcome::AlreadyPresent(json!("first")));
    assert_eq!(next()?, AppendOutcome::Appended);

    for (k, output) in [
        (&live, "live"),
        (&parked, "parked"),
        (&unfenced, "unfenced"),
        (&closed, "first"),
        (&child, "from the child"),
    ] {
        let row = h.store.instance_get(k).await?.expect("row");
        assert_eq!(
            (row.status, row.output, row.lease_owner),
            (Status::Completed, Some(json!(output)), None),
            "{k}"
        );
    }
    assert_eq!(status(&h, &stale).await?, Status::Running);
    assert_eq!(journal_steps(&h, &stale).await?, []);
    // The parent heard of its child's completion in the batch's transaction.
    let delivered = journal_steps(&h, &parent).await?;
    assert_eq!(delivered.len(), 2, "{delivered:?}");
    assert_eq!(delivered[1].0, "child:c:result");
    assert_eq!(delivered[1].1, json!({"ok": "from the child"}));
    Ok(())
}

pub async fn a_refused_value_fails_only_its_own_append(h: Harness) -> TestResult {
    let mut appends = Vec::new();
    let mut keys = Vec::new();
    for i in 0..6 {
        let (k, fence) = claimed(&h, &format!("r{i}"), "w").await?;
        let value = if i == 3 {
            json!({"label": "a\u{0}b"})
        } else {
            json!(i)
        };
        appends.push(fenced(&k, &fence, step("s", value)));
        keys.push(k);
    }
    // A refused output of a completion too, on its own instance.
    let (closing, closing_fence) = claimed(&h, "closing", "w").await?;
    appends.push(fenced(
        &closing,
        &closing_fence,
        Event::WorkflowCompleted {
            output: json!("\u{0}"),
        },
    ));
    let outcomes = h.store.journal_append_batch(&appends).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        match (i, outcome) {
            (3 | 6, Err(e)) => assert!(e.is_value_refused(), "{i}: {e}"),
            (_, Ok(AppendOutcome::Appended)) => {}
            (i, other) => panic!("append {i}: {other:?}"),
        }
    }
    for (i, k) in keys.iter().enumerate() {
        let expected: Vec<(String, Value)> = if i == 3 {
            Vec::new()
        } else {
            vec![("s".into(), json!(i))]
        };
        assert_eq!(journal_steps(&h, k).await?, expected, "{k}");
    }
    assert_eq!(status(&h, &closing).await?, Status::Running);
    assert_eq!(journal_steps(&h, &closing).await?, []);
    Ok(())
}

pub async fn duplicates_in_a_batch_converge_on_the_first_value(h: Harness) -> TestResult {
    let (k, fence) = claimed(&h, "dup", "w").await?;
    let appends = [
        fenced(&k, &fence, step("x", json!("first"))),
        fenced(&k, &fence, step("x", json!("second"))),
        fenced(&k, &fence, Event::WorkflowCompleted { output: json!(1) }),
        fenced(&k, &fence, Event::WorkflowCompleted { output: json!(2) }),
    ];
    let outcomes: Vec<AppendOutcome> = h
        .store
        .journal_append_batch(&appends)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    assert_eq!(
        outcomes,
        [
            AppendOutcome::Appended,
            AppendOutcome::AlreadyPresent(json!("first")),
            AppendOutcome::Appended,
            AppendOutcome::AlreadyPresent(json!(1)),
        ]
    );
    assert_eq!(
        journal_steps(&h, &k).await?,
        [
            ("x".into(), json!("first")),
            ("__workflow_completed__".into(), json!(1))
        ]
    );
    Ok(())
}

pub async fn appends_to_one_instance_keep_their_order_in_a_batch(h: Harness) -> TestResult {
    let (a, a_fence) = claimed(&h, "order-b", "w").await?;
    let (b, b_fence) = claimed(&h, "order-a", "w").await?;
    // Interleaved, and with the instances out of key order: each instance's appends land in
    // the order given, and the completion closes only its own instance.
    let appends = [
        fenced(&a, &a_fence, step("1", json!(1))),
        fenced(&b, &b_fence, step("1", json!(1))),
        fenced(
            &a,
            &a_fence,
            Event::WorkflowCompleted { output: json!("a") },
        ),
        fenced(&b, &b_fence, step("2", json!(2))),
        fenced(&a, &a_fence, step("2", json!(2))),
    ];
    let outcomes = h.store.journal_append_batch(&appends).await;
    let outcomes: Vec<_> = outcomes.into_iter().collect::<Result<_, _>>()?;
    assert_eq!(
        outcomes,
        [
            AppendOutcome::Appended,
            AppendOutcome::Appended,
            AppendOutcome::Appended,
            AppendOutcome::Appended,
            AppendOutcome::RefusedTerminal(Marker::Completed),
        ]
    );
    assert_eq!(
        journal_steps(&h, &a).await?,
        [
            ("1".into(), json!(1)),
            ("__workflow_completed__".into(), json!("a"))
        ]
    );
    assert_eq!(
        journal_steps(&h, &b).await?,
        [("1".into(), json!(1)), ("2".into(), json!(2))]
    );
    Ok(())
}

pub async fn a_cancel_in_a_batch_keeps_its_place(h: Harness) -> TestResult {
    let (k, fence) = claimed(&h, "cancel", "w").await?;
    let (other, other_fence) = claimed(&h, "bystander", "w").await?;
    let appends = [
        fenced(&k, &fence, step("before", json!(1))),
        fenced(&other, &other_fence, step("s", json!(1))),
        Append::external(k.clone(), Event::WorkflowCancelled),
        fenced(&k, &fence, step("after", json!(2))),
    ];
    let outcomes: Vec<_> = h
        .store
        .journal_append_batch(&appends)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    assert_eq!(
        outcomes,
        [
            AppendOutcome::Appended,
            AppendOutcome::Appended,
            AppendOutcome::Appended,
            AppendOutcome::RefusedTerminal(Marker::Cancelled),
        ]
    );
    assert_eq!(status(&h, &k).await?, Status::Cancelled);
    assert_eq!(journal_steps(&h, &other).await?, [("s".into(), json!(1))]);
    Ok(())
}

pub async fn concurrent_batches_over_many_instances_record_each_step_once(
    h: Harness,
) -> TestResult {
    const INSTANCES: usize = 24;
    const BATCHES: usize = 6;
    let mut runs = Vec::new();
    for i in 0..INSTANCES {
        runs.push(claimed(&h, &format!("many-{i:02}"), "w").await?);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for b in 0..BATCHES {
        let store = h.store.clone();
        // Each batch visits the instances in its own order (forwards, backwards, rotated), and
        // every batch writes the shared step "s" (one value wins per instance) and a step of
        // its own.
        let mut order: Vec<(InstanceKey, Fence)> = runs.clone();
        order.rotate_left(b * 5 % INSTANCES);
        if b % 2 == 1 {
            order.reverse();
        }
        tasks.spawn(async move {
            let appends: Vec<Append> = order
                .iter()
                .flat_map(|(k, fence)| {
                    [
                        fenced(k, fence, step("s", json!(b))),
                        fenced(k, fence, step(&format!("own-{b}"), json!(b))),
                    ]
                })
                .collect();
            let outcomes = store.journal_append_batch(&appends).await;
            (appends, outcomes)
        });
    }
    let mut answers = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        answers.push(joined?);
    }
    for (k, _) in &runs {
        let entries = journal_steps(&h, k).await?;
        assert_eq!(entries.len(), 1 + BATCHES, "{k}: {entries:?}");
        let winner = entries
            .iter()
            .find(|(name, _)| name == "s")
            .map(|(_, v)| v.clone())
            .expect("the shared step is recorded");
        for (appends, outcomes) in &answers {
            for (append, outcome) in appends.iter().zip(outcomes) {
                if &append.key != k {
                    continue;
                }
                let outcome = outcome.as_ref().map_err(ToString::to_string)?;
                match (&append.event, outcome) {
                    (Event::StepRecorded { step, result, .. }, AppendOutcome::Appended) => {
                        let stored = entries.iter().find(|(n, _)| n == step).map(|e| &e.1);
                        assert_eq!(stored, Some(result), "{k} {step}");
                    }
                    (Event::StepRecorded { step, .. }, AppendOutcome::AlreadyPresent(v)) => {
                        assert_eq!(step, "s");
                        assert_eq!(v, &winner, "{k}: every writer adopts the first value");
                    }
                    (_, other) => panic!("{k}: {other:?}"),
                }
            }
        }
    }
    Ok(())
}

pub async fn concurrent_single_appends_each_get_their_outcome(h: Harness) -> TestResult {
    const INSTANCES: usize = 32;
    let mut runs = Vec::new();
    for i in 0..INSTANCES {
        runs.push(claimed(&h, &format!("single-{i:02}"), "w").await?);
    }
    // One instance in four has lost its lease: its appends must fail alone.
    for (k, _) in runs.iter().step_by(4) {
        h.store.instance_lease_force_release(k).await?;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (k, fence)) in runs.iter().cloned().enumerate() {
        let store = h.store.clone();
        tasks.spawn(async move {
            let mut outcomes = Vec::new();
            for s in 0..3 {
                let append = fenced(&k, &fence, step(&format!("s{s}"), json!([i, s])));
                outcomes.push(store.journal_append(&append).await);
            }
            let done = fenced(&k, &fence, Event::WorkflowCompleted { output: json!(i) });
            outcomes.push(store.journal_append(&done).await);
            (i, outcomes)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (i, outcomes) = joined?;
        let (k, _) = &runs[i];
        if i % 4 == 0 {
            assert!(
                outcomes
                    .iter()
                    .all(|o| matches!(o, Err(e) if e.is_lease_lost())),
                "{k}: {outcomes:?}"
            );
            assert_eq!(journal_steps(&h, k).await?, []);
        } else {
            assert!(
                outcomes
                    .iter()
                    .all(|o| matches!(o, Ok(AppendOutcome::Appended))),
                "{k}: {outcomes:?}"
            );
            assert_eq!(status(&h, k).await?, Status::Completed);
            assert_eq!(journal_steps(&h, k).await?.len(), 4);
        }
    }
    Ok(())
}

pub async fn start_many_answers_each_item(h: Harness) -> TestResult {
    h.keiro.start("batch", "existing", &json!("old")).await?;
    let inputs = [
        ("fresh-1", json!(1)),
        ("existing", json!("new")),
        ("not/valid", json!(2)),
        ("fresh-2", json!(3)),
        ("fresh-1", json!(4)),
        ("refused", json!("a\u{0}b")),
    ];
    let outcomes = h
        .keiro
        .start_many("batch", inputs.iter().map(|(id, input)| (*id, input)))
        .await?;
    assert_eq!(outcomes.len(), inputs.len());
    let created: Vec<Option<bool>> = outcomes
        .iter()
        .map(|o| o.as_ref().ok().map(|s| s.created))
        .collect();
    assert_eq!(
        created,
        [Some(true), Some(false), None, Some(true), Some(false), None]
    );
    assert!(matches!(outcomes[2], Err(keiro::Error::InvalidId(_))));
    assert!(matches!(outcomes[5], Err(keiro::Error::Payload(_))));
    let row = |i: usize| outcomes[i].as_ref().ok().map(|s| s.instance.input.clone());
    assert_eq!(row(1), Some(json!("old")), "an existing input is untouched");
    assert_eq!(row(4), Some(json!(1)), "the first of two starts wins");
    for id in ["fresh-1", "fresh-2", "existing"] {
        let row = h.keiro.instance(("batch", id)).await?.expect("started");
        assert_eq!(row.status, Status::Running);
    }
    assert!(h.keiro.instance(("batch", "refused")).await?.is_none());
    assert!(matches!(
        h.keiro.start_many("not/valid", [("a", &1)]).await,
        Err(keiro::Error::InvalidId(_))
    ));
    assert!(h.keiro.start_many::<u32>("batch", []).await?.is_empty());

    // The store's own entry point refuses a poisoned input alone, whatever it is batched with.
    let requests: Vec<StartRequest> = [json!(1), json!("a\u{0}b"), json!(3)]
        .into_iter()
        .enumerate()
        .map(|(i, input)| StartRequest {
            attributes: Default::default(),
            key: key("batch", &format!("store-{i}")),
            input,
            parent: None,
            priority: 0,
            queue: None,
        })
        .collect();
    let outcomes = h.store.instances_start(&requests).await;
    assert!(matches!(&outcomes[0], Ok(s) if s.created));
    assert!(matches!(&outcomes[1], Err(e) if e.is_value_refused()));
    assert!(matches!(&outcomes[2], Ok(s) if s.created));
    assert!(h.store.instance_get(&requests[1].key).await?.is_none());
    Ok(())
}

pub async fn concurrent_starts_create_each_instance_once(h: Harness) -> TestResult {
    const IDS: usize = 40;
    let mut tasks = tokio::task::JoinSet::new();
    // Four starters race over the same ids, in different orders.
    for starter in 0..4_usize {
        let keiro = h.keiro.clone();
        tasks.spawn(async move {
            let mut created = Vec::new();
            for n in 0..IDS {
                let i = if starter % 2 == 0 { n } else { IDS - 1 - n };
                let id = format!("race-{i:02}");
                let started = keiro.start("race", &id, &json!(starter)).await?;
                if started.created {
                    created.push(i);
                }
            }
            Ok::<_, keiro::Error>(created)
        });
    }
    let mut created = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        created.extend(joined??);
    }
    created.sort_unstable();
    assert_eq!(
        created,
        (0..IDS).collect::<Vec<_>>(),
        "each id created once"
    );
    Ok(())
}

/// Direct starts (a worker's `run_workflow`) racing over the same ids: each id is created once,
/// exactly one caller holds its lease, and every other caller learns the lease is held.
pub async fn concurrent_direct_starts_lease_each_instance_once(h: Harness) -> TestResult {
    const IDS: usize = 30;
    let mut tasks = tokio::task::JoinSet::new();
    // Every call is a task of its own, so they share batches.
    for starter in 0..4_usize {
        for n in 0..IDS {
            let i = if starter % 2 == 0 { n } else { IDS - 1 - n };
            let request = StartRequest {
                attributes: Default::default(),
                key: key("direct", &format!("d-{i:02}")),
                input: json!(starter),
                parent: None,
                priority: 0,
                queue: None,
            };
            let (store, owner) = (h.store.clone(), format!("starter-{starter}"));
            tasks.spawn(async move {
                let start = store
                    .instance_start_claimed(&request, &owner, TTL, None)
                    .await?;
                Ok::<_, StoreError>((i, owner, start))
            });
        }
    }
    let mut created = Vec::new();
    let mut leased: Vec<(usize, String, i64)> = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (i, owner, start) = joined??;
        {
            if start.created {
                created.push(i);
            }
            match start.claim {
                ClaimOutcome::Acquired(claim) => {
                    assert_eq!(claim.fence.owner, owner);
                    assert!(claim.journal.is_empty());
                    leased.push((i, owner, claim.fence.epoch));
                }
                ClaimOutcome::LeaseHeld => {}
                other => panic!("d-{i:02}: {other:?}"),
            }
        }
    }
    created.sort_unstable();
    assert_eq!(
        created,
        (0..IDS).collect::<Vec<_>>(),
        "each id created once"
    );
    leased.sort_unstable();
    assert_eq!(
        leased.iter().map(|(i, ..)| *i).collect::<Vec<_>>(),
        (0..IDS).collect::<Vec<_>>(),
        "each id leased once"
    );
    for (i, owner, epoch) in leased {
        let row = h
            .store
            .instance_get(&key("direct", &format!("d-{i:02}")))
            .await?
            .expect("row");
        assert_eq!((row.lease_owner, row.lease_epoch), (Some(owner), epoch));
    }
    Ok(())
}

fn completed(output: Value) -> Event {
    Event::WorkflowCompleted { output }
}

/// A run's last step and its completion, as one call: both journaled, the row completed.
pub async fn a_closing_pair_journals_its_step_and_completes(h: Harness) -> TestResult {
    let (k, fence) = claimed(&h, "pair", "w").await?;
    h.store
        .journal_append(&fenced(&k, &fence, step("a", json!(1))))
        .await?;
    let outcome = h
        .store
        .journal_append_closing(
            &fenced(&k, &fence, step("b", json!(2))),
            &fenced(&k, &fence, completed(json!("done"))),
        )
        .await?;
    assert_eq!(
        outcome,
        ClosingOutcome {
            step: AppendOutcome::Appended,
            completion: Some(AppendOutcome::Appended),
        }
    );
    assert_eq!(
        journal_steps(&h, &k).await?,
        [
            ("a".into(), json!(1)),
            ("b".into(), json!(2)),
            ("__workflow_completed__".into(), json!("done")),
        ]
    );
    let row = h.store.instance_get(&k).await?.expect("row");
    assert_eq!(
        (row.status, row.output, row.lease_owner),
        (Status::Completed, Some(json!("done")), None)
    );
    // Sent again (a commit whose answer was lost): the step is there with its value, and the
    // completion answers as a second completion does.
    let again = h
        .store
        .journal_append_closing(
            &fenced(&k, &fence, step("b", json!(2))),
            &fenced(&k, &fence, completed(json!("done"))),
        )
        .await?;
    assert_eq!(again.step, AppendOutcome::AlreadyPresent(json!(2)));
    assert_eq!(
        again.completion,
        Some(AppendOutcome::AlreadyPresent(json!("done")))
    );
    Ok(())
}

/// The run computed its output from the step's value: a journal holding another value for
/// that step must not be completed with it; an equal value completes as if appended.
pub async fn a_closing_pair_completes_only_over_its_own_value(h: Harness) -> TestResult {
    let (other, other_fence) = claimed(&h, "other-value", "w").await?;
    h.store
        .journal_append(&fenced(&other, &other_fence, step("x", json!("first"))))
        .await?;
    let outcome = h
        .store
        .journal_append_closing(
            &fenced(&other, &other_fence, step("x", json!("second"))),
            &fenced(&other, &other_fence, completed(json!("from second"))),
        )
        .await?;
    assert_eq!(
        outcome,
        ClosingOutcome {
            step: AppendOutcome::AlreadyPresent(json!("first")),
            completion: None,
        }
    );
    assert_eq!(status(&h, &other).await?, Status::Running);
    assert_eq!(
        journal_steps(&h, &other).await?,
        [("x".into(), json!("first"))]
    );

    let (same, same_fence) = claimed(&h, "same-value", "w").await?;
    h.store
        .journal_append(&fenced(&same, &same_fence, step("x", json!({"v": 1}))))
        .await?;
    let outcome = h
        .store
        .journal_append_closing(
            &fenced(&same, &same_fence, step("x", json!({"v": 1}))),
            &fenced(&same, &same_fence, completed(json!(1))),
        )
        .await?;
    assert_eq!(
        outcome,
        ClosingOutcome {
            step: AppendOutcome::AlreadyPresent(json!({"v": 1})),
            completion: Some(AppendOutcome::Appended),
        }
    );
    assert_eq!(status(&h, &same).await?, Status::Completed);

    // A cancelled instance: the step is refused, so the completion is not tried.
    let (cancelled, cancelled_fence) = claimed(&h, "cancelled", "w").await?;
    h.store.instance_cancel(&cancelled, false).await?;
    let outcome = h
        .store
        .journal_append_closing(
            &fenced(&cancelled, &cancelled_fence, step("x", json!(1))),
            &fenced(&cancelled, &cancelled_fence, completed(json!(1))),
        )
        .await?;
    assert_eq!(
        outcome,
        ClosingOutcome {
            step: AppendOutcome::RefusedTerminal(Marker::Cancelled),
            completion: None,
        }
    );
    assert_eq!(status(&h, &cancelled).await?, Status::Cancelled);
    Ok(())
}

/// A stale fence or a value the store refuses: an error, and no completion.
pub async fn a_closing_pair_refused_writes_nothing_more(h: Harness) -> TestResult {
    let (stale, stale_fence) = claimed(&h, "stale", "w").await?;
    h.store.instance_lease_force_release(&stale).await?;
    let outcome = h
        .store
        .journal_append_closing(
            &fenced(&stale, &stale_fence, step("x", json!(1))),
            &fenced(&stale, &stale_fence, completed(json!(1))),
        )
        .await;
    assert!(
        matches!(&outcome, Err(e) if e.is_lease_lost()),
        "{outcome:?}"
    );
    assert_eq!(journal_steps(&h, &stale).await?, []);
    assert_eq!(status(&h, &stale).await?, Status::Running);

    // The step's value refused: nothing written.
    let (bad_step, bad_step_fence) = claimed(&h, "bad-step", "w").await?;
    let outcome = h
        .store
        .journal_append_closing(
            &fenced(&bad_step, &bad_step_fence, step("x", json!("a\u{0}b"))),
            &fenced(&bad_step, &bad_step_fence, completed(json!(1))),
        )
        .await;
    assert!(
        matches!(&outcome, Err(e) if e.is_value_refused()),
        "{outcome:?}"
    );
    assert_eq!(journal_steps(&h, &bad_step).await?, []);
    assert_eq!(status(&h, &bad_step).await?, Status::Running);

    // The output refused: the step may land (it is the run's to keep), the row stays open.
    let (bad_output, bad_output_fence) = claimed(&h, "bad-output", "w").await?;
    let outcome = h
        .store
        .journal_append_closing(
            &fenced(&bad_output, &bad_output_fence, step("x", json!(1))),
            &fenced(&bad_output, &bad_output_fence, completed(json!("\u{0}"))),
        )
        .await;
    assert!(
        matches!(&outcome, Err(e) if e.is_value_refused()),
        "{outcome:?}"
    );
    assert_eq!(
        journal_steps(&h, &bad_output).await?,
        [("x".into(), json!(1))]
    );
    assert_eq!(status(&h, &bad_output).await?, Status::Running);
    Ok(())
}

/// Runs ending (closing pairs) beside runs appending steps, all at once, some of them on
/// journals that already hold another value for the step (which undoes a Postgres batch
/// whole): each call gets the outcome it would have had alone.
pub async fn concurrent_closing_pairs_and_appends_each_get_their_outcome(h: Harness) -> TestResult {
    const INSTANCES: usize = 24;
    let mut runs = Vec::new();
    for i in 0..INSTANCES {
        runs.push(claimed(&h, &format!("mix-{i:02}"), "w").await?);
    }
    // One in six already holds another value for its last step.
    for (k, fence) in runs.iter().step_by(6) {
        h.store
            .journal_append(&fenced(k, fence, step("last", json!("earlier"))))
            .await?;
    }
    for round in 0..3 {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, (k, fence)) in runs.iter().cloned().enumerate() {
            let store = h.store.clone();
            tasks.spawn(async move {
                if i % 2 == 0 && round == 2 {
                    let outcome = store
                        .journal_append_closing(
                            &fenced(&k, &fence, step("last", json!(i))),
                            &fenced(&k, &fence, completed(json!(i))),
                        )
                        .await;
                    (i, Err(outcome))
                } else {
                    let append = fenced(&k, &fence, step(&format!("s{round}"), json!(round)));
                    (i, Ok(store.journal_append(&append).await))
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            let (i, outcome) = joined?;
            let (k, _) = &runs[i];
            match outcome {
                Ok(appended) => assert_eq!(appended?, AppendOutcome::Appended, "{k}"),
                Err(closing) if i % 6 == 0 => assert_eq!(
                    closing?,
                    ClosingOutcome {
                        step: AppendOutcome::AlreadyPresent(json!("earlier")),
                        completion: None,
                    },
                    "{k}"
                ),
                Err(closing) => assert_eq!(
                    closing?,
                    ClosingOutcome {
                        step: AppendOutcome::Appended,
                        completion: Some(AppendOutcome::Appended),
                    },
                    "{k}"
                ),
            }
        }
    }
    for (i, (k, _)) in runs.iter().enumerate() {
        let row = h.store.instance_get(k).await?.expect("row");
        let names: Vec<String> = journal_steps(&h, k)
            .await?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        match (i % 6 == 0, i % 2 == 0) {
            (true, _) => {
                assert_eq!(row.status, Status::Running, "{k}");
                assert_eq!(names, ["last", "s0", "s1"], "{k}");
            }
            (false, true) => {
                assert_eq!(
                    (row.status, row.output),
                    (Status::Completed, Some(json!(i)))
                );
                assert_eq!(names, ["s0", "s1", "last", "__workflow_completed__"], "{k}");
            }
            (false, false) => {
                assert_eq!(row.status, Status::Running, "{k}");
                assert_eq!(names, ["s0", "s1", "s2"], "{k}");
            }
        }
    }
    Ok(())
}
