//! Many parked runs and many result waiters: P runs (default 100,000) parked on an awakeable
//! each, a push-aware worker idling over them (its queries per second, and the latency from
//! one awakeable's completion to that run's result), then W callers (default 10,000) of this
//! one process each awaiting a parked run's result with `Keiro::result` (the process's memory,
//! its connections and LISTEN connections on the server, the reads the waiters send while
//! nothing happens, and the latency from a completion to its waiter's answer).
//!
//! The runs park through the real path (started, claimed and driven to their awakeable by a
//! worker), as the `idle` mode parks them, so the journal and the wake-source rows are the
//! ones a worker makes.

use std::time::{Duration, Instant};

use keiro::postgres::PgStore;
use keiro::{worker::Tuning, Keiro};
use serde::Serialize;
use tokio::task::JoinSet;

use super::super::idle::{parked, WORKFLOW};
use super::super::{instance_id, start_all, Background, BenchArgs, Percentiles, Setup};
use crate::common::{connect_store, failure, resident_memory_mb, round, Global, Result, ResultExt};

/// The id prefix of the parked runs.
const PREFIX: &str = "park";
/// The application name of the waiters' store, to find its connections on the server.
const WAITERS_APPLICATION: &str = "keiro-bench-waiters";
/// Time the idle worker runs before its queries are counted.
const WARMUP: Duration = Duration::from_secs(5);
/// Completions timed one at a time, for each wake latency.
const WAKE_SAMPLES: u64 = 20;
/// How long the waiters' reads are counted while nothing happens.
const WAITERS_WINDOW: Duration = Duration::from_secs(10);

/// The idle worker's figures over the parked runs.
#[derive(Debug, Clone, Serialize)]
pub(super) struct ParkedFigures {
    pub(super) parked: u64,
    pub(super) park_s: f64,
    pub(super) idle_window_s: f64,
    pub(super) idle_queries: u64,
    pub(super) idle_queries_per_s: f64,
    /// Completion of one run's awakeable to its result in a waiting caller.
    pub(super) wake: Percentiles,
}

/// The waiters' figures.
#[derive(Debug, Clone, Serialize)]
pub(super) struct WaiterFigures {
    pub(super) waiters: u64,
    /// Resident memory of this process before the waiters and with them all waiting, in MiB.
    pub(super) rss_before_mb: f64,
    pub(super) rss_waiting_mb: f64,
    pub(super) rss_per_waiter_kb: f64,
    /// The waiters' store's connections on the server while they wait, and of those, the ones
    /// listening.
    pub(super) connections: i64,
    pub(super) listen_connections: i64,
    /// Reads the waiters' store sent per second while nothing closed.
    pub(super) reads_per_s: f64,
    /// Completion of a waited run's awakeable to its waiter's answer.
    pub(super) wake: Percentiles,
}

/// The pending awakeable run `id` parked on.
const SCALE_AWAKEABLE: &str = "SELECT id FROM awakeables \
     WHERE workflow_name = $1 AND workflow_id = $2 AND status = 'pending'";

/// The waiters' store's connections, and those whose last statement was a LISTEN.
const SCALE_CONNECTIONS: &str = "SELECT count(*), \
     count(*) FILTER (WHERE query ILIKE 'LISTEN%') \
     FROM pg_stat_activity WHERE application_name = $1";

/// Starts the P runs and has a worker drive each to its awakeable.
async fn park(setup: &Setup, args: &BenchArgs, n: u64) -> Result<f64> {
    let started = Instant::now();
    let keiro = Keiro::builder(setup.store.clone()).without_push().build();
    start_all(&keiro, WORKFLOW, PREFIX, n, args.producers, ()).await?;
    let parker = keiro
        .worker()
        .register(WORKFLOW, parked)
        .concurrency(usize::try_from(args.concurrency).context("--concurrency")?)
        .tuning(Tuning {
            reconcile: None,
            ..Tuning::default()
        })
        .build()
        .context("building the parking worker")?;
    parker.drain().await.context("parking the runs")?;
    let suspended: i64 = setup
        .db
        .query_one(
            "SELECT count(*) FROM workflows WHERE workflow_name = $1 AND status = 'suspended'",
            &[&WORKFLOW],
        )
        .await
        .context("counting the parked runs")?
        .get(0);
    if u64::try_from(suspended).ok() != Some(n) {
        return Err(failure(format!("{suspended} of {n} runs parked")));
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Completes run `i`'s awakeable and waits for `answered` (the run's result reaching a
/// waiter): the span between.
async fn wake_one(
    keiro: &Keiro,
    db: &tokio_postgres::Client,
    i: u64,
    answered: tokio::sync::oneshot::Receiver<()>,
) -> Result<Duration> {
    let id = instance_id(PREFIX, i);
    let awakeable: uuid::Uuid = db
        .query_one(SCALE_AWAKEABLE, &[&WORKFLOW, &id])
        .await
        .context(format!("reading the awakeable of {id}"))?
        .get(0);
    let started = Instant::now();
    keiro
        .complete_awakeable(awakeable, &1_u64)
        .await
        .context(format!("completing the awakeable of {id}"))?;
    tokio::time::timeout(Duration::from_secs(60), answered)
        .await
        .map_err(|_| failure(format!("{id} was not answered within 60 s of its wake")))?
        .map_err(|_| failure(format!("the waiter of {id} ended without an answer")))?;
    Ok(started.elapsed())
}

/// Spawns a waiter on `keiro` for run `i`; it signals `answered` when the result arrives.
fn spawn_waiter(
    waiting: &mut JoinSet<Result<()>>,
    keiro: &Keiro,
    i: u64,
) -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let keiro = keiro.clone();
    waiting.spawn(async move {
        let id = instance_id(PREFIX, i);
        let options = keiro::ResultOptions {
            timeout: None,
            ..keiro::ResultOptions::default()
        };
        keiro
            .result_with::<u64>((WORKFLOW, id.as_str()), &options)
            .await
            .context(format!("awaiting {id}"))?;
        let _ = tx.send(());
        Ok(())
    });
    rx
}

/// A store of `pool` connections named `application` on the server.
async fn named_store(
    global: &Global,
    args: &BenchArgs,
    pool: usize,
    application: &str,
) -> Result<PgStore> {
    let mut config = global.config(&args.bench_schema, pool)?;
    config.application_name = application.to_owned();
    connect_store(config).await
}

/// Parks the runs, then measures the idle worker over them and the waiters.
pub(super) async fn run(
    global: &Global,
    args: &BenchArgs,
    n: u64,
    waiters: u64,
) -> Result<(ParkedFigures, WaiterFigures)> {
    let concurrency = usize::try_from(args.concurrency).context("--concurrency")?;
    let setup = Setup::new(global, args, concurrency + 8).await?;
    println!("scale: parking {n} runs on an awakeable each");
    let park_s = park(&setup, args, n).await?;
    println!("scale: {n} runs parked in {park_s:.1} s");

    // The idle worker, push-aware with default options, on a store of its own.
    let worker_store = named_store(global, args, 4, "keiro-bench-idle-worker").await?;
    let keiro = Keiro::builder(worker_store.clone()).build();
    let worker = keiro
        .worker()
        .register(WORKFLOW, parked)
        .build()
        .context("building the idle worker")?;
    let background = Background::run(worker);
    tokio::time::sleep(WARMUP).await;
    let window = Duration::from_secs(if args.quick { 2 } else { 30 });
    let before = worker_store.round_trips();
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let idle_window_s = started.elapsed().as_secs_f64();
    let idle_queries = worker_store.round_trips() - before;
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let idle_queries_per_s = idle_queries as f64 / idle_window_s;
    println!(
        "scale: idle worker over {n} parked: {idle_queries} queries in {idle_window_s:.1} s = \
         {idle_queries_per_s:.2}/s"
    );

    // One run woken at a time, its result awaited by one caller.
    let samples = WAKE_SAMPLES.min(n / 2).max(1);
    let mut spans = Vec::new();
    let mut waiting = JoinSet::new();
    for i in 0..samples {
        let answered = spawn_waiter(&mut waiting, &keiro, i);
        tokio::time::sleep(Duration::from_millis(20)).await;
        spans.push(wake_one(&keiro, &setup.db, i, answered).await?);
    }
    while let Some(joined) = waiting.join_next().await {
        joined.context("a waiter task")??;
    }
    let wake = Percentiles::of(&spans);
    println!(
        "scale: one of {n} parked woken: completion to result p50 {:.2} ms, p99 {:.2} ms",
        wake.p50_ms, wake.p99_ms
    );
    let parked = ParkedFigures {
        parked: n,
        park_s: round(park_s, 1),
        idle_window_s: round(idle_window_s, 1),
        idle_queries,
        idle_queries_per_s: round(idle_queries_per_s, 2),
        wake,
    };

    // W waiters on a store of their own, over runs not woken yet.
    let waiters = waiters.min(n - samples);
    let waiter_store = named_store(global, args, 16, WAITERS_APPLICATION).await?;
    let waiting_keiro = Keiro::builder(waiter_store.clone()).build();
    let (rss_before_mb, _) = resident_memory_mb().unwrap_or((0.0, 0.0));
    let mut waiting = JoinSet::new();
    let mut answered = std::collections::HashMap::new();
    for i in samples..samples + waiters {
        answered.insert(i, spawn_waiter(&mut waiting, &waiting_keiro, i));
    }
    // Every waiter has read its row once and subscribed before the count starts.
    tokio::time::sleep(Duration::from_secs(if args.quick { 2 } else { 5 })).await;
    let (rss_waiting_mb, _) = resident_memory_mb().unwrap_or((0.0, 0.0));
    let row = setup
        .db
        .query_one(SCALE_CONNECTIONS, &[&WAITERS_APPLICATION])
        .await
        .context("counting the waiters' connections")?;
    let (connections, listen_connections): (i64, i64) = (row.get(0), row.get(1));
    let before = waiter_store.round_trips();
    let started = Instant::now();
    tokio::time::sleep(if args.quick {
        Duration::from_secs(1)
    } else {
        WAITERS_WINDOW
    })
    .await;
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let reads_per_s =
        (waiter_store.round_trips() - before) as f64 / started.elapsed().as_secs_f64();
    let mut spans = Vec::new();
    for i in samples..samples + samples.min(waiters) {
        let rx = answered
            .remove(&i)
            .ok_or_else(|| failure("a waiter lost"))?;
        spans.push(wake_one(&keiro, &setup.db, i, rx).await?);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let wake = Percentiles::of(&spans);
    waiting.abort_all();
    let stopped = background.stop().await?;
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let rss_per_waiter_kb = (rss_waiting_mb - rss_before_mb) * 1024.0 / waiters.max(1) as f64;
    println!(
        "scale: {waiters} result waiters: resident memory {rss_before_mb:.1} -> {rss_waiting_mb:.1} \
         MiB ({rss_per_waiter_kb:.1} KiB a waiter); {connections} connections, \
         {listen_connections} listening; {reads_per_s:.0} reads/s while nothing closed; \
         completion to answer p50 {:.2} ms, p99 {:.2} ms (the worker resumed {} runs)",
        wake.p50_ms, wake.p99_ms, stopped.resumed
    );
    Ok((
        parked,
        WaiterFigures {
            waiters,
            rss_before_mb: round(rss_before_mb, 1),
            rss_waiting_mb: round(rss_waiting_mb, 1),
            rss_per_waiter_kb: round(rss_per_waiter_kb, 2),
            connections,
            listen_connections,
            reads_per_s: round(reads_per_s, 1),
            wake,
        },
    ))
}
