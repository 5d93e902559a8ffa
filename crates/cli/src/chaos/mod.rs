//! `keiro chaos`: the engine's guarantees, under faults, checked from the database.
//!
//! 1. Recreates its scratch schema (`keiro_chaos`), migrates it, creates the witness table, and
//!    starts N instances: 80% run five local steps, 20% a local step and two remote steps.
//!    Every tenth (a local one) is not started here: a direct caller process starts and drives
//!    it with `Worker::run_named`. Every step writes a witness (a row on a connection of its
//!    own, outside the journal).
//! 2. Spawns three worker processes, two remote worker processes and one direct caller
//!    process (this binary, through the hidden `chaos-worker`, `chaos-remote-worker` and
//!    `chaos-direct`).
//! 3. Until every instance is done: every 0.5 s one process chosen at random is killed with
//!    SIGKILL and replaced; at evenly spaced points of the journal's progress PostgreSQL is
//!    restarted in immediate mode (twice by default), and the time from the server accepting
//!    connections again to the next journal row is measured.
//! 4. Stops the fleet, reads the instance rows, the journal and the witnesses, and checks the
//!    invariants ([`invariants`] defines them precisely).
//! 5. Prints one JSON line, naming the faults injected (`faults_injected`: SIGKILLs per role,
//!    PostgreSQL restarts), and exits 0 only if every invariant held and every fault asked for
//!    happened (a SIGKILL interval with no kill, or fewer restarts than planned, fails the run:
//!    [`faults::fault_verdict`]); drops its scratch schema and leaves no child behind however it
//!    ends (an error, the deadline, Ctrl-C or SIGTERM).
//!
//! Progress goes to stderr; stdout carries only the JSON line. The children log (to stderr)
//! only when `RUST_LOG` is set: under these faults their connection errors are expected.

pub(crate) mod child;
mod db;
mod faults;
mod invariants;
mod processes;
mod report;
mod witness;
mod workload;

use std::time::{Duration, Instant};

use clap::Args;
use keiro::Keiro;
use tokio::task::JoinHandle;

pub(crate) use self::child::{DirectArgs, RemoteWorkerArgs, WorkerArgs};
use self::db::Db;
use self::faults::{FaultPlan, Restart, Rng};
use self::invariants::Expected;
use self::processes::{Fleet, SpawnSpec};
use self::report::{Report, Run};
use self::witness::WITNESS_CREATE;
use self::workload::{
    direct_instances, expected_output, instance_id, is_direct, journal_steps_of, steps_of,
    workflow_of, Input, LOCAL, MIXED,
};
use crate::common::{
    connect_store, error_chain, failure, recreate_scratch_schema, Global, Outcome, Result,
    ResultExt,
};

/// How often the chaos loop looks at its children and its schedule.
const TICK: Duration = Duration::from_millis(20);

/// How often progress is read from the database.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// How long one progress read may take before the loop goes on without it.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the children may take to finish their in-flight work once asked to stop.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How long dropping the scratch schema may keep trying while the server is away.
const CLEANUP_WITHIN: Duration = Duration::from_secs(120);

/// Steps journaled, and instances that reached a terminal status.
const PROGRESS: &str = "SELECT
    (SELECT count(*) FROM journal WHERE kind IN ('step', 'remote')),
    (SELECT count(*) FROM workflows WHERE status IN ('completed', 'failed', 'cancelled'))";

/// Options of `keiro chaos`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ChaosArgs {
    /// The scratch schema the run drops, recreates and drops again at the end (never the
    /// `--schema` one).
    #[arg(long, default_value = "keiro_chaos")]
    pub(crate) chaos_schema: String,
    /// Instances started: 80% run five local steps, 20% a local step and two remote steps.
    #[arg(short = 'n', long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub(crate) instances: u64,
    /// Resume worker processes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub(crate) workers: u64,
    /// Remote worker processes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub(crate) remote_workers: u64,
    /// Direct caller processes: each runs every direct instance (one in ten) with
    /// `Worker::run_named`, so a killed one's runs are recovered by the resume workers and
    /// awaited by the others.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub(crate) direct_callers: u64,
    /// Runs (or remote handlers) each process drives at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub(crate) concurrency: u64,
    /// A process chosen at random is killed with SIGKILL (and replaced) this often, in
    /// milliseconds; 0 kills none.
    #[arg(long, default_value_t = 500)]
    pub(crate) kill_interval_ms: u64,
    /// PostgreSQL restarts (immediate mode) during the run.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(0..=20))]
    pub(crate) pg_restarts: u64,
    /// The command that restarts PostgreSQL, run through `sh -c`. Defaults to the local
    /// cluster's `pg_ctlcluster --skip-systemctl-redirect <version> main restart -m immediate`.
    #[arg(long)]
    pub(crate) pg_restart_cmd: Option<String>,
    /// Restart PostgreSQL not at all (a server this user cannot restart, or one others use).
    #[arg(long)]
    pub(crate) no_pg_restart: bool,
    /// The workers' lease time-to-live, in milliseconds.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(200..))]
    pub(crate) lease_ttl_ms: u64,
    /// The workers' gap between idle passes, in milliseconds.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(10..))]
    pub(crate) poll_interval_ms: u64,
    /// How long a remote worker's claim lasts without a heartbeat, in milliseconds.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(200..))]
    pub(crate) claim_ttl_ms: u64,
    /// The run fails if the workload is not done within this many seconds.
    #[arg(long, default_value_t = 300)]
    pub(crate) deadline_s: u64,
    /// Seeds the choice of the processes killed (random by default; the report gives it).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Keep the scratch schema at the end, to inspect it.
    #[arg(long)]
    pub(crate) keep_schema: bool,
}

impl ChaosArgs {
    /// The restart command, or `None` when the run restarts nothing.
    fn restart_command(&self) -> Result<Option<String>> {
        if self.no_pg_restart || self.pg_restarts == 0 {
            return Ok(None);
        }
        match &self.pg_restart_cmd {
            Some(command) => Ok(Some(command.clone())),
            None => faults::local_cluster_restart().map(Some),
        }
    }
}

/// Runs the chaos command.
pub(crate) async fn run(global: &Global, args: &ChaosArgs) -> Result<Outcome> {
    let restart = args.restart_command()?;
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(1..));
    // Dropping `drive` on a signal drops the fleet, which kills and reaps every child.
    let outcome = tokio::select! {
        outcome = drive(global, args, restart.as_deref(), seed) => outcome,
        signal = interrupted() => Err(failure(format!("interrupted by {signal}"))),
    };
    if !args.keep_schema {
        if let Err(error) = drop_schema(global, &args.chaos_schema).await {
            eprintln!(
                "chaos: could not drop schema {}: {}",
                args.chaos_schema,
                error_chain(error.as_ref())
            );
        }
    }
    outcome
}

/// Resolves on SIGINT, SIGTERM or SIGHUP, with the signal's name.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let wait = |kind| async move {
        match signal(kind) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = wait(SignalKind::interrupt()) => "SIGINT",
        () = wait(SignalKind::terminate()) => "SIGTERM",
        () = wait(SignalKind::hangup()) => "SIGHUP",
    }
}

/// The whole run, from the fresh schema to the report.
async fn drive(
    global: &Global,
    args: &ChaosArgs,
    restart: Option<&str>,
    seed: u64,
) -> Result<Outcome> {
    let schema = &args.chaos_schema;
    recreate_scratch_schema(global, schema).await?;
    let store = connect_store(global.config(schema, 4)?).await?;
    store
        .migrate()
        .await
        .context(format!("migrating schema {schema}"))?;
    let connection = store.connection_config().clone();
    let mut db = Db::new(&connection);
    db.batch(WITNESS_CREATE)
        .await
        .context("creating the witness table")?;
    let keiro = Keiro::builder(store).build();
    let expected = start_instances(&keiro, args.instances).await?;
    let mixed = expected.iter().filter(|e| e.name == MIXED).count() as u64;
    let direct = direct_instances(args.instances).count() as u64;
    let plan = FaultPlan {
        kill_interval_ms: args.kill_interval_ms,
        restarts_requested: args.pg_restarts,
        restarts_skipped: args.no_pg_restart,
    };
    let restarts_planned = plan.restarts_planned();
    eprintln!(
        "chaos: schema {schema}: {} instances ({mixed} with remote steps, {direct} run \
         directly); {} workers, {} remote workers and {} direct callers; a SIGKILL every {} ms; \
         {restarts_planned} PostgreSQL restarts{}; seed {seed}",
        args.instances,
        args.workers,
        args.remote_workers,
        args.direct_callers,
        args.kill_interval_ms,
        restart.map(|c| format!(" (`{c}`)")).unwrap_or_default()
    );

    let began = Instant::now();
    let fleet = Fleet::start(
        SpawnSpec::new(global, args),
        usize::try_from(args.workers).context("--workers")?,
        usize::try_from(args.remote_workers).context("--remote-workers")?,
        usize::try_from(args.direct_callers).context("--direct-callers")?,
    )?;
    let total_steps = (1..=args.instances).map(steps_of).sum();
    let chaos = Chaos {
        args,
        restart,
        restarts_planned,
        total_steps,
        connection: &connection,
    };
    let inflicted = chaos.inflict(&mut db, fleet, Rng::new(seed)).await?;
    let elapsed = began.elapsed();
    eprintln!(
        "chaos: workload {} after {:.1} s; {} kills, {} restarts; checking",
        if inflicted.timed_out {
            "timed out"
        } else {
            "done"
        },
        elapsed.as_secs_f64(),
        inflicted.fleet.kills,
        inflicted.restarts.len()
    );

    let rows = invariants::load(&mut db, &[LOCAL, MIXED]).await?;
    let findings = invariants::check(&expected, &rows);
    let mut problems = inflicted.problems;
    if inflicted.timed_out {
        problems.insert(
            0,
            format!("the workload was not done within {} s", args.deadline_s),
        );
    }
    let run = Run {
        instances: args.instances,
        mixed,
        direct,
        fleet: inflicted.fleet,
        restarts: inflicted.restarts,
        plan,
        elapsed,
        timed_out: inflicted.timed_out,
        seed,
        problems,
    };
    let report = Report::new(run, &findings, &rows.journal);
    eprintln!(
        "chaos: faults injected: {}",
        report.faults_injected().join("; ")
    );
    println!(
        "{}",
        serde_json::to_string(&report).context("encoding the report")?
    );
    Ok(if report.passed() {
        Outcome::Success
    } else {
        Outcome::Failed
    })
}

/// Starts instances `1..=count`, but the direct ones (the direct callers start those), and
/// returns what each must end with.
async fn start_instances(keiro: &Keiro, count: u64) -> Result<Vec<Expected>> {
    let mut expected = Vec::new();
    for n in 1..=count {
        let (name, id) = (workflow_of(n), instance_id(n));
        if !is_direct(n) {
            keiro
                .start(name, &id, &Input { n })
                .await
                .context(format!("starting {name} {id}"))?;
        }
        expected.push(Expected {
            name: name.to_owned(),
            id,
            output: expected_output(n),
            steps: journal_steps_of(n),
        });
    }
    Ok(expected)
}

/// The fault schedule of one run.
struct Chaos<'a> {
    args: &'a ChaosArgs,
    restart: Option<&'a str>,
    restarts_planned: u64,
    total_steps: u64,
    connection: &'a tokio_postgres::Config,
}

/// What the faults phase did.
struct Inflicted {
    fleet: processes::FleetStats,
    restarts: Vec<Restart>,
    timed_out: bool,
    problems: Vec<String>,
}

impl Chaos<'_> {
    /// Kills and restarts until every instance is done or the deadline passes, then stops the
    /// fleet.
    async fn inflict(&self, db: &mut Db, mut fleet: Fleet, mut rng: Rng) -> Result<Inflicted> {
        let began = Instant::now();
        let deadline = began + Duration::from_secs(self.args.deadline_s);
        let kill_every = Duration::from_millis(self.args.kill_interval_ms);
        let mut next_kill = began + kill_every;
        let mut next_progress = began;
        let (mut steps, mut done) = (0u64, 0u64);
        let mut restarting: Option<JoinHandle<Result<Restart>>> = None;
        let mut restarts = Vec::new();
        let mut restarts_begun = 0u64;
        let mut problems = Vec::new();
        let timed_out = loop {
            tokio::time::sleep(TICK).await;
            let now = Instant::now();
            fleet.supervise()?;
            if !kill_every.is_zero() && now >= next_kill {
                fleet.kill_random(&mut rng)?;
                next_kill = now + kill_every;
            }
            if now >= next_progress {
                next_progress = now + PROGRESS_EVERY;
                if let Ok(Ok(rows)) =
                    tokio::time::timeout(PROGRESS_TIMEOUT, db.query_once(PROGRESS, &[])).await
                {
                    if let Some(row) = rows.first() {
                        steps = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
                        done = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
                    }
                }
            }
            if restarting.as_ref().is_some_and(JoinHandle::is_finished) {
                if let Some(task) = restarting.take() {
                    match task.await {
                        Ok(Ok(restart)) => {
                            eprintln!(
                                "chaos: PostgreSQL restarted ({:.1} s) and accepting connections",
                                restart.command.as_secs_f64()
                            );
                            restarts.push(restart);
                        }
                        Ok(Err(error)) => {
                            problems.push(format!(
                                "restarting PostgreSQL: {}",
                                error_chain(error.as_ref())
                            ));
                            // A command that failed once will fail again; stop trying.
                            restarts_begun = self.restarts_planned;
                        }
                        Err(error) => problems.push(format!("the restart task failed: {error}")),
                    }
                }
            }
            if let Some(command) = self.restart {
                let threshold =
                    self.total_steps * (restarts_begun + 1) / (self.restarts_planned + 1);
                if restarting.is_none()
                    && restarts_begun < self.restarts_planned
                    && steps >= threshold
                    && done < self.args.instances
                {
                    restarts_begun += 1;
                    eprintln!(
                        "chaos: restarting PostgreSQL ({restarts_begun}/{}) at {steps}/{} steps",
                        self.restarts_planned, self.total_steps
                    );
                    let (command, connection) = (command.to_owned(), self.connection.clone());
                    restarting = Some(tokio::spawn(async move {
                        faults::restart_postgres(&command, &connection).await
                    }));
                }
            }
            // A restart under way is always waited for, so the run never ends with the server
            // down.
            if restarting.is_none() {
                if done >= self.args.instances {
                    break false;
                }
                if now >= deadline {
                    break true;
                }
            }
        };
        let fleet = fleet.stop(STOP_GRACE).await;
        Ok(Inflicted {
            fleet,
            restarts,
            timed_out,
            problems,
        })
    }
}

/// Drops the scratch schema, trying again while the server is away.
async fn drop_schema(global: &Global, schema: &str) -> Result<()> {
    let config = global.config(schema, 1)?;
    // Spliced into DDL (identifiers take no bind parameters): it passed the store's identifier
    // check when the schema was created, and is checked again here.
    config
        .validate()
        .context("checking the scratch schema name")?;
    if schema == global.schema {
        return Err(failure(format!(
            "refusing to drop schema {schema}: it is the operator schema"
        )));
    }
    // From the parsed settings, as every other connection: the driver alone cannot read
    // libpq's verify-ca / verify-full / sslrootcert.
    let connection = config
        .connection_config()
        .context("reading --database-url")?;
    let mut db = Db::new(&connection);
    db.query(
        &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        &[],
        CLEANUP_WITHIN,
    )
    .await
    .context(format!("dropping schema {schema}"))?;
    Ok(())
}
