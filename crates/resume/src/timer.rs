//! The timer worker: fires due durable timers (sleeps, signal-wait timeouts).
//!
//! Firing a timer journals its step into the owner and flips the owner's row in one
//! transaction (the store's `timers_fire_due`), claiming timers with `FOR UPDATE SKIP LOCKED`
//! so several workers never fire the same one. Between batches the loop sleeps until the next
//! due time the store reported, or until a timer is armed (push), or at most `idle_fallback`:
//! an idle worker with no timers makes one query per `idle_fallback`.
//!
//! The wait is measured on the store's clock: the next due time minus the store's clock of the
//! same batch ([`TimerFiring::clock`]), never minus this process's clock, so a worker whose clock
//! is ahead of the database's does not wake early and poll until the database catches up, and
//! one behind does not oversleep. A batch that was not full is followed by at least
//! `min_wait`: a due timer this worker could not fire is held by another worker's open batch
//! (`SKIP LOCKED`), and polling for it in a loop would only load the database.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keiro_journal::{StoreError, TimerFiring};
use keiro_lease::LeaseStore;
use time::OffsetDateTime;

use crate::wake::{WakeReason, WakeSource};
use keiro_journal::error_chain;

/// The default number of timers fired per store call.
pub const TIMER_BATCH_SIZE_DEFAULT: i64 = 100;
/// The default longest sleep of an idle push-woken timer loop: a safety net, since arming a
/// timer notifies (a polling loop uses its poll interval instead).
pub const TIMER_IDLE_FALLBACK_DEFAULT: Duration = Duration::from_secs(300);
/// The default age after which a timer stuck in `firing` is requeued (the seed's 300 s).
pub const TIMER_REQUEUE_STUCK_AFTER_DEFAULT: Duration = Duration::from_secs(300);
/// The default shortest gap between two batches of a timer loop, unless the first was full.
pub const TIMER_MIN_WAIT_DEFAULT: Duration = Duration::from_millis(50);

/// How the timer worker runs.
#[derive(Debug, Clone)]
pub struct TimerOptions {
    /// Timers fired per store call. Defaults to [`TIMER_BATCH_SIZE_DEFAULT`].
    pub batch_size: i64,
    /// The longest wait when no timer is due. Defaults to [`TIMER_IDLE_FALLBACK_DEFAULT`].
    pub idle_fallback: Duration,
    /// Requeue timers stuck in `firing` this long. Defaults to
    /// [`TIMER_REQUEUE_STUCK_AFTER_DEFAULT`].
    pub requeue_stuck_after: Duration,
    /// Metrics; `None` records nothing. Defaults to `None`.
    pub metrics: Option<keiro_telemetry::Metrics>,
    /// The shortest gap between the start of a batch that was not full and the start of the
    /// next, whatever wakes the loop: a timer due meanwhile fires up to this late, and a timer
    /// held by another worker's open batch costs at most one query per `min_wait`. Defaults to
    /// [`TIMER_MIN_WAIT_DEFAULT`].
    pub min_wait: Duration,
}

impl Default for TimerOptions {
    fn default() -> Self {
        Self {
            batch_size: TIMER_BATCH_SIZE_DEFAULT,
            idle_fallback: TIMER_IDLE_FALLBACK_DEFAULT,
            requeue_stuck_after: TIMER_REQUEUE_STUCK_AFTER_DEFAULT,
            metrics: None,
            min_wait: TIMER_MIN_WAIT_DEFAULT,
        }
    }
}

/// What the timer worker did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimerSummary {
    /// Timers fired.
    pub fired: u64,
    /// Of those, how many journaled their step (the rest found it journaled, or the owner gone).
    pub delivered: u64,
    /// Stuck timers requeued.
    pub requeued: u64,
}

impl std::ops::AddAssign for TimerSummary {
    fn add_assign(&mut self, other: Self) {
        self.fired += other.fired;
        self.delivered += other.delivered;
        self.requeued += other.requeued;
    }
}

/// Fires one batch of due timers and records its metrics: the lag of each fired timer, and
/// the backlog when a sample of it is due ([`keiro_telemetry::Metrics::sample_due`]).
///
/// # Errors
///
/// The store's error.
pub async fn fire_due_once(
    store: &Arc<dyn LeaseStore>,
    options: &TimerOptions,
) -> Result<TimerFiring, StoreError> {
    let firing = store.timers_fire_due(None, options.batch_size).await?;
    if let Some(metrics) = &options.metrics {
        for timer in &firing.fired {
            let lag = timer.fired_at - timer.fire_at;
            metrics.timer_fire_lag(lag.try_into().unwrap_or(Duration::ZERO));
        }
        // A count of the due timers, so paced by the metrics handle rather than run per batch:
        // a large backlog must not make every batch dearer.
        if metrics.sample_due(keiro_telemetry::SampledGauge::TimerBacklog) {
            if let Ok(backlog) = store.timers_due_count(None).await {
                metrics.timer_backlog(backlog);
            }
        }
    }
    Ok(firing)
}

/// Runs the timer worker until `shutdown` resolves.
pub async fn run_timer_loop<W: WakeSource>(
    store: Arc<dyn LeaseStore>,
    options: TimerOptions,
    mut wake: W,
    shutdown: impl Future<Output = ()> + Send,
) -> TimerSummary {
    let mut total = TimerSummary::default();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut last_requeue = tokio::time::Instant::now();
    loop {
        let started = tokio::time::Instant::now();
        let wait = match fire_due_once(&store, &options).await {
            Ok(firing) => {
                let fired = u64::try_from(firing.fired.len()).unwrap_or(u64::MAX);
                total.fired += fired;
                total.delivered +=
                    u64::try_from(firing.fired.iter().filter(|t| t.delivered).count()).unwrap_or(0);
                if i64::try_from(firing.fired.len()).unwrap_or(i64::MAX) >= options.batch_size {
                    Duration::ZERO // a full batch: there may be more due right now
                } else {
                    until(firing.next_due, firing.clock, options.idle_fallback)
                        .max(options.min_wait)
                }
            }
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "timer pass failed; retrying after the fallback");
                options
                    .idle_fallback
                    .min(Duration::from_secs(1))
                    .max(options.min_wait)
            }
        };
        if last_requeue.elapsed() >= options.requeue_stuck_after {
            last_requeue = tokio::time::Instant::now();
            match store
                .timers_requeue_stuck(options.requeue_stuck_after)
                .await
            {
                Ok(n) => total.requeued += n,
                Err(error) => {
                    tracing::warn!(error = %error_chain(&error), "requeueing stuck timers failed")
                }
            }
        }
        if wait.is_zero() {
            continue;
        }
        tokio::select! {
            biased;
            () = &mut shutdown => return total,
            reason = wake.wait(wait) => {
                if reason == WakeReason::Reconnected {
                    tracing::debug!("timer wake source reconnected; firing soon");
                }
            }
        }
        // A wake-up (an arm, a reconnect) may come sooner; the next batch still waits for
        // `min_wait`, so a stream of arms costs at most one batch per `min_wait`.
        tokio::select! {
            biased;
            () = &mut shutdown => return total,
            () = tokio::time::sleep_until(started + options.min_wait) => {}
        }
    }
}

/// How long to wait for `next_due`, at most `fallback`: both instants are the store's, so the
/// caller's clock, however skewed, plays no part.
fn until(next_due: Option<OffsetDateTime>, clock: OffsetDateTime, fallback: Duration) -> Duration {
    match next_due {
        Some(at) => Duration::try_from(at - clock)
            .unwrap_or(Duration::ZERO)
            .min(fallback),
        None => fallback,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_the_next_due_timer_at_most_the_fallback() {
        let fallback = Duration::from_secs(60);
        let clock = OffsetDateTime::UNIX_EPOCH;
        assert_eq!(until(None, clock, fallback), fallback);
        let past = clock - time::Duration::seconds(5);
        assert_eq!(until(Some(past), clock, fallback), Duration::ZERO);
        let soon = clock + time::Duration::seconds(2);
        assert_eq!(until(Some(soon), clock, fallback), Duration::from_secs(2));
        let far = clock + time::Duration::hours(5);
        assert_eq!(until(Some(far), clock, fallback), fallback);
    }
}
