//! `suite`: the standard set, run in rounds, each round beside pgbench's one-row INSERT on the
//! same server, printed as one table: medians over the rounds and the median of each round's
//! ratio to that round's pgbench, under a block naming the machine.
//!
//! The set is the headline's: throughput through a worker and by direct execution (K=3), long
//! workflows (K=100), wake latency, what an idle worker costs, remote steps, and the same
//! throughput on a SQLite file. Each part is the mode of the same name, run in this process
//! with the suite's sizes; its figures are the report it emits. The rates are set against
//! pgbench's transactions per second of the same round, because the machine's speed swings
//! within minutes and a ratio taken within one round does not.
//!
//! `--suite-set targets` runs instead the set the engine's throughput targets are held to
//! (steps per second against pgbench at 64 and 16 runs in flight, the worker path against
//! direct execution, an unlimited queue against no queue with four producers and with sixteen,
//! start-then-await against the worker's own throughput and direct execution's latency) and
//! adds a second table: each target's ratio in every round, its median and the rounds that met
//! it.

mod machine;
mod pgbench;

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use clap::ValueEnum;

use super::{direct, idle, remote, sqlite, take_report, throughput, wake, BenchArgs, Mode};
use crate::common::{
    failure, open_connection, recreate_scratch_schema, round, Global, Outcome, Result, ResultExt,
};

/// Which set `--mode suite` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Set {
    /// The headline's: throughput, direct, K=100, wake latency, idle cost, remote, SQLite.
    Standard,
    /// The throughput targets: each part at the concurrency its target names, and a table of
    /// the targets met round by round.
    Targets,
}

/// What a part of the set runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    Postgres,
    Sqlite,
}

/// One figure the table shows, read from a part's report.
struct Figure {
    /// The table's name for it.
    label: &'static str,
    /// The JSON pointer into the part's report.
    pointer: &'static str,
    /// A rate, set against pgbench's; a latency or a query rate is shown alone.
    against_pgbench: bool,
}

/// A part of the set: a mode with the suite's sizes, and the figures it gives.
struct Part {
    name: &'static str,
    on: On,
    args: BenchArgs,
    figures: Vec<Figure>,
}

const fn figure(label: &'static str, pointer: &'static str, against_pgbench: bool) -> Figure {
    Figure {
        label,
        pointer,
        against_pgbench,
    }
}

/// The parts of `base`'s set.
fn parts(base: &BenchArgs) -> Vec<Part> {
    match base.suite_set {
        Set::Standard => standard_parts(base),
        Set::Targets => target_parts(base),
    }
}

/// The standard set, sized from `base` (the user's options): small enough that three rounds
/// take a few minutes, or with `--quick` seconds.
fn standard_parts(base: &BenchArgs) -> Vec<Part> {
    let quick = base.quick;
    let size = |full: u64, small: u64| if quick { small } else { full };
    let with = |mode: Mode, n: u64, steps: u64| BenchArgs {
        mode,
        workflows: Some(n),
        steps,
        ..base.clone()
    };
    vec![
        Part {
            name: "throughput",
            on: On::Postgres,
            args: with(Mode::Throughput, size(4000, 40), 3),
            figures: vec![
                figure("throughput K=3, worker (steps/s)", "/steps_per_s", true),
                figure("throughput K=3, p50 start to done (ms)", "/p50_ms", false),
            ],
        },
        Part {
            name: "direct",
            on: On::Postgres,
            args: with(Mode::Direct, size(4000, 40), 3),
            figures: vec![
                figure("direct K=3, C=16 (steps/s)", "/steps_per_s", true),
                figure("direct K=3, p50 start to output (ms)", "/p50_ms", false),
            ],
        },
        Part {
            name: "throughput K=100",
            on: On::Postgres,
            args: with(Mode::Throughput, size(200, 4), 100),
            figures: vec![figure(
                "throughput K=100, worker (steps/s)",
                "/steps_per_s",
                true,
            )],
        },
        Part {
            name: "wake-latency",
            on: On::Postgres,
            args: BenchArgs {
                poll_samples: size(3, 1),
                ..with(Mode::WakeLatency, size(100, 5), 3)
            },
            figures: vec![
                figure("wake latency, push p50 (ms)", "/push/p50_ms", false),
                figure("wake latency, push p99 (ms)", "/push/p99_ms", false),
            ],
        },
        Part {
            name: "idle",
            on: On::Postgres,
            args: BenchArgs {
                duration_s: size(10, 1),
                ..with(Mode::Idle, size(2000, 20), 3)
            },
            figures: vec![figure(
                "idle worker over parked runs (queries/s)",
                "/queries_per_s",
                false,
            )],
        },
        Part {
            name: "remote",
            on: On::Postgres,
            args: BenchArgs {
                samples: size(50, 3),
                ..with(Mode::Remote, size(500, 10), 3)
            },
            figures: vec![
                figure(
                    "remote steps, one worker process (steps/s)",
                    "/remote_steps_per_s",
                    true,
                ),
                figure(
                    "remote, idle dispatch to result p50 (ms)",
                    "/idle_dispatch_to_result_p50_ms",
                    false,
                ),
            ],
        },
        Part {
            name: "sqlite throughput",
            on: On::Sqlite,
            args: with(Mode::Throughput, size(4000, 40), 3),
            figures: vec![figure(
                "embedded (SQLite file) throughput K=3 (steps/s)",
                "/steps_per_s",
                true,
            )],
        },
    ]
}

/// A part of the targets set: `mode` with N workflows of K steps, C in flight.
fn target_part(
    base: &BenchArgs,
    name: &'static str,
    (mode, n, steps, concurrency): (Mode, u64, u64, u64),
    figures: Vec<Figure>,
) -> Part {
    let n = if base.quick { (n / 100).max(4) } else { n };
    Part {
        name,
        on: On::Postgres,
        args: BenchArgs {
            mode,
            workflows: Some(n),
            steps,
            concurrency,
            // Enough producers that the worker's claims, not the starts, bound it (at 64 in
            // flight four producers' start batches of four cap it).
            producers: if concurrency >= 64 {
                16
            } else {
                base.producers
            },
            queue_keys: 0,
            path: direct::Path::Direct,
            ..base.clone()
        },
        figures,
    }
}

/// `part` with its arguments changed by `change`.
fn adjusted(mut part: Part, change: impl FnOnce(&mut BenchArgs)) -> Part {
    change(&mut part.args);
    part
}

/// The targets set: every part a target reads, at the concurrency the target names.
fn target_parts(base: &BenchArgs) -> Vec<Part> {
    let steps_per_s = |label| vec![figure(label, "/steps_per_s", true)];
    let workflows_per_s = |label| vec![figure(label, "/workflows_per_s", true)];
    // The queue's cost is read twice: with four producers each waiting for its start, every
    // start batch holds four and the start statement sets the rate; with sixteen, it does not.
    let k3_c32 = (Mode::Throughput, 8000, 3, 32);
    let sixteen_producers = |args: &mut BenchArgs| args.producers = 16;
    vec![
        target_part(
            base,
            "direct K=3 C=64",
            (Mode::Direct, 8000, 3, 64),
            steps_per_s(DIRECT_3_64),
        ),
        target_part(
            base,
            "worker K=3 C=64",
            (Mode::Throughput, 8000, 3, 64),
            steps_per_s(WORKER_3_64),
        ),
        target_part(
            base,
            "direct K=100 C=16",
            (Mode::Direct, 240, 100, 16),
            steps_per_s(DIRECT_100_16),
        ),
        target_part(
            base,
            "worker K=100 C=16",
            (Mode::Throughput, 240, 100, 16),
            steps_per_s(WORKER_100_16),
        ),
        target_part(
            base,
            "worker K=3 C=32",
            k3_c32,
            workflows_per_s(WORKER_3_32),
        ),
        adjusted(
            target_part(
                base,
                "unlimited queue K=3 C=32",
                k3_c32,
                workflows_per_s(QUEUE_3_32),
            ),
            |args| args.queue_keys = 1,
        ),
        target_part(
            base,
            "direct K=3 C=32",
            (Mode::Direct, 4000, 3, 32),
            vec![figure(DIRECT_3_32_P50, "/p50_ms", false)],
        ),
        adjusted(
            target_part(
                base,
                "start then await K=3 C=32",
                (Mode::Direct, 4000, 3, 32),
                vec![
                    figure(AWAIT_3_32, "/workflows_per_s", true),
                    figure(AWAIT_3_32_P50, "/p50_ms", false),
                    figure(AWAIT_3_32_COMMITS, "/commits_per_workflow", false),
                ],
            ),
            |args| args.path = direct::Path::Worker,
        ),
        adjusted(
            target_part(
                base,
                "worker K=3 C=32 16 producers",
                k3_c32,
                workflows_per_s(WORKER_3_32_P16),
            ),
            sixteen_producers,
        ),
        adjusted(
            target_part(
                base,
                "unlimited queue K=3 C=32 16 producers",
                k3_c32,
                workflows_per_s(QUEUE_3_32_P16),
            ),
            |args| {
                sixteen_producers(args);
                args.queue_keys = 1;
            },
        ),
    ]
}

const DIRECT_3_64: &str = "direct K=3, C=64 (steps/s)";
const WORKER_3_64: &str = "worker K=3, C=64 (steps/s)";
const DIRECT_100_16: &str = "direct K=100, C=16 (steps/s)";
const WORKER_100_16: &str = "worker K=100, C=16 (steps/s)";
const WORKER_3_32: &str = "worker K=3, C=32, no queue (workflows/s)";
const QUEUE_3_32: &str = "worker K=3, C=32, unlimited queue (workflows/s)";
const WORKER_3_32_P16: &str = "worker K=3, C=32, 16 producers, no queue (workflows/s)";
const QUEUE_3_32_P16: &str = "worker K=3, C=32, 16 producers, unlimited queue (workflows/s)";
const DIRECT_3_32_P50: &str = "direct K=3, C=32, p50 start to output (ms)";
const AWAIT_3_32: &str = "start then await K=3, C=32 (workflows/s)";
const AWAIT_3_32_P50: &str = "start then await K=3, C=32, p50 (ms)";
const AWAIT_3_32_COMMITS: &str = "start then await K=3, C=32, commits a workflow";

/// What a target divides by.
#[derive(Debug, Clone, Copy)]
enum Over {
    /// The same round's pgbench transactions per second.
    Pgbench,
    /// Another figure of the same round, by its label.
    Figure(&'static str),
    /// Nothing: the figure itself is held to the bound.
    One,
}

/// A target: `figure / over` at least or at most `bound` in a round.
struct Target {
    figure: &'static str,
    over: Over,
    at_most: bool,
    bound: f64,
}

/// The targets the targets set is held to.
const TARGETS: [Target; 9] = [
    Target {
        figure: DIRECT_3_64,
        over: Over::Pgbench,
        at_most: false,
        bound: 1.0,
    },
    Target {
        figure: DIRECT_100_16,
        over: Over::Pgbench,
        at_most: false,
        bound: 1.2,
    },
    Target {
        figure: WORKER_3_64,
        over: Over::Figure(DIRECT_3_64),
        at_most: false,
        bound: 0.8,
    },
    Target {
        figure: WORKER_100_16,
        over: Over::Figure(DIRECT_100_16),
        at_most: false,
        bound: 0.8,
    },
    Target {
        figure: QUEUE_3_32,
        over: Over::Figure(WORKER_3_32),
        at_most: false,
        bound: 0.95,
    },
    Target {
        figure: QUEUE_3_32_P16,
        over: Over::Figure(WORKER_3_32_P16),
        at_most: false,
        bound: 0.95,
    },
    Target {
        figure: AWAIT_3_32,
        over: Over::Figure(WORKER_3_32),
        at_most: false,
        bound: 0.8,
    },
    Target {
        figure: AWAIT_3_32_P50,
        over: Over::Figure(DIRECT_3_32_P50),
        at_most: true,
        bound: 1.5,
    },
    Target {
        figure: AWAIT_3_32_COMMITS,
        over: Over::One,
        at_most: true,
        bound: 1.5,
    },
];

/// A target's outcome over the rounds; serialized into the suite's report.
#[derive(Debug, Serialize)]
struct TargetRow {
    target: String,
    /// Each round's ratio (or value, for a bound on the figure itself).
    rounds: Vec<f64>,
    median: f64,
    rounds_met: usize,
    median_met: bool,
}

/// Each target's per-round ratios, from the rows' values (`rows[0]` is pgbench's).
fn target_rows(rows: &[Row]) -> Vec<TargetRow> {
    let values = |label: &str| rows.iter().find(|r| r.figure == label).map(|r| &r.rounds);
    TARGETS
        .iter()
        .filter_map(|target| {
            let numerator = values(target.figure)?;
            let denominator: Vec<f64> = match target.over {
                Over::Pgbench => rows.first()?.rounds.clone(),
                Over::Figure(label) => values(label)?.clone(),
                Over::One => vec![1.0; numerator.len()],
            };
            let ratios: Vec<f64> = numerator
                .iter()
                .zip(&denominator)
                .filter(|(_, d)| **d > 0.0)
                .map(|(n, d)| round(n / d, 3))
                .collect();
            let met = |x: f64| {
                if target.at_most {
                    x <= target.bound
                } else {
                    x >= target.bound
                }
            };
            let median = median(&ratios);
            let over = match target.over {
                Over::Pgbench => " x pgbench".to_owned(),
                Over::Figure(label) => format!(" x {label}"),
                Over::One => String::new(),
            };
            let sign = if target.at_most {
                "at most"
            } else {
                "at least"
            };
            Some(TargetRow {
                target: format!("{}{over}: {sign} {:.2}", target.figure, target.bound),
                rounds_met: ratios.iter().filter(|x| met(**x)).count(),
                median_met: met(median),
                median: round(median, 3),
                rounds: ratios,
            })
        })
        .collect()
}

/// The targets' table, as Markdown.
fn target_table(rows: &[TargetRow]) -> Vec<String> {
    let mut lines = vec![
        "| target | per round | median | rounds met |".to_owned(),
        "| --- | ---: | ---: | ---: |".to_owned(),
    ];
    for row in rows {
        let rounds: Vec<String> = row.rounds.iter().map(|x| format!("{x:.2}")).collect();
        lines.push(format!(
            "| {} | {} | {:.2}{} | {} of {} |",
            row.target,
            rounds.join(" / "),
            row.median,
            if row.median_met { "" } else { " (not met)" },
            row.rounds_met,
            row.rounds.len()
        ));
    }
    lines
}

/// One row of the table, over the rounds; serialized into the suite's report.
#[derive(Debug, Serialize)]
struct Row {
    figure: &'static str,
    /// Each round's value, in order.
    rounds: Vec<f64>,
    median: f64,
    min: f64,
    max: f64,
    /// The median over the rounds of value / the same round's pgbench tps; `null` for a
    /// figure that is no rate of work.
    x_pgbench: Option<f64>,
}

/// The suite's figures; serialized as the last line.
#[derive(Debug, Serialize)]
struct SuiteReport {
    mode: &'static str,
    rounds: u64,
    quick: bool,
    pgbench_clients: u32,
    pgbench_s: u64,
    machine: machine::Machine,
    rows: Vec<Row>,
    /// The targets set's targets (empty for the standard set).
    targets: Vec<TargetRow>,
}

/// The middle value (the mean of the two middle ones for an even count); 0 when empty.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// A row from each round's values, and pgbench's of the same rounds when it is a rate.
fn row(figure: &'static str, values: &[f64], pgbench: Option<&[f64]>) -> Row {
    let ratios: Option<Vec<f64>> = pgbench.map(|tps| {
        values
            .iter()
            .zip(tps)
            .filter(|(_, tps)| **tps > 0.0)
            .map(|(value, tps)| value / tps)
            .collect()
    });
    Row {
        figure,
        rounds: values.to_vec(),
        median: round(median(values), 2),
        min: round(values.iter().copied().fold(f64::INFINITY, f64::min), 2),
        max: round(values.iter().copied().fold(f64::NEG_INFINITY, f64::max), 2),
        x_pgbench: ratios.map(|r| round(median(&r), 3)),
    }
}

/// A figure as the table shows it: thousands separated, decimals only below 100.
fn shown(value: f64) -> String {
    if value.abs() >= 100.0 {
        #[allow(clippy::cast_possible_truncation)] // figures are far below i64's range
        let whole = value.round() as i64;
        let digits = whole.unsigned_abs().to_string();
        let mut grouped = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                grouped.push(',');
            }
            grouped.push(c);
        }
        if whole < 0 {
            grouped.insert(0, '-');
        }
        grouped
    } else {
        format!("{value:.2}")
    }
}

/// The table, as Markdown so it pastes into BENCHMARKS.md.
fn table(rows: &[Row]) -> Vec<String> {
    let mut lines = vec![
        "| figure | median | range over the rounds | x pgbench (median of the rounds) |".to_owned(),
        "| --- | ---: | ---: | ---: |".to_owned(),
    ];
    for row in rows {
        lines.push(format!(
            "| {} | {} | {}-{} | {} |",
            row.figure,
            shown(row.median),
            shown(row.min),
            shown(row.max),
            row.x_pgbench
                .map_or_else(String::new, |x| format!("{x:.2}"))
        ));
    }
    lines
}

/// Runs one part once and returns its report.
async fn run_part(global: &Global, part: &Part, sqlite_file: &Path) -> Result<Value> {
    let args = &part.args;
    let outcome = match (part.on, part.args.mode) {
        (On::Sqlite, _) => sqlite::throughput(args, sqlite_file).await?,
        (On::Postgres, Mode::Throughput) => throughput::run(global, args).await?,
        (On::Postgres, Mode::Direct) => direct::run(global, args).await?,
        (On::Postgres, Mode::WakeLatency) => wake::run(global, args).await?,
        (On::Postgres, Mode::Idle) => idle::run(global, args).await?,
        (On::Postgres, Mode::Remote) => remote::run(global, args).await?,
        (On::Postgres, mode) => {
            return Err(failure(format!("the suite has no part for {mode:?}")));
        }
    };
    if outcome != Outcome::Success {
        return Err(failure(format!(
            "the suite's {} part failed (its lines above say why)",
            part.name
        )));
    }
    take_report().ok_or_else(|| failure(format!("the suite's {} part gave no report", part.name)))
}

/// The suite.
pub(super) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let pgbench_version = pgbench::version()?;
    let schema = &args.bench_schema;
    let config = global.config(schema, 1)?;
    let db = open_connection(
        &config
            .connection_config()
            .context("reading --database-url")?,
    )
    .await
    .context("connecting to the server")?;
    let mut machine = machine::Machine::read(&db).await?;
    let parts = parts(args);
    let rounds = args.rounds;
    let pgbench_s = if args.quick { 1 } else { args.pgbench_s };
    let dir = scratch_dir()?;
    let sqlite_file = dir.join("bench.db");
    println!(
        "suite: {rounds} round(s) of pgbench ({} clients, {pgbench_s} s; {pgbench_version}) then {}; \
         schema {schema}, SQLite file in {}",
        pgbench::CLIENTS,
        parts.iter().map(|p| p.name).collect::<Vec<_>>().join(", "),
        dir.display()
    );
    let mut tps = Vec::new();
    let mut values: Vec<Vec<Vec<f64>>> = parts
        .iter()
        .map(|part| vec![Vec::new(); part.figures.len()])
        .collect();
    let measured = async {
        for round_no in 1..=rounds {
            recreate_scratch_schema(global, schema).await?;
            pgbench::prepare(&db, schema).await?;
            let rate = pgbench::run(global.url(), schema, pgbench_s, machine.cores).await?;
            println!("suite: round {round_no}: pgbench {rate:.0} tps");
            tps.push(rate);
            let mut order: Vec<_> = parts.iter().zip(values.iter_mut()).collect();
            // The targets set compares parts run side by side: every other round runs them in
            // the opposite order, so no part always runs on what the one before it left.
            if args.suite_set == Set::Targets && round_no % 2 == 0 {
                order.reverse();
            }
            for (part, values) in order {
                println!("suite: round {round_no}: {}", part.name);
                let report = run_part(global, part, &sqlite_file).await?;
                for (figure, values) in part.figures.iter().zip(values.iter_mut()) {
                    let value = report
                        .pointer(figure.pointer)
                        .and_then(Value::as_f64)
                        .ok_or_else(|| {
                            failure(format!(
                                "the {} report has no number at {}",
                                part.name, figure.pointer
                            ))
                        })?;
                    values.push(value);
                }
            }
        }
        Ok::<_, crate::common::Error>(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    measured?;
    machine.load_after = machine::load_average();

    let mut rows = vec![row(
        "pgbench one-row INSERT, 16 clients (tps)",
        &tps,
        Some(&tps),
    )];
    for (part, values) in parts.iter().zip(&values) {
        for (figure, values) in part.figures.iter().zip(values) {
            rows.push(row(
                figure.label,
                values,
                figure.against_pgbench.then_some(tps.as_slice()),
            ));
        }
    }
    println!();
    for line in machine.lines() {
        println!("suite: {line}");
    }
    println!();
    for line in table(&rows) {
        println!("{line}");
    }
    println!();
    let targets = target_rows(&rows);
    if args.suite_set == Set::Targets {
        for line in target_table(&targets) {
            println!("{line}");
        }
        println!();
    }
    super::emit(&SuiteReport {
        mode: "suite",
        rounds,
        quick: args.quick,
        pgbench_clients: pgbench::CLIENTS,
        pgbench_s,
        machine,
        rows,
        targets: if args.suite_set == Set::Targets {
            targets
        } else {
            Vec::new()
        },
    })?;
    Ok(Outcome::Success)
}

/// A new temporary directory for the SQLite part's file.
fn scratch_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "keiro-suite-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir(&dir).context(format!("creating {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_takes_the_median_and_each_rounds_ratio() {
        let row = row("x", &[10.0, 30.0, 20.0], Some(&[10.0, 10.0, 40.0]));
        assert!((row.median - 20.0).abs() < 1e-9);
        assert!((row.min - 10.0).abs() < 1e-9 && (row.max - 30.0).abs() < 1e-9);
        // Ratios 1.0, 3.0, 0.5: the median is the first round's.
        assert_eq!(row.x_pgbench, Some(1.0));
        assert!((median(&[1.0, 2.0, 3.0, 4.0]) - 2.5).abs() < 1e-9);
    }

    #[test]
    fn figures_are_grouped_by_thousands() {
        assert_eq!(shown(12_345.6), "12,346");
        assert_eq!(shown(1_234_567.0), "1,234,567");
        assert_eq!(shown(4.256), "4.26");
        assert_eq!(shown(100.0), "100");
    }
}
