//! `keiro versions`: runs per application version and status, which versions have live workers
//! (their heartbeat rows), the live runs no live worker serves; `keiro versions move FROM TO`
//! hands the live runs of one version to another. The unversioned runs are `""` on the command
//! line and `(unversioned)` in the output.

use std::time::Duration;

use clap::{Args, Subcommand};
use keiro::versions::{live, unserved, VersionCount, WorkerRow};
use keiro::{Keiro, Status};
use time::OffsetDateTime;

use crate::common::{failure, Global, Outcome, Result, ResultExt};
use crate::ops::keiro;

/// Options of `keiro versions`.
#[derive(Debug, Clone, Args)]
pub(crate) struct VersionsArgs {
    #[command(subcommand)]
    command: Option<VersionsCommand>,
    /// A worker is live when its latest heartbeat is younger than this many seconds.
    #[arg(long, default_value_t = 30)]
    live_s: u64,
}

/// `keiro versions` subcommands.
#[derive(Debug, Clone, Subcommand)]
enum VersionsCommand {
    /// Hand the live runs (running or suspended) of version FROM to version TO.
    Move(MoveArgs),
}

/// Options of `keiro versions move`.
#[derive(Debug, Clone, Args)]
struct MoveArgs {
    /// The version whose live runs move (`""`: the unversioned runs).
    from: String,
    /// The version they move to (`""`: unversioned).
    to: String,
    /// First replay each run's journal against the workflows compiled into this binary, and
    /// refuse the move on any divergence. The `keiro` binary holds none of your workflows: run
    /// the check from your application (`keiro::testing::verify_version`).
    #[arg(long)]
    verify: bool,
}

/// How many runs `--verify` checks at most.
const VERIFY_LIMIT: i64 = 10_000;

const STATUSES: [Status; 5] = [
    Status::Running,
    Status::Suspended,
    Status::Completed,
    Status::Failed,
    Status::Cancelled,
];

/// `keiro versions [move FROM TO]`.
pub(crate) async fn run(global: &Global, args: &VersionsArgs) -> Result<Outcome> {
    let keiro = keiro(global).await?;
    match &args.command {
        None => show(&keiro, Duration::from_secs(args.live_s)).await,
        Some(VersionsCommand::Move(args)) => move_runs(&keiro, args).await,
    }
}

fn label(version: &str) -> &str {
    if version.is_empty() {
        "(unversioned)"
    } else {
        version
    }
}

async fn show(keiro: &Keiro, window: Duration) -> Result<Outcome> {
    let counts = keiro
        .versions_count()
        .await
        .context("counting runs per version")?;
    let workers = keiro.workers().await.context("listing workers")?;
    let now = OffsetDateTime::now_utc();
    let alive = live(&workers, now, window);
    print!("{:<24}", "version");
    for status in STATUSES {
        print!(" {:>10}", status.as_str());
    }
    println!(" {:>6}", "live workers");
    let mut versions: Vec<&str> = counts.iter().map(|c| c.app_version.as_str()).collect();
    versions.extend(alive.iter().map(|w| w.app_version.as_str()));
    versions.sort_unstable();
    versions.dedup();
    for version in versions {
        print!("{:<24}", label(version));
        for status in STATUSES {
            let n = counts
                .iter()
                .find(|c| c.app_version == version && c.status == status)
                .map_or(0, |c| c.runs);
            print!(" {n:>10}");
        }
        let workers = alive.iter().filter(|w| w.app_version == version).count();
        println!(" {workers:>6}");
    }
    for worker in &alive {
        print_worker(worker, now);
    }
    let gone = workers.len() - alive.len();
    if gone > 0 {
        // Workers killed without stopping leave their row; it is kept, not shown.
        println!(
            "{gone} worker row(s) not seen for {}s or more",
            window.as_secs()
        );
    }
    print_unserved(&counts, &alive);
    Ok(Outcome::Success)
}

fn print_worker(worker: &WorkerRow, now: OffsetDateTime) {
    let serves = match worker.serves.as_filter() {
        None => "any version".to_owned(),
        Some(list) => list.iter().map(|v| label(v)).collect::<Vec<_>>().join(", "),
    };
    let age = (now - worker.last_seen).whole_seconds();
    println!(
        "worker {} (live) runs {} serves {serves}; last seen {age}s ago",
        worker.worker_id,
        label(&worker.app_version)
    );
}

/// The warning lines for live runs no live worker serves (also printed by `keiro stats`).
pub(crate) fn print_unserved(counts: &[VersionCount], alive: &[&WorkerRow]) {
    let mut lonely = unserved(counts, alive);
    lonely.sort_by(|a, b| a.app_version.cmp(&b.app_version));
    let mut versions: Vec<&str> = lonely.iter().map(|c| c.app_version.as_str()).collect();
    versions.dedup();
    for version in versions {
        let runs: u64 = lonely
            .iter()
            .filter(|c| c.app_version == version)
            .map(|c| c.runs)
            .sum();
        println!(
            "warning: {runs} live run(s) of version {} have no live worker serving it",
            label(version)
        );
    }
}

async fn move_runs(keiro: &Keiro, args: &MoveArgs) -> Result<Outcome> {
    if args.verify {
        let registry = keiro::worker::Registry::new();
        let refused = keiro::testing::verify_version(keiro, &registry, &args.from, VERIFY_LIMIT)
            .await
            .context("checking the runs before the move")?;
        if !refused.is_empty() {
            for (key, why) in &refused {
                println!("refused: {key}: {why}");
            }
            println!(
                "nothing moved: {} run(s) of version {} do not replay here",
                refused.len(),
                label(&args.from)
            );
            return Ok(Outcome::Failed);
        }
    }
    let moved = keiro
        .versions_move(&args.from, &args.to)
        .await
        .map_err(|e| failure(format!("moving the runs of {}: {e}", label(&args.from))))?;
    println!(
        "moved {moved} live run(s) from {} to {}",
        label(&args.from),
        label(&args.to)
    );
    Ok(Outcome::Success)
}
