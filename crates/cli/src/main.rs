//! `keiro`: the command-line tool of keiro, durable workflows for Rust on PostgreSQL.
//!
//! - `keiro migrate` applies the schema migrations.
//! - `keiro show`, `cancel`, `resurrect`, `release` operate on one workflow instance.
//! - `keiro list` and `keiro stats` list instances by filter (keyset pages) and count them;
//!   `keiro gc` deletes instances terminal for longer than a window (retention).
//! - `keiro schedule list|pause|resume|trigger` operate on schedules.
//! - `keiro versions` counts runs per application version and status and shows which versions
//!   have live workers; `keiro versions move FROM TO` hands one version's live runs to another.
//! - `keiro stream NAME ID KEY [--from N] [--follow]` prints a workflow's stream, one JSON
//!   line per item, following it live with `--follow`.
//! - `keiro ui` serves the dashboard (a JSON API under `/api/v1` and HTML pages) on
//!   127.0.0.1:8080; actions need `--token` (`KEIRO_UI_TOKEN`), without it it is read-only.
//! - `keiro demo` proves the crash guarantees end to end: it runs 200 workflows through a
//!   worker process, kills that process with SIGKILL mid-run, lets a second one finish the work,
//!   and checks from the database that no recorded step ran again. Beside them, durable sleeps
//!   and awakeables show runs resumed by push, within milliseconds of their wake. Without a
//!   `--database-url` (or `DATABASE_URL`) it runs on a SQLite file in a temporary directory.
//! - `keiro bench` measures throughput, round trips per step, latency and memory; wake latency
//!   (push against polling); and the queries an idle worker makes over parked runs.
//! - `keiro chaos` proves the guarantees under faults: worker and remote worker processes killed
//!   with SIGKILL every 0.5 s and PostgreSQL restarted in immediate mode, then every invariant
//!   checked from the journal and a table of witnesses; one JSON line. Without a
//!   `--database-url` it runs on a SQLite file in a temporary directory (SIGKILLs only: there
//!   is no server to restart).
//!
//! Every command reads `--database-url` (`DATABASE_URL`): `postgres://…` for a PostgreSQL
//! server (default: the local one), `sqlite:PATH` for a SQLite file, where the operator
//! commands work alike through the same facade calls (`keiro bench` is PostgreSQL's but for its
//! `throughput`, `direct` and `sqlite-baseline` modes).
//! `--schema` (`KEIRO_SCHEMA`) is the PostgreSQL schema; the demo and the bench work in scratch
//! schemas of their own, which they drop and recreate.
//! Logs go to stderr, filtered by `RUST_LOG` (default `warn`).

mod age;
mod bench;
mod chaos;
mod common;
mod demo;
mod gc;
mod list;
mod lite;
mod migrate;
mod ops;
mod proof;
mod queue;
mod reencrypt;
mod schedule;
mod stream;
mod timeline;
mod ui;
mod update;
mod versions;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::common::{error_chain, Global};

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "keiro",
    version,
    about = "keiro: durable workflows for Rust on PostgreSQL"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Command {
    /// Create the schema if needed and apply pending migrations.
    Migrate,
    /// Print an instance row, its whole journal, its timeline and its remote tasks.
    Show(ops::KeyArgs),
    /// List instances by filter, newest first, one page at a time (keyset cursor).
    List(list::ListArgs),
    /// Count instances by workflow and status, the timer backlog and remote tasks by group.
    Stats(list::StatsArgs),
    /// Delete instances terminal for longer than a window, with everything they own.
    Gc(gc::GcArgs),
    /// Cancel an instance: the run stops at its next step boundary.
    Cancel(ops::KeyArgs),
    /// Return a failed instance to running, keeping its failure history.
    Resurrect(ops::KeyArgs),
    /// Force-release an instance's lease; its holder stops at its next step boundary.
    Release(ops::KeyArgs),
    /// Retry a failed instance: failed remote steps and failed children run again.
    Requeue(ops::KeyArgs),
    /// Re-dispatch every pending remote step of an instance.
    Redispatch(ops::KeyArgs),
    /// Start `<id>~retry~<hex>` of a failed instance with a corrected input (JSON).
    RetryWithInput(ops::RetryArgs),
    /// Print a workflow's stream, one JSON line per item; `--follow` follows it live.
    Stream(stream::StreamArgs),
    /// Send an update to a running workflow and print its answer (JSON).
    Update(update::UpdateArgs),
    /// Seal the payloads of chosen runs again with the current key of KEIRO_ENCRYPTION_KEYS.
    Reencrypt(reencrypt::ReencryptArgs),
    /// Operate schedules: list, pause, resume, trigger.
    #[command(subcommand)]
    Schedule(schedule::ScheduleCommand),
    /// Operate queues: list, show, pause, resume.
    #[command(subcommand)]
    Queue(queue::QueueCommand),
    /// Runs per application version and status, live workers per version; `move FROM TO`
    /// hands the live runs of one version to another.
    Versions(versions::VersionsArgs),
    /// Serve the dashboard: counts and charts, the instance list, instance pages with their
    /// timeline and live streams, queues, and operator actions.
    Ui(ui::UiArgs),
    /// Crash-recovery demo: kill a worker mid-run and verify every guarantee from the database.
    Demo(demo::DemoArgs),
    /// The demo's worker process (spawned by `keiro demo`, not for direct use).
    #[command(hide = true)]
    DemoWorker(demo::WorkerArgs),
    /// Benchmark: workflows through an in-process worker on a fresh schema.
    Bench(bench::BenchArgs),
    /// The remote bench's worker process (spawned by `keiro bench --mode remote`).
    #[command(hide = true)]
    BenchRemoteWorker(bench::remote::RemoteWorkerArgs),
    /// Chaos: SIGKILLs and PostgreSQL restarts under load, then every invariant checked.
    Chaos(chaos::ChaosArgs),
    /// The chaos run's worker process (spawned by `keiro chaos`, not for direct use).
    #[command(hide = true)]
    ChaosWorker(chaos::WorkerArgs),
    /// The chaos run's remote worker process (spawned by `keiro chaos`, not for direct use).
    #[command(hide = true)]
    ChaosRemoteWorker(chaos::RemoteWorkerArgs),
    /// The chaos run's direct caller process (spawned by `keiro chaos`, not for direct use).
    #[command(hide = true)]
    ChaosDirect(chaos::DirectArgs),
}

/// Exit status: 0 on success, 1 when a check failed or an operation was refused, 2 on errors.
fn main() -> ExitCode {
    let cli = Cli::parse();
    common::init_tracing();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the async runtime: {error}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async move {
        let global = cli.global;
        common::init_tls(&global)?;
        if let Command::BenchRemoteWorker(_) = &cli.command {
            common::postgres_only(
                &global,
                "keiro bench",
                "it measures round trips, plans and pools of the PostgreSQL store",
            )?;
        }
        match cli.command {
            Command::Migrate => migrate::run(&global).await,
            Command::Show(key) => ops::show(&global, &key).await,
            Command::List(args) => list::list(&global, &args).await,
            Command::Stats(args) => list::stats(&global, &args).await,
            Command::Gc(args) => gc::run(&global, &args).await,
            Command::Cancel(key) => ops::cancel(&global, &key).await,
            Command::Resurrect(key) => ops::resurrect(&global, &key).await,
            Command::Release(key) => ops::release(&global, &key).await,
            Command::Requeue(key) => ops::requeue(&global, &key).await,
            Command::Redispatch(key) => ops::redispatch(&global, &key).await,
            Command::RetryWithInput(args) => ops::retry_with_input(&global, &args).await,
            Command::Stream(args) => stream::run(&global, &args).await,
            Command::Reencrypt(args) => reencrypt::run(&global, &args).await,
            Command::Update(args) => update::run(&global, &args).await,
            Command::Schedule(command) => schedule::run(&global, &command).await,
            Command::Queue(command) => queue::run(&global, &command).await,
            Command::Versions(args) => versions::run(&global, &args).await,
            Command::Ui(args) => ui::run(&global, &args).await,
            Command::Demo(args) => demo::run(&global, &args).await,
            Command::DemoWorker(args) => demo::worker::run(&global, &args).await,
            Command::Bench(args) => bench::run(&global, &args).await,
            Command::BenchRemoteWorker(args) => bench::remote::worker(&global, &args).await,
            Command::Chaos(args) => chaos::run(&global, &args).await,
            Command::ChaosWorker(args) => chaos::child::worker(&global, &args).await,
            Command::ChaosRemoteWorker(args) => chaos::child::remote_worker(&global, &args).await,
            Command::ChaosDirect(args) => chaos::child::direct(&global, &args).await,
        }
    });
    // Waiting for background tasks (pool connections, a worker's in-flight runs) would only
    // delay the exit: everything that matters has been awaited by now.
    runtime.shutdown_background();
    match result {
        Ok(common::Outcome::Success) => ExitCode::SUCCESS,
        Ok(common::Outcome::Failed) => ExitCode::from(1),
        Err(error) => {
            eprintln!("error: {}", error_chain(error.as_ref()));
            ExitCode::from(2)
        }
    }
}
