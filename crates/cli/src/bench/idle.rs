//! `idle`: what an idle push-aware worker costs the database while N runs are parked.
//!
//! N workflows (default 10,000) park on an awakeable each; a separate worker drains them to
//! parked first. Then a push-aware worker with default options (1 s fallback poll, timer loop,
//! reconcile 5 min) runs for `--duration-s` on a store of its own, so that store's
//! [`round_trips`](keiro::postgres::PgStore::round_trips) counter is its queries and nothing
//! else's. Nothing wakes during the window, so every query is the worker's idle cost.
//!
//! Then, on the same store with the worker stopped: the round trips of one `resume_once` over
//! the parked runs (the discovery query, plus the pending-awakeables gauge with `--metrics`),
//! and the cost of the reconcile fallback. That fallback gives each parked run
//! `wake_after = park + 5 min`, so each is re-driven once per 5 min: N/300 re-drives per second
//! in the steady state. The window above sees none of them (every run parked less than 5 min
//! before), so the bench samples their price instead: it makes a few parked runs due and
//! counts the round trips of the pass that re-drives them.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keiro::{
    worker::ResumeLogEvent, worker::ResumeOptions, worker::Tuning, Ctx, Keiro, WorkflowError,
};
use serde::Serialize;

use super::{start_all, BenchArgs, MetricsSink, Setup};
use crate::common::{
    connect_store, failure, ms, resident_memory_mb, round, Global, Outcome, Result, ResultExt,
};

/// Time the idle worker runs before counting starts (statement preparation, listener start).
const IDLE_WARMUP: Duration = Duration::from_secs(5);

/// The registered workflow name.
pub(super) const WORKFLOW: &str = "bench-park";

/// Parked runs made due to sample the price of a reconcile re-drive.
const REDRIVE_SAMPLE: i64 = 100;

/// `resume_once` passes measured after the window (the report takes the median; a pass on a
/// pooled connection that has not prepared the discovery query yet pays one more round trip).
const RESUME_ONCE_PASSES: usize = 3;

/// The idle worker's pool: the resume loop and the timer loop each hold one connection at a
/// time; the LISTEN connection is outside the pool.
const IDLE_POOL_SIZE: usize = 4;

/// Parks forever unless its awakeable is completed: the cheapest parked run.
pub(super) async fn parked(ctx: Ctx, _input: ()) -> Result<u64, WorkflowError> {
    let wake = ctx.awakeable::<u64>("wake").await?;
    let value = wake.value().await?;
    ctx.step("woke", || async move { Ok::<_, Infallible>(value) })
        .await
}

/// Parked instances and pending awakeables, read outside every counted store.
const IDLE_PARKED: &str = "SELECT
    (SELECT count(*) FROM workflows WHERE workflow_name = $1 AND status = 'suspended'),
    (SELECT count(*) FROM awakeables WHERE status = 'pending')";

/// Makes a sample of parked runs due now, as the reconcile deadline does five minutes after a
/// run parks. Keyset by id, so the sample is the same runs whatever the plan.
const IDLE_MAKE_DUE: &str = "UPDATE workflows SET wake_after = now()
    WHERE (workflow_name, workflow_id) IN (
        SELECT workflow_name, workflow_id FROM workflows
        WHERE workflow_name = $1 AND status = 'suspended'
        ORDER BY workflow_id LIMIT $2)";

/// The idle figures; serialized as the last line, keys in this order.
#[derive(Debug, Serialize)]
struct IdleReport {
    mode: &'static str,
    parked: u64,
    duration_s: f64,
    /// Round trips of the idle worker's store during the window.
    round_trips: u64,
    queries_per_min: f64,
    queries_per_s: f64,
    /// Resume passes the worker ran in the window (each one discovery query).
    passes: u64,
    /// Round trips of one `resume_once` over the parked runs (median of a few).
    resume_once_round_trips: u64,
    resume_once_ms: f64,
    metrics: bool,
    /// The reconcile fallback, `null` with `--reconcile-off`.
    reconcile_s: Option<u64>,
    /// N / reconcile: parked runs re-driven per second in the steady state.
    reconcile_redrives_per_s: f64,
    /// Round trips per re-drive, sampled (0 with `--reconcile-off`).
    round_trips_per_redrive: f64,
    /// What the re-drives cost amortized: round trips per second.
    reconcile_round_trips_per_s: f64,
    /// Seconds to start and park the N runs.
    park_s: f64,
    rss_mb: f64,
}

/// The idle mode.
pub(super) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let n = args.workflows();
    let concurrency = usize::try_from(args.concurrency).context("--concurrency")?;
    let producers = usize::try_from(args.producers).context("--producers")?;
    let setup = Setup::new(global, args, concurrency + producers + 2).await?;
    let reconcile = if args.reconcile_off {
        None
    } else {
        ResumeOptions::default().reconcile
    };
    println!(
        "bench: idle: {n} runs parked on awakeables, then a push-aware worker with default options \
         idles for {} s; reconcile {}, metrics {}, schema {}",
        args.duration_s,
        reconcile.map_or_else(|| "off".to_owned(), |r| format!("{} s", r.as_secs())),
        if args.metrics { "on" } else { "off" },
        args.bench_schema
    );

    // Start and park everything with a throwaway worker on the setup store.
    let parking = Instant::now();
    let keiro = Keiro::builder(setup.store.clone()).without_push().build();
    start_all(&keiro, WORKFLOW, "park", n, args.producers, ()).await?;
    let parker = keiro
        .worker()
        .register(WORKFLOW, parked)
        .concurrency(concurrency)
        .tuning(Tuning {
            reconcile,
            ..Tuning::default()
        })
        .build()
        .context("building the parking worker")?;
    parker.drain().await.context("parking the runs")?;
    let park_s = parking.elapsed().as_secs_f64();
    let row = setup
        .db
        .query_one(IDLE_PARKED, &[&WORKFLOW])
        .await
        .context("counting the parked runs")?;
    let (parked_runs, pending) = (row.get::<_, i64>(0), row.get::<_, i64>(1));
    if u64::try_from(parked_runs).ok() != Some(n) {
        return Err(failure(format!(
            "{parked_runs} of {n} runs parked (pending awakeables: {pending})"
        )));
    }
    println!("bench: {n} runs parked ({pending} pending awakeables) after {park_s:.1} s");

    // The measured worker, on a store of its own.
    let store = connect_store(global.config(&args.bench_schema, IDLE_POOL_SIZE)?).await?;
    let passes = Arc::new(AtomicU64::new(0));
    let log = {
        let (passes, default_log) = (passes.clone(), ResumeOptions::default().log);
        Arc::new(move |event: &ResumeLogEvent| {
            if let ResumeLogEvent::PassFinished { .. } = event {
                passes.fetch_add(1, Ordering::Relaxed);
            }
            default_log(event);
        })
    };
    let sink = args.metrics.then(MetricsSink::new);
    let mut builder = Keiro::builder(store.clone())
        .build()
        .worker()
        .register(WORKFLOW, parked)
        .tuning(Tuning {
            reconcile,
            ..Tuning::default()
        })
        .log(log);
    if let Some(sink) = &sink {
        builder = builder.metrics(sink.metrics.clone());
    }
    let worker = builder.build().context("building the idle worker")?;
    let window = Duration::from_secs(args.duration_s);
    // Steady state only: the first seconds prepare statements and start the listener once per
    // process, which is not what an idle worker costs per minute.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let idle = worker.clone();
    let running = tokio::spawn(async move {
        idle.run_until(async {
            let _ = stop_rx.await;
        })
        .await
    });
    tokio::time::sleep(IDLE_WARMUP).await;
    let before = store.round_trips();
    let passes_before = passes.load(Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let elapsed = started.elapsed().as_secs_f64();
    let round_trips = store.round_trips() - before;
    let passes = passes.load(Ordering::Relaxed) - passes_before;
    let _ = stop_tx.send(());
    let summary = running.await.context("the idle worker task")?;
    if summary.discovered != 0 {
        println!(
            "bench: note: the idle worker found {} runnable runs during the window",
            summary.discovered
        );
    }
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
    let (per_s, parked_f) = (round_trips as f64 / elapsed, n as f64);
    println!(
        "bench: idle worker: {round_trips} queries in {elapsed:.1} s = {:.1} per minute, {:.2} per \
         second after a {}-s warm-up ({passes} resume passes; the rest is the timer loop)",
        per_s * 60.0,
        per_s,
        IDLE_WARMUP.as_secs()
    );

    // One pass over the parked runs, with the worker stopped, so the counter is the pass alone.
    let mut once = Vec::new();
    for _ in 0..RESUME_ONCE_PASSES {
        let before = store.round_trips();
        let started = Instant::now();
        worker
            .resume_once()
            .await
            .context("running one resume pass")?;
        once.push((store.round_trips() - before, started.elapsed()));
    }
    once.sort();
    let (once_round_trips, once_time) = once[once.len() / 2];
    println!(
        "bench: one resume_once over {n} parked runs: {once_round_trips} round trip(s), {:.2} ms \
         (each of {RESUME_ONCE_PASSES} passes: {:?})",
        ms(once_time),
        once.iter().map(|(rt, _)| *rt).collect::<Vec<_>>()
    );

    let (redrives_per_s, per_redrive) = match reconcile {
        Some(every) => {
            let made_due = setup
                .db
                .execute(IDLE_MAKE_DUE, &[&WORKFLOW, &REDRIVE_SAMPLE])
                .await
                .context("making a sample of parked runs due")?;
            let before = store.round_trips();
            let pass = worker
                .resume_once()
                .await
                .context("re-driving the sample")?;
            let spent = store.round_trips() - before;
            // The pass's one discovery query is not the re-drives' cost.
            #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
            let per = spent.saturating_sub(once_round_trips) as f64 / made_due.max(1) as f64;
            println!(
                "bench: reconcile: a pass re-driving {} due runs ({made_due} made due) took {spent} \
                 round trips = {per:.2} per re-drive; every parked run is re-driven once per {} s, \
                 so {n} parked cost {:.1} re-drives/s = {:.1} round trips/s ({:.0}/min) amortized",
                pass.resumed,
                every.as_secs(),
                parked_f / every.as_secs_f64(),
                parked_f / every.as_secs_f64() * per,
                parked_f / every.as_secs_f64() * per * 60.0
            );
            (parked_f / every.as_secs_f64(), per)
        }
        None => {
            println!("bench: reconcile off: parked runs are never re-driven; they cost nothing");
            (0.0, 0.0)
        }
    };
    if let Some(sink) = &sink {
        sink.shutdown();
    }
    let (rss_mb, _) = resident_memory_mb().unwrap_or((0.0, 0.0));
    let report = IdleReport {
        mode: "idle",
        parked: n,
        duration_s: round(elapsed, 1),
        round_trips,
        queries_per_min: round(per_s * 60.0, 1),
        queries_per_s: round(per_s, 3),
        passes,
        resume_once_round_trips: once_round_trips,
        resume_once_ms: round(ms(once_time), 2),
        metrics: args.metrics,
        reconcile_s: reconcile.map(|r| r.as_secs()),
        reconcile_redrives_per_s: round(redrives_per_s, 2),
        round_trips_per_redrive: round(per_redrive, 2),
        reconcile_round_trips_per_s: round(redrives_per_s * per_redrive, 1),
        park_s: round(park_s, 1),
        rss_mb: round(rss_mb, 1),
    };
    super::emit(&report)?;
    Ok(Outcome::Success)
}
