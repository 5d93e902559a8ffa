//! `throughput`: N workflows of K trivial steps through an in-process worker driving C runs at
//! once, while a few producer tasks start the N workflows concurrently. Measured from the first
//! start to the last completion, and honest end to end: the round trips include the starts,
//! the discovery passes and the claims, not only the step appends.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use keiro::{worker::ResumeLogEvent, worker::ResumeOptions, Ctx, Keiro, WorkflowError};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::phases::{self, server_stats, Phases};
use super::{server, start_all_many, Background, BenchArgs, MetricsSink, Setup};
use crate::common::{ms, resident_memory_mb, round, Global, Outcome, Result, ResultExt};

/// The registered workflow name.
pub(super) const WORKFLOW: &str = "bench";

/// The bench workflow's input.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct BenchInput {
    /// Steps per workflow (K).
    pub(super) steps: u64,
}

/// The worker every workflow bench runs: `bench_workflow` registered, `concurrency` runs at a
/// time, the bench's poll interval; the caller adds its own options.
pub(super) fn bench_worker(
    keiro: &Keiro,
    args: &BenchArgs,
    concurrency: usize,
) -> keiro::WorkerBuilder {
    keiro
        .worker()
        .register(WORKFLOW, bench_workflow)
        .concurrency(concurrency)
        .poll_interval(Duration::from_millis(args.poll_interval_ms))
}

/// K trivial steps: the cost measured is keiro's, not the work's.
pub(super) async fn bench_workflow(ctx: Ctx, input: BenchInput) -> Result<u64, WorkflowError> {
    let mut sum = 0;
    for i in 0..input.steps {
        sum += ctx
            .step(
                &format!("step-{i}"),
                || async move { Ok::<_, Infallible>(i) },
            )
            .await?;
    }
    Ok(sum)
}

// Each run's first admission and its completion, on the database clock, in order.
const ADMISSIONS: &str = "SELECT extract(epoch FROM queue_admitted_at)::float8 \
     FROM workflows WHERE queue = 'bench' AND queue_admitted_at IS NOT NULL \
     ORDER BY queue_admitted_at";
const COMPLETIONS: &str = "SELECT extract(epoch FROM completed_at)::float8 \
     FROM workflows WHERE queue = 'bench' AND completed_at IS NOT NULL ORDER BY completed_at";

/// Admission latency at a concurrency limit of `limit`: the (i + limit)-th admission took the
/// slot the i-th completion freed, so their gap (in ms) is how long a waiting run took to be
/// admitted once a slot was free. p50 and p99; `None` without a limit.
async fn admission_latency(
    db: &tokio_postgres::Client,
    limit: Option<i32>,
) -> Result<Option<(f64, f64)>> {
    let Some(limit) = limit.and_then(|l| usize::try_from(l).ok()) else {
        return Ok(None);
    };
    let read =
        |rows: Vec<tokio_postgres::Row>| -> Vec<f64> { rows.iter().map(|r| r.get(0)).collect() };
    let admitted = read(
        db.query(ADMISSIONS, &[])
            .await
            .context("reading admissions")?,
    );
    let completed = read(
        db.query(COMPLETIONS, &[])
            .await
            .context("reading completions")?,
    );
    let mut gaps: Vec<f64> = admitted
        .iter()
        .skip(limit)
        .zip(&completed)
        .map(|(admitted, freed)| ((admitted - freed) * 1000.0).max(0.0))
        .collect();
    if gaps.is_empty() {
        return Ok(None);
    }
    gaps.sort_by(f64::total_cmp);
    let at = |q: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((gaps.len() - 1) as f64 * q).round() as usize;
        gaps[i]
    };
    Ok(Some((at(0.5), at(0.99))))
}

/// Noticed through the worker's log hook: the moment completions reach the target, with a
/// store counter (round trips, commits) at that moment, so idle passes after the end are not
/// counted.
pub(super) struct FinishLine {
    target: u64,
    pub(super) completed: AtomicU64,
    /// Passes finished, for the report: each costs one discovery query.
    pub(super) passes: AtomicU64,
    pub(super) reached: OnceLock<(Instant, u64)>,
    pub(super) notify: Notify,
}

impl FinishLine {
    /// A line at `target` completions.
    pub(super) fn new(target: u64) -> Self {
        Self {
            target,
            completed: AtomicU64::new(0),
            passes: AtomicU64::new(0),
            reached: OnceLock::new(),
            notify: Notify::new(),
        }
    }

    /// Counts a pass that completed `completed` runs; `counter` reads the store's counter.
    pub(super) fn on_pass(&self, completed: u64, counter: impl FnOnce() -> u64) {
        if self.reached.get().is_none() {
            self.passes.fetch_add(1, Ordering::Relaxed);
        }
        let total = self.completed.fetch_add(completed, Ordering::Relaxed) + completed;
        if total >= self.target {
            self.reached.get_or_init(|| (Instant::now(), counter()));
            self.notify.notify_one();
        }
    }

    /// Waits until the line is reached, for up to `timeout`.
    pub(super) async fn wait(&self, timeout: Duration) -> Option<(Instant, u64)> {
        tokio::time::timeout(timeout, async {
            loop {
                if let Some(reached) = self.reached.get() {
                    break *reached;
                }
                self.notify.notified().await;
            }
        })
        .await
        .ok()
    }
}

/// The throughput figures; serialized as the last line, keys in this order.
#[derive(Debug, Serialize)]
struct ThroughputReport {
    mode: &'static str,
    workflows: u64,
    /// Steps per workflow (K).
    steps: u64,
    concurrency: u64,
    elapsed_s: f64,
    workflows_per_s: f64,
    steps_per_s: f64,
    round_trips_per_step: f64,
    /// Transactions the server committed in the bench's database during the measured phase,
    /// per workflow (`pg_stat_database.xact_commit`).
    commits_per_workflow: f64,
    /// CPU time of the server's processes for this database per workflow, in milliseconds;
    /// `null` when the server is not on this machine.
    pg_cpu_ms_per_workflow: Option<f64>,
    /// CPU time of the bench process (worker, producers) per workflow, in milliseconds.
    keiro_cpu_ms_per_workflow: Option<f64>,
    /// The share of the whole machine's CPU time that was idle during the phase (0 to 1;
    /// `null` without `/proc/stat`).
    host_idle_share: Option<f64>,
    /// Calls per group-commit batch of the append lane (steps and completions), and of the
    /// start lane; `null` with batching off.
    append_batch_mean: Option<f64>,
    start_batch_mean: Option<f64>,
    p50_ms: f64,
    p99_ms: f64,
    /// Resident memory of the bench process (worker and producers) at the end, and its peak.
    rss_mb: f64,
    rss_peak_mb: f64,
    round_trips: u64,
    producers: u64,
    metrics: bool,
    /// Payloads sealed with AES-256-GCM (`--codec`).
    codec: bool,
    batching: bool,
    /// Starts per `start_many` call (1: one `start` each).
    start_batch: u64,
    /// Runs in progress on another owner, seeded in front (`--in-progress`).
    in_progress: u64,
    /// Keys of the queue the workflows were started on (`--queue-keys`; 0: no queue).
    queue_keys: u64,
    /// Admission at the queue's concurrency limit, p50 and p99 in ms (`--queue-concurrency`).
    admission_p50_ms: Option<f64>,
    admission_p99_ms: Option<f64>,
    /// Where the time went (`phases`).
    phases: Phases,
}

/// Start-to-completion latency from the instance rows, and the same span the wall clock saw
/// as the database saw it.
const THROUGHPUT_LATENCY: &str = "SELECT count(*),
    percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
    percentile_cont(0.99) WITHIN GROUP (ORDER BY ms),
    extract(epoch FROM max(completed_at) - min(created_at))::float8
  FROM (SELECT completed_at, created_at,
               extract(epoch FROM completed_at - created_at)::float8 * 1000 AS ms
        FROM workflows WHERE workflow_name = $1 AND status = 'completed') AS done";

/// `--in-progress`: runs other workers hold, older than every measured run.
const SEED_IN_PROGRESS: &str = "INSERT INTO workflows (workflow_name, workflow_id, created_at, \
     lease_owner, lease_epoch, lease_expires_at) \
     SELECT $1, 'held-' || g, now() - interval '1 hour', 'another-worker', 1, \
     now() + interval '1 hour' FROM generate_series(1, $2::bigint) g";

/// The seeded runs in progress still held as seeded: a worker that took a live lease would
/// break fencing, and a seed the worker never met would measure nothing.
const IN_PROGRESS_UNTOUCHED: &str = "SELECT count(*) FROM workflows \
     WHERE workflow_name = $1 AND workflow_id LIKE 'held-%' AND status = 'running' \
       AND lease_owner = 'another-worker' AND lease_epoch = 1";

/// The throughput mode.
pub(super) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let workflows = args.workflows();
    let concurrency = usize::try_from(args.concurrency).context("--concurrency")?;
    let producers = usize::try_from(args.producers).context("--producers")?;
    // Every concurrent run holds a connection for each store call; producers and the discovery
    // query need theirs beside them, so nothing waits on the pool.
    let setup = Setup::new(global, args, concurrency + producers + 2).await?;
    if args.in_progress > 0 {
        let held = i64::try_from(args.in_progress).context("--in-progress")?;
        setup
            .db
            .execute(SEED_IN_PROGRESS, &[&WORKFLOW, &held])
            .await
            .context("seeding the runs in progress")?;
        setup
            .db
            .batch_execute("ANALYZE workflows")
            .await
            .context("analyzing the seeded runs")?;
    }
    let keiro = args
        .sealed(Keiro::builder(setup.store.clone()).without_push())?
        .build();
    let total_steps = workflows * args.steps;

    let finish = Arc::new(FinishLine::new(workflows));
    let log = {
        let (finish, store, default_log) = (
            finish.clone(),
            setup.store.clone(),
            ResumeOptions::default().log,
        );
        Arc::new(move |event: &ResumeLogEvent| {
            if let ResumeLogEvent::PassFinished { summary } = event {
                finish.on_pass(summary.completed, || store.round_trips());
            }
            default_log(event);
        })
    };
    let sink = args.metrics.then(MetricsSink::new);
    let mut builder = super::with_bench_queue(
        &keiro,
        args,
        bench_worker(&keiro, args, concurrency).log(log),
    )
    .await?;
    if let Some(sink) = &sink {
        builder = builder.metrics(sink.metrics.clone());
    }
    let worker = builder.build().context("building the bench worker")?;
    let background = Background::run(worker);

    println!(
        "bench: throughput: {} workflows x {} steps, worker concurrency {}, {} producers, poll {} ms, \
         metrics {}, batching {}, starts {} per call, {} runs in progress elsewhere, schema {}",
        workflows,
        args.steps,
        args.concurrency,
        args.producers,
        args.poll_interval_ms,
        if args.metrics { "on" } else { "off" },
        if args.batching { "on" } else { "off" },
        args.start_batch,
        args.in_progress,
        args.bench_schema
    );
    let server_before = server::read_before(&setup.db, &setup.store).await?;
    let stats_before = server_stats(&setup.db, args).await?;
    let phase_cpu = server::PhaseCpu::start();
    let round_trips_before = setup.store.round_trips();
    let batches_before = setup.store.batch_stats();
    let started = Instant::now();
    if args.start_batch > 1 && args.queue_keys == 0 {
        start_all_many(
            &keiro,
            WORKFLOW,
            "wf",
            workflows,
            args.producers,
            usize::try_from(args.start_batch).context("--start-batch")?,
            BenchInput { steps: args.steps },
        )
        .await?;
    } else {
        super::start_all_keyed(
            &keiro,
            WORKFLOW,
            "wf",
            workflows,
            args.producers,
            args.queue_keys,
            BenchInput { steps: args.steps },
        )
        .await?;
    }
    let starts_done = started.elapsed();
    let reached = finish.wait(Duration::from_secs(args.timeout_s)).await;
    let summary = background.stop().await?;
    let batches = setup.store.batch_stats().since(&batches_before);
    let (own_cpu, host_idle) = phase_cpu.finish();
    let spent = server_before.spent_until(&server::read_after(&setup.db, &setup.store).await?);
    let stats_after = server_stats(&setup.db, args).await?;
    let Some((finished_at, round_trips_after)) = reached else {
        println!(
            "bench: FAIL: only {}/{} workflows completed within {} s",
            finish.completed.load(Ordering::Relaxed),
            workflows,
            args.timeout_s
        );
        return Ok(Outcome::Failed);
    };
    let elapsed = finished_at - started;
    let round_trips = round_trips_after - round_trips_before;

    let row = setup
        .db
        .query_one(THROUGHPUT_LATENCY, &[&WORKFLOW])
        .await
        .context("reading the latencies")?;
    let completed = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
    let (p50, p99, db_span): (f64, f64, f64) = (row.get(1), row.get(2), row.get(3));
    let (rss_mb, rss_peak_mb) = resident_memory_mb().unwrap_or((0.0, 0.0));
    let secs = elapsed.as_secs_f64();
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
    let (workflows_f, steps_f, round_trips_f, commits_f) = (
        workflows as f64,
        total_steps as f64,
        round_trips as f64,
        spent.commits as f64,
    );
    let pg_cpu_ms = spent.cpu.map(|cpu| ms(cpu) / workflows_f);
    let keiro_cpu_ms = own_cpu.map(|cpu| ms(cpu) / workflows_f);

    println!(
        "bench: all started after {:.0} ms; last completion after {:.0} ms (database clock: {:.0} ms \
         from first start to last completion)",
        ms(starts_done),
        ms(elapsed),
        db_span * 1000.0
    );
    println!(
        "bench: {:.0} workflows/s, {:.0} steps/s, {round_trips} round trips = {:.2} per step \
         ({:.2} per workflow)",
        workflows_f / secs,
        steps_f / secs,
        round_trips_f / steps_f,
        round_trips_f / workflows_f
    );
    println!(
        "bench: {} commits = {:.2} per workflow; CPU per workflow: PostgreSQL {}, the bench \
         process {}",
        spent.commits,
        commits_f / workflows_f,
        pg_cpu_ms.map_or_else(|| "n/a".to_owned(), |ms| format!("{ms:.3} ms")),
        keiro_cpu_ms.map_or_else(|| "n/a".to_owned(), |ms| format!("{ms:.3} ms"))
    );
    if let Some(idle) = host_idle {
        println!(
            "bench: the machine's CPUs were {:.0}% idle during the phase (near 0: CPU-bound; \
             well above: the runs waited on round trips and commits)",
            idle * 100.0
        );
    }
    if args.batching {
        println!(
            "{}",
            super::group_commit_line(&[("append", batches.appends), ("start", batches.starts)])
        );
    }
    let phases = phases::report(&phases::Measured {
        lanes: &[("append", batches.appends), ("park", batches.parks)],
        others: &[("start", batches.starts)],
        elapsed,
        in_flight: None,
        own_cpu,
        host_idle,
        spent: &spent,
        server: stats_before.as_ref().zip(stats_after.as_ref()),
    });
    println!(
        "bench: start-to-completion latency p50 {p50:.1} ms, p99 {p99:.1} ms; resident memory \
         {rss_mb:.1} MiB (peak {rss_peak_mb:.1} MiB)"
    );
    println!(
        "bench: worker: {} passes until the last completion; {} discovered, {} resumed, {} completed, \
         {} lease skips, {} transient errors",
        finish.passes.load(Ordering::Relaxed),
        summary.discovered,
        summary.resumed,
        summary.completed,
        summary.lease_skipped,
        summary.transient_errors
    );
    if let Some(sink) = &sink {
        match sink.steps_executed() {
            Some(executed) => println!("bench: metrics recorded {executed} step executions"),
            None => println!("bench: metrics recorded no step executions"),
        }
        sink.shutdown();
    }
    let admission = if args.queue_keys > 0 {
        admission_latency(&setup.db, args.queue_concurrency).await?
    } else {
        None
    };
    if args.queue_keys > 0 {
        println!(
            "bench: queue `{}`: {} keys, concurrency {}, key concurrency {}, fairness {}; \
             admission at the limit (a freed slot to the next admission): {}",
            super::BENCH_QUEUE,
            args.queue_keys,
            args.queue_concurrency
                .map_or_else(|| "none".to_owned(), |n| n.to_string()),
            args.queue_key_concurrency
                .map_or_else(|| "none".to_owned(), |n| n.to_string()),
            if args.queue_fair { "weighted" } else { "fifo" },
            admission.map_or_else(
                || "n/a (no concurrency limit)".to_owned(),
                |(p50, p99)| format!("p50 {p50:.1} ms, p99 {p99:.1} ms")
            )
        );
    }
    let untouched = setup
        .db
        .query_one(IN_PROGRESS_UNTOUCHED, &[&WORKFLOW])
        .await
        .context("reading the seeded runs in progress")?
        .get::<_, i64>(0);
    let outcome = if completed != workflows {
        println!(
            "bench: FAIL: {completed}/{} workflows completed according to the database",
            workflows
        );
        Outcome::Failed
    } else if u64::try_from(untouched).ok() != Some(args.in_progress) {
        println!(
            "bench: FAIL: {untouched}/{} seeded runs in progress are still held as seeded",
            args.in_progress
        );
        Outcome::Failed
    } else {
        Outcome::Success
    };
    let report = ThroughputReport {
        mode: "throughput",
        workflows,
        steps: args.steps,
        concurrency: args.concurrency,
        elapsed_s: round(secs, 3),
        workflows_per_s: round(workflows_f / secs, 1),
        steps_per_s: round(steps_f / secs, 1),
        round_trips_per_step: round(round_trips_f / steps_f, 3),
        commits_per_workflow: round(commits_f / workflows_f, 3),
        pg_cpu_ms_per_workflow: pg_cpu_ms.map(|ms| round(ms, 4)),
        keiro_cpu_ms_per_workflow: keiro_cpu_ms.map(|ms| round(ms, 4)),
        host_idle_share: host_idle.map(|share| round(share, 3)),
        append_batch_mean: batches.appends.mean_len().map(|len| round(len, 2)),
        start_batch_mean: batches.starts.mean_len().map(|len| round(len, 2)),
        p50_ms: round(p50, 2),
        p99_ms: round(p99, 2),
        rss_mb: round(rss_mb, 1),
        rss_peak_mb: round(rss_peak_mb, 1),
        round_trips,
        producers: args.producers,
        metrics: args.metrics,
        codec: args.codec,
        batching: args.batching,
        start_batch: args.start_batch,
        in_progress: args.in_progress,
        queue_keys: args.queue_keys,
        admission_p50_ms: admission.map(|(p50, _)| round(p50, 2)),
        admission_p99_ms: admission.map(|(_, p99)| round(p99, 2)),
        phases,
    };
    super::emit(&report)?;
    Ok(outcome)
}
