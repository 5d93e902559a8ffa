//! `keiro demo-worker`: the demo's worker process. `keiro demo` spawns it (twice) and kills the
//! first one with SIGKILL; it is an ordinary keiro worker (resume loop and timer loop, woken by
//! push where the store has it: LISTEN/NOTIFY on PostgreSQL) with a short lease, on the store
//! `DATABASE_URL` names.
//!
//! It runs until its stdin closes, then finishes its in-flight runs and prints one JSON line,
//! its [`WorkerReport`]. Tying its life to the pipe means that even a parent killed without a
//! chance to clean up leaves no stray worker behind.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use keiro::Keiro;
use serde::{Deserialize, Serialize};

use super::db::Db;
use super::wake;
use super::workflow::{self, Counters, Ledger};
use crate::common::{connect_store, open_sqlite, Global, Outcome, Result, ResultExt, Store};

/// The worker's options, passed by `keiro demo`.
#[derive(Debug, Clone, Args)]
pub(crate) struct WorkerArgs {
    /// The demo's schema (PostgreSQL).
    #[arg(long)]
    pub(crate) demo_schema: String,
    /// Lease time-to-live, in milliseconds.
    #[arg(long)]
    pub(crate) lease_ttl_ms: u64,
    /// Gap between idle passes, in milliseconds.
    #[arg(long)]
    pub(crate) poll_interval_ms: u64,
    /// Runs driven at once.
    #[arg(long)]
    pub(crate) concurrency: usize,
}

/// What a worker process did, printed as its last stdout line.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(crate) struct WorkerReport {
    /// The process id, as in the ledger's `pid` column.
    pub(crate) pid: u32,
    /// Step actions run.
    pub(crate) executed: u64,
    /// Steps answered from the journal.
    pub(crate) replayed: u64,
    /// Runs that completed.
    pub(crate) completed: u64,
}

/// Runs the worker until stdin closes.
pub(crate) async fn run(global: &Global, args: &WorkerArgs) -> Result<Outcome> {
    let (keiro, db) = match global.store()? {
        Store::Postgres => {
            // One connection per concurrent run, plus one each for the discovery query and the
            // timer loop beside them (the LISTEN connection is the store's own, outside the pool).
            let store =
                connect_store(global.config(&args.demo_schema, args.concurrency + 2)?).await?;
            let db = Db::postgres(store.connection_config()).await?;
            (Keiro::builder(store).build(), db)
        }
        Store::Sqlite(path) => (open_sqlite(&path).await?, Db::sqlite(&path).await?),
    };
    let ledger = Arc::new(Ledger::new(db));
    let counters = Arc::new(Counters::default());
    let body_counters = counters.clone();
    let (sleeper_log, waiter_log) = (ledger.clone(), ledger.clone());
    // With push: fired timers and completed awakeables wake this worker within milliseconds;
    // `poll_interval` stays the fallback that finds expired leases.
    let worker = keiro
        .worker()
        .register(workflow::WORKFLOW, move |ctx, input| {
            workflow::order(ctx, input, ledger.clone(), body_counters.clone())
        })
        .register(wake::SLEEPER, move |ctx, input| {
            wake::sleeper(ctx, input, sleeper_log.clone())
        })
        .register(wake::WAITER, move |ctx, input| {
            wake::waiter(ctx, input, waiter_log.clone())
        })
        .concurrency(args.concurrency)
        .lease_ttl(Duration::from_millis(args.lease_ttl_ms))
        .poll_interval(Duration::from_millis(args.poll_interval_ms))
        .build()
        .context("building the demo worker")?;

    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    // A plain thread: reading stdin blocks, and the runtime has no stdin support enabled.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = closed_tx.send(());
    });
    let summary = worker
        .run_until(async {
            let _ = closed_rx.await;
        })
        .await;

    let report = WorkerReport {
        pid: std::process::id(),
        executed: counters.executed.load(Ordering::Relaxed),
        replayed: counters.replayed.load(Ordering::Relaxed),
        completed: summary.completed,
    };
    println!(
        "{}",
        serde_json::to_string(&report).context("encoding the worker report")?
    );
    Ok(Outcome::Success)
}
