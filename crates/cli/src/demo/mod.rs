//! `keiro demo`: the crash-recovery demonstration, verified from the database.
//!
//! 1. Recreates its scratch schema, migrates it, creates the side-effect ledger, and starts
//!    200 `demo-order` workflows of five steps each.
//! 2. Spawns a worker process (this binary, `keiro demo-worker`) with a short lease.
//! 3. Once about a third of the steps are journaled, kills it with SIGKILL: no shutdown, no
//!    release, runs cut mid-step.
//! 4. Spawns a second worker and waits until every workflow has completed.
//! 5. Verifies: every workflow completed with the right output; every step is journaled exactly
//!    once; no step ran after its result was journaled (runs cut by the kill re-ran their
//!    in-flight step, which at-least-once allows, and those are counted); every interrupted run
//!    resumed within lease TTL + poll interval + slack of the kill.
//!
//! It prints a few lines and a one-line verdict, and exits 0 only if every check passed.

mod child;
mod verify;
pub(crate) mod worker;
mod workflow;

use std::time::{Duration, Instant};

use clap::Args;
use keiro::Keiro;

use self::child::WorkerProcess;
use self::verify::{AtKill, Findings};
pub(crate) use self::worker::WorkerArgs;
use self::workflow::{instance_id, Order, LEDGER_CREATE, STEPS, WORKFLOW};
use crate::common::{
    connect_store, failure, open_connection, recreate_scratch_schema, Global, Outcome, Result,
    ResultExt,
};

/// How often progress is read while waiting for the kill point: often enough to kill close to
/// a third, rarely enough to cost the database nothing noticeable.
const KILL_POLL: Duration = Duration::from_millis(20);

/// How often progress is read while waiting for the second worker to finish.
const FINISH_POLL: Duration = Duration::from_millis(100);

/// How long the first worker may take to journal a third of the steps.
const KILL_POINT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the second worker may take to finish its in-flight runs once asked to stop.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The most broken-guarantee lines printed; the count says how many there were.
const PROBLEMS_SHOWN: usize = 10;

/// Options of `keiro demo`.
#[derive(Debug, Clone, Args)]
pub(crate) struct DemoArgs {
    /// The scratch schema the demo drops and recreates (never the `--schema` one).
    #[arg(long, default_value = "keiro_demo")]
    pub(crate) demo_schema: String,
    /// Workflows started.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub(crate) workflows: u64,
    /// Runs each worker process drives at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub(crate) concurrency: u64,
    /// The workers' lease time-to-live, in milliseconds: how long a killed worker's runs stay
    /// blocked.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(100..))]
    pub(crate) lease_ttl_ms: u64,
    /// The workers' gap between idle passes, in milliseconds.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..))]
    pub(crate) poll_interval_ms: u64,
    /// Extra time an interrupted run may take to resume, beyond lease TTL + poll interval, in
    /// milliseconds. It covers the second worker's start and, mostly, a resume pass already under
    /// way when the leases expire: a pass claims only what its one discovery query returned, so
    /// runs whose lease expires mid-pass wait for the pass to end, and on a loaded 2-core machine
    /// the second worker's first pass (the untouched two thirds of the work) can take seconds.
    #[arg(long, default_value_t = 1500)]
    pub(crate) recovery_slack_ms: u64,
    /// How long the second worker may take to complete everything, in seconds.
    #[arg(long, default_value_t = 120)]
    pub(crate) timeout_s: u64,
}

impl DemoArgs {
    fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }

    /// How long after the kill an interrupted run may take to get its next journal entry.
    fn recovery_bound(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms + self.poll_interval_ms + self.recovery_slack_ms)
    }
}

/// Runs the demo.
pub(crate) async fn run(global: &Global, args: &DemoArgs) -> Result<Outcome> {
    let schema = &args.demo_schema;
    let total_steps = args.workflows * STEPS.len() as u64;
    recreate_scratch_schema(global, schema).await?;
    let store = connect_store(global.config(schema, 2)).await?;
    store
        .migrate()
        .await
        .context(format!("migrating schema {schema}"))?;
    let db = open_connection(store.connection_config()).await?;
    db.batch_execute(LEDGER_CREATE)
        .await
        .context("creating the demo ledger")?;
    let keiro = Keiro::new(store);
    for order in 1..=args.workflows {
        keiro
            .start(WORKFLOW, &instance_id(order), &Order { order })
            .await
            .context(format!("starting {WORKFLOW} {}", instance_id(order)))?;
    }
    println!(
        "demo: schema {schema}: started {} {WORKFLOW} workflows of {} steps; workers run {} at once, \
         lease ttl {:.1} s, poll {} ms",
        args.workflows,
        STEPS.len(),
        args.concurrency,
        args.lease_ttl().as_secs_f64(),
        args.poll_interval_ms
    );

    let mut first = WorkerProcess::spawn(global, args)?;
    let killed_pid = first.pid();
    wait_for_kill_point(&db, &mut first, total_steps.div_ceil(3)).await?;
    first.kill()?;
    let at_kill = verify::at_kill(&db).await?;
    println!(
        "demo: killed worker 1 (pid {killed_pid}) with SIGKILL at {}/{total_steps} steps journaled: \
         {} workflows completed, {} runs cut mid-flight",
        at_kill.progress.steps,
        at_kill.progress.completed,
        at_kill.in_flight.len()
    );

    let second = WorkerProcess::spawn(global, args)?;
    println!("demo: worker 2 (pid {}) started", second.pid());
    let finished = wait_for_completion(&db, second, args, &at_kill).await?;
    let findings = verify::verify(
        &db,
        args.workflows,
        &at_kill,
        killed_pid,
        args.recovery_bound(),
    )
    .await?;
    Ok(report(args, &at_kill, &finished, &findings))
}

/// Waits until `target` steps are journaled, failing if the worker dies first or never gets
/// there.
async fn wait_for_kill_point(
    db: &tokio_postgres::Client,
    worker: &mut WorkerProcess,
    target: u64,
) -> Result<()> {
    let started = Instant::now();
    loop {
        if let Some(status) = worker.exited()? {
            return Err(failure(format!(
                "demo worker 1 exited on its own ({status}) before the kill"
            )));
        }
        if verify::progress(db).await?.steps >= target {
            return Ok(());
        }
        if started.elapsed() > KILL_POINT_TIMEOUT {
            return Err(failure(format!(
                "demo worker 1 journaled fewer than {target} steps in {KILL_POINT_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(KILL_POLL).await;
    }
}

/// How the second worker's phase ended.
struct Finished {
    /// Time from the kill to the last completion seen (or to the timeout).
    after_kill: Duration,
    /// The second worker's own report.
    worker: worker::WorkerReport,
    /// Whether everything completed before the timeout.
    in_time: bool,
}

/// Waits until every workflow is completed (or one breaks, or the timeout passes), then stops
/// the second worker gracefully and collects its report.
async fn wait_for_completion(
    db: &tokio_postgres::Client,
    mut worker: WorkerProcess,
    args: &DemoArgs,
    at_kill: &AtKill,
) -> Result<Finished> {
    let started = Instant::now();
    let timeout = Duration::from_secs(args.timeout_s);
    let in_time = loop {
        if let Some(status) = worker.exited()? {
            return Err(failure(format!(
                "demo worker 2 exited on its own ({status})"
            )));
        }
        let progress = verify::progress(db).await?;
        if progress.completed + progress.broken >= args.workflows {
            break true;
        }
        if started.elapsed() > timeout {
            println!(
                "demo: timed out after {} s with {}/{} completed",
                args.timeout_s, progress.completed, args.workflows
            );
            break false;
        }
        tokio::time::sleep(FINISH_POLL).await;
    };
    let now = verify::clock(db).await?;
    let after_kill = Duration::try_from(now - at_kill.killed_at).unwrap_or(Duration::ZERO);
    let report = worker.stop(STOP_GRACE).await?;
    Ok(Finished {
        after_kill,
        worker: report,
        in_time,
    })
}

/// Prints the human lines and the verdict; the outcome is `Success` only if nothing broke.
fn report(args: &DemoArgs, at_kill: &AtKill, finished: &Finished, findings: &Findings) -> Outcome {
    println!(
        "demo: all done {:.1} s after the kill; worker 2 ran {} steps, answered {} from the journal, \
         completed {} runs",
        finished.after_kill.as_secs_f64(),
        finished.worker.executed,
        finished.worker.replayed,
        finished.worker.completed
    );
    println!(
        "ran: {} step executions for {} journaled steps; replayed/skipped: {} (journaled before the \
         kill by the {} cut runs); re-run after crash: {} ({} of them cut by the kill); recorded steps \
         re-executed: {}",
        findings.executions,
        findings.steps_expected,
        at_kill.in_flight_steps,
        at_kill.in_flight.len(),
        findings.reruns,
        findings.reruns_of_killed,
        findings.re_executed
    );
    let recovery = findings.recovery.map_or_else(
        || "none".to_owned(),
        |(slowest, fastest)| {
            format!(
                "{:.2}-{:.2} s",
                fastest.as_secs_f64(),
                slowest.as_secs_f64()
            )
        },
    );
    println!(
        "recovery: {}/{} cut runs got their next journal entry {recovery} after the kill (bound {:.1} s \
         = lease ttl {:.1} s + poll {:.1} s + slack {:.1} s)",
        findings.recovered,
        at_kill.in_flight.len(),
        args.recovery_bound().as_secs_f64(),
        args.lease_ttl().as_secs_f64(),
        Duration::from_millis(args.poll_interval_ms).as_secs_f64(),
        Duration::from_millis(args.recovery_slack_ms).as_secs_f64()
    );
    let mut problems = findings.problems.clone();
    if !finished.in_time {
        problems.insert(
            0,
            format!("not everything completed within {} s", args.timeout_s),
        );
    }
    for line in problems.iter().take(PROBLEMS_SHOWN) {
        println!("FAIL: {line}");
    }
    if problems.len() > PROBLEMS_SHOWN {
        println!("FAIL: ... and {} more", problems.len() - PROBLEMS_SHOWN);
    }
    let verdict = if problems.is_empty() { "PASS" } else { "FAIL" };
    let slowest = findings
        .recovery
        .map_or(0.0, |(slowest, _)| slowest.as_secs_f64());
    println!(
        "demo: {verdict} {}/{} completed, {} steps journaled once, {} in-flight steps re-run, {} recorded \
         steps re-executed, recovery {slowest:.1} s (lease ttl {:.1} s)",
        findings.completed_ok,
        findings.workflows,
        findings.steps_journaled_once,
        findings.reruns,
        findings.re_executed,
        args.lease_ttl().as_secs_f64()
    );
    if problems.is_empty() {
        Outcome::Success
    } else {
        Outcome::Failed
    }
}
