//! Exactly-once database steps (issue 14 item 2): `ctx.transaction(name, |tx| ..)` commits the
//! user's statements and the step's journal row in one transaction, on the Postgres store.
//!
//! The application's tables live in the test's own schema (the transaction runs the user's
//! statements with PostgreSQL's default search_path, so they are qualified).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::postgres::tokio_postgres::IsolationLevel;
use keiro::postgres::{TransactionOptions, TransactionStep};
use keiro::{worker::Tuning, Ctx, Status, WorkflowError};
use keiro_tests::{crash, FastWorker, Harness, TestResult};

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
        .fast()
        .register("transfer", move |ctx: Ctx, (): ()| {
            let (s, runs, crashed_after) = (s.clone(), runs.clone(), crashed_after.clone());
            async move {
                let moved: i64 = ctx
                    .transaction("move-30", move |tx| {
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
            .fast()
            .register("transfer", move |ctx: Ctx, (): ()| {
                let (s, debited) = (s.clone(), debited.clone());
                async move {
                    ctx.transaction("move-30", move |tx| {
                        let (s, debited) = (s.clone(), debited.clone());
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
async fn on_a_store_without_transactions_the_step_is_refused_typed() -> TestResult {
    let h = Harness::sqlite();
    let worker = h
        .keiro
        .worker()
        .fast()
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
        .fast()
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

// ---------------------------------------------------------------------------------------------
// Issue 33, item 1: failures after the closure are the step's own, and nothing loops.

/// What a transfer workflow's body saw: the moved amount, or the step's final failure.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
enum Outcome {
    Moved(i64),
    Failed { attempts: u32, message: String },
}

/// Drains `worker` until the instance is terminal (at most `passes` drains), summing the
/// transient errors the passes met.
async fn drive(
    h: &Harness,
    worker: &keiro::Worker,
    passes: u32,
) -> Result<(keiro::store::Instance, u64), Box<dyn std::error::Error + Send + Sync>> {
    let mut transient = 0;
    for _ in 0..passes {
        transient += worker.drain().await?.transient_errors;
        let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
        if row.status.is_terminal() {
            return Ok((row, transient));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
    Ok((row, transient))
}

/// The step names journaled for the transfer.
async fn journaled(h: &Harness) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    Ok(h.keiro
        .journal(("transfer", "t-1"))
        .await?
        .iter()
        .map(|e| e.event.step_name().into_owned())
        .collect())
}

/// A transfer under `policy` whose closure debits, credits and records the transfer, then
/// runs `extra` (a statement of the test's choosing) and, when `swallow` is set, ignores its
/// error. Counts the closure's runs.
fn policy_transfer(
    h: &Harness,
    policy: keiro::StepOptions,
    extra: String,
    swallow: bool,
    runs: Arc<AtomicU32>,
) -> Result<keiro::Worker, keiro::Error> {
    let s = schema(h);
    h.keiro
        .worker()
        .fast()
        .register("transfer", move |ctx: Ctx, (): ()| {
            let (s, runs, extra, policy) = (s.clone(), runs.clone(), extra.clone(), policy.clone());
            async move {
                let outcome = ctx
                    .transaction_with("move-30", &policy, |tx| {
                        let (s, runs, extra) = (s.clone(), runs.clone(), extra.clone());
                        Box::pin(async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tx.batch_execute(&format!(
                                "UPDATE {s}.accounts SET balance = balance - 30 WHERE id = 'a';
                                 UPDATE {s}.accounts SET balance = balance + 30 WHERE id = 'b';
                                 INSERT INTO {s}.transfers VALUES ('t-1', 30);"
                            ))
                            .await?;
                            let extra = tx.batch_execute(&extra).await;
                            if !swallow {
                                extra?;
                            }
                            Ok::<_, keiro::postgres::tokio_postgres::Error>(30i64)
                        })
                    })
                    .await;
                match outcome {
                    Ok(moved) => Ok(Outcome::Moved(moved)),
                    Err(WorkflowError::StepFailed {
                        attempts, message, ..
                    }) => Ok(Outcome::Failed { attempts, message }),
                    Err(other) => Err(other),
                }
            }
        })
        .build()
}

fn quick_policy(attempts: u32) -> keiro::StepOptions {
    keiro::StepOptions::new(attempts).initial_interval(Duration::from_millis(1))
}

#[tokio::test]
async fn a_closure_that_swallows_a_unique_violation_fails_its_step_under_its_policy() -> TestResult
{
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let s = schema(&h);
    sql(
        &h,
        &format!("CREATE TABLE {s}.seen (id text PRIMARY KEY); INSERT INTO {s}.seen VALUES ('x');"),
    )
    .await?;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = policy_transfer(
        &h,
        quick_policy(3),
        format!("INSERT INTO {s}.seen VALUES ('x')"),
        true,
        runs.clone(),
    )?;
    h.keiro.start("transfer", "t-1", &()).await?;
    let (row, transient) = drive(&h, &worker, 20).await?;
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);
    let outcome: Outcome = serde_json::from_value(row.output.clone().expect("output"))?;
    let Outcome::Failed { attempts, message } = outcome else {
        panic!("the body got StepFailed: {outcome:?}");
    };
    assert_eq!(attempts, 3, "{message}");
    assert!(message.contains("25P02"), "the SQLSTATE is kept: {message}");
    assert!(
        message.contains("current transaction is aborted"),
        "the server's message is kept: {message}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "one run per attempt, no loop"
    );
    assert_eq!(transient, 0, "the aborted transaction is not a store error");
    assert_eq!(balances(&h).await?, (100, 100, 0), "nothing committed");
    let steps = journaled(&h).await?;
    for step in [
        "attempt:move-30:1",
        "attempt:move-30:2",
        "attempt:move-30:failed",
    ] {
        assert!(steps.contains(&step.to_owned()), "{step} in {steps:?}");
    }
    Ok(())
}

#[tokio::test]
async fn an_aborted_plain_transaction_step_crashes_the_run_with_its_error_recorded() -> TestResult {
    // Without a policy the step follows the plain-step rule: the run crashes, the crash is
    // counted and backed off, and the run fails at the crash limit with the error recorded.
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let s = schema(&h);
    sql(
        &h,
        &format!("CREATE TABLE {s}.seen (id text PRIMARY KEY); INSERT INTO {s}.seen VALUES ('x');"),
    )
    .await?;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = {
        let (s, runs) = (s.clone(), runs.clone());
        h.keiro
            .worker()
            .fast()
            .tuning(Tuning {
                max_attempts: 3,
                ..h.fast_tuning()
            })
            .register("transfer", move |ctx: Ctx, (): ()| {
                let (s, runs) = (s.clone(), runs.clone());
                async move {
                    ctx.transaction("move-30", move |tx| {
                        let (s, runs) = (s.clone(), runs.clone());
                        Box::pin(async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tx.batch_execute(&format!(
                                "UPDATE {s}.accounts SET balance = balance - 30 WHERE id = 'a'"
                            ))
                            .await?;
                            // The violation is caught and ignored: the transaction is aborted.
                            let _ = tx
                                .batch_execute(&format!("INSERT INTO {s}.seen VALUES ('x')"))
                                .await;
                            Ok::<_, keiro::postgres::tokio_postgres::Error>(30i64)
                        })
                    })
                    .await
                }
            })
            .build()?
    };
    h.keiro.start("transfer", "t-1", &()).await?;
    let (row, transient) = drive(&h, &worker, 40).await?;
    assert_eq!(row.status, Status::Failed, "{row:?}");
    let error = row.last_error.clone().unwrap_or_default();
    assert!(error.contains("25P02"), "{error}");
    assert_eq!(row.attempts, 3, "crashes counted: {row:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(transient, 0);
    assert_eq!(balances(&h).await?, (100, 100, 0));
    Ok(())
}

#[tokio::test]
async fn a_commit_refused_by_a_deferred_constraint_fails_its_step() -> TestResult {
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let s = schema(&h);
    // A deferred foreign key: the row referencing a missing parent is refused at COMMIT only,
    // after keiro's append ran in the same transaction.
    sql(
        &h,
        &format!(
            "CREATE TABLE {s}.ledger (id int PRIMARY KEY,
                 parent int REFERENCES {s}.ledger DEFERRABLE INITIALLY DEFERRED);"
        ),
    )
    .await?;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = policy_transfer(
        &h,
        quick_policy(2),
        format!("INSERT INTO {s}.ledger VALUES (1, 99)"),
        false,
        runs.clone(),
    )?;
    h.keiro.start("transfer", "t-1", &()).await?;
    let (row, transient) = drive(&h, &worker, 20).await?;
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);
    let outcome: Outcome = serde_json::from_value(row.output.clone().expect("output"))?;
    let Outcome::Failed { attempts, message } = outcome else {
        panic!("the body got StepFailed: {outcome:?}");
    };
    assert_eq!(attempts, 2, "{message}");
    assert!(message.contains("23503"), "the SQLSTATE is kept: {message}");
    assert!(
        message.contains("ledger"),
        "the server's message is kept: {message}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(transient, 0);
    assert_eq!(balances(&h).await?, (100, 100, 0), "nothing committed");
    assert!(
        !journaled(&h).await?.contains(&"move-30".to_owned()),
        "the step's journal row went with the refused commit"
    );
    Ok(())
}

/// Where a test makes a transaction step meet a serialization failure (or a deadlock).
#[derive(Debug, Clone, Copy, PartialEq)]
enum ConflictAt {
    /// A statement of the closure's, whose error the closure returns.
    Statement,
    /// keiro's journal append, inside the transaction.
    Append,
    /// The COMMIT (a deferred trigger).
    Commit,
}

/// Makes the first `times` transfers meet SQLSTATE `code` at `at`, and returns the statement
/// the closure runs (a no-op unless `at` is `Statement`).
async fn conflicting(
    h: &Harness,
    at: ConflictAt,
    code: &str,
    times: i64,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let s = schema(h);
    sql(
        h,
        &format!(
            "CREATE SEQUENCE {s}.conflicts;
             CREATE FUNCTION {s}.conflict() RETURNS void LANGUAGE plpgsql AS $$
             BEGIN
                 IF nextval('{s}.conflicts') <= {times} THEN
                     RAISE EXCEPTION 'injected conflict' USING ERRCODE = '{code}';
                 END IF;
             END $$;
             CREATE FUNCTION {s}.conflict_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 PERFORM {s}.conflict();
                 RETURN NEW;
             END $$;"
        ),
    )
    .await?;
    match at {
        ConflictAt::Statement => return Ok(format!("SELECT {s}.conflict()")),
        ConflictAt::Append => {
            sql(
                h,
                &format!(
                    "CREATE TRIGGER conflict BEFORE INSERT ON {s}.journal FOR EACH ROW
                     WHEN (NEW.step_name = 'move-30') EXECUTE FUNCTION {s}.conflict_trigger();"
                ),
            )
            .await?;
        }
        ConflictAt::Commit => {
            sql(
                h,
                &format!(
                    "CREATE CONSTRAINT TRIGGER conflict AFTER INSERT ON {s}.transfers
                     DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
                     EXECUTE FUNCTION {s}.conflict_trigger();"
                ),
            )
            .await?;
        }
    }
    Ok("SELECT 1".to_owned())
}

async fn a_conflict_is_retried_in_place(at: ConflictAt, code: &str) -> TestResult {
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let extra = conflicting(&h, at, code, 2).await?;
    let runs = Arc::new(AtomicU32::new(0));
    // One attempt: only an in-place retry can get the transfer through.
    let worker = policy_transfer(&h, quick_policy(1), extra, false, runs.clone())?;
    h.keiro.start("transfer", "t-1", &()).await?;
    let (row, transient) = drive(&h, &worker, 1).await?;
    assert_eq!(
        (row.status, row.output.clone()),
        (
            Status::Completed,
            Some(serde_json::to_value(Outcome::Moved(30))?)
        ),
        "{at:?} {code}: {:?}",
        row.last_error
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "{at:?} {code}: two retries in place"
    );
    assert_eq!(transient, 0, "{at:?} {code}");
    assert_eq!(row.attempts, 0, "{at:?} {code}: no crash");
    assert_eq!(balances(&h).await?, (70, 130, 1), "{at:?} {code}: once");
    let steps = journaled(&h).await?;
    assert!(
        !steps.iter().any(|s| s.starts_with("attempt:")),
        "{at:?} {code}: retries in place are not attempts: {steps:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_serialization_failure_at_a_users_statement_is_retried_in_place() -> TestResult {
    a_conflict_is_retried_in_place(ConflictAt::Statement, "40001").await
}

#[tokio::test]
async fn a_deadlock_at_a_users_statement_is_retried_in_place() -> TestResult {
    a_conflict_is_retried_in_place(ConflictAt::Statement, "40P01").await
}

#[tokio::test]
async fn a_serialization_failure_at_the_append_is_retried_in_place() -> TestResult {
    a_conflict_is_retried_in_place(ConflictAt::Append, "40001").await
}

#[tokio::test]
async fn a_deadlock_at_the_append_is_retried_in_place() -> TestResult {
    a_conflict_is_retried_in_place(ConflictAt::Append, "40P01").await
}

#[tokio::test]
async fn a_serialization_failure_at_commit_is_retried_in_place() -> TestResult {
    a_conflict_is_retried_in_place(ConflictAt::Commit, "40001").await
}

#[tokio::test]
async fn serialization_failures_past_the_bound_fail_the_step() -> TestResult {
    let h = Harness::postgres().await;
    accounts(&h).await?;
    conflicting(&h, ConflictAt::Commit, "40001", i64::MAX).await?;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = policy_transfer(&h, quick_policy(2), "SELECT 1".into(), false, runs.clone())?;
    h.keiro.start("transfer", "t-1", &()).await?;
    let (row, transient) = drive(&h, &worker, 20).await?;
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);
    let outcome: Outcome = serde_json::from_value(row.output.clone().expect("output"))?;
    let Outcome::Failed { attempts, message } = outcome else {
        panic!("the body got StepFailed: {outcome:?}");
    };
    assert_eq!(attempts, 2, "{message}");
    assert!(message.contains("40001"), "{message}");
    assert!(message.contains("injected conflict"), "{message}");
    let tries = keiro::postgres::SERIALIZATION_TRIES_MAX;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2 * tries,
        "each attempt tries the transaction {tries} times"
    );
    assert_eq!(transient, 0);
    assert_eq!(balances(&h).await?, (100, 100, 0));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Issue 33, item 1: keiro's own writes never fail the transaction; a lost lease is still seen.

/// A transfer whose closure reads the balances, takes `hold` (longer than a third of the
/// lease, so the heartbeat comes due while it runs), then moves 30: under `level`.
fn slow_transfer(
    h: &Harness,
    level: IsolationLevel,
    lease_ttl: Duration,
    hold: Duration,
    runs: Arc<AtomicU32>,
) -> Result<keiro::Worker, keiro::Error> {
    let s = schema(h);
    h.keiro
        .worker()
        .fast()
        .lease_ttl(lease_ttl)
        .register("transfer", move |ctx: Ctx, (): ()| {
            let (s, runs) = (s.clone(), runs.clone());
            async move {
                let options = TransactionOptions::new().isolation(level);
                ctx.transaction_with("move-30", options, move |tx| {
                    let (s, runs) = (s.clone(), runs.clone());
                    Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let a: i64 = tx
                            .query_one(
                                &format!("SELECT balance FROM {s}.accounts WHERE id = 'a'"),
                                &[],
                            )
                            .await?
                            .get(0);
                        tokio::time::sleep(hold).await;
                        tx.execute(
                            &format!(
                                "UPDATE {s}.accounts SET balance = $1::bigint - 30 WHERE id = 'a'"
                            ),
                            &[&a],
                        )
                        .await?;
                        tx.batch_execute(&format!(
                            "UPDATE {s}.accounts SET balance = balance + 30 WHERE id = 'b';
                             INSERT INTO {s}.transfers VALUES ('t-1', 30);"
                        ))
                        .await?;
                        Ok::<_, keiro::postgres::tokio_postgres::Error>(30i64)
                    })
                })
                .await
            }
        })
        .build()
}

async fn a_long_transaction_commits_once(level: IsolationLevel) -> TestResult {
    // The mechanism the default lease (60 s) meets with a 25 s transaction, at a tenth of the
    // scale: a lease of 3 s renews every second while the closure takes 5 s.
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let runs = Arc::new(AtomicU32::new(0));
    let worker = slow_transfer(
        &h,
        level,
        Duration::from_secs(3),
        Duration::from_secs(5),
        runs.clone(),
    )?;
    h.keiro.start("transfer", "t-1", &()).await?;
    let (row, transient) = drive(&h, &worker, 2).await?;
    assert_eq!(
        (row.status, row.output.clone()),
        (Status::Completed, Some(serde_json::json!(30))),
        "{level:?}: {:?}",
        row.last_error
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "{level:?}: committed at the first try"
    );
    assert_eq!(transient, 0, "{level:?}");
    assert_eq!(balances(&h).await?, (70, 130, 1), "{level:?}");
    Ok(())
}

#[tokio::test]
async fn a_serializable_transaction_longer_than_a_third_of_the_lease_commits_once() -> TestResult {
    a_long_transaction_commits_once(IsolationLevel::Serializable).await
}

#[tokio::test]
async fn a_repeatable_read_transaction_longer_than_a_third_of_the_lease_commits_once() -> TestResult
{
    a_long_transaction_commits_once(IsolationLevel::RepeatableRead).await
}

/// Takes the transfer's lease over as another worker's claim after expiry would, from a
/// connection of its own that waits at most `wait` for the instance row.
async fn steal(
    store: &keiro::postgres::PgStore,
    wait: Duration,
) -> Result<u64, keiro::postgres::tokio_postgres::Error> {
    let client = store.pool().get().await.expect("a pooled connection");
    client
        .batch_execute(&format!("SET lock_timeout = '{}ms'", wait.as_millis()))
        .await?;
    let stolen = client
        .execute(
            "UPDATE workflows SET lease_owner = 'thief', lease_epoch = lease_epoch + 1, \
             lease_expires_at = now() + interval '1 hour' WHERE workflow_id = 't-1'",
            &[],
        )
        .await;
    client.batch_execute("RESET lock_timeout").await?;
    stolen
}

#[tokio::test]
async fn a_lease_lost_before_the_transaction_step_is_refused_before_the_closure_runs() -> TestResult
{
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let s = schema(&h);
    let thief = h.db.as_ref().expect("postgres").store();
    let runs = Arc::new(AtomicU32::new(0));
    let worker = {
        let (s, runs) = (s.clone(), runs.clone());
        h.keiro
            .worker()
            .fast()
            .register("transfer", move |ctx: Ctx, (): ()| {
                let (s, runs, thief) = (s.clone(), runs.clone(), thief.clone());
                async move {
                    // Between two steps, with no action running, another worker takes over.
                    steal(&thief, Duration::from_secs(5))
                        .await
                        .map_err(|e| keiro_tests::crash(&e.to_string()))?;
                    ctx.transaction("move-30", move |tx| {
                        let (s, runs) = (s.clone(), runs.clone());
                        Box::pin(async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tx.execute(
                                &format!(
                                    "UPDATE {s}.accounts SET balance = balance - 30 WHERE id = 'a'"
                                ),
                                &[],
                            )
                            .await?;
                            Ok::<_, keiro::postgres::tokio_postgres::Error>(30i64)
                        })
                    })
                    .await
                }
            })
            .build()?
    };
    h.keiro.start("transfer", "t-1", &()).await?;
    worker.drain().await?;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the closure never ran");
    assert_eq!(balances(&h).await?, (100, 100, 0));
    let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.lease_owner.as_deref()),
        (Status::Running, Some("thief"))
    );
    assert!(
        journaled(&h).await?.iter().all(|s| s != "move-30"),
        "nothing journaled"
    );
    Ok(())
}

#[tokio::test]
async fn nobody_takes_a_run_over_while_its_transaction_step_runs() -> TestResult {
    // While the closure runs, another worker tries to take the lease over. The transaction
    // step holds the instance row from its first statement, so the takeover waits (here: gives
    // up after its lock timeout), and the transfer commits once.
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let s = schema(&h);
    let thief = h.db.as_ref().expect("postgres").store();
    let stolen = Arc::new(std::sync::Mutex::new(None::<Result<u64, String>>));
    let worker = {
        let (s, stolen) = (s.clone(), stolen.clone());
        h.keiro
            .worker()
            .fast()
            .register("transfer", move |ctx: Ctx, (): ()| {
                let (s, stolen, thief) = (s.clone(), stolen.clone(), thief.clone());
                async move {
                    ctx.transaction("move-30", move |tx| {
                        let (s, stolen, thief) = (s.clone(), stolen.clone(), thief.clone());
                        Box::pin(async move {
                            tx.batch_execute(&format!(
                                "UPDATE {s}.accounts SET balance = balance - 30 WHERE id = 'a';
                                 UPDATE {s}.accounts SET balance = balance + 30 WHERE id = 'b';
                                 INSERT INTO {s}.transfers VALUES ('t-1', 30);"
                            ))
                            .await?;
                            let outcome =
                                steal(&thief, Duration::from_millis(300))
                                    .await
                                    .map_err(|e| {
                                        e.code().map(|c| c.code().to_owned()).unwrap_or_default()
                                    });
                            *stolen.lock().unwrap() = Some(outcome);
                            Ok::<_, keiro::postgres::tokio_postgres::Error>(30i64)
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
        stolen.lock().unwrap().clone(),
        Some(Err("55P03".to_owned())),
        "the takeover waited for the transaction's row lock"
    );
    let row = h.keiro.instance(("transfer", "t-1")).await?.expect("row");
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(30))),
        "{:?}",
        row.last_error
    );
    assert_eq!(balances(&h).await?, (70, 130, 1));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Issue 33, item 1: session state a closure sets stays in its transaction step.

/// A Keiro over its own store of `pool_size` connections on the harness's schema.
async fn keiro_with_pool(
    h: &Harness,
    pool_size: usize,
) -> Result<(keiro::Keiro, keiro::postgres::PgStore), Box<dyn std::error::Error + Send + Sync>> {
    let config = keiro::postgres::Config {
        pool_size,
        ..h.db.as_ref().expect("postgres").config()
    };
    let store = keiro::postgres::PgStore::connect(config).await?;
    Ok((
        keiro::Keiro::builder(store.clone()).without_push().build(),
        store,
    ))
}

#[tokio::test]
async fn a_search_path_set_by_a_closure_does_not_leak_into_the_pool() -> TestResult {
    let h = Harness::postgres().await;
    let (keiro, _store) = keiro_with_pool(&h, 2).await?;
    let worker = keiro
        .worker()
        .fast()
        .register("leaky", |ctx: Ctx, (): ()| async move {
            ctx.transaction("set-path", |tx| {
                Box::pin(async move {
                    tx.batch_execute("SET search_path TO public").await?;
                    Ok::<_, keiro::postgres::tokio_postgres::Error>(1i64)
                })
            })
            .await
        })
        .register("plain", |ctx: Ctx, n: i64| async move {
            let a: i64 = ctx
                .step("a", || async move { Ok::<_, std::io::Error>(n) })
                .await?;
            let b: i64 = ctx
                .step("b", || async move { Ok::<_, std::io::Error>(a + 1) })
                .await?;
            Ok::<_, WorkflowError>(b)
        })
        .build()?;
    keiro.start("leaky", "l-1", &()).await?;
    let first = worker.drain().await?;
    assert_eq!(first.completed, 1, "{first:?}");
    for n in 0..50i64 {
        keiro.start("plain", &format!("p-{n}"), &n).await?;
    }
    let mut transient = first.transient_errors;
    for _ in 0..20 {
        let summary = worker.drain().await?;
        transient += summary.transient_errors;
        if summary.advanced == 0 {
            break;
        }
    }
    for n in 0..50i64 {
        let row = keiro
            .instance(("plain", format!("p-{n}").as_str()))
            .await?
            .expect("row");
        assert_eq!(
            (row.status, row.output),
            (Status::Completed, Some(serde_json::json!(n + 1))),
            "p-{n}: {:?}",
            row.last_error
        );
    }
    assert_eq!(
        transient, 0,
        "no store error on a connection the closure changed"
    );
    Ok(())
}

#[tokio::test]
async fn a_transaction_step_leaves_no_session_state_on_its_connection() -> TestResult {
    // A pool of one: the connection checked afterwards is the one the closure changed.
    let h = Harness::postgres().await;
    let s = schema(&h);
    let (keiro, store) = keiro_with_pool(&h, 1).await?;
    let worker = keiro
        .worker()
        .fast()
        .register("leaky", move |ctx: Ctx, (): ()| {
            let s = s.clone();
            async move {
                ctx.transaction("set-everything", move |tx| {
                    let s = s.clone();
                    Box::pin(async move {
                        tx.batch_execute(&format!(
                            "SET search_path TO public;
                             SET statement_timeout = '1234ms';
                             SET synchronous_commit = off;
                             SELECT pg_advisory_lock(4242);
                             CREATE TEMP TABLE scratch (x int);
                             PREPARE leftover AS SELECT 1;
                             DO $do$ BEGIN EXECUTE format('SET ROLE %I', session_user); END $do$;
                             SELECT 1 FROM {s}.workflows LIMIT 0;"
                        ))
                        .await?;
                        Ok::<_, keiro::postgres::tokio_postgres::Error>(1i64)
                    })
                })
                .await
            }
        })
        .build()?;
    let before = session_state(&store).await?;
    assert_eq!(
        before.0,
        h.db.as_ref().expect("postgres").schema(),
        "{before:?}"
    );
    keiro.start("leaky", "l-1", &()).await?;
    let summary = worker.drain().await?;
    assert_eq!(summary.completed, 1, "{summary:?}");
    assert_eq!(
        session_state(&store).await?,
        before,
        "the connection is as keiro opened it"
    );
    Ok(())
}

/// What a closure could leave behind on the one connection of `store`'s pool: search_path,
/// statement_timeout, synchronous_commit, the role set with SET ROLE, advisory locks
/// held, whether the temp table `scratch` exists, SQL-level prepared statements.
async fn session_state(
    store: &keiro::postgres::PgStore,
) -> Result<
    (String, String, String, String, i64, bool, i64),
    Box<dyn std::error::Error + Send + Sync>,
> {
    let client = store.pool().get().await?;
    let row = client
        .query_one(
            "SELECT current_setting('search_path'), current_setting('statement_timeout'),
                    current_setting('synchronous_commit'), current_setting('role'),
                    (SELECT count(*) FROM pg_locks
                     WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
                    to_regclass('pg_temp.scratch') IS NOT NULL,
                    (SELECT count(*) FROM pg_prepared_statements WHERE from_sql)",
            &[],
        )
        .await?;
    Ok((
        row.get(0),
        row.get(1),
        row.get(2),
        row.get(3),
        row.get(4),
        row.get(5),
        row.get(6),
    ))
}

#[tokio::test]
async fn a_write_skew_under_serializable_is_retried_in_place() -> TestResult {
    // A real serialization failure: the closure reads what another serializable transaction
    // then writes and commits, having read what the closure goes on to write. PostgreSQL
    // refuses the closure's transaction (at its write or at its commit); the retry, in a new
    // transaction, sees the other one's row and commits.
    let h = Harness::postgres().await;
    let s = schema(&h);
    sql(
        &h,
        &format!("CREATE TABLE {s}.shifts (doctor text NOT NULL, on_call boolean NOT NULL)"),
    )
    .await?;
    let other = h.db.as_ref().expect("postgres").store();
    let runs = Arc::new(AtomicU32::new(0));
    let worker = {
        let (s, runs) = (s.clone(), runs.clone());
        h.keiro
            .worker()
            .fast()
            .register("transfer", move |ctx: Ctx, (): ()| {
                let (s, runs, other) = (s.clone(), runs.clone(), other.clone());
                async move {
                    let options = TransactionOptions::new()
                        .isolation(IsolationLevel::Serializable)
                        .retry(quick_policy(1));
                    ctx.transaction_with("go-on-call", options, move |tx| {
                        let (s, runs, other) = (s.clone(), runs.clone(), other.clone());
                        Box::pin(async move {
                            let run = runs.fetch_add(1, Ordering::SeqCst);
                            let others: i64 = tx
                                .query_one(
                                    &format!(
                                        "SELECT count(*) FROM {s}.shifts \
                                         WHERE doctor = 'bob' AND on_call"
                                    ),
                                    &[],
                                )
                                .await?
                                .get(0);
                            if run == 0 {
                                let mut client = other.pool().get().await.expect("a connection");
                                let bob = client
                                    .build_transaction()
                                    .isolation_level(IsolationLevel::Serializable)
                                    .start()
                                    .await?;
                                bob.query_one(
                                    &format!(
                                        "SELECT count(*) FROM {s}.shifts \
                                         WHERE doctor = 'alice' AND on_call"
                                    ),
                                    &[],
                                )
                                .await?;
                                bob.execute(
                                    &format!("INSERT INTO {s}.shifts VALUES ('bob', true)"),
                                    &[],
                                )
                                .await?;
                                bob.commit().await?;
                            }
                            tx.execute(
                                &format!("INSERT INTO {s}.shifts VALUES ('alice', true)"),
                                &[],
                            )
                            .await?;
                            Ok::<_, keiro::postgres::tokio_postgres::Error>(others)
                        })
                    })
                    .await
                }
            })
            .build()?
    };
    h.keiro.start("transfer", "t-1", &()).await?;
    let (row, transient) = drive(&h, &worker, 1).await?;
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(1))),
        "the retry saw bob's shift: {:?}",
        row.last_error
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "refused once, then committed"
    );
    assert_eq!(transient, 0);
    assert_eq!(
        query_i64(&h, &format!("SELECT count(*) FROM {s}.shifts")).await?,
        2,
        "bob's shift and alice's, once each"
    );
    Ok(())
}

#[tokio::test]
async fn a_serialization_failure_inside_a_boxed_closure_error_is_retried_in_place() -> TestResult {
    // keiro finds the driver's error in the source chain of a boxed error too.
    let h = Harness::postgres().await;
    accounts(&h).await?;
    let conflict = conflicting(&h, ConflictAt::Statement, "40001", 2).await?;
    let s = schema(&h);
    let runs = Arc::new(AtomicU32::new(0));
    let worker = {
        let runs = runs.clone();
        h.keiro
            .worker()
            .fast()
            .register("transfer", move |ctx: Ctx, (): ()| {
                let (s, runs, conflict) = (s.clone(), runs.clone(), conflict.clone());
                async move {
                    ctx.transaction_with("move-30", quick_policy(1), move |tx| {
                        let (s, runs, conflict) = (s.clone(), runs.clone(), conflict.clone());
                        Box::pin(async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tx.batch_execute(&conflict).await?;
                            tx.batch_execute(&format!(
                                "UPDATE {s}.accounts SET balance = balance - 30 WHERE id = 'a';
                                 UPDATE {s}.accounts SET balance = balance + 30 WHERE id = 'b';
                                 INSERT INTO {s}.transfers VALUES ('t-1', 30);"
                            ))
                            .await?;
                            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(30i64)
                        })
                    })
                    .await
                }
            })
            .build()?
    };
    h.keiro.start("transfer", "t-1", &()).await?;
    let (row, transient) = drive(&h, &worker, 1).await?;
    assert_eq!(
        (row.status, row.output),
        (Status::Completed, Some(serde_json::json!(30))),
        "{:?}",
        row.last_error
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(transient, 0);
    assert_eq!(balances(&h).await?, (70, 130, 1));
    Ok(())
}
