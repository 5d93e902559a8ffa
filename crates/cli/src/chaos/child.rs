//! The chaos command's child processes: `keiro chaos-worker` (a push-aware resume worker with a
//! short lease), `keiro chaos-remote-worker` (a remote worker with a short claim) and `keiro
//! chaos-direct` (callers running the direct instances with `Worker::run_named`), all this same
//! binary.
//!
//! Each opens the store the chaos command runs on (the chaos schema, or the SQLite file, which
//! several processes share as they would share a server) and prints `ready` on stdout once
//! connected, and runs until its stdin closes: a parent
//! that dies without cleaning up (even by SIGKILL) leaves no stray child behind. Under `--profile
//! queue` the workers also serve the queue (`--queue`) and, with the direct callers, stamp
//! their local steps' ends (`--witness-ends`: the workers' `--queue` implies it).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use keiro::{
    remote::RemoteWorkerOptions, remote::TaskContext, worker::Tuning, Backoff, DirectError, Keiro,
    ResultError,
};

use super::witness::Witness;
use super::workload::{
    self, direct_instances, instance_id, Input, Output, LOCAL, MIXED, REMOTE_STEPS,
};
use crate::common::{
    connect_store, failure, open_sqlite, Global, Outcome, Result, ResultExt, Store,
};

/// The line a child prints once it is connected and about to serve.
pub(crate) const READY: &str = "ready";

/// The crash ceiling of the chaos workers. A step fails (and its run crashes) when its witness
/// cannot be written while PostgreSQL restarts; the ceiling is not what this run tests.
const MAX_ATTEMPTS: i32 = 1_000;

/// The crash backoff of the chaos workers: short, so a run that crashed on a restart resumes
/// soon after PostgreSQL is back.
const BACKOFF: Backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_secs(1));

/// The chaos workers' tuning: [`MAX_ATTEMPTS`] and [`BACKOFF`], the rest default.
fn tuning() -> Tuning {
    Tuning {
        max_attempts: MAX_ATTEMPTS,
        backoff: BACKOFF,
        ..Tuning::default()
    }
}

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
    /// The queue this worker serves (`--profile queue`); its local steps then stamp their
    /// witnesses' ends.
    #[arg(long)]
    pub(crate) queue: Option<String>,
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

/// Options of the hidden `keiro chaos-direct`, passed by `keiro chaos`.
#[derive(Debug, Clone, Args)]
pub(crate) struct DirectArgs {
    /// The chaos schema.
    #[arg(long)]
    pub(crate) chaos_schema: String,
    /// Lease time-to-live of the runs it drives, in milliseconds.
    #[arg(long)]
    pub(crate) lease_ttl_ms: u64,
    /// Instances of the run (the direct ones among `1..=instances` are this process's).
    #[arg(long)]
    pub(crate) instances: u64,
    /// Callers running at once.
    #[arg(long)]
    pub(crate) concurrency: usize,
    /// Local steps stamp their witnesses' ends (`--profile queue`).
    #[arg(long)]
    pub(crate) witness_ends: bool,
}

/// How long a direct caller waits before it calls again after an error another call can mend
/// (PostgreSQL restarting, say).
const DIRECT_RETRY: Duration = Duration::from_millis(100);

/// What a direct caller does after its call of `run_named` failed.
#[derive(Debug, PartialEq, Eq)]
enum AfterError {
    /// Call again: the database was away, or the run was still going when the wait ended.
    CallAgain,
    /// Go on to the next instance: the run failed or was cancelled, which the invariants
    /// report.
    NextInstance,
    /// Stop the process: calling again cannot mend it (an unknown workflow, a refused input, a
    /// started instance gone missing, an output that does not decode), and its exit is a
    /// problem the chaos command reports.
    GiveUp,
}

impl AfterError {
    fn of(error: &DirectError) -> Self {
        match error {
            error if error.is_final() => Self::NextInstance,
            DirectError::Start { .. }
            | DirectError::Result(ResultError::Timeout { .. } | ResultError::Store { .. }) => {
                Self::CallAgain
            }
            _ => Self::GiveUp,
        }
    }
}

/// Runs every direct instance of the run with `Worker::run_named`, callers side by side, then
/// waits until stdin closes. A replacement of a killed process runs them all again: an instance
/// already completed answers at once, one a killed caller left leased is awaited while a resume
/// worker recovers it. It drives no worker loop of its own: what its runs park or crash on is
/// the resume workers' to finish.
pub(crate) async fn direct(global: &Global, args: &DirectArgs) -> Result<Outcome> {
    // One connection per caller, plus one for result waits.
    let (keiro, witness) = open(
        global,
        &args.chaos_schema,
        args.concurrency + 2,
        args.witness_ends,
    )
    .await?;
    let witness = Arc::new(witness);
    let worker = keiro
        .worker()
        .register(LOCAL, move |ctx, input: Input| {
            workload::local(ctx, input, witness.clone())
        })
        .lease_ttl(Duration::from_millis(args.lease_ttl_ms))
        .tuning(tuning())
        .owner(format!("direct-{}", std::process::id()))
        .build()
        .context("building the chaos direct callers")?;
    announce_ready()?;
    let ids: Arc<Vec<u64>> = Arc::new(direct_instances(args.instances).collect());
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency.max(1) {
        let (worker, ids, next) = (worker.clone(), ids.clone(), next.clone());
        callers.spawn(async move {
            while let Some(&n) = ids.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                let id = instance_id(n);
                loop {
                    let called = worker
                        .run_named::<Output, _>(LOCAL, &id, &Input { n })
                        .await;
                    // A wrong output is the invariants' to report, as a failed run is.
                    let Err(error) = called else { break };
                    match AfterError::of(&error) {
                        AfterError::CallAgain => tokio::time::sleep(DIRECT_RETRY).await,
                        AfterError::NextInstance => break,
                        AfterError::GiveUp => {
                            return Err(format!("running {LOCAL} {id}: {error:?}"));
                        }
                    }
                }
            }
            Ok(())
        });
    }
    // Done or not, it runs until asked to stop, as the workers do: a child that exits on its
    // own after it was ready is a problem to the chaos command, which is how giving up shows.
    let closed = stdin_closed();
    tokio::pin!(closed);
    let called_all = async {
        while let Some(joined) = callers.join_next().await {
            joined
                .context("a direct caller task failed")?
                .map_err(failure)?;
        }
        Ok::<_, crate::common::Error>(())
    };
    tokio::select! {
        called = called_all => {
            called?;
            closed.await;
        }
        () = &mut closed => {}
    }
    Ok(Outcome::Success)
}

/// Runs a chaos worker until stdin closes.
pub(crate) async fn worker(global: &Global, args: &WorkerArgs) -> Result<Outcome> {
    // One connection per concurrent run, plus one each for discovery and the timer loop.
    let (keiro, witness) = open(
        global,
        &args.chaos_schema,
        args.concurrency + 2,
        args.queue.is_some(),
    )
    .await?;
    let witness = Arc::new(witness);
    let (local_witness, mixed_witness) = (witness.clone(), witness);
    let mut builder = keiro
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
        .tuning(tuning())
        .owner(format!("worker-{}", std::process::id()));
    if let Some(queue) = &args.queue {
        builder = builder.queue(queue.clone());
    }
    let worker = builder.build().context("building the chaos worker")?;
    announce_ready()?;
    worker.run_until(stdin_closed()).await;
    Ok(Outcome::Success)
}

/// Runs a chaos remote worker until stdin closes.
pub(crate) async fn remote_worker(global: &Global, args: &RemoteWorkerArgs) -> Result<Outcome> {
    // Every running handler reports on a connection of its own; the claim needs one beside.
    let (keiro, witness) = open(global, &args.chaos_schema, args.concurrency + 2, false).await?;
    let witness = Arc::new(witness);
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
    let mut builder = keiro
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

/// Opens the store the chaos command names (the chaos schema with a pool of `pool_size`, or
/// the SQLite file) and this process's witness connection to the same database (whose local
/// steps stamp their ends when `ends`).
async fn open(
    global: &Global,
    schema: &str,
    pool_size: usize,
    ends: bool,
) -> Result<(Keiro, Witness)> {
    match global.store()? {
        Store::Postgres => {
            let store = connect_store(global.config(schema, pool_size)?).await?;
            let witness = Witness::postgres(store.connection_config(), ends).await?;
            Ok((Keiro::builder(store).build(), witness))
        }
        Store::Sqlite(path) => {
            let keiro = open_sqlite(&path).await?;
            Ok((keiro, Witness::sqlite(&path, ends).await?))
        }
    }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use keiro::{workflow::WorkflowName, DirectError, InstanceKey, ResultError};

    use super::AfterError;

    #[test]
    fn a_direct_caller_calls_again_only_when_another_call_can_mend_it() {
        let key = InstanceKey::parse("chaos-local", "chaos-00001").unwrap();
        let timeout = ResultError::Timeout {
            key: key.clone(),
            waited: Duration::from_secs(1),
        };
        assert_eq!(AfterError::of(&timeout.into()), AfterError::CallAgain);
        let failed = ResultError::Failed {
            key: key.clone(),
            reason: "poisoned".into(),
        };
        assert_eq!(AfterError::of(&failed.into()), AfterError::NextInstance);
        let missing = ResultError::NotFound { key };
        assert_eq!(AfterError::of(&missing.into()), AfterError::GiveUp);
        let unregistered = DirectError::Unregistered {
            name: WorkflowName::new("nobody").unwrap(),
        };
        assert_eq!(AfterError::of(&unregistered), AfterError::GiveUp);
    }
}
