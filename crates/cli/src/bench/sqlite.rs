//! `throughput` and `direct` on a SQLite file (`--database-url sqlite:PATH`): the same workload
//! and the same worker as on PostgreSQL, on a fresh file with the store's default (durable)
//! settings. What is counted differs: there are no round trips and no server, so the figures are
//! steps per second and the writer's commits ([`SqliteStore::commits`]) per workflow, which
//! group commit keeps below one per write.
//!
//! The file is replaced only if an earlier bench made it (a marker table says so); anything
//! else there may be data and is refused.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keiro::store::sqlite::{Config, SqliteStore};
use keiro::{worker::ResumeLogEvent, worker::ResumeOptions, Keiro};
use serde::Serialize;

use super::direct::closed_loop;
use super::server::PhaseCpu;
use super::throughput::{bench_worker, BenchInput, FinishLine, WORKFLOW};
use super::{Background, BenchArgs, Percentiles};
use crate::common::{
    ms, replace_scratch_file, resident_memory_mb, round, Outcome, Result, ResultExt,
};

/// The table that tells a bench file from someone's data.
const MARKER: &str = "keiro_bench";

/// Start-to-completion spans of the completed runs, in microseconds.
const SPANS: &str = "SELECT completed_at - created_at FROM workflows
    WHERE workflow_name = ?1 AND status = 'completed'";

/// The figures of a SQLite run; serialized as the last line, keys in this order.
#[derive(Debug, Serialize)]
struct SqliteReport {
    /// `throughput`, `direct`, `direct-via-worker` or `direct-alternate`.
    mode: &'static str,
    store: &'static str,
    workflows: u64,
    /// Steps per workflow (K).
    steps: u64,
    concurrency: u64,
    elapsed_s: f64,
    workflows_per_s: f64,
    steps_per_s: f64,
    /// Write transactions the store's writer committed during the phase.
    commits: u64,
    commits_per_workflow: f64,
    /// Step results journaled per commit: what group commit shares one fsync between.
    steps_per_commit: f64,
    commits_per_s: f64,
    /// CPU time of the bench process (it is the whole database here) per workflow, in ms.
    keiro_cpu_ms_per_workflow: Option<f64>,
    host_idle_share: Option<f64>,
    /// Start to completion from the instance rows (`throughput`), or start to output as
    /// each caller saw it (`direct`).
    p50_ms: f64,
    p99_ms: f64,
    rss_mb: f64,
    rss_peak_mb: f64,
    /// Payloads sealed with AES-256-GCM (`--codec`; `throughput` only).
    codec: bool,
}

/// The store's settings: its defaults (durable commits), but for the reader pool and the batch
/// size the options name.
pub(super) fn config(args: &BenchArgs) -> Config {
    let defaults = Config::default();
    let size = |option: Option<u64>, default: usize| {
        option
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(default)
    };
    Config {
        readers: size(args.sqlite_readers, defaults.readers),
        batch_max: size(args.sqlite_batch_max, defaults.batch_max),
        ..defaults
    }
}

/// Opens a fresh bench file at `path` (replacing an earlier bench's) with `config`.
pub(super) async fn open_fresh(path: &Path, config: Config) -> Result<SqliteStore> {
    replace_scratch_file(path, MARKER, "bench")?;
    let owned = path.to_owned();
    let store = tokio::task::spawn_blocking(move || -> Result<SqliteStore> {
        let store =
            SqliteStore::open(&owned, config).context(format!("opening {}", owned.display()))?;
        let conn = rusqlite::Connection::open(&owned).context("opening the bench connection")?;
        conn.execute_batch(&format!("CREATE TABLE {MARKER} (created INTEGER)"))
            .context("marking the bench file")?;
        Ok(store)
    })
    .await
    .context("opening the bench file")??;
    Ok(store)
}

/// The start-to-completion spans of the completed runs.
async fn spans(path: &Path) -> Result<Vec<Duration>> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || -> Result<Vec<Duration>> {
        let conn = rusqlite::Connection::open(&path).context("opening the bench connection")?;
        let mut statement = conn.prepare(SPANS).context("reading the latencies")?;
        let spans = statement
            .query_map([WORKFLOW], |row| row.get::<_, i64>(0))
            .context("reading the latencies")?
            .map(|micros| {
                micros.map(|micros| Duration::from_micros(u64::try_from(micros).unwrap_or(0)))
            })
            .collect::<rusqlite::Result<Vec<_>>>()
            .context("reading the latencies")?;
        Ok(spans)
    })
    .await
    .context("reading the latencies")?
}

/// What one phase measured, for the report.
struct Phase {
    mode: &'static str,
    elapsed: Duration,
    commits: u64,
    cpu: (Option<Duration>, Option<f64>),
    latency: Percentiles,
}

/// Prints the lines and the JSON report of `phase`.
fn report(args: &BenchArgs, workflows: u64, phase: &Phase) -> Result<()> {
    let secs = phase.elapsed.as_secs_f64();
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
    let (workflows_f, steps_f, commits_f) = (
        workflows as f64,
        (workflows * args.steps) as f64,
        phase.commits as f64,
    );
    let (own_cpu, host_idle) = phase.cpu;
    let (rss_mb, rss_peak_mb) = resident_memory_mb().unwrap_or((0.0, 0.0));
    println!(
        "bench: {:.0} workflows/s, {:.0} steps/s in {:.0} ms; {} commits = {:.2} per workflow \
         ({:.2} steps a commit, {:.0} commits/s)",
        workflows_f / secs,
        steps_f / secs,
        ms(phase.elapsed),
        phase.commits,
        commits_f / workflows_f,
        steps_f / commits_f.max(1.0),
        commits_f / secs
    );
    if let (Some(cpu), Some(idle)) = (own_cpu, host_idle) {
        println!(
            "bench: CPU per workflow {:.3} ms (this process is the database too); the machine's \
             CPUs were {:.0}% idle",
            ms(cpu) / workflows_f,
            idle * 100.0
        );
    }
    println!(
        "bench: latency p50 {:.2} ms, p99 {:.2} ms; resident memory {rss_mb:.1} MiB (peak \
         {rss_peak_mb:.1} MiB)",
        phase.latency.p50_ms, phase.latency.p99_ms
    );
    let report = SqliteReport {
        mode: phase.mode,
        store: "sqlite",
        workflows,
        steps: args.steps,
        concurrency: args.concurrency,
        elapsed_s: round(secs, 3),
        workflows_per_s: round(workflows_f / secs, 1),
        steps_per_s: round(steps_f / secs, 1),
        commits: phase.commits,
        commits_per_workflow: round(commits_f / workflows_f, 3),
        steps_per_commit: round(steps_f / commits_f.max(1.0), 2),
        commits_per_s: round(commits_f / secs, 1),
        keiro_cpu_ms_per_workflow: own_cpu.map(|cpu| round(ms(cpu) / workflows_f, 4)),
        host_idle_share: host_idle.map(|idle| round(idle, 3)),
        p50_ms: phase.latency.p50_ms,
        p99_ms: phase.latency.p99_ms,
        rss_mb: round(rss_mb, 1),
        rss_peak_mb: round(rss_peak_mb, 1),
        codec: args.codec && phase.mode == "throughput",
    };
    super::emit(&report)?;
    Ok(())
}

/// `throughput` on the SQLite file at `path`: producers start N workflows while an in-process
/// worker (no push, the poll of `--poll-interval-ms`) drives C at once, as on PostgreSQL.
pub(super) async fn throughput(args: &BenchArgs, path: &Path) -> Result<Outcome> {
    let workflows = args.workflows();
    let concurrency = usize::try_from(args.concurrency).context("--concurrency")?;
    let config = config(args);
    let (readers, batch_max) = (config.readers, config.batch_max);
    let store = open_fresh(path, config).await?;
    let keiro = args
        .sealed(Keiro::builder(store.clone()).without_push())?
        .build();
    let finish = Arc::new(FinishLine::new(workflows));
    let log = {
        let (finish, store, default_log) =
            (finish.clone(), store.clone(), ResumeOptions::default().log);
        Arc::new(move |event: &ResumeLogEvent| {
            if let ResumeLogEvent::PassFinished { summary } = event {
                finish.on_pass(summary.completed, || store.commits());
            }
            default_log(event);
        })
    };
    let worker = super::with_bench_queue(
        &keiro,
        args,
        bench_worker(&keiro, args, concurrency).log(log),
    )
    .await?
    .build()
    .context("building the bench worker")?;
    let background = Background::run(worker);
    println!(
        "bench: throughput: {workflows} workflows x {} steps, worker concurrency {}, {} producers, \
         poll {} ms, sqlite file {} ({readers} readers, batches of at most {batch_max}), \
         queue keys {}",
        args.steps,
        args.concurrency,
        args.producers,
        args.poll_interval_ms,
        path.display(),
        args.queue_keys
    );
    let cpu = PhaseCpu::start();
    let commits_before = store.commits();
    let started = Instant::now();
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
    let reached = finish.wait(Duration::from_secs(args.timeout_s)).await;
    background.stop().await?;
    let cpu = cpu.finish();
    let Some((finished_at, commits_after)) = reached else {
        println!(
            "bench: FAIL: only {}/{workflows} workflows completed within {} s",
            finish.completed.load(std::sync::atomic::Ordering::Relaxed),
            args.timeout_s
        );
        return Ok(Outcome::Failed);
    };
    let spans = spans(path).await?;
    let outcome = completed_all(spans.len() as u64, workflows);
    report(
        args,
        workflows,
        &Phase {
            mode: "throughput",
            elapsed: finished_at - started,
            commits: commits_after - commits_before,
            cpu,
            latency: Percentiles::of(&spans),
        },
    )?;
    Ok(outcome)
}

/// `direct` on the SQLite file at `path`: the closed loop of C callers, a push-aware worker
/// beside them, as on PostgreSQL.
pub(super) async fn direct(args: &BenchArgs, path: &Path) -> Result<Outcome> {
    let workflows = args.workflows();
    let concurrency = usize::try_from(args.concurrency).context("--concurrency")?;
    let config = config(args);
    let (readers, batch_max) = (config.readers, config.batch_max);
    let store = open_fresh(path, config).await?;
    let keiro = Keiro::builder(store.clone()).build();
    let worker = bench_worker(&keiro, args, concurrency)
        .build()
        .context("building the bench worker")?;
    let background = Background::run(worker.clone());
    let mode = args.path.mode();
    println!(
        "bench: {mode}: {workflows} workflows x {} steps, {} in flight, worker poll {} ms, sqlite \
         file {} ({readers} readers, batches of at most {batch_max})",
        args.steps,
        args.concurrency,
        args.poll_interval_ms,
        path.display()
    );
    let cpu = PhaseCpu::start();
    let commits_before = store.commits();
    let started = Instant::now();
    let looped = closed_loop(
        &worker,
        &keiro,
        args.path,
        workflows,
        concurrency,
        BenchInput { steps: args.steps },
        Duration::from_secs(args.timeout_s),
    )
    .await;
    let elapsed = started.elapsed();
    let commits = store.commits() - commits_before;
    let cpu = cpu.finish();
    background.stop().await?;
    let Some(latencies) = looped? else {
        println!(
            "bench: FAIL: not every one of the {workflows} workflows completed within {} s",
            args.timeout_s
        );
        return Ok(Outcome::Failed);
    };
    let outcome = completed_all(spans(path).await?.len() as u64, workflows);
    let called: Vec<Duration> = latencies.iter().map(|(latency, _)| *latency).collect();
    report(
        args,
        workflows,
        &Phase {
            mode,
            elapsed,
            commits,
            cpu,
            latency: Percentiles::of(&called),
        },
    )?;
    Ok(outcome)
}

/// `Success` if the database shows every workflow completed.
fn completed_all(completed: u64, workflows: u64) -> Outcome {
    if completed == workflows {
        Outcome::Success
    } else {
        println!(
            "bench: FAIL: {completed}/{workflows} workflows completed according to the database"
        );
        Outcome::Failed
    }
}
