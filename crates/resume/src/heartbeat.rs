//! The worker heartbeat: a row per running worker (`keiro_lease::versions::VersionStore`),
//! refreshed every interval and deleted when the worker stops, so operators see which
//! versions have live workers. Each beat also deletes the rows of workers not seen for
//! `FORGET_AFTER_DEFAULT` (killed ones, which never delete their own). A failed beat is logged and tried again at the next interval:
//! a missed beat costs the row's freshness, never the worker's work.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keiro_lease::versions::{VersionStore, WorkerBeat, FORGET_AFTER_DEFAULT};

/// Writes `beat` every `interval` until `shutdown` resolves, then deletes its row.
pub async fn run_heartbeat(
    store: Arc<dyn VersionStore>,
    beat: WorkerBeat,
    interval: Duration,
    shutdown: impl Future<Output = ()> + Send,
) {
    tokio::pin!(shutdown);
    loop {
        if let Err(error) = store.worker_beat(&beat).await {
            tracing::warn!(worker = %beat.worker_id, %error, "keiro worker heartbeat failed");
        }
        // A killed worker never deletes its row: the live ones forget it after a while.
        if let Err(error) = store.workers_forget(FORGET_AFTER_DEFAULT).await {
            tracing::warn!(worker = %beat.worker_id, %error, "keiro worker heartbeats not pruned");
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(interval) => {}
        }
    }
    if let Err(error) = store.worker_leave(&beat.worker_id).await {
        tracing::warn!(worker = %beat.worker_id, %error, "keiro worker heartbeat not removed");
    }
}
