//! `keiro bench`: measures keiro on the local Postgres, in a scratch schema it recreates; or,
//! for `throughput` and `direct`, on a SQLite file (`--database-url sqlite:PATH`, see
//! [`sqlite`]), beside `sqlite-baseline`, the same machine's one-row commit rate on SQLite (see
//! [`baseline`]).
//!
//! A mode is one experiment; each prints human lines and then, as its last stdout line, exactly
//! one JSON object with its figures, so scripts can `tail -n1`. A new mode is a variant of
//! [`Mode`] and a module beside [`throughput`] that reuses [`Setup`].
//!
//! - `throughput`: N workflows of K trivial steps through an in-process worker (see
//!   [`throughput`]).
//! - `wake-latency`: how long after an awakeable is completed its run takes its next step, with
//!   the push-aware worker against the fixed 1 s poll (see [`wake`]).
//! - `idle`: what a push-aware worker costs the database while 10,000 runs are parked (see
//!   [`idle`]).
//! - `remote`: remote steps through worker processes: dispatch-to-result latency when idle,
//!   remote steps per second under load (see [`remote`]).
//! - `drive-cost`: the cost of one drive against the length of the journal it replays (see
//!   [`drive_cost`]).
//! - `direct`: N workflows of K trivial steps by direct execution, C in flight in a closed loop
//!   (see [`direct`]); `--path worker` runs the same loop through start, worker and result.
//! - `gc`: retention's deletion rate in rows per second, and a running workload's throughput
//!   with and without a collecting worker, in interleaved rounds (see [`gc`]).
//! - `sqlite-baseline`: durable one-row commits per second on a SQLite file at 1 and C
//!   threads (see [`baseline`]).
//! - `suite`: the standard set in rounds, each beside pgbench's one-row INSERT, as one table
//!   with the machine it ran on (see [`suite`]).
//! - `scale`: a workflows table of a million finished and a hundred thousand live instances,
//!   and many parked runs and result waiters (see [`scale`]).

mod baseline;
mod direct;
mod drive_cost;
mod event;
mod gc;
mod idle;
mod phases;
pub(crate) mod remote;
mod scale;
mod server;
mod sqlite;
mod stream;
mod suite;
mod throughput;
mod wake;

use std::time::Duration;

use clap::{Args, ValueEnum};
use keiro::postgres::{LaneStats, PgStore};
use keiro::Keiro;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use serde::Serialize;

use crate::common::{
    connect_store, open_connection, postgres_only, recreate_scratch_schema, Global, Outcome,
    Result, ResultExt, Store,
};

/// Which experiment to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Mode {
    /// Workflows per second, steps per second, round trips per step, latency, memory.
    Throughput,
    /// Completion-to-next-step latency of awakeables: push-aware worker against 1 s polling.
    WakeLatency,
    /// Queries per minute of an idle push-aware worker over many parked runs.
    Idle,
    /// Remote steps through worker processes: idle latency, then throughput.
    Remote,
    /// Milliseconds per drive against the length of the journal the drive replays.
    DriveCost,
    /// Retention: deletion rows per second, and workload throughput with and without gc.
    Gc,
    /// Direct execution: C runs in flight, each started and driven by its caller.
    Direct,
    /// Durable one-row commits per second on a SQLite file, at 1 and C threads.
    SqliteBaseline,
    /// Stream appends per second by C runs, and the latency from an append to its reader.
    Stream,
    /// The latency from a run's event write to a caller waiting for it, here and elsewhere.
    Event,
    /// The standard set (throughput, direct, K=100, wake latency, idle cost, remote, SQLite)
    /// in rounds interleaved with pgbench: one table of medians and ratios, and the machine.
    Suite,
    /// At scale: claim, list, counts and retention over 1,000,000 finished and 100,000 live
    /// instances; an idle worker over many parked runs; many concurrent result waiters.
    Scale,
}

impl Mode {
    /// N when `-n` is not given.
    fn workflows_default(self) -> u64 {
        match self {
            Self::Throughput => 2000,
            Self::WakeLatency => 200,
            Self::Idle => 10_000,
            Self::Remote => 2000,
            Self::DriveCost => 1,
            Self::Gc => 20_000,
            Self::Direct => 2000,
            Self::SqliteBaseline => 0,
            Self::Stream => 20_000,
            Self::Event => 200,
            Self::Suite => 0,
            Self::Scale => 1_000_000,
        }
    }
}

/// Options of `keiro bench`.
#[derive(Debug, Clone, Args)]
pub(crate) struct BenchArgs {
    /// The experiment.
    #[arg(long, value_enum, default_value_t = Mode::Throughput)]
    pub(crate) mode: Mode,
    /// The scratch schema the bench drops and recreates (never the `--schema` one).
    #[arg(long, default_value = "keiro_bench")]
    pub(crate) bench_schema: String,
    /// Workflows started (N). Defaults to 2000 for `throughput`, 200 for `wake-latency` (the
    /// push samples), 10000 for `idle` (the parked runs), 20000 for `gc` (the expired
    /// backlog seeded each round) and 20000 for `stream` (the items, over C runs).
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) workflows: Option<u64>,
    /// Steps per workflow (K), `throughput` and `direct`.
    #[arg(short = 'k', long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub(crate) steps: u64,
    /// Runs the worker drives at once (C): the measured worker of `throughput`, the worker
    /// that parks the runs of `idle`; the runs in flight of `direct`.
    #[arg(short = 'c', long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub(crate) concurrency: u64,
    /// Tasks starting the workflows concurrently (`throughput`, `idle`).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub(crate) producers: u64,
    /// The `throughput` worker's gap between idle passes, in milliseconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(10..))]
    pub(crate) poll_interval_ms: u64,
    /// Record keiro's OpenTelemetry metrics (SDK meter provider, periodic reader into memory),
    /// to compare the overhead against a run without (`throughput`, `idle`).
    #[arg(long)]
    pub(crate) metrics: bool,
    /// `throughput` (both stores): seal every payload with an AES-256-GCM codec (`KeiroBuilder::codec`, a key
    /// made for the run), to compare the cost of payload encryption against a run without.
    #[arg(long)]
    pub(crate) codec: bool,
    /// How long the measured phase may take, in seconds (`throughput`).
    #[arg(long, default_value_t = 600)]
    pub(crate) timeout_s: u64,
    /// `wake-latency`: samples taken with the fixed 1 s poll worker. Each takes about a second
    /// (half waiting for the poll, half a random gap that spreads the completions over the poll
    /// cycle), so fewer than the push samples.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) poll_samples: u64,
    /// `wake-latency`: the pause between one run's wake and the next completion, in
    /// milliseconds, so each completion finds the worker idle.
    #[arg(long, default_value_t = 20)]
    pub(crate) gap_ms: u64,
    /// `idle`: how long the idle worker runs while its queries are counted, in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) duration_s: u64,
    /// `idle`: park the runs without the reconcile fallback (`reconcile: None`), so they are
    /// never re-driven while parked.
    #[arg(long)]
    pub(crate) reconcile_off: bool,
    /// `remote`: remote worker processes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) remote_workers: u64,
    /// `remote`: handlers each remote worker process runs at once.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) remote_concurrency: u64,
    /// `remote`: one-step workflows run one at a time, for the idle latency.
    #[arg(long, default_value_t = 200)]
    pub(crate) samples: u64,
    /// `gc`: workflows of the workload each round runs (N is the expired backlog seeded).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) workload: u64,
    /// `gc`: pairs of rounds (without gc, then with), interleaved; `suite`: rounds of the
    /// standard set, each beside its own pgbench run.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub(crate) rounds: u64,
    /// `suite`: which set: the headline's standard set, or the throughput targets at the
    /// concurrency each names, with a table of the targets met round by round.
    #[arg(long, value_enum, default_value_t = suite::Set::Standard)]
    pub(crate) suite_set: suite::Set,
    /// `suite`: seconds of each round's pgbench run (one-row INSERT, 16 clients).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(crate) pgbench_s: u64,
    /// `suite` and `scale`: the smallest sizes that still run every part, for a test (seconds
    /// a round); the figures mean nothing.
    #[arg(long)]
    pub(crate) quick: bool,
    /// `scale`: live (runnable) instances beside the N finished ones.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) live: u64,
    /// `scale`: runs parked on an awakeable while an idle worker is counted.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) parked: u64,
    /// `scale`: concurrent `Keiro::result` waiters in this process.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) waiters: u64,
    /// `direct`: how the closed loop runs its workflows: by direct execution, through `start`,
    /// the worker and `result` (the comparison), or alternating the two in every task.
    #[arg(long, value_enum, default_value_t = direct::Path::Direct)]
    pub(crate) path: direct::Path,
    /// Group commit in the bench's store (`Config::batching`): `false` gives one transaction
    /// per append, start and park, for comparison.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) batching: bool,
    /// `throughput`: each producer starts its workflows this many at a time with
    /// `Keiro::start_many` (1: one `start` call each, as a caller starting workflows one by
    /// one does; concurrent calls still share commits when batching is on).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub(crate) start_batch: u64,
    /// `throughput`: runs in progress on other workers, seeded before the measured phase: this
    /// many `running` instances of the bench workflow, older than the measured ones (so first
    /// in claim order), leased to another owner for an hour, then the table analyzed. A
    /// fleet's claims find these in front of the runs they may take.
    #[arg(long, default_value_t = 0)]
    pub(crate) in_progress: u64,
    /// `throughput`: start every workflow on the queue `bench`, keyed `k0` .. `k<n-1>` in turn
    /// (0: no queue). With no queue limit this measures what admission costs against a plain
    /// start and claim.
    #[arg(long, default_value_t = 0)]
    pub(crate) queue_keys: u64,
    /// `throughput` with `--queue-keys`: the queue's fleet-wide concurrency limit; the report
    /// then gives the admission latency at the limit (a freed slot to the next admission).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub(crate) queue_concurrency: Option<i32>,
    /// `throughput` with `--queue-keys`: the queue's per-key concurrency limit.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub(crate) queue_key_concurrency: Option<i32>,
    /// `throughput` with `--queue-keys`: weighted (round-robin) fairness across the keys.
    #[arg(long)]
    pub(crate) queue_fair: bool,
    /// On SQLite: the store's read connections (`Config::readers`; its default when absent).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub(crate) sqlite_readers: Option<u64>,
    /// On SQLite: the most operations one write transaction takes (`Config::batch_max`; its
    /// default when absent).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub(crate) sqlite_batch_max: Option<u64>,
    /// `sqlite-baseline`: seconds each thread count runs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(crate) baseline_s: u64,
    /// With batching, how many batches of one operation may be in flight at once, direct
    /// starts and appends counting as one (`Config::batch_in_flight`; the store's default when
    /// absent).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub(crate) batch_in_flight: Option<u64>,
    /// `throughput` and `direct`: also split the statements' time on the server, with
    /// `track_functions` and `track_wal_io_timing` on for the bench store's connections (a
    /// superuser's session settings), read from `pg_stat_user_functions` and `pg_stat_wal`.
    #[arg(long)]
    pub(crate) phases: bool,
}

impl BenchArgs {
    /// `builder` with an AES-256-GCM codec under a key made for the run when `--codec` asks.
    fn sealed(&self, builder: keiro::KeiroBuilder) -> Result<keiro::KeiroBuilder> {
        if !self.codec {
            return Ok(builder);
        }
        let key = keiro::codec::AesGcmCodec::generate_key_text();
        let codec = keiro::codec::AesGcmCodec::from_keys(&format!("bench:{key}"))
            .context("making the bench's key")?;
        Ok(builder.codec(std::sync::Arc::new(codec)))
    }

    /// N: `-n`, or the mode's default.
    fn workflows(&self) -> u64 {
        self.workflows
            .unwrap_or_else(|| self.mode.workflows_default())
    }

    /// The bench store's settings: the scratch schema, `pool_size` connections, and the
    /// batching options.
    fn store_config(&self, global: &Global, pool_size: usize) -> Result<keiro::postgres::Config> {
        let mut config = global
            .config(&self.bench_schema, pool_size)?
            .batching(self.batching);
        if let Some(in_flight) = self.batch_in_flight.and_then(|n| usize::try_from(n).ok()) {
            config.batch_in_flight = in_flight;
        }
        if self.phases {
            config.url = phases::with_tracking(&config.url)?;
        }
        Ok(config)
    }
}

/// Runs the chosen mode: on SQLite `throughput`, `direct`, `event` and `sqlite-baseline`, the others
/// measure the PostgreSQL store alone.
pub(crate) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let store = global.store()?;
    match (&store, args.mode) {
        (_, Mode::SqliteBaseline) => return baseline::run(args, store).await,
        (Store::Sqlite(path), Mode::Throughput) => return sqlite::throughput(args, path).await,
        (Store::Sqlite(path), Mode::Direct) => return sqlite::direct(args, path).await,
        (Store::Sqlite(path), Mode::Event) => return event::run_sqlite(args, path).await,
        (Store::Sqlite(_), _) => postgres_only(
            global,
            "this mode of keiro bench",
            "it measures round trips, plans and pools of the PostgreSQL store; on SQLite: \
             --mode throughput, direct, event or sqlite-baseline",
        )?,
        (Store::Postgres, _) => {}
    }
    match args.mode {
        Mode::Throughput => throughput::run(global, args).await,
        Mode::WakeLatency => wake::run(global, args).await,
        Mode::Idle => idle::run(global, args).await,
        Mode::Remote => remote::run(global, args).await,
        Mode::DriveCost => drive_cost::run(global, args).await,
        Mode::Gc => gc::run(global, args).await,
        Mode::Direct => direct::run(global, args).await,
        Mode::SqliteBaseline => baseline::run(args, store).await,
        Mode::Stream => stream::run(global, args).await,
        Mode::Event => event::run_postgres(global, args).await,
        Mode::Suite => suite::run(global, args).await,
        Mode::Scale => scale::run(global, args).await,
    }
}

/// The report the last mode emitted, for [`suite`], which runs the modes in turn.
static LAST_REPORT: std::sync::Mutex<Option<serde_json::Value>> = std::sync::Mutex::new(None);

/// Prints a mode's report as its last line (keys in the report's order) and keeps it, so the
/// suite reads each mode's figures as a script reading `tail -n1` would.
fn emit<T: Serialize>(report: &T) -> Result<()> {
    println!(
        "{}",
        serde_json::to_string(report).context("encoding the report")?
    );
    let value = serde_json::to_value(report).context("encoding the report")?;
    *LAST_REPORT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(value);
    Ok(())
}

/// The report [`emit`] kept last, taken (the next call finds none until another mode emits).
fn take_report() -> Option<serde_json::Value> {
    LAST_REPORT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
}

/// What every mode starts from: a fresh, migrated schema, the store (whose round-trip counter
/// the modes read), and a dedicated connection for reading results outside that count.
struct Setup {
    store: PgStore,
    db: tokio_postgres::Client,
}

impl Setup {
    async fn new(global: &Global, args: &BenchArgs, pool_size: usize) -> Result<Self> {
        let schema = &args.bench_schema;
        recreate_scratch_schema(global, schema).await?;
        let store = connect_store(args.store_config(global, pool_size)?).await?;
        store
            .migrate()
            .await
            .context(format!("migrating schema {schema}"))?;
        let db = open_connection(store.connection_config()).await?;
        Ok(Self { store, db })
    }
}

/// Starts `name` instances `<prefix>-0000000` .. `<prefix>-<n-1>` with `input`, from
/// `producers` concurrent tasks (each takes every `producers`-th id).
async fn start_all<I: Serialize + Clone + Send + Sync + 'static>(
    keiro: &Keiro,
    name: &'static str,
    prefix: &str,
    n: u64,
    producers: u64,
    input: I,
) -> Result<()> {
    start_all_keyed(keiro, name, prefix, n, producers, 0, input).await
}

/// [`start_all`], and with `queue_keys` > 0 on the queue `bench`, the i-th workflow keyed
/// `k<i mod queue_keys>`.
async fn start_all_keyed<I: Serialize + Clone + Send + Sync + 'static>(
    keiro: &Keiro,
    name: &'static str,
    prefix: &str,
    n: u64,
    producers: u64,
    queue_keys: u64,
    input: I,
) -> Result<()> {
    let mut producing = tokio::task::JoinSet::new();
    for producer in 0..producers {
        let (keiro, prefix, input) = (keiro.clone(), prefix.to_owned(), input.clone());
        producing.spawn(async move {
            let mut i = producer;
            while i < n {
                let id = instance_id(&prefix, i);
                let options = if queue_keys > 0 {
                    keiro::queue::StartOptions::on_queue(BENCH_QUEUE)
                        .key(format!("k{}", i % queue_keys))
                } else {
                    keiro::queue::StartOptions::default()
                };
                keiro
                    .start_with(name, &id, &input, &options)
                    .await
                    .context(format!("starting {name} {id}"))?;
                i += producers;
            }
            Ok::<_, crate::common::Error>(())
        });
    }
    while let Some(joined) = producing.join_next().await {
        joined.context("a producer task failed")??;
    }
    Ok(())
}

/// The queue `--queue-keys` starts the workflows on.
const BENCH_QUEUE: &str = "bench";

/// With `--queue-keys`: declares the bench queue with the `--queue-*` limits, and has the
/// bench worker serve it. Without: the worker as it is.
async fn with_bench_queue(
    keiro: &Keiro,
    args: &BenchArgs,
    worker: keiro::WorkerBuilder,
) -> Result<keiro::WorkerBuilder> {
    if args.queue_keys == 0 {
        return Ok(worker);
    }
    let mut spec = keiro::queue::QueueSpec::new(BENCH_QUEUE).context("the queue")?;
    spec.concurrency = args.queue_concurrency;
    spec.key_concurrency = args.queue_key_concurrency;
    if args.queue_fair {
        spec = spec.fairness(keiro::queue::Fairness::Weighted);
    }
    keiro
        .declare_queue(&spec)
        .await
        .context("declaring the bench queue")?;
    Ok(worker.queue(BENCH_QUEUE))
}

/// [`start_all`] with `Keiro::start_many`: each producer starts its ids `batch` at a time, in
/// one statement and one commit each.
async fn start_all_many<I: Serialize + Clone + Send + Sync + 'static>(
    keiro: &Keiro,
    name: &'static str,
    prefix: &str,
    n: u64,
    producers: u64,
    batch: usize,
    input: I,
) -> Result<()> {
    let mut producing = tokio::task::JoinSet::new();
    for producer in 0..producers {
        let (keiro, prefix, input) = (keiro.clone(), prefix.to_owned(), input.clone());
        producing.spawn(async move {
            let ids: Vec<String> = (producer..n)
                .step_by(usize::try_from(producers).unwrap_or(1))
                .map(|i| instance_id(&prefix, i))
                .collect();
            for chunk in ids.chunks(batch) {
                let outcomes = keiro
                    .start_many(name, chunk.iter().map(|id| (id.as_str(), &input)))
                    .await
                    .context(format!("starting {} {name} instances", chunk.len()))?;
                for (id, outcome) in chunk.iter().zip(outcomes) {
                    outcome.context(format!("starting {name} {id}"))?;
                }
            }
            Ok::<_, crate::common::Error>(())
        });
    }
    while let Some(joined) = producing.join_next().await {
        joined.context("a producer task failed")??;
    }
    Ok(())
}

/// A group-commit lane's calls per batch, for a report line.
fn mean_len(mean: Option<f64>) -> String {
    mean.map_or_else(
        || "none sent".to_owned(),
        |len| format!("{len:.1} per batch"),
    )
}

/// The report line of group-commit lanes, each named: its batches, the calls they carried,
/// and calls per batch. The first lane's figures are spelled out; the others follow its shape.
fn group_commit_line(lanes: &[(&str, LaneStats)]) -> String {
    let parts: Vec<String> = lanes
        .iter()
        .enumerate()
        .map(|(i, (name, lane))| {
            let carried = if i == 0 { " carried" } else { "" };
            let calls = if i == 0 { " calls" } else { "" };
            format!(
                "{} {name} batches{carried} {}{calls} ({})",
                lane.batches,
                lane.requests,
                mean_len(lane.mean_len())
            )
        })
        .collect();
    format!("bench: group commit: {}", parts.join(", "))
}

/// The id of instance `i` of a bench: zero-padded, so ids sort like numbers.
fn instance_id(prefix: &str, i: u64) -> String {
    format!("{prefix}-{i:07}")
}

/// Latency percentiles of a sample, in milliseconds; serialized into the reports.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Percentiles {
    samples: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    mean_ms: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples` (all zero when empty).
    fn of(samples: &[Duration]) -> Self {
        let mut sorted: Vec<f64> = samples.iter().map(|d| crate::common::ms(*d)).collect();
        sorted.sort_by(f64::total_cmp);
        let rank = |p: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            #[allow(clippy::cast_precision_loss)] // sample counts are far below 2^52
            let len = sorted.len() as f64;
            // Nearest rank: the smallest value with at least p of the sample at or below it.
            let index = (p * len).ceil().max(1.0) - 1.0;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            // index is in 0..len by construction
            sorted[(index as usize).min(sorted.len() - 1)]
        };
        #[allow(clippy::cast_precision_loss)] // sample counts are far below 2^52
        let mean = if sorted.is_empty() {
            0.0
        } else {
            sorted.iter().sum::<f64>() / sorted.len() as f64
        };
        let r = |v: f64| crate::common::round(v, 2);
        Self {
            samples: sorted.len(),
            p50_ms: r(rank(0.50)),
            p99_ms: r(rank(0.99)),
            max_ms: r(sorted.last().copied().unwrap_or(0.0)),
            mean_ms: r(mean),
        }
    }
}

/// A real OpenTelemetry pipeline for `--metrics`: an SDK meter provider whose periodic reader
/// exports into memory. The default export interval (60 s) means the measured cost is that of
/// recording and aggregating, which every deployment pays, not that of an exporter.
struct MetricsSink {
    provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
    metrics: keiro::Metrics,
}

impl MetricsSink {
    fn new() -> Self {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let metrics = keiro::Metrics::from_provider(&provider);
        Self {
            provider,
            exporter,
            metrics,
        }
    }

    /// Exports now and reads back the executed-steps counter: proof the pipeline was live.
    fn steps_executed(&self) -> Option<u64> {
        self.provider.force_flush().ok()?;
        let exported = self.exporter.get_finished_metrics().ok()?;
        // Cumulative temporality: the last export holds the running total.
        let last = exported.last()?;
        let mut total = None;
        for scope in last.scope_metrics() {
            for metric in scope.metrics() {
                if metric.name() != keiro_telemetry::names::WORKFLOW_STEPS_EXECUTED {
                    continue;
                }
                if let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() {
                    let points: u64 = sum.data_points().map(|p| p.value()).sum();
                    total = Some(total.unwrap_or(0) + points);
                }
            }
        }
        total
    }

    fn shutdown(&self) {
        // Nothing is waiting on the export: a failure to stop the reader thread cleanly is moot
        // at exit.
        let _ = self.provider.shutdown();
    }
}

/// A bench worker running in a task of its own until [`stop`](Self::stop).
pub(super) struct Background {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<keiro::worker::ResumeSummary>,
}

impl Background {
    /// Runs `worker` (its resume loop, timers and push) in a spawned task.
    pub(super) fn run(worker: keiro::Worker) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            worker
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
        });
        Self { stop, task }
    }

    /// Stops the worker and waits for its loops to end: what they did in all.
    pub(super) async fn stop(self) -> Result<keiro::worker::ResumeSummary> {
        let _ = self.stop.send(());
        self.task.await.context("the bench worker task failed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let p = Percentiles::of(&samples);
        assert_eq!(p.samples, 100);
        assert!((p.p50_ms - 50.0).abs() < 1e-9, "{p:?}");
        assert!((p.p99_ms - 99.0).abs() < 1e-9, "{p:?}");
        assert!((p.max_ms - 100.0).abs() < 1e-9, "{p:?}");
        assert!((p.mean_ms - 50.5).abs() < 1e-9, "{p:?}");
        let one = Percentiles::of(&[Duration::from_millis(7)]);
        assert!((one.p50_ms - 7.0).abs() < 1e-9 && (one.p99_ms - 7.0).abs() < 1e-9);
        assert_eq!(Percentiles::of(&[]).samples, 0);
    }

    #[test]
    fn each_mode_has_its_own_default_n() {
        assert_eq!(Mode::Throughput.workflows_default(), 2000);
        assert_eq!(Mode::WakeLatency.workflows_default(), 200);
        assert_eq!(Mode::Idle.workflows_default(), 10_000);
    }
}
