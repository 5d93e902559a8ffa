//! The retention loop: deletes expired terminal instances in bounded batches at a bounded
//! rate, beside a worker's resume loop.
//!
//! Each sweep runs batches (one short transaction each, see keiro-journal's `retention`
//! module for what may go) until a batch finds fewer rows than it asked for, another collector
//! holds the retention lock, or the sweep has run `batches_per_sweep` batches; it sleeps
//! `pause` between batches, so deletion never takes more than `batch / pause` instances a
//! second from the database. Then it waits `interval` (plus up to 20% jitter) for the next
//! sweep. A failing batch is logged and the sweep ends; the next one tries again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keiro_journal::{GcBatch, GcRequest, RetentionStore, StoreError};

/// Gap between two sweeps. Defaults to 60 s.
pub const RETENTION_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);
/// Instances per batch of the loop. Defaults to 100: with [`RETENTION_PAUSE_DEFAULT`], at most
/// 200 instances a second (720,000 an hour), a rate a running workload hardly notices
/// (`keiro bench --mode gc`; figures in BENCHMARKS.md and docs/benchmarks-history.md).
pub const RETENTION_BATCH_DEFAULT: u32 = 100;
/// Gap between two batches of one sweep. Defaults to 500 ms.
pub const RETENTION_PAUSE_DEFAULT: Duration = Duration::from_millis(500);
/// The most batches one sweep runs (about 8 minutes at the default pause). Defaults to 1000.
pub const RETENTION_BATCHES_PER_SWEEP_DEFAULT: u32 = 1000;

/// How a retention loop collects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionOptions {
    /// Delete instances terminal for longer than this.
    pub older_than: Duration,
    /// Instances per batch (one transaction). Defaults to [`RETENTION_BATCH_DEFAULT`].
    pub batch: u32,
    /// Gap between two batches of one sweep: the rate bound. Defaults to
    /// [`RETENTION_PAUSE_DEFAULT`].
    pub pause: Duration,
    /// The most batches one sweep runs. Defaults to [`RETENTION_BATCHES_PER_SWEEP_DEFAULT`].
    pub batches_per_sweep: u32,
    /// Gap between sweeps. Defaults to [`RETENTION_INTERVAL_DEFAULT`].
    pub interval: Duration,
}

impl RetentionOptions {
    /// Default batching for a window of `older_than`.
    ///
    /// ```
    /// use std::time::Duration;
    /// let options = keiro_resume::RetentionOptions::new(Duration::from_secs(30 * 86_400));
    /// assert_eq!(options.batch, keiro_resume::RETENTION_BATCH_DEFAULT);
    /// ```
    pub fn new(older_than: Duration) -> Self {
        Self {
            older_than,
            batch: RETENTION_BATCH_DEFAULT,
            pause: RETENTION_PAUSE_DEFAULT,
            batches_per_sweep: RETENTION_BATCHES_PER_SWEEP_DEFAULT,
            interval: RETENTION_INTERVAL_DEFAULT,
        }
    }
}

/// One sweep: batches until the expired rows are gone, another collector holds the lock, or
/// `max_batches` ran, `pause` apart. Returns what was deleted.
///
/// # Errors
///
/// The first failing batch's store error (the batches before it stay deleted).
pub async fn collect(
    store: &dyn RetentionStore,
    request: &GcRequest,
    max_batches: u32,
    pause: Duration,
) -> Result<GcBatch, StoreError> {
    let mut total = GcBatch::default();
    for n in 0..max_batches {
        if n > 0 && !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let batch = store.instances_gc(request).await?;
        total += batch;
        if batch.locked_out || batch.instances < u64::from(request.batch_bounded()) {
            break;
        }
    }
    Ok(total)
}

/// Runs sweeps until `shutdown` resolves; returns everything deleted. A batch in flight when
/// shutdown comes is abandoned (its transaction rolls back), which loses nothing.
pub async fn run_retention_loop(
    store: Arc<dyn RetentionStore>,
    options: RetentionOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> GcBatch {
    let mut total = GcBatch::default();
    let mut shutdown = std::pin::pin!(shutdown);
    let request = GcRequest {
        older_than: options.older_than,
        batch: options.batch,
        now: None,
    };
    loop {
        let sweep = collect(
            store.as_ref(),
            &request,
            options.batches_per_sweep.max(1),
            options.pause,
        );
        tokio::select! {
            biased;
            () = &mut shutdown => return total,
            result = sweep => match result {
                Ok(deleted) => {
                    if deleted.instances > 0 {
                        tracing::info!(
                            instances = deleted.instances,
                            rows = deleted.rows(),
                            "retention deleted expired instances"
                        );
                    }
                    total += deleted;
                }
                Err(error) => tracing::warn!(error = %error, "retention batch failed"),
            },
        }
        tokio::select! {
            biased;
            () = &mut shutdown => return total,
            () = tokio::time::sleep(keiro_journal::store::stretched(options.interval)) => {}
        }
    }
}
