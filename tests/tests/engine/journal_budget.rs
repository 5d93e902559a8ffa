//! The journal budget (issue 17, item 5): a generation's journal stops growing at its budget
//! with a typed error that a body can answer by continuing as new. Both stores.

use std::convert::Infallible;

use keiro::{worker::Tuning, workflow::JournalBudget, Ctx, Status, WorkflowError};
use keiro_tests::{on_both_stores, FastWorker, Harness, Ledger, TestResult};

on_both_stores!(
    a_step_past_the_budget_fails_the_run_before_its_action,
    a_body_continues_as_new_when_its_journal_is_full,
    a_result_past_the_byte_budget_fails_the_run_without_a_retry,
    an_instance_whose_journal_cannot_be_loaded_does_not_block_the_others,
);

fn budget(steps: usize, bytes: usize) -> JournalBudget {
    JournalBudget { steps, bytes }
}

async fn a_step_past_the_budget_fails_the_run_before_its_action(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let worker = h
        .keiro
        .worker()
        .fast()
        .tuning(Tuning {
            journal_budget: budget(10, 1 << 20),
            ..h.fast_tuning()
        })
        .register("loop", move |ctx: Ctx, (): ()| {
            let l = l.clone();
            async move {
                for i in 0..20 {
                    ctx.step(&format!("s-{i}"), || async {
                        l.bump("step");
                        Ok::<_, Infallible>(i)
                    })
                    .await?;
                }
                Ok(())
            }
        })
        .build()?;
    h.keiro.start("loop", "l-1", &()).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("loop", "l-1")).await?.expect("row");
    assert_eq!((row.status, row.attempts), (Status::Failed, 0));
    assert_eq!(ledger.count("step"), 10, "the 11th action never ran");
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("continue as new"), "{error}");
    Ok(())
}

async fn a_body_continues_as_new_when_its_journal_is_full(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let worker = h
        .keiro
        .worker()
        .fast()
        .tuning(Tuning {
            journal_budget: budget(10, 1 << 20),
            ..h.fast_tuning()
        })
        .register("long", move |ctx: Ctx, from: u32| {
            let l = l.clone();
            async move {
                for i in from..25 {
                    let step = ctx
                        .step(&format!("s-{i}"), || async {
                            l.bump(&format!("s-{i}"));
                            Ok::<_, Infallible>(i)
                        })
                        .await;
                    match step {
                        Ok(_) => {}
                        Err(WorkflowError::JournalFull { .. }) => {
                            return Err(ctx.continue_as_new(&i));
                        }
                        Err(other) => return Err(other),
                    }
                }
                Ok(25u32)
            }
        })
        .build()?;
    h.keiro.start("long", "l-1", &0u32).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("long", "l-1")).await?.expect("row");
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);
    assert_eq!(row.generation, 2, "two continues as new");
    assert_eq!(ledger.all().len(), 25);
    assert!(ledger.all().values().all(|n| *n == 1), "{:?}", ledger.all());
    Ok(())
}

async fn a_result_past_the_byte_budget_fails_the_run_without_a_retry(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let l = ledger.clone();
    let worker = h
        .keiro
        .worker()
        .fast()
        .tuning(Tuning {
            journal_budget: budget(1000, 1000),
            ..h.fast_tuning()
        })
        .register("wide", move |ctx: Ctx, (): ()| {
            let l = l.clone();
            async move {
                for i in 0..3 {
                    ctx.step(&format!("s-{i}"), || async {
                        l.bump("step");
                        Ok::<_, Infallible>("x".repeat(600))
                    })
                    .await?;
                }
                Ok(())
            }
        })
        .build()?;
    h.keiro.start("wide", "w-1", &()).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("wide", "w-1")).await?.expect("row");
    assert_eq!((row.status, row.attempts), (Status::Failed, 0));
    assert_eq!(
        ledger.count("step"),
        2,
        "the second result did not fit and was not retried"
    );
    assert_eq!(
        h.keiro.journal(("wide", "w-1")).await?.len(),
        2,
        "s-0 and the failure"
    );
    Ok(())
}

async fn an_instance_whose_journal_cannot_be_loaded_does_not_block_the_others(
    h: Harness,
) -> TestResult {
    // A journal past what one claim can load (PostgreSQL: a jsonb array over 256 MiB, 54000)
    // refuses every batch claim that may pick it. The worker loop claims one at a time then:
    // the others run, and that instance is failed with a reason instead of tried forever.
    let faulty = keiro_tests::FaultyStore::new(h.store.clone());
    let keiro = keiro::KeiroBuilder::lease_only(std::sync::Arc::new(faulty.clone()))
        .without_push()
        .build();
    for id in ["a", "big", "c"] {
        keiro.start("plain", id, &()).await?;
    }
    faulty.unloadable(Some(keiro_tests::key("plain", "big")));
    let worker = keiro
        .worker()
        .fast()
        .register("plain", |ctx: Ctx, (): ()| async move {
            ctx.step("one", || async { Ok::<_, Infallible>(1u32) })
                .await
        })
        .build()?;
    let running = keiro_tests::spawn_worker(worker);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let statuses = loop {
        let mut statuses = Vec::new();
        for id in ["a", "big", "c"] {
            statuses.push(keiro.instance(("plain", id)).await?.expect("row").status);
        }
        if statuses.iter().all(|s| s.is_terminal()) || tokio::time::Instant::now() > deadline {
            break statuses;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    running.stop().await?;
    assert_eq!(
        statuses,
        [Status::Completed, Status::Failed, Status::Completed]
    );
    let error = keiro
        .instance(("plain", "big"))
        .await?
        .expect("row")
        .last_error
        .unwrap_or_default();
    assert!(error.contains("cannot be claimed"), "{error}");
    Ok(())
}
