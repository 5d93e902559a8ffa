//! The faults the chaos command injects beside the SIGKILLs (which the fleet sends): PostgreSQL
//! restarts in immediate mode, and the random source that picks the victims; and the verdict
//! on whether the faults asked for happened.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use crate::common::{failure, open_connection, Result, ResultExt};

/// Where Debian's PostgreSQL keeps one directory per installed major version.
const CLUSTERS: &str = "/etc/postgresql";

/// How long the restart command may run.
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);

/// How long PostgreSQL may take to accept connections beyond the restart command's time.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(120);

/// How often the restart command and the server are checked: the recovery figure is no finer
/// than this.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// The time on the database clock, and the start of the server that answered.
const PROBE: &str = "SELECT clock_timestamp(), pg_postmaster_start_time()";

/// A small deterministic random source (xorshift64*): the victims of a run follow from its seed.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A source seeded with `seed` (any value; zero is mapped to a fixed non-zero state).
    pub(crate) fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0); the modulo bias is irrelevant for a handful of choices.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).unwrap_or(u64::MAX).max(1);
        usize::try_from(self.next() % n).unwrap_or(0)
    }
}

/// The command that restarts the local cluster in immediate mode, found as `.ci/run` finds it:
/// the highest version under `/etc/postgresql`, cluster `main`.
pub(crate) fn local_cluster_restart() -> Result<String> {
    let entries = std::fs::read_dir(CLUSTERS).context(format!(
        "looking for the local PostgreSQL cluster in {CLUSTERS} (pass --pg-restart-cmd, or \
         --no-pg-restart where the server cannot be restarted)"
    ))?;
    let names = entries
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .collect::<Vec<_>>();
    let version = highest_version(&names).ok_or_else(|| {
        failure(format!(
            "no PostgreSQL version under {CLUSTERS} (pass --pg-restart-cmd, or --no-pg-restart)"
        ))
    })?;
    Ok(format!(
        "pg_ctlcluster --skip-systemctl-redirect {version} main restart -m immediate"
    ))
}

/// The highest of `names` that reads as a version (`15`, `9.6`), compared as numbers.
fn highest_version(names: &[String]) -> Option<&str> {
    let key = |name: &str| -> Option<Vec<u64>> {
        name.split('.').map(|part| part.parse().ok()).collect()
    };
    names
        .iter()
        .filter_map(|name| Some((key(name)?, name.as_str())))
        .max()
        .map(|(_, name)| name)
}

/// One restart of PostgreSQL, as observed.
#[derive(Debug, Clone)]
pub(crate) struct Restart {
    /// How long the restart command ran.
    pub(crate) command: Duration,
    /// When the new server started (`pg_postmaster_start_time()`): every journal row recorded
    /// after it was written by the new server.
    pub(crate) server_started: OffsetDateTime,
    /// The database clock at the first query the new server answered, probing every
    /// [`PROBE_EVERY`] from the moment the restart began: when it accepted connections again,
    /// to within a probe (a connection and a query).
    pub(crate) accepted_at: OffsetDateTime,
}

/// Runs `command` (through `sh -c`) and waits until a server started after it answers.
///
/// The command runs in a process group of its own, so a Ctrl-C meant for the chaos command does
/// not cut a restart halfway and leave the server down; if the chaos command stops meanwhile,
/// the restart still runs to its end.
pub(crate) async fn restart_postgres(
    command: &str,
    config: &tokio_postgres::Config,
) -> Result<Restart> {
    let (_, before) = probe(config)
        .await
        .context("reading the server's start time before the restart")?;
    let began = Instant::now();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context(format!("running the restart command `{command}`"))?;
    // Probed from the start, beside the command: the command may return well after the new
    // server accepts connections (or, for another command, before the old one is gone), and
    // only an answer from a server started after `before` counts.
    let mut status = None;
    let mut accepted = None;
    loop {
        if status.is_none() {
            status = child
                .try_wait()
                .context("waiting for the restart command")?
                .map(|status| (status, began.elapsed()));
            if let Some((status, _)) = status.filter(|(status, _)| !status.success()) {
                return Err(failure(format!(
                    "the restart command `{command}` exited with {status}"
                )));
            }
        }
        if accepted.is_none() {
            if let Ok((now, started)) = probe(config).await {
                accepted = (started > before).then_some((now, started));
            }
        }
        if let (Some((_, ran)), Some((accepted_at, server_started))) = (status, accepted) {
            return Ok(Restart {
                command: ran,
                server_started,
                accepted_at,
            });
        }
        if status.is_none() && began.elapsed() > RESTART_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(failure(format!(
                "the restart command `{command}` did not end within {RESTART_TIMEOUT:?}; killed it"
            )));
        }
        if began.elapsed() > RESTART_TIMEOUT + ACCEPT_TIMEOUT {
            return Err(failure(format!(
                "no restarted PostgreSQL answered within {:?} of `{command}`",
                RESTART_TIMEOUT + ACCEPT_TIMEOUT
            )));
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

/// One query on a fresh connection: the database clock and the server's start time.
async fn probe(config: &tokio_postgres::Config) -> Result<(OffsetDateTime, OffsetDateTime)> {
    let mut config = config.clone();
    config.connect_timeout(Duration::from_secs(1));
    let client = open_connection(&config).await?;
    let row = client
        .query_one(PROBE, &[])
        .await
        .context("probing the server")?;
    Ok((row.get(0), row.get(1)))
}

/// The faults a run was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FaultPlan {
    /// A SIGKILL this often, in milliseconds (`--kill-interval-ms`); 0 asks for none.
    pub(crate) kill_interval_ms: u64,
    /// PostgreSQL restarts asked for (`--pg-restarts`).
    pub(crate) restarts_requested: u64,
    /// Whether `--no-pg-restart` turned them off.
    pub(crate) restarts_skipped: bool,
    /// Whether the store has no server to restart (a SQLite file).
    pub(crate) no_server: bool,
}

impl FaultPlan {
    /// The restarts the run will make.
    pub(crate) fn restarts_planned(&self) -> u64 {
        if self.restarts_skipped || self.no_server {
            0
        } else {
            self.restarts_requested
        }
    }
}

/// The faults a run injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Injected {
    /// SIGKILLs sent.
    pub(crate) kills: u64,
    /// PostgreSQL restarts that happened.
    pub(crate) restarts: u64,
}

/// What the report says of a run's faults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FaultVerdict {
    /// What was injected, one line per kind of fault (also what was not, and why).
    pub(crate) injected: Vec<String>,
    /// A fault asked for that did not happen, one line each: the run fails on any.
    pub(crate) problems: Vec<String>,
}

/// Compares what a run was asked to inject with what it injected: a proof under faults that
/// met none proves nothing, so a SIGKILL interval without a kill, or fewer restarts than
/// planned, fails the run. Faults turned off on purpose (`--kill-interval-ms 0`,
/// `--no-pg-restart`, `--pg-restarts 0`) are not problems; the report says they were not made.
pub(crate) fn fault_verdict(plan: &FaultPlan, injected: &Injected) -> FaultVerdict {
    let mut verdict = FaultVerdict::default();
    if plan.kill_interval_ms == 0 {
        verdict
            .injected
            .push("no SIGKILL (--kill-interval-ms 0)".to_owned());
    } else {
        verdict.injected.push(format!(
            "{} SIGKILLs, one every {} ms",
            injected.kills, plan.kill_interval_ms
        ));
        if injected.kills == 0 {
            verdict.problems.push(format!(
                "no SIGKILL happened (one every {} ms was asked for): the workload ended first, \
                 so nothing was checked under kills",
                plan.kill_interval_ms
            ));
        }
    }
    let planned = plan.restarts_planned();
    if plan.no_server {
        verdict
            .injected
            .push("no PostgreSQL restart (a SQLite file: no server to restart)".to_owned());
    } else if plan.restarts_skipped && plan.restarts_requested > 0 {
        verdict
            .injected
            .push("no PostgreSQL restart (--no-pg-restart)".to_owned());
    } else if planned == 0 {
        verdict
            .injected
            .push("no PostgreSQL restart (--pg-restarts 0)".to_owned());
    } else {
        verdict.injected.push(format!(
            "{} of {planned} PostgreSQL restarts",
            injected.restarts
        ));
        if injected.restarts < planned {
            verdict.problems.push(format!(
                "only {} of {planned} PostgreSQL restarts happened before the workload ended",
                injected.restarts
            ));
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(kill_interval_ms: u64, restarts: u64, skipped: bool) -> FaultPlan {
        FaultPlan {
            kill_interval_ms,
            restarts_requested: restarts,
            restarts_skipped: skipped,
            no_server: false,
        }
    }

    #[test]
    fn a_sqlite_run_names_the_restart_it_could_not_make_and_still_needs_its_kills() {
        let sqlite = FaultPlan {
            no_server: true,
            ..plan(500, 0, false)
        };
        assert_eq!(sqlite.restarts_planned(), 0);
        let verdict = fault_verdict(&sqlite, &injected(9, 0));
        assert!(verdict.problems.is_empty(), "{verdict:?}");
        assert_eq!(
            verdict.injected,
            [
                "9 SIGKILLs, one every 500 ms",
                "no PostgreSQL restart (a SQLite file: no server to restart)"
            ]
        );
        assert_eq!(fault_verdict(&sqlite, &injected(0, 0)).problems.len(), 1);
    }

    fn injected(kills: u64, restarts: u64) -> Injected {
        Injected { kills, restarts }
    }

    #[test]
    fn a_run_that_made_every_fault_asked_for_has_no_problem_and_says_what_it_made() {
        let verdict = fault_verdict(&plan(500, 2, false), &injected(12, 2));
        assert!(verdict.problems.is_empty(), "{verdict:?}");
        assert_eq!(
            verdict.injected,
            [
                "12 SIGKILLs, one every 500 ms",
                "2 of 2 PostgreSQL restarts"
            ]
        );
    }

    #[test]
    fn no_kill_where_kills_were_asked_for_fails_the_run() {
        let verdict = fault_verdict(&plan(500, 0, false), &injected(0, 0));
        assert_eq!(verdict.problems.len(), 1, "{verdict:?}");
        assert!(verdict.problems[0].contains("no SIGKILL happened"));
    }

    #[test]
    fn fewer_restarts_than_planned_fail_the_run() {
        let verdict = fault_verdict(&plan(500, 4, false), &injected(30, 3));
        assert_eq!(
            verdict.problems,
            ["only 3 of 4 PostgreSQL restarts happened before the workload ended"]
        );
        assert_eq!(verdict.injected[1], "3 of 4 PostgreSQL restarts");
    }

    #[test]
    fn faults_turned_off_on_purpose_are_reported_not_failed() {
        let verdict = fault_verdict(&plan(0, 2, true), &injected(0, 0));
        assert!(verdict.problems.is_empty(), "{verdict:?}");
        assert_eq!(
            verdict.injected,
            [
                "no SIGKILL (--kill-interval-ms 0)",
                "no PostgreSQL restart (--no-pg-restart)"
            ]
        );
        let verdict = fault_verdict(&plan(500, 0, false), &injected(3, 0));
        assert_eq!(
            verdict.injected[1],
            "no PostgreSQL restart (--pg-restarts 0)"
        );
        assert_eq!(plan(500, 2, true).restarts_planned(), 0);
    }

    #[test]
    fn the_highest_version_is_compared_as_numbers() {
        let names = ["9.6", "15", "12", "common", "16beta"].map(String::from);
        assert_eq!(highest_version(&names), Some("15"));
        assert_eq!(highest_version(&["main".to_owned()]), None);
    }

    #[test]
    fn the_random_source_is_deterministic_and_in_range() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            let x = a.below(5);
            assert_eq!(x, b.below(5));
            assert!(x < 5);
        }
        let mut zero = Rng::new(0);
        let picks: std::collections::BTreeSet<usize> = (0..100).map(|_| zero.below(5)).collect();
        assert_eq!(picks.len(), 5, "every process gets picked");
    }
}
