//! `keiro demo` with no database named runs on a SQLite file in a temporary directory, says so
//! in its first line with the line that runs it on PostgreSQL, and passes every check there
//! (the crash, the recovery, the wakes): whether a PostgreSQL server is up or not.

use std::process::Command;

#[test]
fn the_demo_runs_and_passes_on_a_temporary_sqlite_file_by_default(
) -> Result<(), Box<dyn std::error::Error>> {
    let output = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        // Nothing may reach a server: a URL in a child's environment would name it.
        .env("PGHOST", "/nonexistent")
        .args(["demo", "--workflows", "60"])
        .output()?;
    let stdout = String::from_utf8(output.stdout)?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}{stderr}");
    let first = stdout.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("demo: on SQLite, the file ")
            && first.contains("keiro demo --database-url postgres://"),
        "{first}"
    );
    let file = first
        .split_whitespace()
        .nth(5)
        .expect("the first line names the file");
    assert!(
        !std::path::Path::new(file).exists(),
        "the temporary file {file} is removed at the end"
    );
    let verdict = stdout.lines().last().unwrap_or_default();
    assert!(
        verdict.starts_with("demo: PASS 60/60 completed, 300 steps journaled once")
            && verdict.contains(" 0 recorded steps re-executed"),
        "{stdout}"
    );
    Ok(())
}

#[test]
fn the_demo_refuses_to_replace_a_sqlite_file_it_did_not_make(
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("keiro-demo-refuse-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("data.db");
    std::fs::write(&file, b"someone's data")?;
    let output = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .arg("--database-url")
        .arg(format!("sqlite:{}", file.display()))
        .arg("demo")
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let kept = std::fs::read(&file)?;
    std::fs::remove_dir_all(&dir)?;
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("refusing to replace"), "{stderr}");
    assert_eq!(kept, b"someone's data");
    Ok(())
}
