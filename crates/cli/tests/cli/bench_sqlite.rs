//! `keiro bench` on a SQLite file: `throughput` and `direct` run the workload there and report
//! steps/s and the writer's commits per workflow (group commit keeps them below one a step);
//! `sqlite-baseline` reports the one-row commit rate at 1 and C threads; the PostgreSQL-only
//! modes refuse a SQLite file, saying which modes work there.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

/// A directory of its own, removed however the test ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> std::io::Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("keiro-bench-sqlite-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    fn url(&self) -> String {
        format!("sqlite:{}", self.0.join("bench.db").display())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bench(url: &str, args: &[&str]) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .arg("--database-url")
        .arg(url)
        .arg("bench")
        .args(args)
        .output()
}

fn report(output: &Output) -> Result<Value, Box<dyn std::error::Error>> {
    let stdout = String::from_utf8(output.stdout.clone())?;
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(serde_json::from_str(
        stdout.lines().last().unwrap_or_default(),
    )?)
}

#[test]
fn throughput_and_direct_run_on_a_sqlite_file_and_count_its_commits(
) -> Result<(), Box<dyn std::error::Error>> {
    let scratch = Scratch::new("modes")?;
    for mode in ["throughput", "direct"] {
        // The second run replaces the file the first made.
        let report = report(&bench(&scratch.url(), &["--mode", mode, "-n", "100"])?)?;
        assert_eq!(report["mode"], mode, "{report}");
        assert_eq!(report["store"], "sqlite", "{report}");
        assert_eq!(report["workflows"], 100, "{report}");
        assert!(
            report["steps_per_s"].as_f64().unwrap_or(0.0) > 0.0,
            "{report}"
        );
        let commits = report["commits_per_workflow"].as_f64().unwrap_or(0.0);
        assert!(commits > 0.0 && commits < 6.0, "{report}");
    }
    Ok(())
}

#[test]
fn the_baseline_reports_one_row_commits_at_one_and_c_threads(
) -> Result<(), Box<dyn std::error::Error>> {
    let scratch = Scratch::new("baseline")?;
    let output = bench(
        &scratch.url(),
        &["--mode", "sqlite-baseline", "--baseline-s", "1", "-c", "4"],
    )?;
    let report = report(&output)?;
    let rates = report["rates"].as_array().expect("rates");
    assert_eq!(rates.len(), 2, "{report}");
    assert_eq!(
        (rates[0]["threads"].clone(), rates[1]["threads"].clone()),
        (1.into(), 4.into())
    );
    assert!(
        rates.iter().all(|r| r["commits"].as_u64().unwrap_or(0) > 0),
        "{report}"
    );
    // Its file, made beside the bench file, is gone.
    assert_eq!(std::fs::read_dir(&scratch.0)?.count(), 0);
    Ok(())
}

#[test]
fn a_postgres_only_mode_refuses_a_sqlite_file() -> Result<(), Box<dyn std::error::Error>> {
    let scratch = Scratch::new("refused")?;
    let output = bench(&scratch.url(), &["--mode", "idle"])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("PostgreSQL only") && stderr.contains("sqlite-baseline"),
        "{stderr}"
    );
    Ok(())
}
