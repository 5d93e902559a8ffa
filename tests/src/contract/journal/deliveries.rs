//! Deliveries reach awaits and nothing else (issue 12 item 4, issue 17 item 3). A delivery
//! waits for an `await_step` of its name, so one that names a step the body runs itself, before
//! or after the body gets there, changes nothing; one bound to a generation the run has left is
//! refused, typed, and writes nothing. Both stores.

use std::convert::Infallible;

use crate::{FastWorker, Harness, Ledger, TestResult};
use keiro::{worker::Tuning, workflow::DeliveryRefusal, Ctx, Status, WorkflowError};

/// A worker for `order`: it charges (each run of the action counted in `ledger`), then awaits
/// an approval, and returns both.
fn charging_worker(h: &Harness, ledger: &Ledger) -> Result<keiro::Worker, keiro::Error> {
    let l = ledger.clone();
    h.keiro
        .worker()
        .fast()
        .register("order", move |ctx: Ctx, (): ()| {
            let l = l.clone();
            async move {
                let charged: u32 = ctx
                    .step("charge", || async {
                        l.bump("charge");
                        Ok::<_, Infallible>(42u32)
                    })
                    .await?;
                let approved: bool = ctx.await_step("approval").await?;
                Ok::<_, WorkflowError>((charged, approved))
            }
        })
        .build()
}

pub async fn a_delivery_before_the_body_runs_a_step_of_that_name_changes_nothing(
    h: Harness,
) -> TestResult {
    // A caller delivers to "charge" before the body has run its `ctx.step("charge")`: the value
    // waits for an await of that name and never stands in for the step.
    let ledger = Ledger::default();
    let worker = charging_worker(&h, &ledger)?;
    h.keiro.start("order", "o-1", &()).await?;
    h.keiro.deliver(("order", "o-1"), "charge", &7u32).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(row.status, Status::Suspended, "{:?}", row.last_error);
    assert_eq!(ledger.count("charge"), 1, "the step ran, once");
    h.keiro.deliver(("order", "o-1"), "approval", &true).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!([42, true]))),
        "{:?}",
        row.last_error
    );
    assert_eq!(ledger.count("charge"), 1, "the step ran once");
    Ok(())
}

pub async fn an_early_delivery_waits_for_its_await(h: Harness) -> TestResult {
    // Both deliveries land before the worker ever drives the run; the await reads its own.
    let ledger = Ledger::default();
    let worker = charging_worker(&h, &ledger)?;
    h.keiro.start("order", "o-1", &()).await?;
    h.keiro.deliver(("order", "o-1"), "approval", &true).await?;
    let again = h
        .keiro
        .deliver(("order", "o-1"), "approval", &false)
        .await?;
    assert_eq!(
        again,
        keiro::store::AppendOutcome::AlreadyPresent(serde_json::json!(true)),
        "the first delivery wins"
    );
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!([42, true]))),
        "{:?}",
        row.last_error
    );
    Ok(())
}

pub async fn a_delivery_to_a_step_the_body_recorded_changes_nothing(h: Harness) -> TestResult {
    // The body recorded "charge" and parked on "approval"; a delivery to "charge" neither
    // replaces the recorded result nor fails the run (it used to fail it with a kind mismatch).
    let ledger = Ledger::default();
    let worker = charging_worker(&h, &ledger)?;
    h.keiro.start("order", "o-1", &()).await?;
    worker.drain().await?;
    h.keiro.deliver(("order", "o-1"), "charge", &7u32).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(row.status, Status::Suspended, "{:?}", row.last_error);
    h.keiro.deliver(("order", "o-1"), "approval", &true).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!([42, true]))),
        "{:?}",
        row.last_error
    );
    assert_eq!(ledger.count("charge"), 1);
    Ok(())
}

pub async fn a_delivery_bound_to_a_left_generation_is_refused(h: Harness) -> TestResult {
    // A loop: await a payment, ship, continue as new. A webhook retry of generation 0's payment
    // arrives after the run moved on: bound to its generation, it is refused instead of being
    // taken as generation 1's payment (which would ship twice).
    let ledger = Ledger::default();
    let l = ledger.clone();
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("billing", move |ctx: Ctx, round: u32| {
            let l = l.clone();
            async move {
                let paid: u32 = ctx.await_step("payment").await?;
                ctx.step("ship", || async {
                    l.bump(&format!("ship-{paid}"));
                    Ok::<_, Infallible>(())
                })
                .await?;
                if round < 1 {
                    return Err(ctx.continue_as_new(&(round + 1)));
                }
                Ok::<_, WorkflowError>(paid)
            }
        })
        .build()?;
    h.keiro.start("billing", "b-1", &0u32).await?;
    worker.drain().await?;
    h.keiro
        .deliver_to(("billing", "b-1"), 0, "payment", &100u32)
        .await?;
    worker.drain().await?;
    assert_eq!(
        h.keiro
            .instance(("billing", "b-1"))
            .await?
            .expect("row")
            .generation,
        1
    );
    // The retry answers generation 0's await, which already has it: idempotent, and not
    // taken as generation 1's payment.
    let retried = h
        .keiro
        .deliver_to(("billing", "b-1"), 0, "payment", &100u32)
        .await?;
    assert_eq!(
        retried,
        keiro::store::AppendOutcome::AlreadyPresent(serde_json::json!(100))
    );
    // A delivery for generation 0 that it never got is refused: that await is gone.
    let late = h
        .keiro
        .deliver_to(("billing", "b-1"), 0, "refund", &5u32)
        .await;
    assert!(
        matches!(
            &late,
            Err(keiro::Error::DeliveryRefused {
                reason: DeliveryRefusal::StaleGeneration {
                    generation: 0,
                    current: 1
                },
                ..
            })
        ),
        "{late:?}"
    );
    worker.drain().await?;
    assert_eq!(ledger.count("ship-100"), 1, "shipped once");
    // Generation 1's own payment is accepted.
    h.keiro
        .deliver_to(("billing", "b-1"), 1, "payment", &200u32)
        .await?;
    worker.drain().await?;
    let row = h.keiro.instance(("billing", "b-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(200)))
    );
    Ok(())
}

pub async fn a_value_delivered_under_the_bare_name_is_still_read(h: Harness) -> TestResult {
    // An older keiro journaled deliveries under the await's bare name; a run parked across the
    // upgrade must still read such a value rather than wait for one under `await:<step>`.
    let ledger = Ledger::default();
    let worker = charging_worker(&h, &ledger)?;
    h.keiro.start("order", "o-1", &()).await?;
    worker.drain().await?;
    let key = keiro::InstanceKey::parse("order", "o-1")?;
    let legacy = keiro::store::Append::external(
        key,
        keiro::store::Event::StepRecorded {
            step: "approval".into(),
            kind: keiro::store::StepKind::Await,
            result: serde_json::json!(true),
        },
    );
    h.keiro.store().journal_append(&legacy).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("order", "o-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!([42, true]))),
        "{:?}",
        row.last_error
    );
    Ok(())
}

/// A worker for `gated` with a journal budget of `budget`: it charges, awaits an approval, then
/// ships (each action counted in `ledger`), and returns the approval.
fn gated_worker(
    h: &Harness,
    ledger: &Ledger,
    budget: keiro::workflow::JournalBudget,
) -> Result<keiro::Worker, keiro::Error> {
    let l = ledger.clone();
    h.keiro
        .worker()
        .fast()
        .tuning(Tuning {
            journal_budget: budget,
            ..h.fast_tuning()
        })
        .register("gated", move |ctx: Ctx, (): ()| {
            let l = l.clone();
            async move {
                ctx.step("charge", || async {
                    l.bump("charge");
                    Ok::<_, Infallible>(())
                })
                .await?;
                let approved: bool = ctx.await_step("approval").await?;
                ctx.step("ship", || async {
                    l.bump("ship");
                    Ok::<_, Infallible>(())
                })
                .await?;
                Ok::<_, WorkflowError>(approved)
            }
        })
        .build()
}

pub async fn deliveries_no_await_reads_do_not_fill_the_journal_budget(h: Harness) -> TestResult {
    // A public webhook delivers under names no await reads, more of them (and more bytes) than
    // the whole journal budget: the run's next step still runs. Only what an await reads
    // counts against the budget.
    let ledger = Ledger::default();
    let budget = keiro::workflow::JournalBudget {
        steps: 20,
        bytes: 4_000,
    };
    let worker = gated_worker(&h, &ledger, budget)?;
    for id in ["by-count", "by-bytes"] {
        h.keiro.start("gated", id, &()).await?;
    }
    worker.drain().await?;
    for n in 0..30 {
        h.keiro
            .deliver(("gated", "by-count"), &format!("junk-{n}"), &n)
            .await?;
    }
    for n in 0..3 {
        h.keiro
            .deliver(
                ("gated", "by-bytes"),
                &format!("junk-{n}"),
                &"x".repeat(2_000),
            )
            .await?;
    }
    for id in ["by-count", "by-bytes"] {
        h.keiro.deliver(("gated", id), "approval", &true).await?;
    }
    worker.drain().await?;
    for id in ["by-count", "by-bytes"] {
        let row = h.keiro.instance(("gated", id)).await?.expect("row");
        assert_eq!(
            (row.status, row.output),
            (Status::Completed, Some(serde_json::json!(true))),
            "{id}: {:?}",
            row.last_error
        );
    }
    assert_eq!(ledger.count("ship"), 2);
    Ok(())
}

pub async fn a_delivery_past_the_unread_bound_is_refused_and_writes_nothing(
    h: Harness,
) -> TestResult {
    // The default bound: a generation holds at most 1,000 deliveries no await has read. The
    // next fresh name is refused, typed, and journals nothing; a repeat is still idempotent,
    // and the delivery the parked run waits for is still taken.
    let ledger = Ledger::default();
    let worker = gated_worker(&h, &ledger, keiro::workflow::JournalBudget::default())?;
    h.keiro.start("gated", "g-1", &()).await?;
    worker.drain().await?;
    for n in 0..1_000 {
        let outcome = h
            .keiro
            .deliver(("gated", "g-1"), &format!("junk-{n}"), &n)
            .await?;
        assert_eq!(outcome, keiro::store::AppendOutcome::Appended, "junk-{n}");
    }
    let journaled = h.keiro.journal(("gated", "g-1")).await?.len();
    let refused = h.keiro.deliver(("gated", "g-1"), "junk-1000", &1_000).await;
    assert!(
        matches!(
            &refused,
            Err(keiro::Error::DeliveryRefused {
                step,
                reason: DeliveryRefusal::Backlog { unread, backlog },
            }) if step == "junk-1000"
                && unread.count == 1_000
                && *backlog == keiro::workflow::DeliveryBacklog::default()
        ),
        "{refused:?}"
    );
    assert_eq!(
        h.keiro.journal(("gated", "g-1")).await?.len(),
        journaled,
        "nothing was journaled"
    );
    let repeat = h.keiro.deliver(("gated", "g-1"), "junk-7", &7).await?;
    assert_eq!(
        repeat,
        keiro::store::AppendOutcome::AlreadyPresent(serde_json::json!(7))
    );
    let approval = h.keiro.deliver(("gated", "g-1"), "approval", &true).await?;
    assert_eq!(
        approval,
        keiro::store::AppendOutcome::Appended,
        "the awaited one"
    );
    worker.drain().await?;
    let row = h.keiro.instance(("gated", "g-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(true))),
        "{:?}",
        row.last_error
    );
    Ok(())
}

/// Whether `result` is a refusal for the backlog, holding `count` unread deliveries.
fn backlogged(result: &Result<keiro::store::AppendOutcome, keiro::Error>, count: usize) -> bool {
    matches!(
        result,
        Err(keiro::Error::DeliveryRefused {
            reason: DeliveryRefusal::Backlog { unread, .. },
            ..
        }) if unread.count == count
    )
}

pub async fn what_the_awaits_read_makes_room_and_a_parked_wait_is_always_answered(
    h: Harness,
) -> TestResult {
    // A backlog of two. The body awaits item-0 .. item-3 in turn.
    let keiro = h
        .keiro
        .clone()
        .with_delivery_backlog(keiro::workflow::DeliveryBacklog {
            deliveries: 2,
            ..keiro::workflow::DeliveryBacklog::default()
        });
    let worker = keiro
        .worker()
        .fast()
        .register("items", |ctx: Ctx, (): ()| async move {
            let mut total = 0u32;
            for i in 0..4 {
                let item: u32 = ctx.await_step(&format!("item-{i}")).await?;
                total = ctx
                    .step(&format!("add-{i}"), || async move {
                        Ok::<_, Infallible>(total + item)
                    })
                    .await?;
            }
            Ok::<_, WorkflowError>(total)
        })
        .build()?;
    let key = ("items", "i-1");
    keiro.start("items", "i-1", &()).await?;
    // Before the run ever parks: two early deliveries fill the backlog.
    keiro.deliver(key, "item-0", &1u32).await?;
    keiro.deliver(key, "item-1", &2u32).await?;
    let early = keiro.deliver(key, "item-2", &3u32).await;
    assert!(backlogged(&early, 2), "{early:?}");
    // The run reads both and parks on item-2, telling the store what it read: room again.
    worker.drain().await?;
    keiro.deliver(key, "junk-a", &0u32).await?;
    keiro.deliver(key, "junk-b", &0u32).await?;
    let junk = keiro.deliver(key, "junk-c", &0u32).await;
    assert!(backlogged(&junk, 2), "{junk:?}");
    // Full, but the parked run waits on item-2 (and the junk woke it, so it is running again
    // until a worker looks): taken.
    assert_eq!(
        keiro.deliver(key, "item-2", &3u32).await?,
        keiro::store::AppendOutcome::Appended
    );
    worker.drain().await?;
    // The junk is still unread, and the run now waits on item-3.
    assert_eq!(
        keiro.deliver(key, "item-3", &4u32).await?,
        keiro::store::AppendOutcome::Appended
    );
    worker.drain().await?;
    let row = keiro.instance(key).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(10))),
        "{:?}",
        row.last_error
    );
    Ok(())
}

pub async fn the_unread_bytes_are_bounded_too(h: Harness) -> TestResult {
    let keiro = h
        .keiro
        .clone()
        .with_delivery_backlog(keiro::workflow::DeliveryBacklog {
            deliveries: 100,
            bytes: 100,
        });
    keiro.start("gate", "g-1", &()).await?;
    let sixty = "x".repeat(58); // 60 bytes encoded, with its quotes
    keiro.deliver(("gate", "g-1"), "a", &sixty).await?;
    let refused = keiro.deliver(("gate", "g-1"), "b", &sixty).await;
    assert!(
        matches!(
            &refused,
            Err(keiro::Error::DeliveryRefused {
                reason: DeliveryRefusal::Backlog { unread, .. },
                ..
            }) if unread.count == 1 && unread.bytes == 60
        ),
        "{refused:?}"
    );
    keiro.deliver(("gate", "g-1"), "c", &"x".repeat(38)).await?;
    Ok(())
}

pub async fn a_new_generation_starts_with_no_unread_delivery(h: Harness) -> TestResult {
    // A backlog of one; the body awaits `next` and continues as new once.
    let keiro = h
        .keiro
        .clone()
        .with_delivery_backlog(keiro::workflow::DeliveryBacklog {
            deliveries: 1,
            ..keiro::workflow::DeliveryBacklog::default()
        });
    let worker = keiro
        .worker()
        .fast()
        .register("rounds", |ctx: Ctx, round: u32| async move {
            let next: u32 = ctx.await_step("next").await?;
            if round == 0 {
                return Err(ctx.continue_as_new(&next));
            }
            Ok::<_, WorkflowError>(next)
        })
        .build()?;
    let key = ("rounds", "r-1");
    keiro.start("rounds", "r-1", &0u32).await?;
    worker.drain().await?;
    keiro.deliver(key, "junk", &0u32).await?;
    let full = keiro.deliver(key, "more-junk", &0u32).await;
    assert!(backlogged(&full, 1), "{full:?}");
    keiro.deliver(key, "next", &7u32).await?;
    worker.drain().await?;
    assert_eq!(keiro.instance(key).await?.expect("row").generation, 1);
    // Generation 0's unread junk does not count in generation 1.
    assert_eq!(
        keiro.deliver(key, "junk", &0u32).await?,
        keiro::store::AppendOutcome::Appended
    );
    keiro.deliver_to(key, 1, "next", &8u32).await?;
    worker.drain().await?;
    let row = keiro.instance(key).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(8))),
        "{:?}",
        row.last_error
    );
    Ok(())
}

/// A delivery of `value` to the await `name` of `k`, as `Keiro::deliver` makes it.
fn delivery(k: &keiro::InstanceKey, name: &str, value: serde_json::Value) -> keiro::store::Append {
    keiro::store::Append::external(
        k.clone(),
        keiro::store::Event::StepRecorded {
            step: format!("await:{name}"),
            kind: keiro::store::StepKind::Await,
            result: value,
        },
    )
}

pub async fn the_unread_bound_counts_only_what_the_awaits_reported_read(h: Harness) -> TestResult {
    // At the store: the bound, the counts a refusal reports, and `deliveries_read`, whose
    // report for another generation or of a smaller total changes nothing.
    use keiro_journal::store::{AppendOutcome, DeliveryOutcome};
    use keiro_journal::{Deliveries, DeliveryBacklog};
    use serde_json::json;
    let store = &*h.store;
    let k = crate::contract::support::started(store, "d").await?;
    let backlog = DeliveryBacklog {
        deliveries: 2,
        ..DeliveryBacklog::default()
    };
    let appended = DeliveryOutcome::Append(AppendOutcome::Appended);
    for (name, value) in [("x", 1), ("y", 2)] {
        assert_eq!(
            store
                .delivery_append(&delivery(&k, name, json!(value)), &backlog)
                .await?,
            appended
        );
    }
    let full = DeliveryOutcome::Backlog(Deliveries { count: 2, bytes: 2 });
    assert_eq!(
        store
            .delivery_append(&delivery(&k, "z", json!(3)), &backlog)
            .await?,
        full
    );
    assert_eq!(
        store.journal_load(&k, 0).await?.len(),
        2,
        "nothing journaled"
    );
    assert_eq!(
        store
            .delivery_append(&delivery(&k, "x", json!(9)), &backlog)
            .await?,
        DeliveryOutcome::Append(AppendOutcome::AlreadyPresent(json!(1))),
        "a repeat is still idempotent"
    );
    // What the run read makes room.
    store
        .deliveries_read(&k, 0, Deliveries { count: 1, bytes: 1 })
        .await?;
    assert_eq!(
        store
            .delivery_append(&delivery(&k, "z", json!(3)), &backlog)
            .await?,
        appended
    );
    // A report for another generation, or of a smaller total, changes nothing.
    store
        .deliveries_read(&k, 0, Deliveries { count: 0, bytes: 0 })
        .await?;
    store
        .deliveries_read(&k, 5, Deliveries { count: 9, bytes: 9 })
        .await?;
    assert_eq!(
        store
            .delivery_append(&delivery(&k, "w", json!(4)), &backlog)
            .await?,
        full
    );
    Ok(())
}

pub async fn only_an_unfenced_await_record_is_a_delivery_and_a_closed_run_gets_no_backlog(
    h: Harness,
) -> TestResult {
    use keiro_journal::store::{AppendOutcome, DeliveryOutcome};
    use keiro_journal::{DeliveryBacklog, Marker};
    use serde_json::json;
    let store = &*h.store;
    let k = crate::contract::support::started(store, "d").await?;
    // A plain step is no delivery: refused for good, and not as a value.
    let plain = crate::contract::support::step(&k, "s", keiro::store::StepKind::Step, json!(1));
    let err = store
        .delivery_append(&plain, &DeliveryBacklog::default())
        .await
        .unwrap_err();
    assert!(!err.is_retryable() && !err.is_value_refused(), "{err}");
    let missing = crate::contract::support::key("wf", "missing");
    assert!(store
        .delivery_append(
            &delivery(&missing, "x", json!(1)),
            &DeliveryBacklog::default()
        )
        .await
        .unwrap_err()
        .is_not_found());

    // A full backlog, then the run closes: the append rules' own answer, never a backlog.
    let backlog = DeliveryBacklog {
        deliveries: 1,
        ..DeliveryBacklog::default()
    };
    store
        .delivery_append(&delivery(&k, "junk", json!(0)), &backlog)
        .await?;
    assert!(matches!(
        store
            .delivery_append(&delivery(&k, "more", json!(0)), &backlog)
            .await?,
        DeliveryOutcome::Backlog(_)
    ));
    crate::contract::support::append(
        store,
        &k,
        None,
        keiro::store::Event::WorkflowCancelled,
        None,
    )
    .await?;
    assert_eq!(
        store
            .delivery_append(&delivery(&k, "late", json!(0)), &backlog)
            .await?,
        DeliveryOutcome::Append(AppendOutcome::RefusedTerminal(Marker::Cancelled))
    );
    Ok(())
}
