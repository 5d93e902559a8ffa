//! `gc`: retention's deletion rate, and what a collecting worker costs a running workload.
//!
//! Each round seeds a backlog of N expired instances (completed two days ago, K journal rows
//! each, written by SQL so seeding costs no workflow runs), then runs a workload of `--workload`
//! workflows of K steps through an in-process worker, measured from the first start to the
//! last completion. Rounds alternate: without a collector, then with one (the worker built with
//! `retention(1 day)`, so its retention loop runs at its default rate beside the resume loop,
//! as in production), `--rounds` pairs, interleaved so drift (caches, autovacuum, the machine's
//! other tenants) hits both sides alike. After each round an unthrottled `Keiro::gc` clears
//! what is left of the backlog; those runs give the raw deletion rate in rows per second.

use std::time::{Duration, Instant};

use keiro::{operate::GcRequest, Ctx, Keiro, WorkflowError};
use serde::Serialize;

use super::{start_all, BenchArgs, Setup};
use crate::common::{round, Global, Outcome, Result, ResultExt};

/// The workload's workflow name.
const WORKFLOW: &str = "gcbench";
/// The seeded backlog's workflow name.
const BACKLOG: &str = "expired";
/// The retention window: the backlog is two days old, the workload's runs are fresh.
const WINDOW: Duration = Duration::from_secs(86_400);

/// K trivial steps, as `throughput` runs.
async fn workload(ctx: Ctx, steps: u64) -> Result<u64, WorkflowError> {
    let mut sum = 0;
    for i in 0..steps {
        sum += ctx
            .step(&format!("step-{i}"), || async move {
                Ok::<_, std::convert::Infallible>(i)
            })
            .await?;
    }
    Ok(sum)
}

// The backlog, in two statements: expired instance rows, then their journals.
const GC_BENCH_SEED_INSTANCES: &str = "INSERT INTO workflows (workflow_name, workflow_id, status, \
     created_at, updated_at, completed_at, output) \
     SELECT $1, $2 || '-' || g, 'completed', now() - interval '3 days', now() - interval '2 days', \
            now() - interval '2 days', '1' \
     FROM generate_series(1, $3::bigint) g";
const GC_BENCH_SEED_JOURNAL: &str = "INSERT INTO journal (workflow_name, workflow_id, generation, \
     step_name, kind, payload, recorded_at) \
     SELECT $1, $2 || '-' || g, 0, 'step-' || s, 'step', to_jsonb(s), now() - interval '2 days' \
     FROM generate_series(1, $3::bigint) g, generate_series(0, $4::bigint - 1) s";
// Workload completions of one round (its ids share a prefix: served by workflows_list_id_idx).
const GC_BENCH_DONE: &str = "SELECT count(*) FROM workflows \
     WHERE workflow_name = $1 AND workflow_id ^@ $2 AND status = 'completed'";

/// One round's figures.
#[derive(Debug, Clone, Serialize)]
struct Round {
    collecting: bool,
    workflows_per_s: f64,
    /// Rows the worker's retention loop deleted while the workload ran (0 without one).
    rows_deleted_during: u64,
    /// The unthrottled clean-up after the round: rows and rows per second.
    cleanup_rows: u64,
    cleanup_rows_per_s: f64,
}

/// The report, last line.
#[derive(Debug, Serialize)]
struct GcReport {
    mode: &'static str,
    backlog_instances: u64,
    rows_per_instance: u64,
    workload_workflows: u64,
    steps: u64,
    rounds: u64,
    /// Raw deletion rate: every unthrottled clean-up's rows over its time.
    deletion_rows_per_s: f64,
    deletion_instances_per_s: f64,
    /// Mean workload throughput without and with a collecting worker, and their ratio.
    without_gc_workflows_per_s: f64,
    with_gc_workflows_per_s: f64,
    with_over_without: f64,
    /// Each pair's ratio (with over without), in order, and their median: the figure to quote
    /// on a shared machine, where one noisy round moves a mean.
    pair_ratios: Vec<f64>,
    median_pair_ratio: f64,
    rounds_detail: Vec<Round>,
}

/// The gc mode.
pub(super) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let backlog = args.workflows();
    let steps = args.steps;
    let concurrency = usize::try_from(args.concurrency).context("--concurrency")?;
    let producers = usize::try_from(args.producers).context("--producers")?;
    let setup = Setup::new(global, args, concurrency + producers + 4).await?;
    let keiro = Keiro::builder(setup.store.clone()).without_push().build();
    println!(
        "bench: gc: backlog {backlog} expired instances x {steps} journal rows per round, workload \
         {} workflows x {steps} steps, concurrency {}, {} round pairs, schema {}",
        args.workload, args.concurrency, args.rounds, args.bench_schema
    );
    let mut rounds = Vec::new();
    let (mut cleanup_rows, mut cleanup_instances, mut cleanup_secs) = (0_u64, 0_u64, 0.0_f64);
    for n in 0..args.rounds * 2 {
        let collecting = n % 2 == 1;
        let tag = format!("r{n}");
        seed(&setup, &tag, backlog, steps).await?;
        let mut builder = keiro
            .worker()
            .register(WORKFLOW, workload)
            .concurrency(concurrency)
            .poll_interval(Duration::from_millis(args.poll_interval_ms));
        if collecting {
            builder = builder.retention(Some(WINDOW));
        }
        let worker = builder.build().context("building the bench worker")?;
        let before = count_backlog(&setup).await?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let worker_task = tokio::spawn(async move {
            worker
                .run_until(async {
                    let _ = stop_rx.await;
                })
                .await
        });
        let started = Instant::now();
        start_all(&keiro, WORKFLOW, &tag, args.workload, args.producers, steps).await?;
        let deadline = started + Duration::from_secs(args.timeout_s);
        loop {
            let done: i64 = setup
                .db
                .query_one(GC_BENCH_DONE, &[&WORKFLOW, &tag])
                .await
                .context("counting completions")?
                .get(0);
            if u64::try_from(done).unwrap_or(0) >= args.workload {
                break;
            }
            if Instant::now() > deadline {
                let _ = stop_tx.send(());
                println!(
                    "bench: FAIL: round {n} did not finish within {} s",
                    args.timeout_s
                );
                return Ok(Outcome::Failed);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let _ = stop_tx.send(());
        worker_task.await.context("the bench worker task failed")?;
        let during = before.saturating_sub(count_backlog(&setup).await?) * (steps + 1);

        let clean_start = Instant::now();
        let cleaned = keiro
            .gc(&GcRequest::new(WINDOW), Duration::ZERO)
            .await
            .context("clearing the backlog")?;
        let clean_secs = clean_start.elapsed().as_secs_f64().max(1e-6);
        cleanup_rows += cleaned.rows();
        cleanup_instances += cleaned.instances;
        cleanup_secs += clean_secs;
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
        let round = Round {
            collecting,
            workflows_per_s: round(args.workload as f64 / elapsed, 1),
            rows_deleted_during: during,
            cleanup_rows: cleaned.rows(),
            cleanup_rows_per_s: round(cleaned.rows() as f64 / clean_secs, 0),
        };
        println!(
            "bench: round {n} ({}): {:.0} workflows/s, {} rows deleted meanwhile; clean-up {} rows \
             at {:.0} rows/s",
            if collecting { "collecting" } else { "no gc" },
            round.workflows_per_s,
            round.rows_deleted_during,
            round.cleanup_rows,
            round.cleanup_rows_per_s
        );
        rounds.push(round);
    }
    let mean = |collecting: bool| {
        let rates: Vec<f64> = rounds
            .iter()
            .filter(|r| r.collecting == collecting)
            .map(|r| r.workflows_per_s)
            .collect();
        #[allow(clippy::cast_precision_loss)] // a handful of rounds
        let len = rates.len().max(1) as f64;
        rates.iter().sum::<f64>() / len
    };
    let pair_ratios: Vec<f64> = rounds
        .chunks(2)
        .filter(|pair| pair.len() == 2)
        .map(|pair| round(pair[1].workflows_per_s / pair[0].workflows_per_s, 3))
        .collect();
    let (without, with) = (mean(false), mean(true));
    let median_pair_ratio = {
        let mut sorted = pair_ratios.clone();
        sorted.sort_by(f64::total_cmp);
        match sorted.len() {
            0 => 0.0,
            n if n % 2 == 1 => sorted[n / 2],
            n => round((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0, 3),
        }
    };
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
    let report = GcReport {
        mode: "gc",
        backlog_instances: backlog,
        rows_per_instance: steps + 1,
        workload_workflows: args.workload,
        steps,
        rounds: args.rounds,
        deletion_rows_per_s: round(cleanup_rows as f64 / cleanup_secs, 0),
        deletion_instances_per_s: round(cleanup_instances as f64 / cleanup_secs, 0),
        without_gc_workflows_per_s: round(without, 1),
        with_gc_workflows_per_s: round(with, 1),
        with_over_without: round(with / without, 3),
        pair_ratios,
        median_pair_ratio,
        rounds_detail: rounds,
    };
    println!(
        "bench: deletion {:.0} rows/s ({:.0} instances/s); workload {:.0} workflows/s without gc, \
         {:.0} with (ratio of means {:.3}, median pair ratio {:.3})",
        report.deletion_rows_per_s,
        report.deletion_instances_per_s,
        without,
        with,
        report.with_over_without,
        report.median_pair_ratio
    );
    super::emit(&report)?;
    Ok(Outcome::Success)
}

async fn seed(setup: &Setup, tag: &str, backlog: u64, steps: u64) -> Result<()> {
    let (backlog, steps) = (
        i64::try_from(backlog).context("-n")?,
        i64::try_from(steps).context("-k")?,
    );
    setup
        .db
        .execute(GC_BENCH_SEED_INSTANCES, &[&BACKLOG, &tag, &backlog])
        .await
        .context("seeding expired instances")?;
    setup
        .db
        .execute(GC_BENCH_SEED_JOURNAL, &[&BACKLOG, &tag, &backlog, &steps])
        .await
        .context("seeding their journals")?;
    setup
        .db
        .batch_execute("ANALYZE workflows; ANALYZE journal")
        .await
        .context("analyzing")?;
    Ok(())
}

// The backlog left: an index-only count on workflows_list_name_idx.
const GC_BENCH_BACKLOG: &str = "SELECT count(*) FROM workflows WHERE workflow_name = $1";

async fn count_backlog(setup: &Setup) -> Result<u64> {
    let n: i64 = setup
        .db
        .query_one(GC_BENCH_BACKLOG, &[&BACKLOG])
        .await
        .context("counting the backlog")?
        .get(0);
    Ok(u64::try_from(n).unwrap_or(0))
}
