//! Worker processes on one SQLite file (issue 35): a worker SIGKILLed mid-run leaves its runs
//! to a second process, which finishes them without executing a journaled step again; and two
//! workers contending on the file while this test's process starts instances never execute one
//! instance's steps at the same moment, between them executing and journaling each step once.
//!
//! The workers are `keiro-test-sqlite-worker` processes; what their steps executed is read from
//! the [`StepLedger`] they keep beside the store, what the store recorded from its journal
//! through a `SqliteStore` this process opens on the same file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keiro::store::Event;
use keiro::{InstanceKey, Keiro, KeiroBuilder, Status};
use keiro_sqlite::{Config, SqliteStore};
use keiro_tests::step_ledger::{Executed, Job, StepLedger};
use keiro_tests::TestResult;

/// The workflow the worker binary registers.
const WORKFLOW: &str = "ledgered";
/// How long a test waits for its runs to complete (the machine may be loaded).
const DEADLINE: Duration = Duration::from_secs(120);
/// The worker binary's concurrency: how many runs a killed worker can have had in flight.
const WORKER_CONCURRENCY: usize = 8;

/// A directory of its own for one test's database file and ledger, removed however the test
/// ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "keiro-sqlite-processes-{test}-{}",
            uuid::Uuid::new_v4()
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    fn database(&self) -> PathBuf {
        self.0.join("keiro.db")
    }

    fn ledger(&self) -> PathBuf {
        self.0.join("ledger")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A worker process, SIGKILLed and reaped however the test ends.
struct Worker(Child);

impl Worker {
    fn spawn(scratch: &Scratch, lease_ttl: Duration) -> std::io::Result<Self> {
        let child = Command::new(env!("CARGO_BIN_EXE_keiro-test-sqlite-worker"))
            .arg(scratch.database())
            .arg(scratch.ledger())
            .arg(lease_ttl.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        Ok(Self(child))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// SIGKILL (what `Child::kill` sends on Unix), then reap, so the process is gone when this
    /// returns.
    fn kill(&mut self) -> std::io::Result<()> {
        self.0.kill()?;
        self.0.wait()?;
        Ok(())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn id(index: u64) -> String {
    format!("j-{index}")
}

fn step(n: u32) -> String {
    format!("step-{n}")
}

/// The store the test starts and reads through (a process of its own on the file) and the
/// handle over it. Opening it first also creates and migrates the file before any worker.
fn starter(scratch: &Scratch) -> Result<(SqliteStore, Keiro), keiro_sqlite::Error> {
    let store = SqliteStore::open(scratch.database(), Config::default())?;
    let keiro = KeiroBuilder::lease_only(Arc::new(store.clone()))
        .without_push()
        .build();
    Ok((store, keiro))
}

async fn completed(keiro: &Keiro, jobs: &[Job]) -> Result<usize, keiro::Error> {
    let mut done = 0;
    for job in jobs {
        let status = keiro
            .instance((WORKFLOW, &id(job.index)))
            .await?
            .map(|r| r.status);
        if status == Some(Status::Completed) {
            done += 1;
        }
    }
    Ok(done)
}

async fn until_all_completed(keiro: &Keiro, jobs: &[Job]) -> TestResult {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let done = completed(keiro, jobs).await?;
        if done == jobs.len() {
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "only {done}/{} completed within {DEADLINE:?}",
            jobs.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The step results `job`'s journal recorded, in step order, once the journal is checked to be
/// exactly the run's steps in order, each once, then its completion with the right output.
async fn journaled(
    store: &SqliteStore,
    job: &Job,
) -> Result<Vec<Executed>, Box<dyn std::error::Error + Send + Sync>> {
    let key = InstanceKey::parse(WORKFLOW, &id(job.index))?;
    let history = store.journal_history(&key).await?;
    let mut executed = Vec::new();
    let mut output = None;
    for entry in history {
        assert!(
            output.is_none(),
            "{key}: an entry after completion: {entry:?}"
        );
        match entry.event {
            Event::StepRecorded {
                step: name, result, ..
            } => {
                let n = u32::try_from(executed.len())?;
                assert_eq!(name, step(n), "{key}: steps journaled in order, each once");
                let result: Executed = serde_json::from_value(result)?;
                assert_eq!(result.value, job.value(n), "{key}: {name}'s value");
                executed.push(result);
            }
            Event::WorkflowCompleted { output: value } => output = Some(value),
            other => panic!("{key}: unexpected journal entry {other:?}"),
        }
    }
    assert_eq!(
        executed.len(),
        usize::try_from(job.steps)?,
        "{key}: every step journaled"
    );
    assert_eq!(
        output,
        Some(serde_json::json!(job.output())),
        "{key}: the output"
    );
    let instance = store.instance_get(&key).await?.ok_or("instance gone")?;
    assert_eq!(instance.status, Status::Completed, "{key}");
    assert_eq!(
        instance.output,
        Some(serde_json::json!(job.output())),
        "{key}: the output"
    );
    Ok(executed)
}

/// Every execution the ledger recorded, by `(id, step)`, as the executing pids in order;
/// checks first that none overlapped another execution of its instance.
fn executions(ledger: &StepLedger) -> std::io::Result<BTreeMap<(String, String), Vec<u32>>> {
    let mut by_step: BTreeMap<_, Vec<u32>> = BTreeMap::new();
    for execution in ledger.executions()? {
        assert!(
            !execution.overlapped,
            "two executions of {}'s steps at the same moment ({} of {} in process {})",
            execution.id, execution.step, execution.id, execution.pid
        );
        by_step
            .entry((execution.id, execution.step))
            .or_default()
            .push(execution.pid);
    }
    Ok(by_step)
}

fn ledger_in(scratch: &Scratch) -> std::io::Result<StepLedger> {
    StepLedger::open(scratch.ledger())
}

async fn start_all(keiro: &Keiro, jobs: &[Job], pause: Duration) -> TestResult {
    for job in jobs {
        let started = keiro.start(WORKFLOW, &id(job.index), job).await?;
        assert!(started.created);
        tokio::time::sleep(pause).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_process_leaves_its_runs_to_another_without_executing_a_journaled_step_again(
) -> TestResult {
    let scratch = Scratch::new("kill")?;
    let (store, keiro) = starter(&scratch)?;
    let ledger = ledger_in(&scratch)?;
    let (count, steps) = (40u64, 5u32);
    let jobs: Vec<Job> = (0..count).map(|index| Job { index, steps }).collect();
    start_all(&keiro, &jobs, Duration::ZERO).await?;
    let total = usize::try_from(count)? * usize::try_from(steps)?;

    // The first worker runs until a third of the steps have been executed, then is SIGKILLed.
    let began = Instant::now();
    let mut first = Worker::spawn(&scratch, Duration::from_secs(3))?;
    let killed = first.pid();
    let deadline = Instant::now() + DEADLINE;
    while ledger.executions()?.len() < total / 3 {
        assert!(
            Instant::now() < deadline,
            "the first worker made no progress"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill()?;
    let ran_before_kill = began.elapsed();
    let executed_at_kill = ledger.executions()?.len();
    let completed_at_kill = completed(&keiro, &jobs).await?;
    assert!(
        completed_at_kill < jobs.len(),
        "the kill came after every run completed: nothing left to prove"
    );

    // The second finishes every run, after the killed worker's leases expire.
    let second = Worker::spawn(&scratch, Duration::from_secs(3))?;
    let survivor = second.pid();
    let resumed = Instant::now();
    until_all_completed(&keiro, &jobs).await?;
    let recovery = resumed.elapsed();

    let by_step = executions(&ledger)?;
    let (mut by_killed, mut by_survivor, mut reexecuted) = (0, 0, 0);
    for job in &jobs {
        let journal = journaled(&store, job).await?;
        // The run moves from the killed worker to the survivor once: the killed worker's
        // journaled steps, then the survivor's.
        let handed_over = journal.iter().take_while(|e| e.pid == killed).count();
        for (n, executed) in (0u32..).zip(&journal) {
            let key = (id(job.index), step(n));
            let pids = by_step.get(&key).map(Vec::as_slice).unwrap_or_default();
            if executed.pid == killed {
                assert_eq!(
                    pids,
                    [killed],
                    "{key:?} was journaled by the killed worker: executed once, never again"
                );
                by_killed += 1;
            } else {
                assert_eq!(
                    executed.pid, survivor,
                    "{key:?}: journaled by one of the workers"
                );
                assert!(
                    usize::try_from(n)? >= handed_over,
                    "{key:?}: the killed worker journaled no step after the survivor's"
                );
                // The one step the killed worker may have been running, unjournaled, when it
                // was killed: executed again by the survivor (at least once, at most twice).
                if pids == [killed, survivor] {
                    assert_eq!(
                        usize::try_from(n)?,
                        handed_over,
                        "{key:?}: only the step after the killed worker's last journaled one may run twice"
                    );
                    reexecuted += 1;
                } else {
                    assert_eq!(pids, [survivor], "{key:?}: executed once, by the survivor");
                }
                by_survivor += 1;
            }
        }
    }
    assert_eq!(
        by_step.values().map(Vec::len).sum::<usize>(),
        total + reexecuted,
        "the ledger holds no execution the journal does not account for"
    );
    assert!(
        by_killed > 0,
        "the killed worker journaled steps before the kill"
    );
    assert!(by_survivor > 0, "the survivor journaled the rest");
    assert!(
        reexecuted <= WORKER_CONCURRENCY,
        "at most one step per run the killed worker had in flight was executed again"
    );
    eprintln!(
        "sqlite_processes kill: {count} instances x {steps} steps, 1 SIGKILL after {ran_before_kill:?} \
         ({executed_at_kill} executions, {completed_at_kill} completed); {by_killed} steps journaled \
         by the killed worker, {by_survivor} by the survivor, {reexecuted} executed twice; \
         recovery {recovery:?}"
    );
    drop(second);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_on_one_file_never_execute_an_instance_at_once() -> TestResult {
    let scratch = Scratch::new("contend")?;
    let (store, keiro) = starter(&scratch)?;
    let ledger = ledger_in(&scratch)?;
    let (count, steps) = (80u64, 4u32);
    let jobs: Vec<Job> = (0..count).map(|index| Job { index, steps }).collect();

    // Both workers contend for the file while this process starts the instances one by one
    // (three processes writing); leases long enough that none expires under load.
    let began = Instant::now();
    let workers = [
        Worker::spawn(&scratch, Duration::from_secs(10))?,
        Worker::spawn(&scratch, Duration::from_secs(10))?,
    ];
    start_all(&keiro, &jobs, Duration::from_millis(5)).await?;
    until_all_completed(&keiro, &jobs).await?;
    let elapsed = began.elapsed();

    let by_step = executions(&ledger)?;
    let mut pids = workers.each_ref().map(Worker::pid);
    pids.sort_unstable();
    let mut journaled_by = BTreeMap::<u32, usize>::new();
    for job in &jobs {
        for (n, executed) in (0u32..).zip(journaled(&store, job).await?) {
            let key = (id(job.index), step(n));
            assert_eq!(
                by_step.get(&key).map(Vec::as_slice).unwrap_or_default(),
                [executed.pid],
                "{key:?}: executed once, by the process whose result was journaled"
            );
            *journaled_by.entry(executed.pid).or_default() += 1;
        }
    }
    let total = usize::try_from(count)? * usize::try_from(steps)?;
    assert_eq!(
        by_step.values().map(Vec::len).sum::<usize>(),
        total,
        "no crash, so no step executed again"
    );
    assert_eq!(
        journaled_by.keys().copied().collect::<Vec<_>>(),
        pids,
        "both worker processes took part"
    );
    eprintln!(
        "sqlite_processes contend: {count} instances x {steps} steps started while 2 workers ran, \
         all completed in {elapsed:?}; steps journaled per worker {journaled_by:?}"
    );
    Ok(())
}
