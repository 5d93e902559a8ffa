//! The suite's baseline: pgbench's one-row INSERT at 16 clients on the same server, run in
//! every round, so each keiro figure has a same-round rate of durable commits to be read
//! against (the machine's speed swings within minutes; a ratio within one round does not).

use std::process::Command;

use crate::common::{failure, Result, ResultExt};

/// Clients of the baseline run, as BENCHMARKS.md has always run it.
pub(super) const CLIENTS: u32 = 16;

/// `pgbench --version`, or the error that says pgbench must be installed.
pub(super) fn version() -> Result<String> {
    let output = Command::new("pgbench")
        .arg("--version")
        .output()
        .map_err(|e| {
            failure(format!(
                "keiro bench --mode suite runs pgbench beside keiro, and pgbench could not be run \
             ({e}): install PostgreSQL's client programs (e.g. the postgresql-client package) so \
             that pgbench is on PATH"
            ))
        })?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Creates `schema.one_row`, the table pgbench inserts into (the schema must exist).
pub(super) async fn prepare(db: &tokio_postgres::Client, schema: &str) -> Result<()> {
    // The schema name passed the store's identifier check when the scratch schema was made.
    db.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {schema}.one_row (v integer)"
    ))
    .await
    .context("creating pgbench's table")
}

/// Runs pgbench for `seconds` against `url` and returns its transactions per second.
pub(super) async fn run(url: &str, schema: &str, seconds: u64, threads: usize) -> Result<f64> {
    let dir = std::env::temp_dir().join(format!(
        "keiro-suite-pgbench-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir(&dir).context(format!("creating {}", dir.display()))?;
    let script = dir.join("one_row.sql");
    std::fs::write(
        &script,
        format!("INSERT INTO {schema}.one_row (v) VALUES (1);\n"),
    )
    .context(format!("writing {}", script.display()))?;
    let (url, threads) = (url.to_owned(), threads.clamp(1, CLIENTS as usize));
    let script_path = script.clone();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("pgbench")
            .args(["-n", "-c", &CLIENTS.to_string(), "-j", &threads.to_string()])
            .args(["-T", &seconds.to_string(), "-f"])
            .arg(&script_path)
            .arg(&url)
            .output()
    })
    .await
    .context("the pgbench task")?
    .context("running pgbench");
    let _ = std::fs::remove_dir_all(&dir);
    let output = output?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(failure(format!(
            "pgbench failed ({}): {}{}",
            output.status,
            stdout.trim(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    tps(&stdout).ok_or_else(|| failure(format!("no tps line in pgbench's output: {stdout}")))
}

/// The rate of `tps = 12345.678901 (without initial connection time)`.
fn tps(stdout: &str) -> Option<f64> {
    stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_read_from_the_tps_line() {
        let out = "number of failed transactions: 0 (0.000%)\nlatency average = 1.2 ms\n\
                   initial connection time = 9.1 ms\ntps = 12345.678901 (without initial connection time)\n";
        assert_eq!(tps(out), Some(12_345.678_901));
        assert_eq!(tps("no rate here"), None);
    }
}
