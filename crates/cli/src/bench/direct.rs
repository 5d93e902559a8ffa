//! `direct`: N workflows of K trivial steps run by direct execution, C in flight (a closed
//! loop: C tasks each run one workflow after another with `Worker::run_named` until N are
//! done). Each run is started already leased to its task and driven there, so the figures are
//! those of the start-and-drive path with no discovery, claim or poll in it. A push-aware
//! worker runs beside the tasks, as it would in a deployment, to recover what a direct caller
//! leaves; here it finds nothing to do.
//!
//! With `--path worker` the same closed loop goes through the worker instead: each task starts
//! its workflow (`Keiro::start`) and awaits its result (`Keiro::result_with`, woken by push),
//! and the worker drives C runs at once. That is the start-to-output latency a caller of the
//! queued path sees, measured the same way, for the comparison. With `--path alternate` each
//! task alternates the two paths workflow by workflow, so both are sampled at the same moments
//! of a machine whose load varies, and reports each path's latency apart.
//!
//! Latency is measured by each task around its call (start to output, as the caller sees it)
//! and, as `throughput` does, from the instance rows (`created_at` to `completed_at`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use keiro::{Keiro, ResultOptions, Worker};
use serde::Serialize;

use super::phases::{self, server_stats, Phases};
use super::throughput::{bench_worker, BenchInput, WORKFLOW};
use super::{instance_id, server, Background, BenchArgs, Percentiles, Setup};
use crate::common::{ms, resident_memory_mb, round, Global, Outcome, Result, ResultExt};

/// Which way the closed loop of `direct` runs its workflows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Path {
    /// `Worker::run_named`: started leased to its task and driven there.
    Direct,
    /// `Keiro::start`, then `Keiro::result_with` (woken by push) while the worker drives it.
    Worker,
    /// Even workflows direct, odd ones through the worker, in every task.
    Alternate,
}

impl Path {
    /// Whether workflow `i` goes through the worker.
    fn via_worker(self, i: u64) -> bool {
        match self {
            Self::Direct => false,
            Self::Worker => true,
            Self::Alternate => i % 2 == 1,
        }
    }

    /// The report's name of a closed loop on this path.
    pub(super) fn mode(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Worker => "direct-via-worker",
            Self::Alternate => "direct-alternate",
        }
    }
}

/// Runs the closed loop: `concurrency` tasks each run one workflow after another on `path`
/// until `workflows` are done. Returns each workflow's start-to-output latency and whether it
/// went through the worker, or `None` if they were not all done within `timeout`.
pub(super) async fn closed_loop(
    worker: &Worker,
    keiro: &Keiro,
    path: Path,
    workflows: u64,
    concurrency: usize,
    input: BenchInput,
    timeout: Duration,
) -> Result<Option<Vec<(Duration, bool)>>> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (worker, keiro, next) = (worker.clone(), keiro.clone(), next.clone());
        tasks.spawn(async move {
            // (latency, through the worker) per workflow.
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= workflows {
                    return Ok::<_, crate::common::Error>(latencies);
                }
                let id = instance_id("wf", i);
                let via_worker = path.via_worker(i);
                let called = Instant::now();
                if via_worker {
                    keiro
                        .start(WORKFLOW, &id, &input)
                        .await
                        .context(format!("starting {id}"))?;
                    let options = ResultOptions {
                        timeout: Some(Duration::from_secs(600)),
                        ..ResultOptions::default()
                    };
                    keiro
                        .result_with::<u64>((WORKFLOW, &id), &options)
                        .await
                        .context(format!("awaiting {id}"))?;
                } else {
                    worker
                        .run_named::<u64, _>(WORKFLOW, &id, &input)
                        .await
                        .context(format!("running {id}"))?;
                }
                latencies.push((called.elapsed(), via_worker));
            }
        });
    }
    let mut latencies = Vec::new();
    let finished = tokio::time::timeout(timeout, async {
        while let Some(joined) = tasks.join_next().await {
            latencies.extend(joined.context("a bench task failed")??);
        }
        Ok::<_, crate::common::Error>(())
    })
    .await;
    match finished {
        Ok(finished) => finished.map(|()| Some(latencies)),
        Err(_) => Ok(None),
    }
}

/// The figures of `direct`; serialized as the last line, keys in this order.
#[derive(Debug, Serialize)]
struct DirectReport {
    /// `direct`, `direct-via-worker` or `direct-alternate`.
    mode: &'static str,
    workflows: u64,
    /// Steps per workflow (K).
    steps: u64,
    /// Runs in flight (C).
    concurrency: u64,
    elapsed_s: f64,
    workflows_per_s: f64,
    steps_per_s: f64,
    round_trips_per_step: f64,
    /// Transactions the server committed in the bench's database per workflow.
    commits_per_workflow: f64,
    /// CPU time of the server's processes for this database per workflow, in milliseconds;
    /// `null` when the server is not on this machine.
    pg_cpu_ms_per_workflow: Option<f64>,
    /// CPU time of this process (the callers, the worker beside them, the store) per
    /// workflow, in milliseconds.
    keiro_cpu_ms_per_workflow: Option<f64>,
    /// Share of the machine's CPU time that was idle during the phase.
    host_idle_share: Option<f64>,
    /// Calls per batch of the direct start lane and of the append lane.
    direct_start_batch_mean: Option<f64>,
    append_batch_mean: Option<f64>,
    /// Start to output as each caller saw it, over every workflow.
    p50_ms: f64,
    p99_ms: f64,
    /// The same, of the direct runs alone and of the runs through the worker alone.
    direct: Option<Percentiles>,
    via_worker: Option<Percentiles>,
    /// `created_at` to `completed_at` of the instance rows, as `throughput` reports it.
    db_p50_ms: f64,
    db_p99_ms: f64,
    rss_mb: f64,
    rss_peak_mb: f64,
    round_trips: u64,
    /// Where the time went (`phases`).
    phases: Phases,
}

/// Start-to-completion latency from the instance rows.
const DIRECT_LATENCY: &str = "SELECT count(*),
    percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
    percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
  FROM (SELECT extract(epoch FROM completed_at - created_at)::float8 * 1000 AS ms
        FROM workflows WHERE workflow_name = $1 AND status = 'completed') AS done";

/// The direct mode.
pub(super) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let workflows = args.workflows();
    let concurrency = usize::try_from(args.concurrency).context("--concurrency")?;
    // Each task holds at most one connection at a time; the worker's pass and its result
    // waiters' reads need theirs beside them.
    let setup = Setup::new(global, args, concurrency * 2 + 2).await?;
    let keiro = Keiro::builder(setup.store.clone()).build(); // with push
    let worker = bench_worker(&keiro, args, concurrency)
        .build()
        .context("building the bench worker")?;
    let background = Background::run(worker.clone());
    let path = args.path;
    let mode = path.mode();
    println!(
        "bench: {mode}: {} workflows x {} steps, {} in flight, worker poll {} ms, schema {}",
        workflows, args.steps, args.concurrency, args.poll_interval_ms, args.bench_schema
    );

    let input = BenchInput { steps: args.steps };
    let server_before = server::read_before(&setup.db, &setup.store).await?;
    let stats_before = server_stats(&setup.db, args).await?;
    let round_trips_before = setup.store.round_trips();
    let phase_cpu = server::PhaseCpu::start();
    let batches_before = setup.store.batch_stats();
    let started = Instant::now();
    let looped = closed_loop(
        &worker,
        &keiro,
        path,
        workflows,
        concurrency,
        input,
        Duration::from_secs(args.timeout_s),
    )
    .await;
    let elapsed = started.elapsed();
    let round_trips = setup.store.round_trips() - round_trips_before;
    let batches = setup.store.batch_stats().since(&batches_before);
    let (own_cpu, host_idle) = phase_cpu.finish();
    let summary = background.stop().await?;
    let spent = server_before.spent_until(&server::read_after(&setup.db, &setup.store).await?);
    let stats_after = server_stats(&setup.db, args).await?;
    let Some(latencies) = looped? else {
        println!(
            "bench: FAIL: not every one of the {workflows} workflows completed within {} s",
            args.timeout_s
        );
        return Ok(Outcome::Failed);
    };

    let row = setup
        .db
        .query_one(DIRECT_LATENCY, &[&WORKFLOW])
        .await
        .context("reading the latencies")?;
    let completed = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
    let (db_p50, db_p99): (Option<f64>, Option<f64>) = (row.get(1), row.get(2));
    let called = Percentiles::of(&latencies.iter().map(|(l, _)| *l).collect::<Vec<_>>());
    let of_path = |worker: bool| {
        let samples: Vec<Duration> = latencies
            .iter()
            .filter(|(_, via)| *via == worker)
            .map(|(l, _)| *l)
            .collect();
        (!samples.is_empty()).then(|| Percentiles::of(&samples))
    };
    let (direct, via_worker) = (of_path(false), of_path(true));
    for (name, p) in [("direct", &direct), ("through the worker", &via_worker)] {
        if let (Some(p), Path::Alternate) = (p, path) {
            println!(
                "bench: {name}: {} workflows, start-to-output p50 {:.2} ms, p99 {:.2} ms",
                p.samples, p.p50_ms, p.p99_ms
            );
        }
    }
    let (rss_mb, rss_peak_mb) = resident_memory_mb().unwrap_or((0.0, 0.0));
    let secs = elapsed.as_secs_f64();
    let total_steps = workflows * args.steps;
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
        "bench: {:.0} workflows/s, {:.0} steps/s in {:.0} ms; {round_trips} round trips = {:.2} per \
         step ({:.2} per workflow)",
        workflows_f / secs,
        steps_f / secs,
        ms(elapsed),
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
            "bench: the machine's CPUs were {:.0}% idle during the phase",
            idle * 100.0
        );
    }
    println!(
        "{}",
        super::group_commit_line(&[
            ("direct start", batches.direct_starts),
            ("append", batches.appends)
        ])
    );
    if via_worker.is_some() {
        println!(
            "{}",
            super::group_commit_line(&[
                ("start", batches.starts),
                ("result read", batches.reads),
                ("awaited mark", batches.awaited_marks)
            ])
        );
    }
    let lanes = [
        ("direct start", batches.direct_starts),
        ("append", batches.appends),
    ];
    let others = [
        ("start", batches.starts),
        ("result read", batches.reads),
        ("awaited mark", batches.awaited_marks),
    ];
    // Through the worker, the callers wait in starts and reads while the worker's runs append:
    // the runs' time outside the lanes is a direct caller's only.
    let all: Vec<_> = lanes.iter().chain(&others).copied().collect();
    let (lanes, others): (&[_], &[_]) = if via_worker.is_some() {
        (&[], &all)
    } else {
        (&lanes, &[])
    };
    let phases = phases::report(&phases::Measured {
        lanes,
        others,
        elapsed,
        in_flight: Some(args.concurrency),
        own_cpu,
        host_idle,
        spent: &spent,
        server: stats_before.as_ref().zip(stats_after.as_ref()),
    });
    println!(
        "bench: start-to-output latency p50 {:.2} ms, p99 {:.2} ms (rows: p50 {:.2} ms, p99 {:.2} \
         ms); resident memory {rss_mb:.1} MiB (peak {rss_peak_mb:.1} MiB)",
        called.p50_ms,
        called.p99_ms,
        db_p50.unwrap_or(0.0),
        db_p99.unwrap_or(0.0)
    );
    println!(
        "bench: worker beside: {} discovered, {} resumed, {} completed, {} lease skips, {} \
         transient errors",
        summary.discovered,
        summary.resumed,
        summary.completed,
        summary.lease_skipped,
        summary.transient_errors
    );
    let outcome = if completed == workflows {
        Outcome::Success
    } else {
        println!(
            "bench: FAIL: {completed}/{workflows} workflows completed according to the database"
        );
        Outcome::Failed
    };
    let report = DirectReport {
        mode,
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
        host_idle_share: host_idle.map(|idle| round(idle, 3)),
        direct_start_batch_mean: batches.direct_starts.mean_len().map(|len| round(len, 2)),
        append_batch_mean: batches.appends.mean_len().map(|len| round(len, 2)),
        p50_ms: called.p50_ms,
        p99_ms: called.p99_ms,
        direct,
        via_worker,
        db_p50_ms: round(db_p50.unwrap_or(0.0), 2),
        db_p99_ms: round(db_p99.unwrap_or(0.0), 2),
        rss_mb: round(rss_mb, 1),
        rss_peak_mb: round(rss_peak_mb, 1),
        round_trips,
        phases,
    };
    super::emit(&report)?;
    Ok(outcome)
}
