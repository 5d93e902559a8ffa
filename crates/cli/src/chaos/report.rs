//! The chaos command's one JSON line: the verdict, each invariant's violations, the faults
//! injected and the figures they cost.

use std::collections::BTreeMap;

use serde::Serialize;

use super::faults::Restart;
use super::invariants::{Findings, JournalRow};
use super::processes::FleetStats;
use crate::common::{ms, round};

/// The most problem lines the report carries; the violation counts say how many there were.
const PROBLEMS: usize = 10;

/// The report, serialized as the last stdout line.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    mode: &'static str,
    pass: bool,
    instances: u64,
    local_instances: u64,
    mixed_instances: u64,
    /// Of the local ones, those started and driven by the direct callers.
    direct_instances: u64,
    completed_ok: u64,
    /// Violations per invariant (0: it held).
    invariants: BTreeMap<&'static str, u64>,
    journaled_steps: u64,
    witnesses: u64,
    /// Witnesses minus journaled steps: at-least-once re-executions.
    re_executions: i64,
    processes_spawned: u64,
    kills: u64,
    startup_failures: u64,
    unexpected_exits: u64,
    pg_restarts: u64,
    pg_restarts_planned: u64,
    pg_restart_command_ms: Vec<f64>,
    /// Per restart: from the server accepting connections again to the next journal row.
    pg_recovery_ms: Vec<Option<f64>>,
    pg_recovery_max_ms: Option<f64>,
    elapsed_s: f64,
    timed_out: bool,
    seed: u64,
    problems: Vec<String>,
}

/// What the run did, beside the findings.
#[derive(Debug)]
pub(crate) struct Run {
    /// Instances started, and how many of them were mixed.
    pub(crate) instances: u64,
    /// Of them, the mixed ones.
    pub(crate) mixed: u64,
    /// Of them, the ones the direct callers ran.
    pub(crate) direct: u64,
    /// The fleet's history.
    pub(crate) fleet: FleetStats,
    /// The restarts that happened.
    pub(crate) restarts: Vec<Restart>,
    /// How many were asked for.
    pub(crate) restarts_planned: u64,
    /// From the first start to the end of the workload.
    pub(crate) elapsed: std::time::Duration,
    /// Whether the deadline passed before every instance was done.
    pub(crate) timed_out: bool,
    /// The random seed of the kills.
    pub(crate) seed: u64,
    /// Problems of the run itself (a failed restart, the deadline), beside the invariants'.
    pub(crate) problems: Vec<String>,
}

impl Report {
    /// Builds the report; it passes only if every invariant held and the run had no problem.
    pub(crate) fn new(run: Run, findings: &Findings, journal: &[JournalRow]) -> Self {
        let recovery = recovery_ms(&run.restarts, journal);
        let mut problems = run.problems;
        problems.extend(run.fleet.unexpected_exits.iter().cloned());
        if run.restarts.len() < usize::try_from(run.restarts_planned).unwrap_or(usize::MAX) {
            problems.push(format!(
                "only {} of {} PostgreSQL restarts happened before the workload ended",
                run.restarts.len(),
                run.restarts_planned
            ));
        }
        let checks = [
            ("completed_right", &findings.completed),
            ("journaled_once", &findings.journaled_once),
            ("witnessed", &findings.witnessed),
            ("no_late_witness", &findings.late),
            ("no_stale_epoch", &findings.stale_epoch),
        ];
        for (name, check) in checks {
            problems.extend(check.examples.iter().map(|line| format!("{name}: {line}")));
        }
        let pass = findings.held() && problems.is_empty();
        problems.truncate(PROBLEMS);
        Self {
            mode: "chaos",
            pass,
            instances: run.instances,
            local_instances: run.instances - run.mixed,
            mixed_instances: run.mixed,
            direct_instances: run.direct,
            completed_ok: findings.completed_ok,
            invariants: checks
                .iter()
                .map(|(name, check)| (*name, check.violations))
                .collect(),
            journaled_steps: findings.journaled_steps,
            witnesses: findings.witnesses,
            re_executions: findings.re_executions(),
            processes_spawned: run.fleet.spawned,
            kills: run.fleet.kills,
            startup_failures: run.fleet.startup_failures,
            unexpected_exits: run.fleet.unexpected_exits.len() as u64,
            pg_restarts: run.restarts.len() as u64,
            pg_restarts_planned: run.restarts_planned,
            pg_restart_command_ms: run
                .restarts
                .iter()
                .map(|restart| round(ms(restart.command), 1))
                .collect(),
            pg_recovery_max_ms: recovery.iter().flatten().copied().reduce(f64::max),
            pg_recovery_ms: recovery,
            elapsed_s: round(run.elapsed.as_secs_f64(), 2),
            timed_out: run.timed_out,
            seed: run.seed,
            problems,
        }
    }

    /// Whether the run passed.
    pub(crate) fn passed(&self) -> bool {
        self.pass
    }
}

/// Per restart, the time from the new server accepting connections to the first journal row it
/// recorded, in ms; zero when a worker's append beat the probe that saw the server back, `None`
/// when nothing was journaled after it.
pub(crate) fn recovery_ms(restarts: &[Restart], journal: &[JournalRow]) -> Vec<Option<f64>> {
    restarts
        .iter()
        .map(|restart| {
            let next = journal
                .iter()
                .map(|row| row.recorded_at)
                .filter(|at| *at >= restart.server_started)
                .min()?;
            let gap = (next - restart.accepted_at).as_seconds_f64() * 1000.0;
            Some(round(gap.max(0.0), 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use time::{Duration, OffsetDateTime};

    use super::*;

    fn at(ms: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + Duration::milliseconds(ms)
    }

    fn row(ms: i64) -> JournalRow {
        JournalRow {
            key: ("w".into(), "i".into(), 0, format!("s{ms}")),
            kind: "step".into(),
            recorded_at: at(ms),
        }
    }

    fn restart(started: i64, accepted: i64) -> Restart {
        Restart {
            command: std::time::Duration::from_millis(900),
            server_started: at(started),
            accepted_at: at(accepted),
        }
    }

    #[test]
    fn recovery_runs_from_acceptance_to_the_first_row_of_the_new_server() {
        let journal = [row(100), row(1_300), row(1_250), row(5_000)];
        let restarts = [
            restart(1_000, 1_050),
            restart(1_240, 1_260),
            restart(9_000, 9_010),
        ];
        assert_eq!(
            recovery_ms(&restarts, &journal),
            vec![Some(200.0), Some(0.0), None]
        );
    }
}
