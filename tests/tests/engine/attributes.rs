//! Search attributes end to end: a run is found by the attributes its start gave it and those
//! its body set, as they change; a worker killed after a set leaves a run the next worker
//! finishes without setting again. Both stores.

use std::time::Duration;

use keiro::operate::ListRequest;
use keiro::queue::StartOptions;
use keiro::workflow::{AttrValue, Attributes};
use keiro::{Ctx, Status, WorkflowError};
use keiro_tests::{on_both_stores, spawn_worker, FastWorker, Harness, Ledger, TestResult};

on_both_stores!(
    a_run_is_found_by_its_start_and_body_attributes_as_they_change,
    a_worker_killed_after_a_set_leaves_it_to_the_next_worker_without_a_second_set,
);

/// Places an order: `stage = placed`, waits for the decision, then `stage = shipped` and the
/// final amount.
async fn order(ctx: Ctx, (): ()) -> Result<(), WorkflowError> {
    ctx.set_attributes(&Attributes::new().with("stage", "placed"))
        .await?;
    let amount: i64 = ctx.await_step("decision").await?;
    ctx.set_attributes(
        &Attributes::new()
            .with("stage", "shipped")
            .with("amount", amount),
    )
    .await?;
    Ok(())
}

/// The ids the list gives for `pairs`, newest first.
async fn ids(h: &Harness, pairs: &[(&str, &str)]) -> Result<Vec<String>, keiro::Error> {
    let page = h
        .keiro
        .list(&ListRequest::from_pairs(pairs.iter().copied())?)
        .await?;
    Ok(page
        .instances
        .iter()
        .map(|row| row.key.id.as_str().to_owned())
        .collect())
}

async fn a_run_is_found_by_its_start_and_body_attributes_as_they_change(h: Harness) -> TestResult {
    let worker = h.keiro.worker().fast().register("order", order).build()?;
    for (id, customer, amount) in [("o-1", "acme", 1200), ("o-2", "globex", 300)] {
        let options = StartOptions::default()
            .attribute("customer", customer)
            .attribute("amount", amount);
        h.keiro.start_with("order", id, &(), &options).await?;
    }
    assert_eq!(ids(&h, &[("attr", "customer=acme")]).await?, ["o-1"]);
    assert_eq!(ids(&h, &[("attr", "amount>=1000")]).await?, ["o-1"]);
    worker.drain().await?;
    assert_eq!(
        ids(&h, &[("attr", "stage=placed")]).await?,
        ["o-2", "o-1"],
        "both parked after their first set"
    );
    h.keiro
        .deliver(("order", "o-2"), "decision", &5_000)
        .await?;
    worker.drain().await?;
    assert_eq!(ids(&h, &[("attr", "stage=placed")]).await?, ["o-1"]);
    assert_eq!(
        ids(&h, &[("attr", "stage=shipped"), ("status", "completed")]).await?,
        ["o-2"]
    );
    // The body's amount replaced the start's: the latest value wins.
    assert_eq!(ids(&h, &[("attr", "amount>=1000")]).await?, ["o-2", "o-1"]);
    let attrs = h.keiro.attributes(("order", "o-2")).await?;
    assert_eq!(attrs.get("amount"), Some(&AttrValue::Int(5_000)));
    assert_eq!(attrs.get("customer"), Some(&AttrValue::from("globex")));
    // A replay of the whole run (another drive finds every set journaled) sets nothing again.
    let journal = h.keiro.journal(("order", "o-2")).await?;
    let sets = journal
        .iter()
        .filter(|e| e.event.step_name().starts_with("attrs:"))
        .count();
    assert_eq!(sets, 2);
    Ok(())
}

async fn a_worker_killed_after_a_set_leaves_it_to_the_next_worker_without_a_second_set(
    h: Harness,
) -> TestResult {
    let ledger = Ledger::default();
    let build = |ledger: Ledger| {
        h.keiro
            .worker()
            .fast()
            .register("slow", move |ctx: Ctx, (): ()| {
                let ledger = ledger.clone();
                async move {
                    ctx.set_attributes(&Attributes::new().with("stage", "started"))
                        .await?;
                    ledger.bump("after-set");
                    ctx.step("work", || async {
                        if ledger.count("after-set") == 1 {
                            // The first worker dies here.
                            tokio::time::sleep(Duration::from_secs(600)).await;
                        }
                        Ok::<_, String>(())
                    })
                    .await?;
                    ctx.set_attributes(&Attributes::new().with("stage", "done"))
                        .await?;
                    Ok::<_, WorkflowError>(())
                }
            })
            .build()
    };
    h.keiro.start("slow", "s-1", &()).await?;
    let first = spawn_worker(build(ledger.clone())?);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while ledger.count("after-set") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the run never set");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        ids(&h, &[("attr", "stage=started")]).await?,
        ["s-1"],
        "the set is in the store before the worker dies"
    );
    first.kill();
    h.keiro.force_release(("slow", "s-1")).await?;
    let second = build(ledger.clone())?;
    for _ in 0..100 {
        second.drain().await?;
        if h.keiro.instance(("slow", "s-1")).await?.map(|r| r.status) == Some(Status::Completed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        ledger.count("after-set"),
        2,
        "the second worker replayed the set"
    );
    assert_eq!(ids(&h, &[("attr", "stage=done")]).await?, ["s-1"]);
    let journal = h.keiro.journal(("slow", "s-1")).await?;
    let sets: Vec<String> = journal
        .iter()
        .map(|e| e.event.step_name().into_owned())
        .filter(|s| s.starts_with("attrs:"))
        .collect();
    assert_eq!(sets, ["attrs:#1", "attrs:#2"], "each set journaled once");
    Ok(())
}
