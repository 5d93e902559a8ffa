//! The chaos command's fleet of child processes: spawning, killing, respawning and stopping
//! them, and never leaving one behind.
//!
//! Every child is killed (SIGKILL) and reaped when its handle is dropped, so an error or an
//! interrupt that unwinds the chaos command takes the fleet with it; a chaos command killed
//! outright closes the children's stdin, on which they stop by themselves.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::child::READY;
use super::faults::Rng;
use super::{ChaosArgs, Profile, QUEUE};
use crate::common::{Global, Result, ResultExt};

/// How long a child that exited before it was ready (PostgreSQL down while it connected) waits
/// before it is spawned again, so an outage does not turn into a spawn loop.
const RESPAWN_BACKOFF: Duration = Duration::from_millis(250);

/// How often a stopping child is checked for exit.
const EXIT_POLL: Duration = Duration::from_millis(20);

/// What a child process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A resume worker (`keiro chaos-worker`).
    Worker,
    /// A remote worker (`keiro chaos-remote-worker`).
    Remote,
    /// Direct callers (`keiro chaos-direct`).
    Direct,
}

/// How to spawn children: the binary, the environment and each role's arguments.
#[derive(Debug, Clone)]
pub(crate) struct SpawnSpec {
    database_url: String,
    schema: String,
    worker_args: Vec<String>,
    remote_args: Vec<String>,
    direct_args: Vec<String>,
}

impl SpawnSpec {
    /// The children of `keiro chaos` with `args`: under `--profile queue` the workers serve
    /// the queue, and the workers and direct callers stamp their local steps' ends.
    pub(crate) fn new(global: &Global, args: &ChaosArgs) -> Self {
        let mut spec = Self {
            database_url: global.url().to_owned(),
            schema: global.schema.clone(),
            worker_args: vec![
                "chaos-worker".into(),
                "--chaos-schema".into(),
                args.chaos_schema.clone(),
                "--lease-ttl-ms".into(),
                args.lease_ttl_ms.to_string(),
                "--poll-interval-ms".into(),
                args.poll_interval_ms.to_string(),
                "--concurrency".into(),
                args.concurrency.to_string(),
            ],
            remote_args: vec![
                "chaos-remote-worker".into(),
                "--chaos-schema".into(),
                args.chaos_schema.clone(),
                "--claim-ttl-ms".into(),
                args.claim_ttl_ms.to_string(),
                "--concurrency".into(),
                args.concurrency.to_string(),
            ],
            direct_args: vec![
                "chaos-direct".into(),
                "--chaos-schema".into(),
                args.chaos_schema.clone(),
                "--lease-ttl-ms".into(),
                args.lease_ttl_ms.to_string(),
                "--instances".into(),
                args.instances.to_string(),
                "--concurrency".into(),
                args.concurrency.to_string(),
            ],
        };
        if args.profile == Profile::Queue {
            spec.worker_args
                .extend(["--queue".to_owned(), QUEUE.to_owned()]);
            spec.direct_args.push("--witness-ends".into());
        }
        spec
    }

    fn spawn(&self, role: Role) -> Result<Process> {
        let exe = std::env::current_exe().context("locating the keiro binary")?;
        let args = match role {
            Role::Worker => &self.worker_args,
            Role::Remote => &self.remote_args,
            Role::Direct => &self.direct_args,
        };
        let mut command = Command::new(exe);
        // Through the environment rather than argv, so a password in the URL does not show in
        // the process list.
        command
            .env("DATABASE_URL", &self.database_url)
            .env("KEIRO_SCHEMA", &self.schema);
        // Every restart makes every child log its lost connections: expected here, so they log
        // only when asked to (RUST_LOG set). A panic still reaches stderr.
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "off");
        }
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning a chaos child process")?;
        let stdin = child.stdin.take();
        let ready = Arc::new(AtomicBool::new(false));
        if let Some(stdout) = child.stdout.take() {
            let ready = Arc::clone(&ready);
            // A plain thread: the pipe blocks, and it ends when the child does.
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    match line {
                        Ok(line) if line.trim() == READY => ready.store(true, Ordering::Relaxed),
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            });
        }
        Ok(Process {
            child,
            stdin,
            ready,
            reaped: false,
        })
    }
}

/// A running child.
struct Process {
    child: Child,
    /// Held open for the child's whole life: closing it asks the child to stop.
    stdin: Option<ChildStdin>,
    ready: Arc<AtomicBool>,
    reaped: bool,
}

impl Process {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn exited(&mut self) -> Result<Option<ExitStatus>> {
        let status = self
            .child
            .try_wait()
            .context("checking a chaos child process")?;
        self.reaped |= status.is_some();
        Ok(status)
    }

    /// SIGKILL (what `Child::kill` sends on Unix), then reaps: when this returns the process is
    /// gone and can send nothing more to the database.
    fn kill(&mut self) -> Result<()> {
        if !self.reaped {
            self.child.kill().context("killing a chaos child process")?;
            self.child.wait().context("reaping a chaos child process")?;
            self.reaped = true;
        }
        Ok(())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.reaped {
            // Best effort on the way out: the child may have exited meanwhile.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One place in the fleet: a role, and the process filling it (none while it waits to be
/// respawned).
struct Slot {
    role: Role,
    process: Option<Process>,
    respawn_at: Option<Instant>,
}

/// What happened to the fleet, for the report.
#[derive(Debug, Clone, Default)]
pub(crate) struct FleetStats {
    /// Processes spawned, the first ones included.
    pub(crate) spawned: u64,
    /// SIGKILLs sent.
    pub(crate) kills: u64,
    /// Of them, per role (`worker`, `remote`, `direct`).
    pub(crate) kills_by_role: BTreeMap<String, u64>,
    /// Children that exited on their own before they were ready (PostgreSQL down while they
    /// connected); they are spawned again.
    pub(crate) startup_failures: u64,
    /// Children that exited on their own after they were ready: a worker that did not survive
    /// what it met. Each is a problem.
    pub(crate) unexpected_exits: Vec<String>,
}

/// The chaos command's children.
pub(crate) struct Fleet {
    spec: SpawnSpec,
    slots: Vec<Slot>,
    stats: FleetStats,
}

impl Fleet {
    /// Spawns `workers` resume workers, `remotes` remote workers and `direct` direct caller
    /// processes.
    pub(crate) fn start(
        spec: SpawnSpec,
        workers: usize,
        remotes: usize,
        direct: usize,
    ) -> Result<Self> {
        let roles = std::iter::repeat_n(Role::Worker, workers)
            .chain(std::iter::repeat_n(Role::Remote, remotes))
            .chain(std::iter::repeat_n(Role::Direct, direct));
        let mut fleet = Self {
            spec,
            slots: roles
                .map(|role| Slot {
                    role,
                    process: None,
                    respawn_at: None,
                })
                .collect(),
            stats: FleetStats::default(),
        };
        for index in 0..fleet.slots.len() {
            fleet.respawn(index)?;
        }
        Ok(fleet)
    }

    fn respawn(&mut self, index: usize) -> Result<()> {
        let slot = &mut self.slots[index];
        slot.process = Some(self.spec.spawn(slot.role)?);
        slot.respawn_at = None;
        self.stats.spawned += 1;
        Ok(())
    }

    /// Reaps children that exited on their own and spawns the ones whose wait is over.
    pub(crate) fn supervise(&mut self) -> Result<()> {
        let now = Instant::now();
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            if let Some(process) = slot.process.as_mut() {
                if let Some(status) = process.exited()? {
                    if process.ready.load(Ordering::Relaxed) {
                        self.stats.unexpected_exits.push(format!(
                            "{:?} process {} exited on its own ({status}) after it was ready",
                            slot.role,
                            process.pid()
                        ));
                    } else {
                        self.stats.startup_failures += 1;
                    }
                    slot.process = None;
                    slot.respawn_at = Some(now + RESPAWN_BACKOFF);
                }
            }
            let due = slot.process.is_none() && slot.respawn_at.is_none_or(|at| at <= now);
            if due {
                self.respawn(index)?;
            }
        }
        Ok(())
    }

    /// Kills one running child chosen at random with SIGKILL and spawns its replacement at
    /// once. Returns the killed process id, if any child was running.
    pub(crate) fn kill_random(&mut self, rng: &mut Rng) -> Result<Option<u32>> {
        let running: Vec<usize> = (0..self.slots.len())
            .filter(|index| self.slots[*index].process.is_some())
            .collect();
        if running.is_empty() {
            return Ok(None);
        }
        let index = running[rng.below(running.len())];
        let Some(mut process) = self.slots[index].process.take() else {
            return Ok(None);
        };
        let pid = process.pid();
        process.kill()?;
        self.stats.kills += 1;
        let role = format!("{:?}", self.slots[index].role).to_lowercase();
        *self.stats.kills_by_role.entry(role).or_default() += 1;
        self.respawn(index)?;
        Ok(Some(pid))
    }

    /// Asks every child to stop (closes its stdin), waits up to `grace` for them to finish their
    /// in-flight work, and kills whatever is left. Returns what happened to the fleet.
    pub(crate) async fn stop(mut self, grace: Duration) -> FleetStats {
        for slot in &mut self.slots {
            if let Some(process) = slot.process.as_mut() {
                drop(process.stdin.take());
            }
        }
        let deadline = Instant::now() + grace;
        loop {
            let mut running = false;
            for slot in &mut self.slots {
                if let Some(process) = slot.process.as_mut() {
                    running |= !matches!(process.exited(), Ok(Some(_)) | Err(_));
                }
            }
            if !running || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
        for slot in &mut self.slots {
            if let Some(process) = slot.process.as_mut() {
                let _ = process.kill();
            }
        }
        std::mem::take(&mut self.stats)
    }
}
