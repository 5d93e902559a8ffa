//! `keiro gc`: retention by hand. Deletes instances terminal for longer than `--older-than`,
//! with everything they own, in bounded batches (one short transaction each, `--pause` apart),
//! through the facade's `Keiro::gc`; `--dry-run` only counts them. A worker with
//! `ResumeOptions::retention` does the same continuously; the two never run a batch at once.

use std::time::{Duration, Instant};

use clap::Args;
use keiro::operate::GcRequest;

use crate::common::{Global, Outcome, Result, ResultExt};
use crate::ops::keiro;

/// Options of `keiro gc`.
#[derive(Debug, Clone, Args)]
pub(crate) struct GcArgs {
    /// Delete instances terminal for longer than this (`90s`, `15m`, `1h`, `30d`).
    #[arg(long)]
    older_than: String,
    /// Only count what would be deleted.
    #[arg(long)]
    dry_run: bool,
    /// Instances per batch (one transaction each; 1 to 10000).
    #[arg(long, default_value_t = keiro::operate::GC_BATCH_DEFAULT)]
    batch: u32,
    /// Pause between batches (`0ms` for none): the rate bound.
    #[arg(long, default_value = "100ms")]
    pause: String,
}

/// `keiro gc`.
pub(crate) async fn run(global: &Global, args: &GcArgs) -> Result<Outcome> {
    let older_than = crate::age::parse(&args.older_than).context("reading --older-than")?;
    let pause = crate::age::parse(&args.pause).context("reading --pause")?;
    let request = GcRequest {
        batch: args.batch.clamp(1, keiro::operate::GC_BATCH_MAX),
        ..GcRequest::new(older_than)
    };
    let keiro = keiro(global).await?;
    if args.dry_run {
        let n = keiro
            .gc_eligible(&request)
            .await
            .context("counting expired instances")?;
        println!(
            "{n} instance(s) terminal for over {} would be deleted",
            args.older_than
        );
        return Ok(Outcome::Success);
    }
    let started = Instant::now();
    let deleted = keiro
        .gc(&request, pause)
        .await
        .context("deleting expired instances")?;
    let elapsed = started.elapsed().max(Duration::from_millis(1));
    println!(
        "deleted {} instance(s), {} row(s) in all (journal {}, timers {}, awakeables {}, \
         signal waits {}, remote tasks {}) in {:.2}s",
        deleted.instances,
        deleted.rows(),
        deleted.journal,
        deleted.timers,
        deleted.awakeables,
        deleted.signal_waiters,
        deleted.remote_tasks,
        elapsed.as_secs_f64()
    );
    if deleted.locked_out {
        println!("stopped: another collector holds the retention lock; run again later");
        return Ok(Outcome::Failed);
    }
    Ok(Outcome::Success)
}
