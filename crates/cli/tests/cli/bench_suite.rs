//! `keiro bench --mode suite` and `--mode scale` in their quick forms, against a test schema:
//! every part runs, the suite prints its machine block and one table row per figure with the
//! ratio to the same round's pgbench where the figure is a rate, and each ends with one JSON
//! line of the right shape. Speed is never asserted: the quick sizes measure nothing.

use std::process::{Command, Output};

use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;
use serde_json::Value;

fn bench(db: &TestDb, args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .args([
            "--database-url",
            db.url(),
            "bench",
            "--bench-schema",
            db.schema(),
        ])
        .args(args)
        .output()
}

/// The stdout of a run that succeeded, and its last line as JSON.
fn report(output: &Output) -> Result<(String, Value), Box<dyn std::error::Error + Send + Sync>> {
    let stdout = String::from_utf8(output.stdout.clone())?;
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = serde_json::from_str(stdout.lines().last().unwrap_or_default())?;
    Ok((stdout, last))
}

/// The figures the suite's table has, in order; `true` where it is a rate set against pgbench.
const FIGURES: [(&str, bool); 12] = [
    ("pgbench one-row INSERT, 16 clients (tps)", true),
    ("throughput K=3, worker (steps/s)", true),
    ("throughput K=3, p50 start to done (ms)", false),
    ("direct K=3, C=16 (steps/s)", true),
    ("direct K=3, p50 start to output (ms)", false),
    ("throughput K=100, worker (steps/s)", true),
    ("wake latency, push p50 (ms)", false),
    ("wake latency, push p99 (ms)", false),
    ("idle worker over parked runs (queries/s)", false),
    ("remote steps, one worker process (steps/s)", true),
    ("remote, idle dispatch to result p50 (ms)", false),
    ("embedded (SQLite file) throughput K=3 (steps/s)", true),
];

#[tokio::test]
async fn the_quick_suite_prints_the_machine_one_row_per_figure_and_a_json_line() -> TestResult {
    let db = TestDb::new().await;
    // Two rounds: the second finds what the first left (schemas recreated, pgbench's table).
    let (stdout, json) = report(&bench(
        &db,
        &["--mode", "suite", "--quick", "--rounds", "2"],
    )?)?;
    for line in [
        "suite: machine: ",
        "suite: postgres: PostgreSQL ",
        "suite: synchronous_commit: ",
        "suite: disk: ",
        "suite: load average (1 min): ",
        "| figure | median | range over the rounds | x pgbench (median of the rounds) |",
    ] {
        assert!(stdout.contains(line), "no {line:?} in\n{stdout}");
    }
    for (figure, _) in FIGURES {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("| {figure} | "))),
            "no row for {figure:?} in\n{stdout}"
        );
    }
    assert_eq!(json["mode"], "suite");
    assert_eq!(json["rounds"], 2);
    assert_eq!(json["quick"], true);
    let machine = &json["machine"];
    assert!(
        machine["cores"].as_u64().is_some_and(|c| c >= 1),
        "{machine}"
    );
    assert!(
        machine["postgres"]
            .as_str()
            .is_some_and(|v| v.starts_with("PostgreSQL")),
        "{machine}"
    );
    assert!(machine["synchronous_commit"].is_string(), "{machine}");
    assert!(machine["disk"].is_string(), "{machine}");
    let rows = json["rows"].as_array().ok_or("rows is no array")?;
    assert_eq!(rows.len(), FIGURES.len(), "{json}");
    for (row, (figure, rate)) in rows.iter().zip(FIGURES) {
        assert_eq!(row["figure"], figure);
        assert_eq!(row["rounds"].as_array().map(Vec::len), Some(2), "{row}");
        assert!(row["median"].as_f64().is_some_and(|m| m >= 0.0), "{row}");
        assert_eq!(row["x_pgbench"].is_number(), rate, "{row}");
    }
    Ok(())
}

/// The targets the targets set holds, in order, as its second table names them.
const TARGETS: [&str; 9] = [
    "direct K=3, C=64 (steps/s) x pgbench: at least 1.00",
    "direct K=100, C=16 (steps/s) x pgbench: at least 1.20",
    "worker K=3, C=64 (steps/s) x direct K=3, C=64 (steps/s): at least 0.80",
    "worker K=100, C=16 (steps/s) x direct K=100, C=16 (steps/s): at least 0.80",
    "worker K=3, C=32, unlimited queue (workflows/s) x worker K=3, C=32, no queue (workflows/s): at least 0.95",
    "worker K=3, C=32, 16 producers, unlimited queue (workflows/s) x worker K=3, C=32, 16 producers, no queue (workflows/s): at least 0.95",
    "start then await K=3, C=32 (workflows/s) x worker K=3, C=32, no queue (workflows/s): at least 0.80",
    "start then await K=3, C=32, p50 (ms) x direct K=3, C=32, p50 start to output (ms): at most 1.50",
    "start then await K=3, C=32, commits a workflow: at most 1.50",
];

#[tokio::test]
async fn the_quick_targets_set_holds_each_target_round_by_round() -> TestResult {
    let db = TestDb::new().await;
    // Two rounds: the second runs the parts in the opposite order.
    let (stdout, json) = report(&bench(
        &db,
        &[
            "--mode",
            "suite",
            "--suite-set",
            "targets",
            "--quick",
            "--rounds",
            "2",
        ],
    )?)?;
    assert!(
        stdout.contains("| target | per round | median | rounds met |"),
        "{stdout}"
    );
    let targets = json["targets"].as_array().ok_or("targets is no array")?;
    assert_eq!(targets.len(), TARGETS.len(), "{json}");
    // Each part runs with its own arguments: the two queue parts on the queue, the two parts
    // at 32 in flight of the second pair with sixteen producers; two rounds each.
    let count = |needle: &str| stdout.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("bench: queue `bench`"), 4, "{stdout}");
    assert_eq!(count("worker concurrency 32, 16 producers"), 4, "{stdout}");
    for (row, target) in targets.iter().zip(TARGETS) {
        assert_eq!(row["target"], target, "{row}");
        let rounds = row["rounds"].as_array().ok_or("rounds is no array")?;
        assert_eq!(rounds.len(), 2, "{row}");
        assert!(
            rounds.iter().all(|x| x.as_f64().is_some_and(|x| x > 0.0)),
            "{row}"
        );
        let met = row["rounds_met"].as_u64().ok_or("no rounds_met")?;
        assert!(met <= 2, "{row}");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("| {target} | "))),
            "no row for {target:?} in\n{stdout}"
        );
    }
    // The commits a workflow are a figure of their own, with no ratio to pgbench; the rates
    // each have one.
    let rows = json["rows"].as_array().ok_or("rows is no array")?;
    assert_eq!(rows.len(), 13, "{json}");
    for row in rows {
        let figure = row["figure"].as_str().unwrap_or_default();
        let rate = figure.ends_with("/s)") || figure.ends_with("(tps)");
        assert_eq!(row["x_pgbench"].is_number(), rate, "{row}");
    }
    Ok(())
}

#[tokio::test]
async fn the_suite_without_pgbench_on_path_says_how_to_get_it() -> TestResult {
    let db = TestDb::new().await;
    let output = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .env("PATH", "")
        .args([
            "--database-url",
            db.url(),
            "bench",
            "--bench-schema",
            db.schema(),
        ])
        .args(["--mode", "suite", "--quick"])
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("pgbench could not be run") && stderr.contains("on PATH"),
        "{stderr}"
    );
    Ok(())
}

#[tokio::test]
async fn the_quick_scale_run_measures_every_part() -> TestResult {
    let db = TestDb::new().await;
    let (stdout, json) = report(&bench(&db, &["--mode", "scale", "--quick"])?)?;
    assert_eq!(json["mode"], "scale", "{stdout}");
    let table = &json["table"];
    assert_eq!(table["filled"]["finished"], 2000, "{table}");
    assert_eq!(table["filled"]["live"], 200, "{table}");
    assert!(table["claim"]["samples"].as_u64() > Some(0), "{table}");
    let list = table["list"].as_array().ok_or("list is no array")?;
    assert!(list.len() >= 10, "{table}");
    assert!(table["counts_p50_ms"].is_number(), "{table}");
    // The oldest tenth expired (but a parent whose child is younger): each deleted instance
    // went with its three journal rows.
    let deleted = table["gc_instances"].as_u64().ok_or("no gc_instances")?;
    assert!((180..=220).contains(&deleted), "{table}");
    assert_eq!(table["gc_rows"].as_u64(), Some(deleted * 4), "{table}");
    let parked = &json["parked"];
    assert_eq!(parked["parked"], 200, "{parked}");
    assert!(parked["wake"]["samples"].as_u64() > Some(0), "{parked}");
    let waiters = &json["waiters"];
    assert_eq!(waiters["waiters"], 100, "{waiters}");
    // The waiters share one listening connection, however many they are.
    assert_eq!(waiters["listen_connections"], 1, "{waiters}");
    Ok(())
}
