//! What the demo reads from the database: progress while it runs, a snapshot at the kill, and
//! the final verification of every guarantee, the same on both stores (the reads are `db`'s).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use time::OffsetDateTime;

use super::db::{Db, Progress};
use super::workflow::{expected_receipt, instance_id, Order, Receipt, STEPS, WORKFLOW};
use crate::common::Result;
use crate::proof;

/// Reads the progress counters in one query.
pub(crate) async fn progress(db: &Db) -> Result<Progress> {
    db.progress(WORKFLOW).await
}

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
pub(crate) async fn at_kill(db: &Db) -> Result<AtKill> {
    let killed_at = db.clock().await?;
    let progress = progress(db).await?;
    // Runs the dead worker held leases on: still live at the kill, and nobody else was running.
    let in_flight = db.leased_at(WORKFLOW, killed_at).await?;
    let in_flight_steps = db.steps_of(WORKFLOW, &in_flight).await?;
    Ok(AtKill {
        killed_at,
        progress,
        in_flight,
        in_flight_steps,
    })
}

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
    db: &Db,
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
async fn check_instances(db: &Db, orders: u64, findings: &mut Findings) -> Result<()> {
    let rows = db.instances(&[WORKFLOW]).await?;
    let mut seen = BTreeSet::new();
    for row in rows {
        let (id, status, input, output, last_error) =
            (row.id, row.status, row.input, row.output, row.last_error);
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
    db: &Db,
    orders: u64,
    findings: &mut Findings,
) -> Result<BTreeMap<(String, String), OffsetDateTime>> {
    let rows = db.journal_steps(WORKFLOW).await?;
    let mut recorded = BTreeMap::new();
    for row in rows {
        let (id, step, count) = (row.id, row.step, row.count);
        if count != 1 {
            // The unique key makes this impossible; checking costs nothing.
            findings
                .problems
                .push(format!("{id} step {step} is journaled {count} times"));
        }
        recorded.insert((id, step), row.recorded_at);
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
/// The comparison is sound because an execution's ledger row is stamped and committed before
/// its action even returns, and so before the append that records the step begins;
/// `recorded_at` is that append's instant on the same clock (PostgreSQL's, or the host's for a
/// SQLite file). A ledger row stamped after `recorded_at` can only come from running the step
/// again.
async fn check_ledger(
    db: &Db,
    recorded: &BTreeMap<(String, String), OffsetDateTime>,
    at_kill: &AtKill,
    killed_pid: u32,
    findings: &mut Findings,
) -> Result<()> {
    let rows = db.executions().await?;
    // Per step: executions before its record, and whether the killed worker ran it before the kill.
    let mut runs: BTreeMap<(String, String), (u64, bool)> = BTreeMap::new();
    for row in rows {
        let (id, step, pid, ran_at) = (row.id, row.step, row.pid, row.ran_at);
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
    db: &Db,
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
    let next: BTreeMap<String, OffsetDateTime> = db
        .first_entries_after(WORKFLOW, &at_kill.in_flight, at_kill.killed_at)
        .await?
        .into_iter()
        .collect();
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
