//! `drive-cost`: what one drive costs as a generation's journal grows.
//!
//! Every drive loads the whole generation's journal and replays it before the body does
//! anything fresh, so a drive is O(n) in the journal's length, and a workflow that parks and
//! wakes n times in one generation pays O(n²) in all. For each length L (10 up to 20,000
//! entries) the bench builds one instance whose body runs L trivial steps and then parks on an
//! await, then times re-drives of it: the load, the replay of L journal hits and the park. The
//! report gives milliseconds per drive and microseconds per journal entry; the journal budget
//! (`JournalBudget`, 50,000 entries by default) bounds the worst drive, and continue-as-new
//! resets it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keiro::{store::LeaseStore, worker::Registry, worker::ResumeOptions, Ctx, WorkflowError};
use serde::Serialize;

use super::{BenchArgs, Percentiles, Setup};
use crate::common::{failure, round, Global, Outcome, Result, ResultExt};

/// The journal lengths measured.
const LENGTHS: [u64; 6] = [10, 100, 1_000, 5_000, 10_000, 20_000];

/// Re-drives timed per length (the report takes their median).
const DRIVES: usize = 15;

/// Runs `input` trivial steps, then parks until `go` is delivered.
async fn long_journal(ctx: Ctx, steps: u64) -> Result<u64, WorkflowError> {
    for i in 0..steps {
        ctx.step(&format!("s-{i}"), || async move { Ok::<_, Infallible>(i) })
            .await?;
    }
    ctx.await_step::<()>("go").await?;
    Ok(steps)
}

#[derive(Debug, Serialize)]
struct Length {
    entries: u64,
    drive_p50_ms: f64,
    drive_p99_ms: f64,
    us_per_entry: f64,
}

#[derive(Debug, Serialize)]
struct DriveCostReport {
    mode: &'static str,
    drives_per_length: usize,
    lengths: Vec<Length>,
}

pub(crate) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let setup = Setup::new(global, args, 4).await?;
    let store: Arc<dyn LeaseStore> = Arc::new(setup.store.clone());
    let keiro = keiro::Keiro::builder(setup.store.clone())
        .without_push()
        .build();
    let mut registry = Registry::new();
    registry
        .register("bench-drive-cost", long_journal)
        .context("registering")?;
    // A parked run is due again at once (the reconcile fallback of 1 ms), so each pass is one
    // full drive: the claim that loads the journal, the replay, the park.
    let options = ResumeOptions {
        reconcile: Some(Duration::from_millis(1)),
        journal_budget: keiro::workflow::JournalBudget {
            steps: usize::MAX,
            bytes: usize::MAX,
        },
        ..ResumeOptions::default()
    };
    let mut lengths = Vec::new();
    for entries in LENGTHS {
        let id = format!("len-{entries}");
        keiro
            .start("bench-drive-cost", &id, &entries)
            .await
            .context("starting")?;
        // The first drive journals the steps; every later one replays them and parks again.
        let built = keiro::worker::resume_once(&store, &registry, &options)
            .await
            .context("building the journal")?;
        if built.resumed != 1 {
            return Err(failure(format!(
                "building the journal of {entries}: {built:?}"
            )));
        }
        let mut samples = Vec::with_capacity(DRIVES);
        for _ in 0..DRIVES {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let started = Instant::now();
            let driven = keiro::worker::resume_once(&store, &registry, &options)
                .await
                .context("re-driving")?;
            samples.push(started.elapsed());
            if driven.resumed != 1 {
                return Err(failure(format!(
                    "re-driving the journal of {entries}: {driven:?}"
                )));
            }
        }
        // Done with this length: finish it so the next length's passes drive only their own.
        keiro
            .deliver(("bench-drive-cost", &id), "go", &())
            .await
            .context("finishing")?;
        keiro::worker::resume_once(&store, &registry, &options)
            .await
            .context("finishing")?;
        let p = Percentiles::of(&samples);
        #[allow(clippy::cast_precision_loss)] // lengths are small
        let per_entry = p.p50_ms * 1000.0 / entries as f64;
        println!(
            "{entries:>6} entries: drive p50 {:.2} ms, p99 {:.2} ms, {:.2} us per entry",
            p.p50_ms, p.p99_ms, per_entry
        );
        lengths.push(Length {
            entries,
            drive_p50_ms: round(p.p50_ms, 2),
            drive_p99_ms: round(p.p99_ms, 2),
            us_per_entry: round(per_entry, 2),
        });
    }
    let report = DriveCostReport {
        mode: "drive-cost",
        drives_per_length: DRIVES,
        lengths,
    };
    super::emit(&report)?;
    Ok(Outcome::Success)
}
