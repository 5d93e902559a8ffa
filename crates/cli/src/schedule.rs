//! `keiro schedule list|pause|resume|trigger`: the operator's view of schedules. Each is a thin
//! call of the facade's [`Schedules`](keiro::schedule::Schedules); none migrates.

use clap::{Args, Subcommand};
use keiro::{schedule::Cadence, schedule::CatchUp, schedule::Schedule};
use time::OffsetDateTime;

use crate::common::{Global, Outcome, Result, ResultExt};

/// The schedule subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Print every schedule: cadence, policies, next and last tick, last run, last error.
    List,
    /// Pause a schedule: no tick starts anything until it is resumed.
    Pause(NameArgs),
    /// Resume a paused schedule from its next tick; ticks that fell while paused are skipped.
    Resume(NameArgs),
    /// Start one run of a schedule now, whatever its overlap policy.
    Trigger(NameArgs),
}

/// Which schedule.
#[derive(Debug, Clone, Args)]
pub(crate) struct NameArgs {
    /// The schedule's name.
    pub(crate) name: String,
}

/// Runs one schedule subcommand.
pub(crate) async fn run(global: &Global, command: &ScheduleCommand) -> Result<Outcome> {
    let keiro = crate::common::keiro(global, 1).await?;
    let schedules = keiro.schedules();
    match command {
        ScheduleCommand::List => {
            let all = schedules.list().await.context("listing schedules")?;
            if all.is_empty() {
                println!("no schedules in {}", global.place());
            }
            for schedule in &all {
                print_schedule(schedule);
            }
            Ok(Outcome::Success)
        }
        ScheduleCommand::Pause(args) => {
            let s = schedules
                .pause(&args.name)
                .await
                .context(format!("pausing schedule {}", args.name))?;
            println!("paused {}", s.spec.name);
            Ok(Outcome::Success)
        }
        ScheduleCommand::Resume(args) => {
            let s = schedules
                .resume(&args.name)
                .await
                .context(format!("resuming schedule {}", args.name))?;
            println!(
                "resumed {}, next tick {}",
                s.spec.name,
                timestamp(s.next_tick)
            );
            Ok(Outcome::Success)
        }
        ScheduleCommand::Trigger(args) => {
            let started = schedules
                .trigger(&args.name)
                .await
                .context(format!("triggering schedule {}", args.name))?;
            println!("started {}", started.instance.key);
            Ok(Outcome::Success)
        }
    }
}

fn print_schedule(s: &Schedule) {
    let cadence = match &s.spec.cadence {
        Cadence::Cron {
            expression,
            time_zone,
        } => format!("cron {expression:?} in {time_zone}"),
        Cadence::Every(interval) => format!("every {}s", interval.as_secs()),
    };
    let catch_up = match s.spec.catch_up {
        CatchUp::None => "none".to_owned(),
        CatchUp::Last => "last".to_owned(),
        CatchUp::All { max } => format!("all (up to {max})"),
    };
    println!(
        "{}{}  workflow {}  {cadence}  overlap {}  catch-up {catch_up}",
        s.spec.name,
        if s.paused { " [paused]" } else { "" },
        s.spec.workflow,
        s.spec.overlap.as_str(),
    );
    println!(
        "  next {}  last {}  buffered {}  last run {}",
        timestamp(s.next_tick),
        timestamp(s.last_tick),
        timestamp(s.buffered_tick),
        s.last_instance.as_ref().map_or("-", |id| id.as_str()),
    );
    if let Some(error) = &s.last_error {
        println!("  last error {error}");
    }
    if let Some(retry_at) = s.retry_at {
        println!(
            "  backed off after {} failure(s) until {}",
            s.failures,
            timestamp(Some(retry_at))
        );
    }
}

fn timestamp(at: Option<OffsetDateTime>) -> String {
    at.map_or_else(|| "-".to_owned(), crate::common::timestamp)
}
