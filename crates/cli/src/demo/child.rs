//! The demo's worker processes, as children that never outlive the demo.
//!
//! Two safety nets: [`WorkerProcess`] kills and reaps its child when dropped (every exit path
//! of the demo, errors and panics included), and the child itself exits when its stdin pipe
//! closes, which also covers the demo being killed outright.

use std::io::Read;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::worker::WorkerReport;
use super::DemoArgs;
use crate::common::{failure, Global, Result, ResultExt};

/// How often a stopping child is checked for exit.
const EXIT_POLL: Duration = Duration::from_millis(20);

/// A running `keiro demo-worker` child.
pub(crate) struct WorkerProcess {
    child: Child,
    /// Held open for the child's whole life: closing it asks the child to stop.
    stdin: Option<ChildStdin>,
    reaped: bool,
}

impl WorkerProcess {
    /// Spawns this same binary as a demo worker on the demo's schema.
    pub(crate) fn spawn(global: &Global, args: &DemoArgs) -> Result<Self> {
        let exe = std::env::current_exe().context("locating the keiro binary")?;
        let mut child = Command::new(exe)
            // Through the environment rather than argv, so a password in the URL does not show
            // in the process list.
            .env("DATABASE_URL", global.url())
            .env("KEIRO_SCHEMA", &global.schema)
            .arg("demo-worker")
            .arg("--demo-schema")
            .arg(&args.demo_schema)
            .arg("--lease-ttl-ms")
            .arg(args.lease_ttl_ms.to_string())
            .arg("--poll-interval-ms")
            .arg(args.poll_interval_ms.to_string())
            .arg("--concurrency")
            .arg(args.concurrency.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // The worker's logs go where ours go.
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning a demo worker process")?;
        let stdin = child.stdin.take();
        Ok(Self {
            child,
            stdin,
            reaped: false,
        })
    }

    /// The child's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the child has exited on its own.
    pub(crate) fn exited(&mut self) -> Result<Option<ExitStatus>> {
        let status = self
            .child
            .try_wait()
            .context("checking a demo worker process")?;
        self.reaped |= status.is_some();
        Ok(status)
    }

    /// Kills the child with SIGKILL (what `Child::kill` sends on Unix) and reaps it: when this
    /// returns the process is gone and can send nothing more to the database.
    pub(crate) fn kill(&mut self) -> Result<()> {
        self.child.kill().context("killing a demo worker process")?;
        self.child.wait().context("reaping a demo worker process")?;
        self.reaped = true;
        Ok(())
    }

    /// Asks the child to stop (closes its stdin), waits up to `grace` for it to finish its
    /// in-flight runs and exit, and returns its report. Kills it if the grace runs out.
    pub(crate) async fn stop(mut self, grace: Duration) -> Result<WorkerReport> {
        drop(self.stdin.take());
        let deadline = Instant::now() + grace;
        let status = loop {
            if let Some(status) = self.exited()? {
                break status;
            }
            if Instant::now() >= deadline {
                self.kill()?;
                return Err(failure(format!(
                    "demo worker {} did not stop within {grace:?} of being asked to; killed it",
                    self.pid()
                )));
            }
            tokio::time::sleep(EXIT_POLL).await;
        };
        let mut stdout = String::new();
        if let Some(mut pipe) = self.child.stdout.take() {
            pipe.read_to_string(&mut stdout)
                .context("reading a demo worker's report")?;
        }
        if !status.success() {
            return Err(failure(format!(
                "demo worker {} exited with {status}",
                self.pid()
            )));
        }
        let line = stdout
            .lines()
            .last()
            .ok_or_else(|| failure(format!("demo worker {} printed no report", self.pid())))?;
        serde_json::from_str(line)
            .context(format!("reading the report of demo worker {}", self.pid()))
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if !self.reaped {
            // Best effort on the way out: the child may have exited meanwhile.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
