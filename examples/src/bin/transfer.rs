//! A money transfer between two accounts of the application's own tables, as an exactly-once
//! database step (`ctx.transaction`): the debit, the credit and the step's journal row commit
//! in one transaction. The example runs the transfer once for every point a crash can hit (in
//! the middle of the statements, before the journal append, after the commit) and checks after
//! each that the money moved exactly once and the balances still add up.
//!
//! ```sh
//! cargo run -p keiro-examples --bin transfer
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use keiro::postgres::TransactionStep;
use keiro::{Ctx, Keiro, Status, WorkflowError};

/// Where the first attempt of a transfer crashes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CrashAt {
    Nowhere,
    BetweenDebitAndCredit,
    BeforeTheJournalAppend,
    AfterTheCommit,
}

const CRASH_POINTS: [CrashAt; 4] = [
    CrashAt::Nowhere,
    CrashAt::BetweenDebitAndCredit,
    CrashAt::BeforeTheJournalAppend,
    CrashAt::AfterTheCommit,
];

/// The transfer's input: the crash to inject, and the amount in cents.
#[derive(serde::Serialize, serde::Deserialize)]
struct Transfer {
    id: String,
    cents: i64,
}

fn transfer_workflow(
    crash_at: CrashAt,
) -> impl Fn(Ctx, Transfer) -> keiro::workflow::BoxFuture<'static, Result<i64, WorkflowError>> + Clone
{
    let crashed = Arc::new(AtomicBool::new(false));
    move |ctx: Ctx, transfer: Transfer| {
        let crashed = crashed.clone();
        Box::pin(async move {
            let first_attempt = !crashed.load(Ordering::SeqCst);
            let crash_here = move |point: CrashAt| point == crash_at && first_attempt;
            let c = crashed.clone();
            let moved: i64 = ctx
                .transaction("move-money", move |tx| {
                    // The closure may run more than once (a serialization failure is tried
                    // again in place), so it clones what its future takes.
                    let (id, c) = (transfer.id.clone(), c.clone());
                    Box::pin(async move {
                        tx.execute(
                            "UPDATE bank.accounts SET balance = balance - $1 WHERE id = 'alice'",
                            &[&transfer.cents],
                        )
                        .await?;
                        if crash_here(CrashAt::BetweenDebitAndCredit) {
                            c.store(true, Ordering::SeqCst);
                            panic!("injected crash between the debit and the credit");
                        }
                        tx.execute(
                            "UPDATE bank.accounts SET balance = balance + $1 WHERE id = 'bob'",
                            &[&transfer.cents],
                        )
                        .await?;
                        tx.execute(
                            "INSERT INTO bank.transfers (id, cents) VALUES ($1, $2)",
                            &[&id, &transfer.cents],
                        )
                        .await?;
                        if crash_here(CrashAt::BeforeTheJournalAppend) {
                            c.store(true, Ordering::SeqCst);
                            panic!("injected crash before the journal append");
                        }
                        Ok::<_, keiro::postgres::tokio_postgres::Error>(transfer.cents)
                    })
                })
                .await?;
            if crash_here(CrashAt::AfterTheCommit) {
                crashed.store(true, Ordering::SeqCst);
                return Err(WorkflowError::Step {
                    step: "after-commit".into(),
                    message: "injected crash after the commit".into(),
                });
            }
            Ok(moved)
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The injected crashes are panics inside the step; one line each is enough.
    std::panic::set_hook(Box::new(|info| eprintln!("  {info}")));
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut config = keiro::postgres::Config::new(url);
    config.schema = "keiro_transfer".into();
    let keiro = Keiro::connect(config).await?;
    let bank = keiro
        .store()
        .as_any()
        .and_then(|any| any.downcast_ref::<keiro::postgres::PgStore>())
        .ok_or("the Postgres store")?
        .pool()
        .get()
        .await?;
    bank.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS bank;
         DROP TABLE IF EXISTS bank.accounts, bank.transfers;
         CREATE TABLE bank.accounts (id text PRIMARY KEY, balance bigint NOT NULL);
         CREATE TABLE bank.transfers (id text PRIMARY KEY, cents bigint NOT NULL);
         INSERT INTO bank.accounts VALUES ('alice', 1000), ('bob', 1000);",
    )
    .await?;

    for (n, crash_at) in (1i64..).zip(CRASH_POINTS) {
        let id = format!("transfer-{}-{n}", std::process::id());
        keiro
            .start(
                "transfer",
                &id,
                &Transfer {
                    id: id.clone(),
                    cents: 100,
                },
            )
            .await?;
        let worker = keiro
            .worker()
            .register("transfer", transfer_workflow(crash_at))
            .build()?;
        let watcher = (keiro.clone(), id.clone());
        worker
            .run_until(async move {
                let (keiro, id) = watcher;
                while !matches!(keiro.instance(("transfer", &id)).await,
                    Ok(Some(row)) if row.status.is_terminal())
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            })
            .await;
        let row = keiro
            .instance(("transfer", &id))
            .await?
            .ok_or("the transfer exists")?;
        let balances = bank
            .query(
                "SELECT (SELECT balance FROM bank.accounts WHERE id = 'alice'), \
                        (SELECT balance FROM bank.accounts WHERE id = 'bob'), \
                        (SELECT count(*) FROM bank.transfers)",
                &[],
            )
            .await?;
        let (alice, bob, transfers): (i64, i64, i64) =
            (balances[0].get(0), balances[0].get(1), balances[0].get(2));
        let moved_once = transfers == n && alice == 1000 - 100 * transfers;
        println!(
            "crash {crash_at:?}: {} · alice {alice} bob {bob} (sum {}) · {transfers} transfers · {}",
            row.status,
            alice + bob,
            if row.status == Status::Completed && alice + bob == 2000 && moved_once {
                "exactly once"
            } else {
                "WRONG"
            }
        );
        if row.status != Status::Completed || alice + bob != 2000 || !moved_once {
            return Err(format!("the transfer with a crash {crash_at:?} went wrong").into());
        }
    }
    Ok(())
}
