//! `keiro chaos`: the engine's guarantees, under faults, checked from the database.
//!
//! It runs on the store `--database-url` names (a scratch schema of the PostgreSQL server, or a
//! SQLite file), and without one on a SQLite file in a temporary directory, which its first line
//! (on stderr) announces with the line that runs it on PostgreSQL instead. On SQLite the worker
//! processes share the one file, as they would share a server; there is no server to restart,
//! so the faults are the SIGKILLs (`--pg-restarts` is refused there, and the report says no
//! restart was made and why). The invariants are the same on both: each store's rows are read
//! into plain structs and one set of pure checks decides ([`invariants`]).
//!
//! 1. Recreates its scratch schema (`keiro_chaos`) or file, migrates it, creates the witness
//!    table, and starts N instances: 80% run five local steps, 20% a local step and two remote steps.
//!    Every tenth (a local one) is not started here: a direct caller process starts and drives
//!    it with `Worker::run_named`. Every step writes a witness (a row on a connection of its
//!    own, outside the journal).
//! 2. Spawns three worker processes, two remote worker processes and one direct caller
//!    process (this binary, through the hidden `chaos-worker`, `chaos-remote-worker` and
//!    `chaos-direct`).
//! 3. Until every instance is done: every 0.5 s one process chosen at random is killed with
//!    SIGKILL and replaced; on PostgreSQL, at evenly spaced points of the journal's progress the
//!    server is restarted in immediate mode (twice by default), and the time from the server
//!    accepting connections again to the next journal row is measured.
//! 4. Stops the fleet, reads the instance rows, the journal and the witnesses, and checks the
//!    invariants ([`invariants`] defines them precisely).
//! 5. Prints one JSON line, naming the faults injected (`faults_injected`: SIGKILLs per role,
//!    PostgreSQL restarts), and exits 0 only if every invariant held and every fault asked for
//!    happened (a SIGKILL interval with no kill, or fewer restarts than planned, fails the run:
//!    [`faults::fault_verdict`]); drops its scratch schema (or removes its temporary file) and
//!    leaves no child behind however it ends (an error, the deadline, Ctrl-C or SIGTERM).
//!
//! Progress goes to stderr; stdout carries only the JSON line. The children log (to stderr)
//! only when `RUST_LOG` is set: under these faults their connection errors are expected.
//!
//! # `--profile queue`
//!
//! The same run, faults and invariants, with every instance started on the queue `chaos-q`,
//! declared with `concurrency(C)` (`--queue-concurrency`, 4 by default) and
//! `key_concurrency(1)`, under one of K keys (`--queue-keys`, 8 by default: instance `n` gets
//! key `key-{n % K}`); the worker processes serve it (`.queue("chaos-q")`). Admission holds the
//! limits in the claim transaction; the run checks from the database alone, after the fact,
//! that they were never exceeded, with nothing read from the processes it kills:
//!
//! - Every local step's witness also stamps its end (`ended_at`), and records, read in the
//!   statement that writes it, the expiry its run's lease had as the step began. A step that
//!   never got its end (its worker was killed in it) counts until that expiry: its slot was
//!   held at least that long, and may have been given to another run right after. Not the
//!   witness's instant plus the lease TTL: the lease was last renewed before the step began, so
//!   that would overrun the slot by the gap, and a run admitted into the freed slot inside it
//!   would count as an overlap (runs here showed one, 47 ms after an expiry). A step whose end
//!   cannot be written keeps trying until that expiry has passed, since failing sooner would
//!   crash its run, which gives its slot back early.
//! - [`invariants::check_queue`] sweeps those spans and finds the most runs in a local step at
//!   once, fleet-wide and per key, against C and 1; it also checks that every run records an
//!   admission under its key, that none that ended still holds its slot, and that none ran a
//!   step before its first admission. The report's `queue` object gives the limits, the maxima
//!   seen and how many steps ended unwritten; its `invariants` three more counts.
//!
//! The other roles stay, each for what it tests about a queue:
//!
//! - **Remote steps** stay as in the default workload (a fifth of the runs). Their runs park
//!   while a remote worker runs the step, and a parked run gives its slot back (the queue's
//!   `release_on_park`, on by default), so remote handlers run outside the limit by design and
//!   are not counted; what they add is the path of a run admitted again each time it wakes
//!   (three admissions per such run), under SIGKILLs of both kinds of worker.
//! - **Direct callers** do not go through admission (`Worker::run_named` starts and leases a
//!   run in one statement, with no queue), so here they start nothing: every instance, the
//!   direct ones too, is started on the queue first, and the direct callers then call
//!   `run_named` on the same tenth as in the default profile. A run waiting for admission is not theirs to claim (they may
//!   only take one that holds its slot with no lease, as any claim may), so they await it: a
//!   direct call that bypassed the queue would show as one run too many in a step at once.

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
use keiro::queue::{QueueSpec, StartOptions};
use keiro::Keiro;
use tokio::task::JoinHandle;

pub(crate) use self::child::{DirectArgs, RemoteWorkerArgs, WorkerArgs};
use self::db::{Db, Pg};
use self::faults::{FaultPlan, Restart, Rng};
use self::invariants::{Expected, QueueLimits};
use self::processes::{Fleet, SpawnSpec};
use self::report::{QueueReport, Report, Run};
use self::workload::{
    direct_instances, expected_output, instance_id, is_direct, journal_steps_of, queue_key,
    steps_of, workflow_of, Input, LOCAL, MIXED,
};
use crate::common::{
    connect_store, error_chain, failure, open_sqlite, recreate_scratch_schema,
    replace_scratch_file, Global, Outcome, Result, ResultExt, Store,
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

/// PostgreSQL restarts when `--pg-restarts` is not given, on PostgreSQL.
const PG_RESTARTS_DEFAULT: u64 = 2;

/// The table that tells a chaos file from someone's data (`--database-url sqlite:PATH`).
const SQLITE_MARKER: &str = "chaos_witness";

/// The queue of `--profile queue`.
pub(crate) const QUEUE: &str = "chaos-q";

/// The queue's concurrency when `--queue-concurrency` is not given.
const QUEUE_CONCURRENCY_DEFAULT: u64 = 4;

/// The keys the queue's runs are spread over when `--queue-keys` is not given.
const QUEUE_KEYS_DEFAULT: u64 = 8;

/// What the run puts under faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Profile {
    /// Every instance started for the workers as they come; the journal's guarantees checked.
    Default,
    /// Every instance started on the queue `chaos-q` (a concurrency and a per-key limit of 1),
    /// served by the workers; the limits checked beside every other invariant.
    Queue,
}

/// The queue of `--profile queue`: its limits and the keys its runs are spread over.
#[derive(Debug, Clone, Copy)]
struct QueuePlan {
    concurrency: u64,
    keys: u64,
}

impl QueuePlan {
    /// The queue's declaration: `concurrency` fleet-wide, one run at a time per key.
    fn spec(&self) -> Result<QueueSpec> {
        let concurrency = i32::try_from(self.concurrency).context("--queue-concurrency")?;
        Ok(QueueSpec::new(QUEUE)
            .context("naming the chaos queue")?
            .concurrency(concurrency)
            .key_concurrency(1))
    }

    /// The limits the checks hold the run to, with the workers' lease TTL.
    fn limits(&self, lease_ttl_ms: u64) -> QueueLimits {
        QueueLimits {
            name: QUEUE.to_owned(),
            concurrency: self.concurrency,
            key_concurrency: 1,
            lease_ttl: time::Duration::milliseconds(
                i64::try_from(lease_ttl_ms).unwrap_or(i64::MAX),
            ),
        }
    }
}

/// Options of `keiro chaos`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ChaosArgs {
    /// The scratch schema the run drops, recreates and drops again at the end (never the
    /// `--schema` one); PostgreSQL only.
    #[arg(long, default_value = "keiro_chaos")]
    pub(crate) chaos_schema: String,
    /// `default`, or `queue`: every instance started on a queue with a concurrency limit and a
    /// per-key limit of 1, which the checks hold the run to (the module's documentation).
    #[arg(long, value_enum, default_value_t = Profile::Default)]
    pub(crate) profile: Profile,
    /// `--profile queue`: how many runs the queue admits at once, fleet-wide (4 by default).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub(crate) queue_concurrency: Option<u64>,
    /// `--profile queue`: how many keys the runs are spread over, round robin, each admitted
    /// one run at a time (8 by default).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub(crate) queue_keys: Option<u64>,
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
    /// PostgreSQL restarts (immediate mode) during the run: 2 by default on PostgreSQL. A
    /// SQLite file has no server to restart, and refuses a number above 0.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=20))]
    pub(crate) pg_restarts: Option<u64>,
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
    /// Keep the scratch schema (or the temporary SQLite file) at the end, to inspect it.
    #[arg(long)]
    pub(crate) keep_schema: bool,
}

impl ChaosArgs {
    /// The queue of `--profile queue`, or `None`; the queue's options without it are refused
    /// rather than ignored.
    fn queue_plan(&self) -> Result<Option<QueuePlan>> {
        match self.profile {
            Profile::Queue => Ok(Some(QueuePlan {
                concurrency: self.queue_concurrency.unwrap_or(QUEUE_CONCURRENCY_DEFAULT),
                keys: self.queue_keys.unwrap_or(QUEUE_KEYS_DEFAULT),
            })),
            Profile::Default => {
                if self.queue_concurrency.is_some() || self.queue_keys.is_some() {
                    return Err(failure(
                        "--queue-concurrency and --queue-keys shape the queue of --profile \
                         queue; the default profile starts no run on a queue",
                    ));
                }
                Ok(None)
            }
        }
    }

    /// The faults asked for on `store`: a SQLite file has no server, so any restart asked for
    /// there is an error, not a fault quietly left out.
    fn fault_plan(&self, store: &Store) -> Result<FaultPlan> {
        let no_server = matches!(store, Store::Sqlite(_));
        if let Store::Sqlite(path) = store {
            let asked = match (self.pg_restarts, &self.pg_restart_cmd) {
                (Some(n), _) if n > 0 => Some(format!("--pg-restarts {n}")),
                (_, Some(_)) => Some("--pg-restart-cmd".to_owned()),
                _ => None,
            };
            if let Some(asked) = asked {
                return Err(failure(format!(
                    "{asked}: the run is on the SQLite file {}, which has no server to restart; \
                     its faults are the SIGKILLs (leave {asked} out, or run on PostgreSQL with \
                     --database-url postgres://…)",
                    path.display()
                )));
            }
        }
        Ok(FaultPlan {
            kill_interval_ms: self.kill_interval_ms,
            restarts_requested: self.pg_restarts.unwrap_or(if no_server {
                0
            } else {
                PG_RESTARTS_DEFAULT
            }),
            restarts_skipped: self.no_pg_restart,
            no_server,
        })
    }

    /// The restart command, or `None` when the run restarts nothing.
    fn restart_command(&self, plan: &FaultPlan) -> Result<Option<String>> {
        if plan.restarts_planned() == 0 {
            return Ok(None);
        }
        match &self.pg_restart_cmd {
            Some(command) => Ok(Some(command.clone())),
            None => faults::local_cluster_restart().map(Some),
        }
    }
}

/// Runs the chaos command, on a temporary SQLite file when no URL was given (removed at the
/// end unless `--keep-schema`).
pub(crate) async fn run(global: &Global, args: &ChaosArgs) -> Result<Outcome> {
    let scratch = global.scratch_store("chaos")?;
    // stderr: stdout carries only the report.
    if let Some(line) = &scratch.announcement {
        eprintln!("{line}");
    }
    let outcome = run_on(&global.with_store(&scratch.store), &scratch.store, args).await;
    match (&scratch.temporary, args.keep_schema) {
        (Some(dir), true) => eprintln!("chaos: kept {} (--keep-schema)", dir.display()),
        _ => scratch.remove(),
    }
    outcome
}

async fn run_on(global: &Global, store: &Store, args: &ChaosArgs) -> Result<Outcome> {
    let plan = args.fault_plan(store)?;
    let queue = args.queue_plan()?;
    let restart = args.restart_command(&plan)?;
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(1..));
    // Dropping `drive` on a signal drops the fleet, which kills and reaps every child.
    let outcome = tokio::select! {
        outcome = drive(global, store, args, plan, queue, restart.as_deref(), seed) => outcome,
        signal = interrupted() => Err(failure(format!("interrupted by {signal}"))),
    };
    if *store == Store::Postgres && !args.keep_schema {
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

/// The store's fresh scratch (the schema recreated and migrated, or the SQLite file replaced
/// and created): the facade that starts the instances, the chaos command's own connection,
/// where it runs (for the report), and the PostgreSQL settings the restarts probe with.
struct Fresh {
    keiro: Keiro,
    db: Db,
    place: String,
    connection: Option<tokio_postgres::Config>,
}

async fn open_fresh(global: &Global, store: &Store, args: &ChaosArgs) -> Result<Fresh> {
    match store {
        Store::Postgres => {
            let schema = &args.chaos_schema;
            recreate_scratch_schema(global, schema).await?;
            let store = connect_store(global.config(schema, 4)?).await?;
            store
                .migrate()
                .await
                .context(format!("migrating schema {schema}"))?;
            let connection = store.connection_config().clone();
            Ok(Fresh {
                keiro: Keiro::builder(store).build(),
                db: Db::postgres(&connection),
                place: format!("schema {schema}"),
                connection: Some(connection),
            })
        }
        Store::Sqlite(path) => {
            replace_scratch_file(path, SQLITE_MARKER, "chaos")?;
            let keiro = open_sqlite(path).await?;
            Ok(Fresh {
                keiro,
                db: Db::sqlite(path).await?,
                place: format!("sqlite file {}", path.display()),
                connection: None,
            })
        }
    }
}

/// The whole run, from the fresh schema (or file) to the report.
async fn drive(
    global: &Global,
    store: &Store,
    args: &ChaosArgs,
    plan: FaultPlan,
    queue: Option<QueuePlan>,
    restart: Option<&str>,
    seed: u64,
) -> Result<Outcome> {
    let Fresh {
        keiro,
        mut db,
        place,
        connection,
    } = open_fresh(global, store, args).await?;
    db.create_witness_table().await?;
    let expected = start_instances(&keiro, args.instances, queue.as_ref()).await?;
    let mixed = expected.iter().filter(|e| e.name == MIXED).count() as u64;
    let direct = direct_instances(args.instances).count() as u64;
    let restarts_planned = plan.restarts_planned();
    let restarts = if plan.no_server {
        "no server to restart".to_owned()
    } else {
        format!(
            "{restarts_planned} PostgreSQL restarts{}",
            restart.map(|c| format!(" (`{c}`)")).unwrap_or_default()
        )
    };
    let on_queue = queue
        .map(|q| {
            format!(
                " on queue {QUEUE} (concurrency {}, 1 per key, {} keys)",
                q.concurrency, q.keys
            )
        })
        .unwrap_or_default();
    eprintln!(
        "chaos: {place}: {} instances{on_queue} ({mixed} with remote steps, {direct} run \
         directly); {} workers, {} remote workers and {} direct callers; a SIGKILL every {} ms; \
         {restarts}; seed {seed}",
        args.instances,
        args.workers,
        args.remote_workers,
        args.direct_callers,
        args.kill_interval_ms,
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
        restart: restart.zip(connection.as_ref()),
        restarts_planned,
        total_steps,
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

    let rows = db.load(&[LOCAL, MIXED]).await?;
    let findings = invariants::check(&expected, &rows);
    let queue = queue.map(|plan| {
        let limits = plan.limits(args.lease_ttl_ms);
        let found = invariants::check_queue(&expected, &rows, &limits);
        QueueReport::new(&limits, plan.keys, args.lease_ttl_ms, found)
    });
    let mut problems = inflicted.problems;
    if inflicted.timed_out {
        problems.insert(
            0,
            format!("the workload was not done within {} s", args.deadline_s),
        );
    }
    let run = Run {
        store: if plan.no_server { "sqlite" } else { "postgres" },
        queue,
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
/// returns what each must end with. With a queue, declares it and starts every instance on it
/// under its key, the direct ones too: a direct caller's `run_named` then finds its run
/// started and waiting for admission, which it must not bypass.
async fn start_instances(
    keiro: &Keiro,
    count: u64,
    queue: Option<&QueuePlan>,
) -> Result<Vec<Expected>> {
    if let Some(queue) = queue {
        keiro
            .declare_queue(&queue.spec()?)
            .await
            .context(format!("declaring queue {QUEUE}"))?;
    }
    let mut expected = Vec::new();
    for n in 1..=count {
        let (name, id) = (workflow_of(n), instance_id(n));
        let key = queue.map(|queue| queue_key(n, queue.keys));
        if let Some(key) = &key {
            let options = StartOptions::on_queue(QUEUE).key(key.clone());
            keiro
                .start_with(name, &id, &Input { n }, &options)
                .await
                .context(format!("starting {name} {id} on queue {QUEUE}"))?;
        } else if !is_direct(n) {
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
            queue_key: key,
        });
    }
    Ok(expected)
}

/// The fault schedule of one run.
struct Chaos<'a> {
    args: &'a ChaosArgs,
    /// The restart command, and the server's settings to probe it with (PostgreSQL only).
    restart: Option<(&'a str, &'a tokio_postgres::Config)>,
    restarts_planned: u64,
    total_steps: u64,
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
                if let Ok(Ok(progress)) =
                    tokio::time::timeout(PROGRESS_TIMEOUT, db.progress()).await
                {
                    (steps, done) = progress;
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
            if let Some((command, connection)) = self.restart {
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
                    let (command, connection) = (command.to_owned(), connection.clone());
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
    let mut db = Pg::new(&connection);
    db.query(
        &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        &[],
        CLEANUP_WITHIN,
    )
    .await
    .context(format!("dropping schema {schema}"))?;
    Ok(())
}
