//! `keiro demo` and `keiro chaos` with no database named run on a SQLite file in a temporary
//! directory: the first line says so with the line that runs the command on PostgreSQL, the
//! file is removed at the end, and every check passes there, whether a PostgreSQL server is up
//! or not. Given a `sqlite:` URL, they refuse what would lose data or cannot be done: a file
//! they did not make, a server restart.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `keiro <args>` with no database named, and nothing in its (or its children's) environment
/// that could reach a server.
fn without_database(args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .env("PGHOST", "/nonexistent")
        .args(args)
        .output()
}

/// `keiro --database-url sqlite:<file> <args>`.
fn on_file(file: &Path, args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .arg("--database-url")
        .arg(format!("sqlite:{}", file.display()))
        .args(args)
        .output()
}

/// A directory of the test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!("keiro-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Checks `first`, the announcement of `command` on a temporary file, and that the file it
/// names is gone.
fn announced_and_removed(command: &str, first: &str) {
    assert!(
        first.starts_with(&format!("{command}: on SQLite, the file "))
            && first.contains(&format!("keiro {command} --database-url postgres://")),
        "{first}"
    );
    let file = first
        .split_whitespace()
        .nth(5)
        .expect("the first line names the file");
    assert!(
        !Path::new(file).exists(),
        "the temporary file {file} is removed at the end"
    );
}

#[test]
fn the_demo_runs_and_passes_on_a_temporary_sqlite_file_by_default() -> TestResult {
    let output = without_database(&["demo", "--workflows", "60"])?;
    let stdout = String::from_utf8(output.stdout)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    announced_and_removed("demo", stdout.lines().next().unwrap_or_default());
    let verdict = stdout.lines().last().unwrap_or_default();
    assert!(
        verdict.starts_with("demo: PASS 60/60 completed, 300 steps journaled once")
            && verdict.contains(" 0 recorded steps re-executed"),
        "{stdout}"
    );
    Ok(())
}

#[test]
fn the_demo_refuses_to_replace_a_sqlite_file_it_did_not_make() -> TestResult {
    let scratch = Scratch::new("demo-refuse")?;
    let file = scratch.0.join("data.db");
    std::fs::write(&file, b"someone's data")?;
    let output = on_file(&file, &["demo"])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("refusing to replace"), "{stderr}");
    assert_eq!(std::fs::read(&file)?, b"someone's data");
    Ok(())
}

/// The chaos run on a temporary file: its worker processes share the file while they are
/// SIGKILLed, and every invariant is checked from the file (0 lost, 0 duplicate journal
/// steps, every journaled step witnessed). Its stdout is the report alone, so the
/// announcement goes to stderr.
#[test]
fn chaos_runs_and_passes_on_a_temporary_sqlite_file_by_default() -> TestResult {
    let output = without_database(&[
        "chaos",
        "-n",
        "120",
        "--kill-interval-ms",
        "150",
        "--deadline-s",
        "240",
        "--seed",
        "7",
    ])?;
    let stdout = String::from_utf8(output.stdout)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    announced_and_removed("chaos", stderr.lines().next().unwrap_or_default());
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let report: Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(report["pass"], true, "{report}");
    assert_eq!(report["store"], "sqlite", "{report}");
    assert_eq!(report["completed_ok"], 120, "{report}");
    for (name, violations) in report["invariants"].as_object().expect("invariants") {
        assert_eq!(violations, 0, "{name}: {report}");
    }
    assert_eq!(report["invariants"]["journaled_once"], 0);
    assert!(report["kills"].as_u64().unwrap_or(0) > 0, "{report}");
    assert!(
        report["witnesses"].as_u64() >= report["journaled_steps"].as_u64(),
        "{report}"
    );
    assert_eq!(report["pg_restarts"], 0);
    assert_eq!(
        report["faults_injected"][1], "no PostgreSQL restart (a SQLite file: no server to restart)",
        "{report}"
    );
    Ok(())
}

/// The queue profile on a temporary file: every run started on a queue (2 at once, one per
/// key over 3 keys) served by worker processes that are SIGKILLed, and the limits checked from
/// the witnesses' spans besides every other invariant.
#[test]
fn chaos_queue_profile_holds_the_queue_limits_on_a_temporary_sqlite_file() -> TestResult {
    let output = without_database(&[
        "chaos",
        "--profile",
        "queue",
        "--queue-concurrency",
        "2",
        "--queue-keys",
        "3",
        "-n",
        "60",
        "--kill-interval-ms",
        "150",
        "--deadline-s",
        "240",
        "--seed",
        "7",
    ])?;
    let stdout = String::from_utf8(output.stdout)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    announced_and_removed("chaos", stderr.lines().next().unwrap_or_default());
    let report: Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(report["pass"], true, "{report}");
    assert_eq!(report["profile"], "queue", "{report}");
    assert_eq!(report["completed_ok"], 60, "{report}");
    for name in [
        "queue_admitted",
        "queue_concurrency",
        "queue_key_concurrency",
    ] {
        assert_eq!(report["invariants"][name], 0, "{name}: {report}");
    }
    for (name, violations) in report["invariants"].as_object().expect("invariants") {
        assert_eq!(violations, 0, "{name}: {report}");
    }
    let queue = &report["queue"];
    assert_eq!(queue["concurrency_limit"], 2, "{report}");
    assert_eq!(queue["key_concurrency_limit"], 1, "{report}");
    assert_eq!(queue["admitted_runs"], 60, "{report}");
    let max = queue["max_running"].as_u64().unwrap_or(0);
    assert!((1..=2).contains(&max), "{report}");
    assert_eq!(queue["max_running_per_key"], 1, "{report}");
    // 48 runs of five local steps and 12 of one, each at least once.
    assert!(
        queue["local_steps"].as_u64().unwrap_or(0) >= 252,
        "{report}"
    );
    assert!(report["kills"].as_u64().unwrap_or(0) > 0, "{report}");
    Ok(())
}

#[test]
fn the_queue_options_without_the_queue_profile_are_refused() -> TestResult {
    let output = without_database(&["chaos", "--queue-concurrency", "2"])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--profile queue"), "{stderr}");
    Ok(())
}

#[test]
fn a_restart_asked_for_on_a_sqlite_file_is_refused() -> TestResult {
    let scratch = Scratch::new("chaos-restart")?;
    let file = scratch.0.join("chaos.db");
    let output = on_file(&file, &["chaos", "--pg-restarts", "1"])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--pg-restarts 1") && stderr.contains("no server to restart"),
        "{stderr}"
    );
    assert!(!file.exists(), "nothing was created before the refusal");
    Ok(())
}
