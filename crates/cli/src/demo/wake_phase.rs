//! The demo's wake phase, run by the parent once the crash workflows are done: it waits for the
//! sleepers, completes each waiter's awakeable from this process, and verifies from the
//! database that every run woke by push, on time.
//!
//! Every figure is a difference of two timestamps: a sleep's `timers.fire_at` (or an
//! awakeable's `settled_at`, stamped by the completing transaction) against the `woke_at` the
//! run's next step stamped. One clock (PostgreSQL's, or the host's for a SQLite file), so no
//! skew between this process and the worker's.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use keiro::{workflow::AwakeableOutcome, Keiro};
use serde_json::Value;
use uuid::Uuid;

use super::db::Db;
use super::wake::{
    approval_value, sleeper_id, waiter_id, Nap, Wait, APPROVAL, NAPS, SLEEPER, WAITER,
};
use super::workflow::WORKFLOW;
use super::DemoArgs;
use crate::common::{Result, ResultExt};

/// How often the wake phase reads the database while it waits for runs.
const WAKE_POLL: Duration = Duration::from_millis(5);

/// The pause before each completion, so the worker is idle when it arrives: the figure is the
/// latency of one wake, not of a queue.
pub(crate) const COMPLETION_GAP: Duration = Duration::from_millis(150);

/// How long one completed awakeable's run may take to wake before the demo gives up on it
/// (far beyond the bound; only a broken wake path gets here).
const WOKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Extra time, beyond their naps, the sleepers and waiters may take to finish.
const WAKE_PHASE_SLACK: Duration = Duration::from_secs(20);

/// Starts the sleepers and the waiters. Called before the crash workflows are started, so the
/// first worker drives them first and they sit parked through the kill.
pub(crate) async fn start(keiro: &Keiro, args: &DemoArgs) -> Result<()> {
    let nap = Nap {
        sleep_ms: args.sleep_ms,
    };
    for n in 1..=args.sleepers {
        keiro
            .start(SLEEPER, &sleeper_id(n), &nap)
            .await
            .context(format!("starting {SLEEPER} {}", sleeper_id(n)))?;
    }
    for n in 1..=args.waiters {
        keiro
            .start(WAITER, &waiter_id(n), &Wait { waiter: n })
            .await
            .context(format!("starting {WAITER} {}", waiter_id(n)))?;
    }
    Ok(())
}

/// What the wake phase found.
#[derive(Debug, Default)]
pub(crate) struct WakeFindings {
    /// How long after its deadline each nap woke, in ms (negative: early).
    pub(crate) sleep_lags_ms: Vec<f64>,
    /// The same for the naps that ended after the crash workflows were done.
    pub(crate) idle_sleep_lags_ms: Vec<f64>,
    /// Naps that ended while the crash workflows were still running.
    pub(crate) sleeps_busy: u64,
    /// How long after its completion each waiter woke, in ms.
    pub(crate) push_ms: Vec<f64>,
    /// Sleepers and waiters that completed with the right output.
    pub(crate) completed_ok: u64,
    /// Broken expectations, one line each.
    pub(crate) problems: Vec<String>,
}

impl WakeFindings {
    /// The median and the largest of `values` (`None` when empty).
    pub(crate) fn spread(values: &[f64]) -> Option<(f64, f64)> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let median = *sorted.get(sorted.len() / 2)?;
        Some((median, *sorted.last()?))
    }
}

/// Waits for the sleepers, completes the awakeables one at a time, waits for the waiters, and
/// verifies. Needs a live worker on the demo schema throughout.
pub(crate) async fn run(db: &Db, keiro: &Keiro, args: &DemoArgs) -> Result<WakeFindings> {
    let deadline = Instant::now() + Duration::from_millis(args.sleep_ms) * NAPS + WAKE_PHASE_SLACK;
    // The sleepers first: their wakes are timed by their deadlines, and completing awakeables
    // meanwhile would put two wakes in one pass.
    wait_finished(db, SLEEPER, deadline).await?;
    let parked = wait_parked(db, args.waiters, deadline).await?;
    let mut problems = Vec::new();
    for n in 1..=args.waiters {
        let id = waiter_id(n);
        let Some(awakeable) = parked.get(&id) else {
            problems.push(format!("{id} never announced its awakeable"));
            continue;
        };
        tokio::time::sleep(COMPLETION_GAP).await;
        let outcome = keiro
            .complete_awakeable(*awakeable, &approval_value(n))
            .await
            .context(format!("completing the awakeable of {id}"))?;
        if outcome != AwakeableOutcome::Delivered {
            problems.push(format!(
                "completing the awakeable of {id} gave {outcome:?}, not Delivered"
            ));
            continue;
        }
        if !wait_woke(db, &id).await? {
            problems.push(format!(
                "{id} did not wake within {WOKE_TIMEOUT:?} of its completion"
            ));
        }
    }
    wait_finished(db, WAITER, deadline).await?;
    let mut findings = WakeFindings {
        problems,
        ..WakeFindings::default()
    };
    check_outputs(db, args, &mut findings).await?;
    check_sleeps(db, args, &mut findings).await?;
    check_pushes(db, args, &mut findings).await?;
    Ok(findings)
}

/// Waits until no instance of `name` is running or suspended, or `deadline` passes (the
/// verification then reports what is unfinished).
async fn wait_finished(db: &Db, name: &str, deadline: Instant) -> Result<()> {
    while Instant::now() < deadline {
        if db.unfinished(name).await? == 0 {
            break;
        }
        // Coarser than WAKE_POLL: nothing is timed by this wait.
        tokio::time::sleep(WAKE_POLL * 10).await;
    }
    Ok(())
}

/// Waits until every waiter is parked with its awakeable announced (or `deadline` passes), and
/// returns the awakeable ids by instance id.
async fn wait_parked(db: &Db, waiters: u64, deadline: Instant) -> Result<BTreeMap<String, Uuid>> {
    loop {
        let parked: BTreeMap<String, Uuid> = db
            .parked_waiters(WAITER, APPROVAL)
            .await?
            .into_iter()
            .collect();
        if parked.len() as u64 >= waiters || Instant::now() >= deadline {
            return Ok(parked);
        }
        tokio::time::sleep(WAKE_POLL * 10).await;
    }
}

/// Waits until waiter `id` stamped its wake; `false` after [`WOKE_TIMEOUT`].
async fn wait_woke(db: &Db, id: &str) -> Result<bool> {
    let started = Instant::now();
    while started.elapsed() < WOKE_TIMEOUT {
        if db.woke(id, APPROVAL).await? {
            return Ok(true);
        }
        tokio::time::sleep(WAKE_POLL).await;
    }
    Ok(false)
}

/// Every sleeper and waiter completed, with the output its input implies.
async fn check_outputs(db: &Db, args: &DemoArgs, findings: &mut WakeFindings) -> Result<()> {
    let expected: BTreeMap<String, Value> = (1..=args.sleepers)
        .map(|n| (sleeper_id(n), Value::from(NAPS)))
        .chain((1..=args.waiters).map(|n| (waiter_id(n), Value::from(approval_value(n)))))
        .collect();
    let rows = db.instances(&[SLEEPER, WAITER]).await?;
    let mut seen = 0;
    for row in rows {
        let (id, status, output, last_error) = (row.id, row.status, row.output, row.last_error);
        seen += 1;
        let want = expected.get(&id);
        if status != "completed" {
            let reason = last_error.map(|e| format!(" ({e})")).unwrap_or_default();
            findings
                .problems
                .push(format!("{id} is {status}, not completed{reason}"));
        } else if output.as_ref() != want {
            findings
                .problems
                .push(format!("{id} completed with {output:?}, expected {want:?}"));
        } else {
            findings.completed_ok += 1;
        }
    }
    if seen != expected.len() {
        findings.problems.push(format!(
            "{seen} sleepers and waiters exist, {} were started",
            expected.len()
        ));
    }
    Ok(())
}

/// Every nap woke, no earlier than its deadline and within the bound after it.
///
/// A nap that ends while the crash workflows are still running gets the recovery slack on top
/// of the bound: a worker in the middle of a pass finishes it before the next discovery sees
/// the woken run, and worker 2's first pass over the crash workflows can take a second on a
/// loaded machine. Naps that end after them measure an idle worker, under the bound alone.
async fn check_sleeps(db: &Db, args: &DemoArgs, findings: &mut WakeFindings) -> Result<()> {
    let rows = db.naps(SLEEPER, WORKFLOW).await?;
    for row in &rows {
        let (id, step, busy) = (&row.id, &row.step, row.busy);
        let bound = if busy {
            findings.sleeps_busy += 1;
            args.sleep_bound_busy_ms() as f64
        } else {
            args.sleep_bound_ms as f64
        };
        let Some(lag) = row.lag_ms else {
            findings
                .problems
                .push(format!("{id} never recorded waking from {step}"));
            continue;
        };
        findings.sleep_lags_ms.push(lag);
        if !busy {
            findings.idle_sleep_lags_ms.push(lag);
        }
        if lag < 0.0 {
            findings.problems.push(format!(
                "{id} woke from {step} {:.1} ms before its deadline",
                -lag
            ));
        } else if lag > bound {
            findings.problems.push(format!(
                "{id} woke from {step} {lag:.1} ms after its deadline, beyond the bound of {bound:.0} ms"
            ));
        }
    }
    let expected = args.sleepers * u64::from(NAPS);
    if rows.len() as u64 != expected {
        findings.problems.push(format!(
            "{} sleep timers were armed, expected {expected} ({} sleepers x {NAPS} naps)",
            rows.len(),
            args.sleepers
        ));
    }
    Ok(())
}

/// Every awakeable was completed and its run woke within the bound of the completion.
async fn check_pushes(db: &Db, args: &DemoArgs, findings: &mut WakeFindings) -> Result<()> {
    let rows = db.pushes(APPROVAL).await?;
    let bound = args.push_bound_ms as f64;
    for row in &rows {
        let (id, status) = (&row.id, &row.status);
        if status.as_deref() != Some("completed") {
            findings.problems.push(format!(
                "the awakeable of {id} is {}, not completed",
                status.as_deref().unwrap_or("missing")
            ));
            continue;
        }
        let Some(latency) = row.latency_ms else {
            findings
                .problems
                .push(format!("{id} never recorded waking from its awakeable"));
            continue;
        };
        findings.push_ms.push(latency);
        if latency > bound {
            findings.problems.push(format!(
                "{id} woke {latency:.1} ms after its awakeable was completed, beyond the bound of \
                 {bound:.0} ms"
            ));
        }
    }
    if rows.len() as u64 != args.waiters {
        findings.problems.push(format!(
            "{} awakeables were announced, expected {}",
            rows.len(),
            args.waiters
        ));
    }
    Ok(())
}
