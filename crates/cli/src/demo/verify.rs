//! What the demo reads from the database: progress while it runs, a snapshot at the kill, and
//! the final verification of every guarantee.
//!
//! All of it is SQL on the demo schema (the connection's `search_path`) over one dedicated
//! connection: reading 200 instances and 1,000 journal rows in bulk is one query each, where
//! the facade would take one call per instance.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;
use tokio_postgres::Client;

use super::workflow::{expected_receipt, instance_id, Order, Receipt, STEPS, WORKFLOW};
use crate::common::{Result, ResultExt};
use crate::proof;

const PROGRESS: &str = "SELECT
    (SELECT count(*) FROM journal WHERE workflow_name = $1 AND kind = 'step'),
    (SELECT count(*) FROM workflows WHERE workflow_name = $1 AND status = 'completed'),
    (SELECT count(*) FROM workflows WHERE workflow_name = $1 AND status IN ('failed', 'cancelled'))";

/// Where the demo's workflows are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Progress {
    /// Step results journaled.
    pub(crate) steps: u64,
    /// Instances completed.
    pub(crate) completed: u64,
    /// Instances failed or cancelled (none should be).
    pub(crate) broken: u64,
}

/// Reads the progress counters in one query.
pub(crate) async fn progress(db: &Client) -> Result<Progress> {
    let row = db
        .query_one(PROGRESS, &[&WORKFLOW])
        .await
        .context("reading the demo's progress")?;
    let count = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
    Ok(Progress {
        steps: count(0),
        completed: count(1),
        broken: count(2),
    })
}

const CLOCK: &str = "SELECT clock_timestamp()";

/// The database clock now, the one that stamps `recorded_at` and the ledger's `ran_at`.
pub(crate) async fn clock(db: &Client) -> Result<OffsetDateTime> {
    Ok(db
        .query_one(CLOCK, &[])
        .await
        .context("reading the database clock")?
        .get(0))
}

/// Runs the dead worker held leases on: still live at the kill, and nobody else was running.
const KILL_IN_FLIGHT: &str = "SELECT workflow_id FROM workflows
    WHERE workflow_name = $1 AND status IN ('running', 'suspended')
      AND lease_owner IS NOT NULL AND lease_expires_at > $2
    ORDER BY workflow_id";

const KILL_IN_FLIGHT_STEPS: &str =
    "SELECT count(*) FROM journal WHERE workflow_name = $1 AND workflow_id = ANY($2) AND kind = 'step'";

/// The state of things right after the first worker died.
#[derive(Debug, Clone)]
pub(crate) struct AtKill {
    /// The database clock once the killed process was reaped, so it can send nothing later.
    pub(crate) killed_at: OffsetDateTime,
    /// Progress at that moment.
    pub(crate) progress: Progress,
    /// Instances whose run the kill interrupted (their lease was live).
    pub(crate) in_flight: Vec<String>,
    /// Steps those runs had journaled: the next worker answers them from the journal.
    pub(crate) in_flight_steps: u64,
}

/// Takes the snapshot; call it after the killed worker has been reaped and before another
/// worker starts.
pub(crate) async fn at_kill(db: &Client) -> Result<AtKill> {
    let killed_at = clock(db).await?;
    let progress = progress(db).await?;
    let in_flight: Vec<String> = db
        .query(KILL_IN_FLIGHT, &[&WORKFLOW, &killed_at])
        .await
        .context("reading the runs in flight at the kill")?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let in_flight_steps: i64 = db
        .query_one(KILL_IN_FLIGHT_STEPS, &[&WORKFLOW, &in_flight])
        .await
        .context("counting the steps of the runs in flight")?
        .get(0);
    Ok(AtKill {
        killed_at,
        progress,
        in_flight,
        in_flight_steps: u64::try_from(in_flight_steps).unwrap_or(0),
    })
}

const VERIFY_INSTANCES: &str =
    "SELECT workflow_id, status, input, output, last_error FROM workflows WHERE workflow_name = $1";

const VERIFY_JOURNAL: &str =
    "SELECT workflow_id, step_name, count(*), min(recorded_at) FROM journal
    WHERE workflow_name = $1 AND kind = 'step'
    GROUP BY workflow_id, step_name";

const VERIFY_LEDGER: &str = "SELECT workflow_id, step, pid, ran_at FROM demo_ledger";

/// The first journal entry (any kind) each interrupted run got after the kill.
const VERIFY_RECOVERY: &str = "SELECT workflow_id, min(recorded_at) FROM journal
    WHERE workflow_name = $1 AND workflow_id = ANY($2) AND recorded_at > $3
    GROUP BY workflow_id";

/// What the verification found: the figures, and every broken guarantee as a line.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// Instances expected.
    pub(crate) workflows: u64,
    /// Instances completed with the right output.
    pub(crate) completed_ok: u64,
    /// `(workflow, step)` pairs expected.
    pub(crate) steps_expected: u64,
    /// Pairs journaled exactly once.
    pub(crate) steps_journaled_once: u64,
    /// Step executions in the ledger.
    pub(crate) executions: u64,
    /// Executions beyond a step's first, all before its record: at-least-once re-runs.
    pub(crate) reruns: u64,
    /// Of those, the re-runs of an execution the killed worker started before the kill.
    pub(crate) reruns_of_killed: u64,
    /// Executions after the step's result was journaled: the guarantee broken.
    pub(crate) re_executed: u64,
    /// Interrupted runs that got a journal entry after the kill, within the bound.
    pub(crate) recovered: u64,
    /// Slowest and fastest recovery among interrupted runs.
    pub(crate) recovery: Option<(Duration, Duration)>,
    /// Broken guarantees, one line each.
    pub(crate) problems: Vec<String>,
}

/// Checks every guarantee; `orders` is how many were started, `recovery_bound` how long after
/// the kill an interrupted run may take to get its next journal entry.
pub(crate) async fn verify(
    db: &Client,
    orders: u64,
    at_kill: &AtKill,
    killed_pid: u32,
    recovery_bound: Duration,
) -> Result<Findings> {
    let mut findings = Findings {
        workflows: orders,
        steps_expected: orders * STEPS.len() as u64,
        ..Findings::default()
    };
    check_instances(db, orders, &mut findings).await?;
    let recorded = check_journal(db, orders, &mut findings).await?;
    check_ledger(db, &recorded, at_kill, killed_pid, &mut findings).await?;
    check_recovery(db, at_kill, recovery_bound, &mut findings).await?;
    Ok(findings)
}

/// Every instance completed, with the output its input implies.
async fn check_instances(db: &Client, orders: u64, findings: &mut Findings) -> Result<()> {
    let rows = db
        .query(VERIFY_INSTANCES, &[&WORKFLOW])
        .await
        .context("reading the demo's instances")?;
    let mut seen = BTreeSet::new();
    for row in &rows {
        let id: String = row.get(0);
        let status: String = row.get(1);
        let input: Value = row.get(2);
        let output: Option<Value> = row.get(3);
        let last_error: Option<String> = row.get(4);
        seen.insert(id.clone());
        if status != "completed" {
            let reason = last_error.map(|e| format!(" ({e})")).unwrap_or_default();
            findings
                .problems
                .push(format!("{id} is {status}, not completed{reason}"));
            continue;
        }
        let Ok(order) = serde_json::from_value::<Order>(input) else {
            findings
                .problems
                .push(format!("{id} has an input that is not an order"));
            continue;
        };
        let receipt = output.and_then(|o| serde_json::from_value::<Receipt>(o).ok());
        if receipt == Some(expected_receipt(order.order)) {
            findings.completed_ok += 1;
        } else {
            findings.problems.push(format!(
                "{id} completed with {receipt:?}, expected {:?}",
                expected_receipt(order.order)
            ));
        }
    }
    for order in 1..=orders {
        if !seen.contains(&instance_id(order)) {
            findings
                .problems
                .push(format!("{} was never started", instance_id(order)));
        }
    }
    Ok(())
}

/// Every `(workflow, step)` journaled exactly once, and nothing else journaled. Returns when
/// each step was recorded.
async fn check_journal(
    db: &Client,
    orders: u64,
    findings: &mut Findings,
) -> Result<BTreeMap<(String, String), OffsetDateTime>> {
    let rows = db
        .query(VERIFY_JOURNAL, &[&WORKFLOW])
        .await
        .context("reading the demo's journal")?;
    let mut recorded = BTreeMap::new();
    for row in &rows {
        let (id, step): (String, String) = (row.get(0), row.get(1));
        let count: i64 = row.get(2);
        if count != 1 {
            // The unique key makes this impossible; checking costs nothing.
            findings
                .problems
                .push(format!("{id} step {step} is journaled {count} times"));
        }
        recorded.insert((id, step), row.get::<_, OffsetDateTime>(3));
    }
    let expected: Vec<(String, Vec<String>)> = (1..=orders)
        .map(|order| (instance_id(order), STEPS.map(str::to_owned).to_vec()))
        .collect();
    let found = proof::check_steps(&expected, &recorded.keys().cloned().collect());
    findings.steps_journaled_once += found.journaled;
    findings.problems.extend(found.missing);
    findings.problems.extend(found.unknown);
    Ok(recorded)
}

/// No execution of a step after its record; every recorded step ran at least once; count the
/// legitimate re-runs.
///
/// The comparison is sound because an execution's ledger row commits before its action even
/// returns, and so before the append that records the step begins; `recorded_at` is that
/// append's transaction start on the same database clock. A ledger row stamped after
/// `recorded_at` can only come from running the step again.
async fn check_ledger(
    db: &Client,
    recorded: &BTreeMap<(String, String), OffsetDateTime>,
    at_kill: &AtKill,
    killed_pid: u32,
    findings: &mut Findings,
) -> Result<()> {
    let rows = db
        .query(VERIFY_LEDGER, &[])
        .await
        .context("reading the demo's ledger")?;
    // Per step: executions before its record, and whether the killed worker ran it before the kill.
    let mut runs: BTreeMap<(String, String), (u64, bool)> = BTreeMap::new();
    for row in &rows {
        let (id, step): (String, String) = (row.get(0), row.get(1));
        let pid: i64 = row.get(2);
        let ran_at: OffsetDateTime = row.get(3);
        findings.executions += 1;
        let key = (id, step);
        match recorded.get(&key) {
            None => findings.problems.push(format!(
                "{} step {} ran (pid {pid}) but was never journaled",
                key.0, key.1
            )),
            Some(recorded_at) if ran_at > *recorded_at => {
                findings.re_executed += 1;
                findings.problems.push(format!(
                    "{} step {} ran again (pid {pid}) {:.0} ms after its result was journaled",
                    key.0,
                    key.1,
                    (ran_at - *recorded_at).as_seconds_f64() * 1000.0
                ));
            }
            Some(_) => {
                let by_killed = pid == i64::from(killed_pid) && ran_at < at_kill.killed_at;
                let entry = runs.entry(key).or_insert((0, false));
                entry.0 += 1;
                entry.1 |= by_killed;
            }
        }
    }
    for (count, by_killed) in runs.values() {
        findings.reruns += count - 1;
        if *by_killed {
            findings.reruns_of_killed += count - 1;
        }
    }
    for key in recorded.keys() {
        if !runs.contains_key(key) {
            findings.problems.push(format!(
                "{} step {} was journaled but its side effect never ran",
                key.0, key.1
            ));
        }
    }
    Ok(())
}

/// Each run the kill interrupted got its next journal entry within the bound.
async fn check_recovery(
    db: &Client,
    at_kill: &AtKill,
    bound: Duration,
    findings: &mut Findings,
) -> Result<()> {
    if at_kill.in_flight.is_empty() {
        findings
            .problems
            .push("the kill interrupted no run, so no recovery was exercised".to_owned());
        return Ok(());
    }
    let rows = db
        .query(
            VERIFY_RECOVERY,
            &[&WORKFLOW, &at_kill.in_flight, &at_kill.killed_at],
        )
        .await
        .context("reading the recovery of the interrupted runs")?;
    let next: BTreeMap<String, OffsetDateTime> =
        rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    for id in &at_kill.in_flight {
        let Some(at) = next.get(id) else {
            findings.problems.push(format!(
                "{id} was interrupted by the kill and never resumed"
            ));
            continue;
        };
        let delay = Duration::try_from(*at - at_kill.killed_at).unwrap_or(Duration::ZERO);
        findings.recovery = Some(match findings.recovery {
            None => (delay, delay),
            Some((slowest, fastest)) => (slowest.max(delay), fastest.min(delay)),
        });
        if delay > bound {
            findings.problems.push(format!(
                "{id} resumed {:.2} s after the kill, later than the bound of {:.2} s",
                delay.as_secs_f64(),
                bound.as_secs_f64()
            ));
        } else {
            findings.recovered += 1;
        }
    }
    Ok(())
}
