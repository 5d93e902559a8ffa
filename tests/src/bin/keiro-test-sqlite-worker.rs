//! A worker process for the multi-process tests on one SQLite file: opens a `SqliteStore` on the
//! file and drives `ledgered` workflows, whose steps record every execution in a
//! [`StepLedger`] beside the store (which survives a SIGKILL and witnesses overlaps).
//!
//! Usage: `keiro-test-sqlite-worker <database-file> <ledger-dir> <lease-ttl-ms>`; runs until
//! killed.

use std::time::Duration;

use keiro::{Ctx, Worker, WorkflowError};
use keiro_sqlite::{Config, SqliteStore};
use keiro_tests::step_ledger::{Executed, Job, StepLedger};

/// How long each step body runs while holding its instance's ledger lock: long enough that a
/// second execution of the same instance at the same moment would meet the lock, and that a
/// SIGKILL often lands inside a step.
const STEP_BODY: Duration = Duration::from_millis(20);

/// The workflow: `job.steps` steps, each recorded in the ledger before it runs and returning its
/// value and this process's id; the output is the sum of the values, executed or replayed.
async fn ledgered(ctx: Ctx, job: Job, ledger: StepLedger) -> Result<u64, WorkflowError> {
    let id = ctx.key().id.to_string();
    let mut sum = 0;
    for n in 0..job.steps {
        let step = format!("step-{n}");
        let (ledger, id, name) = (ledger.clone(), id.clone(), step.clone());
        let executed: Executed = ctx
            .step(&step, || async move {
                let inside = ledger.enter(&id, &name)?;
                tokio::time::sleep(STEP_BODY).await;
                drop(inside);
                Ok::<_, std::io::Error>(Executed {
                    value: job.value(n),
                    pid: std::process::id(),
                })
            })
            .await?;
        sum += executed.value;
    }
    Ok(sum)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(file), Some(ledger), Some(ttl)) = (args.next(), args.next(), args.next()) else {
        return Err(
            "usage: keiro-test-sqlite-worker <database-file> <ledger-dir> <lease-ttl-ms>".into(),
        );
    };
    let ledger = StepLedger::open(ledger)?;
    let store = SqliteStore::open(file, Config::default())?;
    let worker = Worker::builder(store)
        .register("ledgered", move |ctx, job| {
            ledgered(ctx, job, ledger.clone())
        })
        .concurrency(8)
        .lease_ttl(Duration::from_millis(ttl.parse()?))
        .poll_interval(Duration::from_millis(50))
        .build()?;
    worker.run().await;
    Ok(())
}
