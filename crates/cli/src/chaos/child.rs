//! The chaos command's child processes: `keiro chaos-worker` (a push-aware resume worker with a
//! short lease) and `keiro chaos-remote-worker` (a remote worker with a short claim), both this
//! same binary.
//!
//! Each prints `ready` on stdout once connected, and runs until its stdin closes: a parent
//! that dies without cleaning up (even by SIGKILL) leaves no stray child behind.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use keiro::{Backoff, Keiro, RemoteWorkerOptions, TaskContext};

use super::witness::Witness;
use super::workload::{self, Input, LOCAL, MIXED, REMOTE_STEPS};
use crate::common::{connect_store, Global, Outcome, Result, ResultExt};

/// The line a child prints once it is connected and about to serve.
pub(crate) const READY: &str = "ready";

/// The crash ceiling of the chaos workers. A step fails (and its run crashes) when its witness
/// cannot be written while PostgreSQL restarts; the ceiling is not what this run tests.
const MAX_ATTEMPTS: i32 = 1_000;

/// The crash backoff of the chaos workers: short, so a run that crashed on a restart resumes
/// soon after PostgreSQL is back.
const BACKOFF: Backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1));

/// Options of the hidden `keiro chaos-worker`, passed by `keiro chaos`.
#[derive(Debug, Clone, Args)]
pub(crate) struct WorkerArgs {
    /// The chaos schema.
    #[arg(long)]
    pub(crate) chaos_schema: String,
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

/// Options of the hidden `keiro chaos-remote-worker`, passed by `keiro chaos`.
#[derive(Debug, Clone, Args)]
pub(crate) struct RemoteWorkerArgs {
    /// The chaos schema.
    #[arg(long)]
    pub(crate) chaos_schema: String,
    /// How long a claim lasts without a heartbeat, in milliseconds.
    #[arg(long)]
    pub(crate) claim_ttl_ms: u64,
    /// Handlers running at once.
    #[arg(long)]
    pub(crate) concurrency: usize,
}

/// Runs a chaos worker until stdin closes.
pub(crate) async fn worker(global: &Global, args: &WorkerArgs) -> Result<Outcome> {
    // One connection per concurrent run, plus one each for discovery and the timer loop.
    let store = connect_store(global.config(&args.chaos_schema, args.concurrency + 2)).await?;
    let witness = Arc::new(Witness::open(store.connection_config()).await?);
    let (local_witness, mixed_witness) = (witness.clone(), witness);
    let worker = Keiro::builder(store)
        .build()
        .worker()
        .register(LOCAL, move |ctx, input: Input| {
            workload::local(ctx, input, local_witness.clone())
        })
        .register(MIXED, move |ctx, input: Input| {
            workload::mixed(ctx, input, mixed_witness.clone())
        })
        .concurrency(args.concurrency)
        .lease_ttl(Duration::from_millis(args.lease_ttl_ms))
        .poll_interval(Duration::from_millis(args.poll_interval_ms))
        .max_attempts(MAX_ATTEMPTS)
        .backoff(BACKOFF)
        .owner(format!("worker-{}", std::process::id()))
        .build()
        .context("building the chaos worker")?;
    announce_ready()?;
    worker.run_until(stdin_closed()).await;
    Ok(Outcome::Success)
}

/// Runs a chaos remote worker until stdin closes.
pub(crate) async fn remote_worker(global: &Global, args: &RemoteWorkerArgs) -> Result<Outcome> {
    // Every running handler reports on a connection of its own; the claim needs one beside.
    let store = connect_store(global.config(&args.chaos_schema, args.concurrency + 2)).await?;
    let witness = Arc::new(Witness::open(store.connection_config()).await?);
    let worker_id: Arc<str> = Arc::from(format!("remote-{}", std::process::id()));
    let claim_ttl = Duration::from_millis(args.claim_ttl_ms);
    let options = RemoteWorkerOptions {
        worker_id: worker_id.to_string(),
        concurrency: args.concurrency,
        claim_ttl,
        heartbeat_every: claim_ttl / 3,
        // Push wakes it; the poll finds expired claims and tasks whose NOTIFY a restart lost.
        poll_interval: Duration::from_millis(500),
        drain_timeout: Duration::from_secs(5),
        ..RemoteWorkerOptions::default()
    };
    let mut builder = Keiro::builder(store)
        .build()
        .remote_worker()
        .context("building the chaos remote worker")?
        .options(options);
    for step in REMOTE_STEPS {
        let (witness, worker_id) = (witness.clone(), worker_id.clone());
        builder = builder.handle(step, move |input: u64, task: TaskContext| {
            workload::remote(witness.clone(), worker_id.clone(), step, input, task)
        });
    }
    let worker = builder.build();
    announce_ready()?;
    worker.run_until(stdin_closed()).await;
    Ok(Outcome::Success)
}

fn announce_ready() -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{READY}").context("announcing readiness")?;
    stdout.flush().context("announcing readiness")
}

/// Resolves when stdin closes: the parent asked this child to stop, or died.
async fn stdin_closed() {
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    // A plain thread: reading stdin blocks, and the runtime has no stdin support enabled.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = closed_tx.send(());
    });
    let _ = closed_rx.await;
}
