//! `keiro demo`: the crash-recovery demonstration, verified from the database.
//!
//! It runs on the store `--database-url` names (a scratch schema of the PostgreSQL server, or a
//! SQLite file), and without one on a SQLite file in a temporary directory, so it needs no
//! database server. The checks are the same on both (`db` asks them of either).
//!
//! 1. Recreates its scratch schema (or file), migrates it, creates the side-effect ledger, and starts
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
//! Alongside the crash workflows it starts a few wake-source workflows (started first, so they
//! park before the kill and sit parked through it): `demo-sleeper`s sleep durably between
//! steps, `demo-waiter`s announce an awakeable from a step and wait on it. After the crash part
//! the demo completes the awakeables from this process, one at a time, and verifies that every
//! sleeper woke no earlier than its deadline and within a small bound after it (plus the
//! recovery slack for a sleep that ends while the crash workflows still run, since a woken run
//! may wait for a worker's slot), and every waiter within a small bound of its completion: push
//! (LISTEN/NOTIFY on PostgreSQL), well inside the workers' poll interval. On a store without
//! push the bounds add the poll interval, and the report says the runs woke by polling.
//!
//! It prints a few lines and a one-line verdict, and exits 0 only if every check passed.

mod child;
mod db;
mod verify;
mod wake;
mod wake_phase;
pub(crate) mod worker;
mod workflow;

use std::time::{Duration, Instant};

use clap::Args;
use keiro::Keiro;

use self::child::WorkerProcess;
use self::db::Db;
use self::verify::{AtKill, Findings};
use self::wake::NAPS;
use self::wake_phase::WakeFindings;
pub(crate) use self::worker::WorkerArgs;
use self::workflow::{instance_id, Order, STEPS, WORKFLOW};
use crate::common::{
    connect_store, failure, open_sqlite, recreate_scratch_schema, Global, Outcome, Result,
    ResultExt, Store,
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
    /// Workflows that sleep durably between steps (two sleeps each).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=99))]
    pub(crate) sleepers: u64,
    /// How long each of the sleepers' sleeps lasts, in milliseconds.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub(crate) sleep_ms: u64,
    /// How long after its deadline a sleep may end, in milliseconds. The timer loop sleeps
    /// until the deadline, fires it and notifies, which takes milliseconds on an idle worker. A
    /// sleep that ends while the crash workflows still run may also take the recovery slack:
    /// a woken run may wait for a slot of a worker busy with them.
    #[arg(long, default_value_t = 250)]
    pub(crate) sleep_bound_ms: u64,
    /// Workflows that wait on an awakeable which the demo completes from this process.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=99))]
    pub(crate) waiters: u64,
    /// How long after its completion an awakeable's run may take to wake, in milliseconds.
    /// Below the poll interval, so only push can meet it reliably.
    #[arg(long, default_value_t = 100)]
    pub(crate) push_bound_ms: u64,
}

impl DemoArgs {
    fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }

    /// How long after its deadline a sleep that ends while the crash workflows still run may
    /// take to wake: the sleep bound plus the recovery slack (see `recovery_slack_ms`).
    fn sleep_bound_busy_ms(&self) -> u64 {
        self.sleep_bound_ms + self.recovery_slack_ms
    }

    /// How long after the kill an interrupted run may take to get its next journal entry.
    fn recovery_bound(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms + self.poll_interval_ms + self.recovery_slack_ms)
    }
}

/// Runs the demo, on a temporary SQLite file when no URL was given (removed at the end).
pub(crate) async fn run(global: &Global, args: &DemoArgs) -> Result<Outcome> {
    let scratch = global.scratch_store("demo")?;
    if let Some(line) = &scratch.announcement {
        println!("{line}");
    }
    let outcome = run_on(&global.with_store(&scratch.store), &scratch.store, args).await;
    scratch.remove();
    outcome
}

/// Opens the demo's store fresh: the scratch schema recreated and migrated, or the SQLite file
/// replaced (only one an earlier demo made) and created. Returns the handle, the demo's own
/// connection, and where it runs, for the report.
async fn open_fresh(
    global: &Global,
    store: &Store,
    args: &DemoArgs,
) -> Result<(Keiro, Db, String)> {
    match store {
        Store::Postgres => {
            let schema = &args.demo_schema;
            recreate_scratch_schema(global, schema).await?;
            let store = connect_store(global.config(schema, 2)?).await?;
            store
                .migrate()
                .await
                .context(format!("migrating schema {schema}"))?;
            let db = Db::postgres(store.connection_config()).await?;
            Ok((
                Keiro::builder(store).build(),
                db,
                format!("schema {schema}"),
            ))
        }
        Store::Sqlite(path) => {
            db::prepare_file(path)?;
            let keiro = open_sqlite(path).await?;
            let db = Db::sqlite(path).await?;
            Ok((keiro, db, format!("sqlite file {}", path.display())))
        }
    }
}

async fn run_on(global: &Global, store: &Store, args: &DemoArgs) -> Result<Outcome> {
    let total_steps = args.workflows * STEPS.len() as u64;
    let (keiro, db, place) = open_fresh(global, store, args).await?;
    db.create_tables().await?;
    // Without push a woken run waits for the workers' next poll: the bounds say so.
    let push = keiro.notifier().is_some();
    let mut bounded = args.clone();
    if !push {
        bounded.push_bound_ms += args.poll_interval_ms;
        bounded.sleep_bound_ms += args.poll_interval_ms;
    }
    let args = &bounded;
    wake_phase::start(&keiro, args).await?;
    for order in 1..=args.workflows {
        keiro
            .start(WORKFLOW, &instance_id(order), &Order { order })
            .await
            .context(format!("starting {WORKFLOW} {}", instance_id(order)))?;
    }
    println!(
        "demo: {place}: started {} {WORKFLOW} workflows of {} steps; workers run {} at once, \
         lease ttl {:.1} s, poll {} ms, push {}",
        args.workflows,
        STEPS.len(),
        args.concurrency,
        args.lease_ttl().as_secs_f64(),
        args.poll_interval_ms,
        if push {
            "on"
        } else {
            "off (this store has none yet: runs wake at the next poll)"
        }
    );
    println!(
        "demo: also started {} sleepers ({NAPS} durable sleeps of {:.1} s between steps) and {} \
         waiters (each announces an awakeable from a step and parks on it)",
        args.sleepers,
        Duration::from_millis(args.sleep_ms).as_secs_f64(),
        args.waiters
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

    let mut second = WorkerProcess::spawn(global, args)?;
    println!("demo: worker 2 (pid {}) started", second.pid());
    let (after_kill, in_time) = wait_for_completion(&db, &mut second, args, &at_kill).await?;
    println!(
        "demo: crash workflows done; waiting for the sleepers, then completing {} awakeables one \
         at a time",
        args.waiters
    );
    // Worker 2 stays up for the wake phase: it is the one the timers and completions wake.
    let wakes = wake_phase::run(&db, &keiro, args).await?;
    if let Some(status) = second.exited()? {
        return Err(failure(format!(
            "demo worker 2 exited on its own ({status}) during the wake phase"
        )));
    }
    let finished = Finished {
        after_kill,
        worker: second.stop(STOP_GRACE).await?,
        in_time,
    };
    let findings = verify::verify(
        &db,
        args.workflows,
        &at_kill,
        killed_pid,
        args.recovery_bound(),
    )
    .await?;
    Ok(report(args, push, &at_kill, &finished, &findings, &wakes))
}

/// Waits until `target` steps are journaled, failing if the worker dies first or never gets
/// there.
async fn wait_for_kill_point(db: &Db, worker: &mut WorkerProcess, target: u64) -> Result<()> {
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
    /// Time from the kill to the last crash workflow's completion seen (or to the timeout).
    after_kill: Duration,
    /// The second worker's own report (crash workflows and wake phase together).
    worker: worker::WorkerReport,
    /// Whether everything completed before the timeout.
    in_time: bool,
}

/// Waits until every crash workflow is completed (or one breaks, or the timeout passes), and
/// returns the time from the kill to then (database clock) and whether it was in time. The
/// worker keeps running.
async fn wait_for_completion(
    db: &Db,
    worker: &mut WorkerProcess,
    args: &DemoArgs,
    at_kill: &AtKill,
) -> Result<(Duration, bool)> {
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
    let now = db.clock().await?;
    let after_kill = Duration::try_from(now - at_kill.killed_at).unwrap_or(Duration::ZERO);
    Ok((after_kill, in_time))
}

/// Prints the human lines and the verdict; the outcome is `Success` only if nothing broke.
fn report(
    args: &DemoArgs,
    push: bool,
    at_kill: &AtKill,
    finished: &Finished,
    findings: &Findings,
    wakes: &WakeFindings,
) -> Outcome {
    println!(
        "demo: all done {:.1} s after the kill; worker 2 ran {} order steps, answered {} from the \
         journal, completed {} runs (orders, sleepers and waiters)",
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
    let sleeps = WakeFindings::spread(&wakes.sleep_lags_ms);
    let idle_sleeps = WakeFindings::spread(&wakes.idle_sleep_lags_ms);
    let pushes = WakeFindings::spread(&wakes.push_ms);
    println!(
        "wake: {} sleeps woke {} after their deadlines, none early: {} ended while the crash \
         workflows ran (bound {:.2} s: a woken run may wait for a busy worker's slot), {} \
         after them, on an idle worker: {}, bound {} ms",
        wakes.sleep_lags_ms.len(),
        range_ms(&wakes.sleep_lags_ms, sleeps),
        wakes.sleeps_busy,
        Duration::from_millis(args.sleep_bound_busy_ms()).as_secs_f64(),
        wakes.idle_sleep_lags_ms.len(),
        range_ms(&wakes.idle_sleep_lags_ms, idle_sleeps),
        args.sleep_bound_ms
    );
    println!(
        "push: {} awakeables completed from this process, one every {} ms, woke their runs {} later \
         (bound {} ms; the workers poll every {} ms)",
        wakes.push_ms.len(),
        wake_phase::COMPLETION_GAP.as_millis(),
        range_ms(&wakes.push_ms, pushes),
        args.push_bound_ms,
        args.poll_interval_ms
    );
    println!(
        "wake: {}/{} sleepers and waiters completed with the right output",
        wakes.completed_ok,
        args.sleepers + args.waiters
    );
    let mut problems = findings.problems.clone();
    problems.extend(wakes.problems.iter().cloned());
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
    let (sleep_median, sleep_max) = sleeps.unwrap_or_default();
    let (push_median, push_max) = pushes.unwrap_or_default();
    println!(
        "demo: {verdict} {}/{} completed, {} steps journaled once, {} in-flight steps re-run, {} recorded \
         steps re-executed, recovery {slowest:.1} s (lease ttl {:.1} s); {} sleeps woke {sleep_median:.0} ms \
         (max {sleep_max:.0} ms) after their deadlines, {} awakeables woke their runs in {push_median:.0} ms \
         (max {push_max:.0} ms) by {} (poll {} ms)",
        findings.completed_ok,
        findings.workflows,
        findings.steps_journaled_once,
        findings.reruns,
        findings.re_executed,
        args.lease_ttl().as_secs_f64(),
        wakes.sleep_lags_ms.len(),
        wakes.push_ms.len(),
        if push { "push" } else { "polling" },
        args.poll_interval_ms
    );
    if problems.is_empty() {
        Outcome::Success
    } else {
        Outcome::Failed
    }
}

/// "min-max ms (median m ms)" of `values`, or "none".
fn range_ms(values: &[f64], spread: Option<(f64, f64)>) -> String {
    let Some((median, max)) = spread else {
        return "none".to_owned();
    };
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    format!("{min:.1}-{max:.1} ms (median {median:.1} ms)")
}
