//! The chaos command's one JSON line: the verdict, each invariant's violations, the faults
//! injected and the figures they cost; under `--profile queue` also the queue's limits and the
//! most runs seen in a step at once (`queue`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::faults::{fault_verdict, FaultPlan, Injected, Restart};
use super::invariants::{Check, Findings, JournalRow, QueueFindings, QueueLimits};
use super::processes::FleetStats;
use crate::common::{ms, round};

/// The most problem lines the report carries; the violation counts say how many there were.
const PROBLEMS: usize = 10;

/// The report, serialized as the last stdout line.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    mode: &'static str,
    /// `default` or `queue`.
    profile: &'static str,
    /// `postgres` or `sqlite`.
    store: &'static str,
    pass: bool,
    instances: u64,
    local_instances: u64,
    mixed_instances: u64,
    /// Of the local ones, those started and driven by the direct callers (under `--profile
    /// queue` started on the queue, and run with `run_named` by the direct callers).
    direct_instances: u64,
    completed_ok: u64,
    /// Violations per invariant (0: it held).
    invariants: BTreeMap<&'static str, u64>,
    journaled_steps: u64,
    witnesses: u64,
    /// Witnesses minus journaled steps: at-least-once re-executions.
    re_executions: i64,
    /// The faults injected, in words (and those turned off, and why).
    faults_injected: Vec<String>,
    processes_spawned: u64,
    kill_interval_ms: u64,
    kills: u64,
    kills_by_role: BTreeMap<String, u64>,
    startup_failures: u64,
    unexpected_exits: u64,
    pg_restarts: u64,
    pg_restarts_requested: u64,
    pg_restarts_skipped: bool,
    pg_restarts_planned: u64,
    pg_restart_command_ms: Vec<f64>,
    /// Per restart: from the server accepting connections again to the next journal row.
    pg_recovery_ms: Vec<Option<f64>>,
    pg_recovery_max_ms: Option<f64>,
    elapsed_s: f64,
    timed_out: bool,
    seed: u64,
    /// `--profile queue`: the limits and what was seen of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<QueueFigures>,
    problems: Vec<String>,
}

/// The queue part of the report: the limits, and the most runs seen in a local step at once.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QueueFigures {
    name: String,
    concurrency_limit: u64,
    key_concurrency_limit: u64,
    keys: u64,
    /// The most runs in a local step at once, fleet-wide.
    max_running: u64,
    /// The most runs of one key in a local step at once.
    max_running_per_key: u64,
    /// Runs whose row records an admission.
    admitted_runs: u64,
    /// Local step executions counted.
    local_steps: u64,
    /// Of them, those whose worker died before their end: counted until their lease expired.
    unended_steps: u64,
    /// Of them, those that ended after their lease expired: counted until it did.
    steps_cut_at_lease: u64,
    /// The workers' lease TTL.
    lease_ttl_ms: u64,
}

/// The queue profile's findings and figures, for [`Report::new`].
#[derive(Debug, Clone)]
pub(crate) struct QueueReport {
    figures: QueueFigures,
    findings: QueueFindings,
}

impl QueueReport {
    /// What the queue checks found under `limits`, with `keys` keys and the workers'
    /// `lease_ttl_ms`.
    pub(crate) fn new(
        limits: &QueueLimits,
        keys: u64,
        lease_ttl_ms: u64,
        findings: QueueFindings,
    ) -> Self {
        Self {
            figures: QueueFigures {
                name: limits.name.clone(),
                concurrency_limit: limits.concurrency,
                key_concurrency_limit: limits.key_concurrency,
                keys,
                max_running: findings.max_running,
                max_running_per_key: findings.max_running_per_key,
                admitted_runs: findings.admitted_runs,
                local_steps: findings.steps,
                unended_steps: findings.unended,
                steps_cut_at_lease: findings.cut_at_lease,
                lease_ttl_ms,
            },
            findings,
        }
    }
}

/// What the run did, beside the findings.
#[derive(Debug)]
pub(crate) struct Run {
    /// The store the run was on: `postgres` or `sqlite`.
    pub(crate) store: &'static str,
    /// `--profile queue`: what its checks found.
    pub(crate) queue: Option<QueueReport>,
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
    /// The faults asked for.
    pub(crate) plan: FaultPlan,
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
        let faults = fault_verdict(
            &run.plan,
            &Injected {
                kills: run.fleet.kills,
                restarts: run.restarts.len() as u64,
            },
        );
        problems.extend(faults.problems);
        let mut checks: Vec<(&'static str, &Check)> = vec![
            ("completed_right", &findings.completed),
            ("journaled_once", &findings.journaled_once),
            ("witnessed", &findings.witnessed),
            ("no_late_witness", &findings.late),
            ("no_stale_epoch", &findings.stale_epoch),
            ("every_step_journaled", &findings.all_journaled),
        ];
        if let Some(queue) = &run.queue {
            checks.extend([
                ("queue_admitted", &queue.findings.admitted),
                ("queue_concurrency", &queue.findings.concurrency),
                ("queue_key_concurrency", &queue.findings.key_concurrency),
            ]);
        }
        for (name, check) in &checks {
            problems.extend(check.examples.iter().map(|line| format!("{name}: {line}")));
        }
        let queue_held = run.queue.as_ref().is_none_or(|q| q.findings.held());
        let pass = findings.held() && queue_held && problems.is_empty();
        problems.truncate(PROBLEMS);
        Self {
            mode: "chaos",
            profile: if run.queue.is_some() {
                "queue"
            } else {
                "default"
            },
            store: run.store,
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
            faults_injected: faults.injected,
            processes_spawned: run.fleet.spawned,
            kill_interval_ms: run.plan.kill_interval_ms,
            kills: run.fleet.kills,
            kills_by_role: run.fleet.kills_by_role,
            startup_failures: run.fleet.startup_failures,
            unexpected_exits: run.fleet.unexpected_exits.len() as u64,
            pg_restarts: run.restarts.len() as u64,
            pg_restarts_requested: run.plan.restarts_requested,
            pg_restarts_skipped: run.plan.restarts_skipped,
            pg_restarts_planned: run.plan.restarts_planned(),
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
            queue: run.queue.map(|queue| queue.figures),
            problems,
        }
    }

    /// Whether the run passed.
    pub(crate) fn passed(&self) -> bool {
        self.pass
    }

    /// The faults injected, in words.
    pub(crate) fn faults_injected(&self) -> &[String] {
        &self.faults_injected
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

    fn run(kills: u64, plan: FaultPlan) -> Run {
        Run {
            store: "postgres",
            queue: None,
            instances: 1,
            mixed: 0,
            direct: 0,
            fleet: FleetStats {
                kills,
                ..FleetStats::default()
            },
            restarts: Vec::new(),
            plan,
            elapsed: std::time::Duration::from_secs(1),
            timed_out: false,
            seed: 1,
            problems: Vec::new(),
        }
    }

    #[test]
    fn a_run_whose_faults_did_not_happen_fails_and_says_so() {
        let plan = FaultPlan {
            kill_interval_ms: 500,
            restarts_requested: 1,
            restarts_skipped: false,
            no_server: false,
        };
        let findings = Findings::default();
        let report = Report::new(run(0, plan), &findings, &[]);
        assert!(!report.passed(), "{report:?}");
        assert_eq!(report.problems.len(), 2, "{:?}", report.problems);
        assert_eq!(
            report.faults_injected(),
            ["0 SIGKILLs, one every 500 ms", "0 of 1 PostgreSQL restarts"]
        );
        let skipped = FaultPlan {
            restarts_skipped: true,
            ..plan
        };
        let report = Report::new(run(3, skipped), &findings, &[]);
        assert!(report.passed(), "{report:?}");
        assert_eq!(
            report.faults_injected(),
            [
                "3 SIGKILLs, one every 500 ms",
                "no PostgreSQL restart (--no-pg-restart)"
            ]
        );
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
