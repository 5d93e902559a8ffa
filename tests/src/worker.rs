//! A worker loop running in a task of its own for the length of a test.

use std::time::Duration;

use keiro::{worker::ResumeSummary, Worker};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long [`RunningWorker::stop`] waits for the loop's graceful shutdown.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A worker's loop (`run_until`) spawned on the test's runtime; [`stop`](Self::stop) ends it.
/// Dropped without `stop`, the loop goes on until the runtime ends with the test.
#[derive(Debug)]
pub struct RunningWorker {
    stop: oneshot::Sender<()>,
    task: JoinHandle<ResumeSummary>,
}

/// Spawns `worker`'s loop until [`RunningWorker::stop`].
pub fn spawn_worker(worker: Worker) -> RunningWorker {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    RunningWorker { stop, task }
}

impl RunningWorker {
    /// Kills the loop as a crash would: its task is aborted, with whatever runs it was driving
    /// (their leases stay held until they expire or an operator releases them).
    pub fn kill(self) {
        self.task.abort();
    }

    /// Shuts the loop down gracefully (runs in flight finish) and returns the sum of its passes.
    ///
    /// # Errors
    ///
    /// When the loop takes longer than five seconds to stop, or its task panicked.
    pub async fn stop(self) -> Result<ResumeSummary, Box<dyn std::error::Error + Send + Sync>> {
        let _ = self.stop.send(());
        Ok(tokio::time::timeout(STOP_TIMEOUT, self.task).await??)
    }
}
