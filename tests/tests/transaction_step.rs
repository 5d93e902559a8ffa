//! Exactly-once database steps (issue 14 item 2): `ctx.transaction(name, |tx| ..)` commits the
//! user's statements and the step's journal row in one transaction, on the Postgres store.
//!
//! The application's tables live in the test's own schema (the transaction runs the user's
//! statements with PostgreSQL's default search_path, so they are qualified).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::postgres::TransactionStep;
use keiro::{Ctx, Status, WorkflowError};
use keiro_tests::{crash, Harness, TestResult};

/// The test's schema, quoted for SQL.
fn schema(h: &Harness) -> String {
    format!(
        "\"{}\"",
        h.db.as_ref().expect("a Postgres harness").schema()
    )
}

async fn sql(h: &Harness, statements: &str) -> TestResult {
    let store = h.db.as_ref().expect("a Postgres harness").store();
    let client = store.pool().get().await?;
    client.batch_execute(statements).await?;
    Ok(())
}

async fn query_i64(
    h: &Harness,
    query: &str,
) -> Result<i64, Box<dyn std::error::Error + Send + Sync>> {
    let store = h.db.as_ref().expect("a Postgres harness").store();
    let client = store.pool().get().await?;
    Ok(client.query_one(query, &[]).await?.get(0))
}

/// Two accounts holding 100 each, in the application's own table.
async fn accounts(h: &Harness) -> TestResult {
    let s = schema(h);
    sql(
        h,
        &format!(
            "CREATE TABLE {s}.accounts (id text PRIMARY KEY, balance bigint NOT NULL);
             INSERT INTO {s}.accounts VALUES ('a', 100), ('b', 100);
             CREATE TABLE {s}.transfers (id text PRIMARY KEY, cents bigint NOT NULL);"
        ),
    )
    .await
}

async fn balances(
    h: &Harness,
) -> Result<(i64, i64, i64), Box<dyn std::error::Error + Send + Sync>> {
    let s = schema(h);
    Ok((
        query_i64(
            h,
            &format!("SELECT balance FROM {s}.accounts WHERE id = 'a'"),
        )
        .await?,
        query_i64(
            h,
            &format!("SELECT balance FROM {s}.accounts WHERE id = 'b'"),
        )
        .await?,
        query_i64(h, &format!("SELECT count(*) FROM {s}.transfers")).await?,
    ))
}

/// Where a run of the transfer workflow crashes the first time it gets there.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CrashAt {
    Nowhere,
    /// Inside the transaction, after the debit, before the credit (a panic).
    AfterDebit,
    /// Inside the transaction, after both statements, before the journal append (an error).
    BeforeAppend,
    /// At the commit, after the append: a deferred constraint fails the first commit.
    AtCommit,
    /// After the step returned (the next step crashes the run).
    AfterCommit,
}

/// A transfer of 30 from `a` to `b` as one transaction step, counting the closure's runs.
fn transfer_worker(
    h: &Harness,
    at: CrashAt,
    runs: Arc<AtomicU32>,
) -> Result<keiro::Worker, keiro::Error> {
    let s = schema(h);
    let crashed_after = Arc::new(AtomicU32::new(0));
    h.keiro
        .worker()
        .options(h.fast_options())
        .register("transfer", move |ctx: Ctx, (): ()| {
            let (s, runs, crashed_after) = (s.clone(), runs.clone(), crashed_after.clone());
            async move {
                let moved: i64 = ctx
                    .transaction("move-30", move |tx| {
                        Box::pin(async move {
                            let run = runs.fetch_add(1, Ordering::SeqCst);
                            tx.execute(
                                &format!(
                                    "UPDATE {s}.accounts SET balance = balance - 30 WHERE id = 'a'"
                                ),
                                &[],
                            )
                            .await
                            .map_err(|e| e.to_string())?;
                            if at == CrashAt::AfterDebit && run == 0 {
                                panic!("crash after the debit");
                            }
                            tx.execute(
                                &format!(
                                    "UPDATE {s}.accounts SET balance = balance + 30 WHERE id = 'b'"
                                ),
                                &[],
                            )
                            .await
                            .map_err(|e| e.to_string())?;
                            tx.execute(
                                &format!("INSERT INTO {s}.transfers VALUES ('t-1', 30)"),
                                &[],
                            )
                            .await
                            .map_err(|e| e.to_string())?;
                            if at == CrashAt::BeforeAppend && run == 0 {
                                return Err("crash before the append".to_owned());
                            }
                            Ok::<_, String>(30i64)
                        })
                    })
                    .await?;
                if at == CrashAt::AfterCommit && crashed_after.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(crash("crash after the commit"));
                }
                Ok::<_, WorkflowError>(moved)
            }
        })
        .build()
}

async fn transfer_with_a_crash(at: CrashAt) -> TestResult {
    let h = Harness::postgres().await;
    accounts(&h).await?;
    if at == CrashAt::AtCommit {
        // A deferred check that fails the first commit touching the accounts table, after
        // keiro's append ran in the same transaction: nextval is not rolled back with it.
        let s = schema(&h);
        sql(
            &h,
            &format!(
                "CREATE SEQUENCE {s}.commits;
                 CREATE FUNCTION {s}.fail_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     IF nextval('{s}.commits') = 1 THEN
                         RAISE EXCEPTION 'the first commit fails';
                     END IF;
                     RETURN NULL;
                 END $$;
                 CREATE CONSTRAINT TRIGGER fail_first_commit AFTER UPDATE ON {s}.accounts
                     DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
                     EXECUTE FUNCTION {s}.fail_first_commit();"
            ),
        )
        .await?;
    }
    let runs = Arc::new(AtomicU32::new(0));
    let worker = transfer_worker(&h, at, runs.clone())?;
    h.keiro.start("transfer", "t-1", &()).await?;
    for _ in 0..20 {
        worker.drain().await?;
        let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
        if row.status.is_terminal() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output.clone()),
        (Status::Completed, Some(serde_json::json!(30))),
        "{at:?}: {:?}",
        row.last_error
    );
    assert_eq!(
        balances(&h).await?,
        (70, 130, 1),
        "{at:?}: the transfer took effect exactly once and balances are conserved"
    );
    let expected_runs = match at {
        CrashAt::Nowhere | CrashAt::AfterCommit => 1,
        CrashAt::AfterDebit | CrashAt::BeforeAppend | CrashAt::AtCommit => 2,
    };
    assert_eq!(runs.load(Ordering::SeqCst), expected_runs, "{at:?}");
    Ok(())
}

#[tokio::test]
async fn a_transfer_without_a_crash_commits_once() -> TestResult {
    transfer_with_a_crash(CrashAt::Nowhere).await
}

#[tokio::test]
async fn a_panic_between_the_statements_leaves_no_trace() -> TestResult {
    transfer_with_a_crash(CrashAt::AfterDebit).await
}

#[tokio::test]
async fn an_error_before_the_append_leaves_no_trace() -> TestResult {
    transfer_with_a_crash(CrashAt::BeforeAppend).await
}

#[tokio::test]
async fn a_failed_commit_leaves_neither_the_effects_nor_the_journal_row() -> TestResult {
    transfer_with_a_crash(CrashAt::AtCommit).await
}

#[tokio::test]
async fn a_redrive_after_the_commit_does_not_run_the_closure_again() -> TestResult {
    transfer_with_a_crash(CrashAt::AfterCommit).await
}

#[tokio::test]
async fn a_process_dying_inside_the_transaction_leaves_no_trace() -> TestResult {
    // The closure has debited and then hangs; the worker is dropped mid-transaction, as a
    // killed process would be. A second worker finds nothing of the first attempt.
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let s = schema(&h);
    let debited = Arc::new(tokio::sync::Notify::new());
    let hang = {
        let (s, debited) = (s.clone(), debited.clone());
        h.keiro
            .worker()
            .options(h.fast_options())
            .register("transfer", move |ctx: Ctx, (): ()| {
                let (s, debited) = (s.clone(), debited.clone());
                async move {
                    ctx.transaction("move-30", move |tx| {
                        Box::pin(async move {
                            tx.execute(
                                &format!(
                                    "UPDATE {s}.accounts SET balance = balance - 30 WHERE id = 'a'"
                                ),
                                &[],
                            )
                            .await
                            .map_err(|e| e.to_string())?;
                            debited.notify_one();
                            std::future::pending::<()>().await;
                            Ok::<_, String>(0i64)
                        })
                    })
                    .await
                }
            })
            .build()?
    };
    h.keiro.start("transfer", "t-1", &()).await?;
    let dying = tokio::spawn(async move { hang.drain().await });
    debited.notified().await;
    dying.abort();
    let _ = dying.await;
    // Whatever the first attempt did is rolled back once its connection is released.
    h.keiro.force_release(("transfer", "t-1")).await?;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = transfer_worker(&h, CrashAt::Nowhere, runs.clone())?;
    worker.drain().await?;
    let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);
    assert_eq!(balances(&h).await?, (70, 130, 1));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn a_lost_lease_rolls_the_users_writes_back() -> TestResult {
    // While the closure runs, another worker takes the instance over (a new owner and epoch,
    // as a claim after an expired lease makes). The append is refused by the fence, so the
    // transaction, and the debit in it, roll back.
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let s = schema(&h);
    let thief = h.db.as_ref().expect("postgres").store();
    let worker = {
        let s = s.clone();
        h.keiro
            .worker()
            .options(h.fast_options())
            .register("transfer", move |ctx: Ctx, (): ()| {
                let (s, thief) = (s.clone(), thief.clone());
                async move {
                    ctx.transaction("move-30", move |tx| {
                        Box::pin(async move {
                            tx.execute(
                                &format!(
                                    "UPDATE {s}.accounts SET balance = balance - 30 WHERE id = 'a'"
                                ),
                                &[],
                            )
                            .await
                            .map_err(|e| e.to_string())?;
                            thief
                                .pool()
                                .get()
                                .await
                                .map_err(|e| e.to_string())?
                                .batch_execute(&format!(
                                    "UPDATE {s}.workflows SET lease_owner = 'thief', \
                                     lease_epoch = lease_epoch + 1, \
                                     lease_expires_at = now() + interval '1 hour'"
                                ))
                                .await
                                .map_err(|e| e.to_string())?;
                            Ok::<_, String>(30i64)
                        })
                    })
                    .await
                }
            })
            .build()?
    };
    h.keiro.start("transfer", "t-1", &()).await?;
    worker.drain().await?;
    assert_eq!(
        balances(&h).await?,
        (100, 100, 0),
        "the debit was rolled back"
    );
    let journal = h.keiro.journal(("transfer", "t-1")).await?;
    assert!(
        journal.iter().all(|e| e.event.step_name() != "move-30"),
        "nothing journaled: {journal:?}"
    );
    let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
    assert_eq!(row.status, Status::Running);
    Ok(())
}

#[tokio::test]
async fn on_a_store_without_transactions_the_step_is_refused_typed() -> TestResult {
    let h = Harness::memory();
    let worker = h
        .keiro
        .worker()
        .options(h.fast_options())
        .register("transfer", |ctx: Ctx, (): ()| async move {
            ctx.transaction("move-30", |_tx| Box::pin(async { Ok::<_, String>(30i64) }))
                .await
        })
        .build()?;
    h.keiro.start("transfer", "t-1", &()).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
    assert_eq!(row.status, Status::Failed);
    let reason = row.last_error.unwrap_or_default();
    assert!(reason.contains("Postgres store"), "{reason}");
    Ok(())
}

/// A transfer under a retry policy whose closure fails its first `failing` attempts after the
/// debit: each failed attempt rolls back and is journaled; returns the worker.
fn retrying_transfer(
    h: &Harness,
    failing: u32,
    runs: Arc<AtomicU32>,
) -> Result<keiro::Worker, keiro::Error> {
    let s = schema(h);
    h.keiro
        .worker()
        .options(h.fast_options())
        .register("transfer", move |ctx: Ctx, (): ()| {
            let (s, runs) = (s.clone(), runs.clone());
            async move {
                let policy = keiro::StepOptions::new(3).initial_interval(Duration::from_millis(1));
                let outcome = ctx
                    .transaction_with("move-30", &policy, |tx| {
                        let (s, runs) = (s.clone(), runs.clone());
                        Box::pin(async move {
                            let run = runs.fetch_add(1, Ordering::SeqCst);
                            tx.execute(
                                &format!(
                                    "UPDATE {s}.accounts SET balance = balance - 30 WHERE id = 'a'"
                                ),
                                &[],
                            )
                            .await
                            .map_err(|e| e.to_string())?;
                            if run < failing {
                                return Err(format!("declined on attempt {}", run + 1));
                            }
                            tx.execute(
                                &format!(
                                    "UPDATE {s}.accounts SET balance = balance + 30 WHERE id = 'b'"
                                ),
                                &[],
                            )
                            .await
                            .map_err(|e| e.to_string())?;
                            tx.execute(
                                &format!("INSERT INTO {s}.transfers VALUES ('t-1', 30)"),
                                &[],
                            )
                            .await
                            .map_err(|e| e.to_string())?;
                            Ok::<_, String>(30i64)
                        })
                    })
                    .await;
                match outcome {
                    Ok(moved) => Ok(moved),
                    Err(WorkflowError::StepFailed { attempts, .. }) => Ok(-i64::from(attempts)),
                    Err(other) => Err(other),
                }
            }
        })
        .build()
}

#[tokio::test]
async fn a_failing_closure_rolls_back_and_counts_as_an_attempt_of_its_retry_policy() -> TestResult {
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = retrying_transfer(&h, 2, runs.clone())?;
    h.keiro.start("transfer", "t-1", &()).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(30))),
        "{:?}",
        row.last_error
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "two failed attempts, then success"
    );
    assert_eq!(
        balances(&h).await?,
        (70, 130, 1),
        "failed attempts left no trace"
    );
    let steps: Vec<String> = h
        .keiro
        .journal(("transfer", "t-1"))
        .await?
        .iter()
        .map(|e| e.event.step_name().into_owned())
        .collect();
    assert!(
        steps.contains(&"attempt:move-30:1".to_owned())
            && steps.contains(&"attempt:move-30:2".to_owned()),
        "{steps:?}"
    );
    Ok(())
}

#[tokio::test]
async fn spent_attempts_give_the_body_step_failed_and_no_effects() -> TestResult {
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = retrying_transfer(&h, 10, runs.clone())?;
    h.keiro.start("transfer", "t-1", &()).await?;
    worker.drain().await?;
    let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(-3))),
        "the body saw StepFailed after 3 attempts: {:?}",
        row.last_error
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(balances(&h).await?, (100, 100, 0));
    Ok(())
}
