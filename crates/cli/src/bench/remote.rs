//! `remote`: remote steps through worker processes. This process runs the resume worker (it
//! dispatches the steps and resumes the runs); `--remote-workers` child processes
//! (`keiro bench-remote-worker`, this same binary) claim the tasks, run a trivial handler and
//! report. Two phases:
//!
//! 1. idle latency: `--samples` one-step workflows one after another, each started when
//!    everything is idle, so a worker can only learn of the task by NOTIFY (its poll is 1 s);
//! 2. throughput: N workflows of K remote steps started at once, C runs driven at once.
//!
//! Dispatch-to-result latency is read from the task rows on the database clock: from the
//! dispatching transaction (`created_at`) to the report's (`settled_at`).

use std::io::{BufRead, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use keiro::{
    remote::RemoteOptions, remote::RemoteWorkerOptions, remote::TaskContext, remote::TaskError,
    worker::ResumeLogEvent, worker::ResumeOptions, Ctx, Keiro, WorkflowError,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::{start_all, BenchArgs, Setup};
use crate::common::{connect_store, round, Global, Outcome, Result, ResultExt};

/// The registered workflow name.
const WORKFLOW: &str = "remote-bench";
/// The remote step (and worker group).
const STEP: &str = "echo";

/// The workflow's input.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct RemoteInput {
    steps: u64,
}

/// K remote steps in sequence, each adding one on a worker process.
async fn remote_workflow(ctx: Ctx, input: RemoteInput) -> Result<u64, WorkflowError> {
    let options = RemoteOptions::default();
    let mut value = 0u64;
    for i in 0..input.steps {
        // Each step has its own name: replay is keyed by name.
        let step = format!("{STEP}-{i}");
        value = ctx.remote(&step, &value, &options).await?;
    }
    Ok(value)
}

/// Options of the hidden `keiro bench-remote-worker`.
#[derive(Debug, Clone, Args)]
pub(crate) struct RemoteWorkerArgs {
    /// The bench's schema.
    #[arg(long)]
    pub(crate) bench_schema: String,
    /// Handlers running at once.
    #[arg(long)]
    pub(crate) concurrency: usize,
    /// The largest K the bench uses (one group per step name).
    #[arg(long)]
    pub(crate) steps: u64,
}

/// The remote worker process: serves `echo-0` .. `echo-<K-1>` until stdin closes, then prints
/// how many tasks it completed and how many round trips it made since the last line it read
/// on stdin (the bench writes one when its measured phase begins).
pub(crate) async fn worker(global: &Global, args: &RemoteWorkerArgs) -> Result<Outcome> {
    // Every running handler reports on a connection of its own; the claim needs one beside.
    let store = connect_store(global.config(&args.bench_schema, args.concurrency + 2)?).await?;
    let counted = store.clone();
    let keiro = Keiro::builder(store).build();
    let options = RemoteWorkerOptions {
        concurrency: args.concurrency,
        // NOTIFY wakes it; the poll is only a fallback, slow on purpose so the idle latency
        // measures push.
        poll_interval: Duration::from_secs(1),
        ..RemoteWorkerOptions::default()
    };
    let mut builder = keiro
        .remote_worker()
        .context("building the remote worker")?
        .options(options);
    for i in 0..args.steps {
        builder = builder.handle(
            &format!("{STEP}-{i}"),
            |value: u64, _task: TaskContext| async move { Ok::<_, TaskError>(value + 1) },
        );
    }
    let worker = builder.build();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
    let mark = Arc::new(AtomicU64::new(counted.round_trips()));
    let marked = Arc::clone(&mark);
    let marking = counted.clone();
    // A plain thread: reading stdin blocks, and the runtime has no stdin support enabled.
    std::thread::spawn(move || {
        for _line in std::io::stdin().lock().lines() {
            marked.store(marking.round_trips(), Ordering::Relaxed);
        }
        let _ = closed_tx.send(());
    });
    worker
        .run_until(async {
            let _ = closed_rx.await;
        })
        .await;
    let since_mark = counted.round_trips() - mark.load(Ordering::Relaxed);
    println!("{} {since_mark}", worker.stats().completed());
    Ok(Outcome::Success)
}

/// A remote worker child process; killed and reaped when dropped.
struct WorkerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl WorkerProcess {
    fn spawn(global: &Global, args: &BenchArgs, steps: u64) -> Result<Self> {
        let exe = std::env::current_exe().context("locating the keiro binary")?;
        let mut child = Command::new(exe)
            .env("DATABASE_URL", global.url())
            .env("KEIRO_SCHEMA", &global.schema)
            .arg("bench-remote-worker")
            .arg("--bench-schema")
            .arg(&args.bench_schema)
            .arg("--concurrency")
            .arg(args.remote_concurrency.to_string())
            .arg("--steps")
            .arg(steps.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning a remote worker process")?;
        let stdin = child.stdin.take();
        Ok(Self { child, stdin })
    }

    /// Tells the child the measured phase begins: it counts its round trips from here.
    fn mark(&mut self) -> Result<()> {
        if let Some(stdin) = self.stdin.as_mut() {
            writeln!(stdin, "mark").context("marking a remote worker's phase")?;
            stdin.flush().context("marking a remote worker's phase")?;
        }
        Ok(())
    }

    /// Closes stdin, waits for the child and returns the tasks it completed and its round
    /// trips since the last [`mark`](Self::mark).
    fn stop(mut self) -> Result<(u64, u64)> {
        drop(self.stdin.take());
        let _ = self.child.wait().context("waiting for a remote worker")?;
        let mut out = String::new();
        if let Some(mut pipe) = self.child.stdout.take() {
            pipe.read_to_string(&mut out)
                .context("reading a remote worker's report")?;
        }
        let mut numbers = out
            .lines()
            .last()
            .unwrap_or_default()
            .split_whitespace()
            .map(|n| n.parse::<u64>().unwrap_or(0));
        Ok((numbers.next().unwrap_or(0), numbers.next().unwrap_or(0)))
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Counts completions through the worker's log hook.
struct Completions {
    count: AtomicU64,
    notify: Notify,
}

impl Completions {
    async fn wait_for(&self, target: u64, within: Duration) -> bool {
        tokio::time::timeout(within, async {
            loop {
                let notified = self.notify.notified();
                if self.count.load(Ordering::Relaxed) >= target {
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok()
    }
}

/// Dispatch-to-result percentiles of the tasks whose step id starts with a prefix.
const TASK_LATENCY: &str = "SELECT count(*),
    coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 0),
    coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 0),
    coalesce(max(ms), 0)
  FROM (SELECT extract(epoch FROM settled_at - created_at)::float8 * 1000 AS ms
        FROM remote_tasks WHERE step_id LIKE $1 AND status = 'completed') AS done";

/// Runs `worker` until the returned sender fires (or is dropped).
fn spawn_worker(
    worker: keiro::Worker,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<keiro::worker::ResumeSummary>,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stop_rx.await;
            })
            .await
    });
    (stop_tx, task)
}

/// The remote figures; serialized as the last line.
#[derive(Debug, Serialize)]
struct RemoteReport {
    mode: &'static str,
    remote_workers: u64,
    remote_concurrency: u64,
    idle_samples: u64,
    idle_dispatch_to_result_p50_ms: f64,
    idle_dispatch_to_result_p99_ms: f64,
    idle_start_to_completion_p50_ms: f64,
    workflows: u64,
    steps: u64,
    concurrency: u64,
    elapsed_s: f64,
    remote_steps_per_s: f64,
    dispatch_to_result_p50_ms: f64,
    dispatch_to_result_p99_ms: f64,
    round_trips_per_remote_step: f64,
    worker_round_trips_per_remote_step: f64,
}

async fn task_latency(setup: &Setup, prefix: &str) -> Result<(u64, f64, f64)> {
    let row = setup
        .db
        .query_one(TASK_LATENCY, &[&format!("{WORKFLOW}/{prefix}-%")])
        .await
        .context("reading task latencies")?;
    Ok((
        u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
        row.get(1),
        row.get(2),
    ))
}

/// The remote mode.
pub(super) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let workflows = args.workflows();
    let concurrency = usize::try_from(args.concurrency).context("--concurrency")?;
    let setup = Setup::new(
        global,
        args,
        concurrency + usize::try_from(args.producers).context("--producers")? + 2,
    )
    .await?;
    let keiro = Keiro::builder(setup.store.clone()).build();
    let completions = Arc::new(Completions {
        count: AtomicU64::new(0),
        notify: Notify::new(),
    });
    let log = {
        let (completions, default_log) = (completions.clone(), ResumeOptions::default().log);
        Arc::new(move |event: &ResumeLogEvent| {
            if let ResumeLogEvent::PassFinished { summary } = event {
                if summary.completed > 0 {
                    completions
                        .count
                        .fetch_add(summary.completed, Ordering::Relaxed);
                    completions.notify.notify_waiters();
                }
            }
            default_log(event);
        })
    };
    let resume_worker = |concurrency: usize| {
        keiro
            .worker()
            .register(WORKFLOW, remote_workflow)
            .concurrency(concurrency)
            .poll_interval(Duration::from_millis(args.poll_interval_ms))
            .log(log.clone())
            .build()
            .context("building the resume worker")
    };
    let (stop_tx, worker_task) = spawn_worker(resume_worker(concurrency)?);
    let mut processes: Vec<WorkerProcess> = (0..args.remote_workers)
        .map(|_| WorkerProcess::spawn(global, args, args.steps))
        .collect::<Result<_>>()?;
    println!(
        "bench: remote: {} worker process(es) x {} handlers; idle phase {} samples; throughput \
         phase {} workflows x {} remote steps, resume concurrency {}, schema {}",
        args.remote_workers,
        args.remote_concurrency,
        args.samples,
        workflows,
        args.steps,
        args.concurrency,
        args.bench_schema
    );
    // Let the workers connect and LISTEN before the first dispatch.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Phase 1: one run at a time, everything idle in between.
    let mut idle_e2e = Vec::new();
    for i in 0..args.samples {
        let before = completions.count.load(Ordering::Relaxed);
        let started = Instant::now();
        keiro
            .start(
                WORKFLOW,
                &super::instance_id("idle", i),
                &RemoteInput { steps: 1 },
            )
            .await
            .context("starting an idle sample")?;
        if !completions
            .wait_for(before + 1, Duration::from_secs(30))
            .await
        {
            println!("bench: FAIL: idle sample {i} did not complete within 30 s");
            return Ok(Outcome::Failed);
        }
        idle_e2e.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(args.gap_ms)).await;
    }
    let (idle_n, idle_p50, idle_p99) = task_latency(&setup, "idle").await?;
    let idle_e2e = super::Percentiles::of(&idle_e2e);
    println!(
        "bench: idle: dispatch-to-result p50 {idle_p50:.2} ms, p99 {idle_p99:.2} ms over {idle_n} \
         tasks; start-to-completion p50 {:.2} ms",
        idle_e2e.p50_ms
    );

    // Phase 2: the workflows are all started first, then a fresh resume worker drives them, so
    // the figure is that of remote steps (starts are `throughput`'s business; their
    // synchronous, notifying commits would also contend with the steps' here).
    let _ = stop_tx.send(());
    let _ = worker_task.await;
    let before = completions.count.load(Ordering::Relaxed);
    let starts_began = Instant::now();
    start_all(
        &keiro,
        WORKFLOW,
        "load",
        workflows,
        args.producers,
        RemoteInput { steps: args.steps },
    )
    .await?;
    let starts = starts_began.elapsed();
    for process in &mut processes {
        process.mark()?;
    }
    let round_trips_before = setup.store.round_trips();
    let started = Instant::now();
    let (stop_tx, worker_task) = spawn_worker(resume_worker(concurrency)?);
    let done = completions
        .wait_for(before + workflows, Duration::from_secs(args.timeout_s))
        .await;
    let elapsed = started.elapsed();
    let round_trips = setup.store.round_trips() - round_trips_before;
    let _ = stop_tx.send(());
    let _ = worker_task.await;
    let (mut remote_completed, mut worker_round_trips) = (0, 0);
    for process in processes {
        let (completed, round_trips) = process.stop()?;
        remote_completed += completed;
        worker_round_trips += round_trips;
    }
    if !done {
        println!(
            "bench: FAIL: the throughput phase did not finish within {} s",
            args.timeout_s
        );
        return Ok(Outcome::Failed);
    }
    println!(
        "bench: started {workflows} workflows in {:.0} ms before the resume worker began",
        crate::common::ms(starts)
    );
    let (load_n, p50, p99) = task_latency(&setup, "load").await?;
    let remote_steps = workflows * args.steps;
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
    let (steps_f, round_trips_f, worker_round_trips_f) = (
        remote_steps as f64,
        round_trips as f64,
        worker_round_trips as f64,
    );
    let secs = elapsed.as_secs_f64();
    println!(
        "bench: throughput: {remote_steps} remote steps in {secs:.2} s = {:.0} remote steps/s; \
         dispatch-to-result p50 {p50:.2} ms, p99 {p99:.2} ms over {load_n} tasks; round trips \
         per remote step {:.2} from this process ({round_trips}) + {:.2} from the remote \
         workers ({worker_round_trips}: claims and reports); workers completed \
         {remote_completed} tasks",
        steps_f / secs,
        round_trips_f / steps_f,
        worker_round_trips_f / steps_f
    );
    let report = RemoteReport {
        mode: "remote",
        remote_workers: args.remote_workers,
        remote_concurrency: args.remote_concurrency,
        idle_samples: args.samples,
        idle_dispatch_to_result_p50_ms: round(idle_p50, 2),
        idle_dispatch_to_result_p99_ms: round(idle_p99, 2),
        idle_start_to_completion_p50_ms: idle_e2e.p50_ms,
        workflows,
        steps: args.steps,
        concurrency: args.concurrency,
        elapsed_s: round(secs, 3),
        remote_steps_per_s: round(steps_f / secs, 1),
        dispatch_to_result_p50_ms: round(p50, 2),
        dispatch_to_result_p99_ms: round(p99, 2),
        round_trips_per_remote_step: round(round_trips_f / steps_f, 3),
        worker_round_trips_per_remote_step: round(worker_round_trips_f / steps_f, 3),
    };
    super::emit(&report)?;
    Ok(if load_n == remote_steps {
        Outcome::Success
    } else {
        Outcome::Failed
    })
}
