//! `keiro chaos` with no database named runs on a SQLite file in a temporary directory: its
//! first line says so with the line that runs it on PostgreSQL, its worker processes share the
//! file while they are SIGKILLed, and every invariant is checked from the file (0 lost, 0
//! duplicate journal steps, every journaled step witnessed). A restart asked for there is
//! refused: a SQLite file has no server.

use std::process::Command;

use serde_json::Value;

#[test]
fn chaos_runs_and_passes_on_a_temporary_sqlite_file_by_default(
) -> Result<(), Box<dyn std::error::Error>> {
    let output = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        // Nothing may reach a server: a URL in a child's environment would name it.
        .env("PGHOST", "/nonexistent")
        .args([
            "chaos",
            "-n",
            "120",
            "--kill-interval-ms",
            "150",
            "--deadline-s",
            "240",
            "--seed",
            "7",
        ])
        .output()?;
    let stdout = String::from_utf8(output.stdout)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("chaos: on SQLite, the file ")
            && first.contains("keiro chaos --database-url postgres://"),
        "{stderr}"
    );
    let file = first
        .split_whitespace()
        .nth(5)
        .expect("the first line names the file");
    assert!(
        !std::path::Path::new(file).exists(),
        "the temporary file {file} is removed at the end"
    );
    // stdout is the report alone.
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

#[test]
fn a_restart_asked_for_on_a_sqlite_file_is_refused() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("keiro-chaos-restart-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("chaos.db");
    let output = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .arg("--database-url")
        .arg(format!("sqlite:{}", file.display()))
        .args(["chaos", "--pg-restarts", "1"])
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let made = file.exists();
    std::fs::remove_dir_all(&dir)?;
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--pg-restarts 1") && stderr.contains("no server to restart"),
        "{stderr}"
    );
    assert!(!made, "nothing was created before the refusal");
    Ok(())
}
