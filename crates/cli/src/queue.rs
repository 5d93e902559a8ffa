//! `keiro queue list|show|pause|resume`: the operator's view of queues. Each is a thin call of
//! the facade's queue calls (`Keiro::queues`, `pause_queue`, `resume_queue`); none migrates.

use clap::{Args, Subcommand};
use keiro::queue::{Fairness, QueueInfo, QueueSpec, Rate};

use crate::common::{Global, Outcome, Result, ResultExt};

/// The queue subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum QueueCommand {
    /// Print every queue: its limits, and waiting, delayed and running runs.
    List,
    /// Print one queue: its limits, what it holds, the oldest waiting run and the busiest keys.
    Show(NameArgs),
    /// Pause admission: running runs go on, waiting ones wait.
    Pause(NameArgs),
    /// Resume admission.
    Resume(NameArgs),
}

/// Which queue.
#[derive(Debug, Clone, Args)]
pub(crate) struct NameArgs {
    /// The queue's name.
    pub(crate) name: String,
}

/// Runs one queue subcommand.
pub(crate) async fn run(global: &Global, command: &QueueCommand) -> Result<Outcome> {
    let keiro = crate::common::keiro(global, 1).await?;
    match command {
        QueueCommand::List => {
            let all = keiro.queues().await.context("listing queues")?;
            if all.is_empty() {
                println!("no queues in {}", global.place());
            }
            for queue in &all {
                print_summary(queue);
            }
        }
        QueueCommand::Show(args) => {
            let Some(queue) = keiro
                .queue(&args.name)
                .await
                .context(format!("reading queue {}", args.name))?
            else {
                eprintln!("no queue {} in {}", args.name, global.place());
                return Ok(Outcome::Failed);
            };
            print_summary(&queue);
            println!(
                "  oldest waiting since {}",
                queue
                    .oldest_waiting
                    .map_or_else(|| "-".to_owned(), crate::common::timestamp)
            );
            println!(
                "  admitted in the last {}: {}",
                queue
                    .spec
                    .rate
                    .map_or_else(|| "60s".to_owned(), |r| period(&r)),
                queue.admitted_recently
            );
            for (key, waiting, running) in &queue.top_keys {
                let key = if key.is_empty() { "(no key)" } else { key };
                println!("  key {key}: {waiting} waiting, {running} running");
            }
        }
        QueueCommand::Pause(args) => {
            keiro
                .pause_queue(&args.name)
                .await
                .context(format!("pausing queue {}", args.name))?;
            println!("paused {}", args.name);
        }
        QueueCommand::Resume(args) => {
            keiro
                .resume_queue(&args.name)
                .await
                .context(format!("resuming queue {}", args.name))?;
            println!("resumed {}", args.name);
        }
    }
    Ok(Outcome::Success)
}

fn print_summary(q: &QueueInfo) {
    let limits = limits(&q.spec);
    println!(
        "{}{}  {limits}  waiting {} (delayed {})  running {}",
        q.spec.name,
        if q.paused { " [paused]" } else { "" },
        q.waiting,
        q.delayed,
        q.running,
    );
}

/// A queue's limits and options as operators read them (`concurrency 10, key rate 100/60s,
/// weighted fairness`), in declaration order; `no limits` for a queue with none. The CLI and
/// the dashboard print the same words.
pub(crate) fn limits(spec: &QueueSpec) -> String {
    let mut limits = Vec::new();
    for (what, limit) in [
        ("concurrency", spec.concurrency),
        ("per worker", spec.worker_concurrency),
        ("per key", spec.key_concurrency),
    ] {
        if let Some(limit) = limit {
            limits.push(format!("{what} {limit}"));
        }
    }
    if let Some(rate) = &spec.rate {
        limits.push(format!("rate {}/{}", rate.limit(), period(rate)));
    }
    if let Some(rate) = &spec.key_rate {
        limits.push(format!("key rate {}/{}", rate.limit(), period(rate)));
    }
    if spec.priority {
        limits.push("priority".to_owned());
    }
    if spec.fairness == Fairness::Weighted {
        limits.push("weighted fairness".to_owned());
    }
    if let Some(dedup) = spec.dedup {
        limits.push(format!("dedup {}", dedup.as_str()));
    }
    if !spec.release_on_park {
        limits.push("keeps slots while parked".to_owned());
    }
    if limits.is_empty() {
        "no limits".to_owned()
    } else {
        limits.join(", ")
    }
}

/// A rate's period in whole seconds when it is one (`60s`), else in milliseconds (`250ms`).
pub(crate) fn period(rate: &Rate) -> String {
    let ms = rate.period_ms();
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}
