//! What wakes a worker loop between passes.

use std::time::Duration;

/// Why a loop woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeReason {
    /// A notification said something became runnable.
    Notified,
    /// The fallback interval elapsed.
    Timeout,
    /// The wake source was re-established after a loss; notifications may have been missed, so
    /// the loop should poll at once.
    Reconnected,
}

/// A source of wake-ups. The fixed-poll loop uses [`FixedPoll`]; stores with push
/// notifications provide their own.
#[async_trait::async_trait]
pub trait WakeSource: Send {
    /// Waits until something may be runnable, or at most `fallback`.
    async fn wait(&mut self, fallback: Duration) -> WakeReason;
}

/// Never notified: every wait lasts the full fallback (the fixed-poll loop).
#[derive(Debug, Clone, Copy, Default)]
pub struct FixedPoll;

#[async_trait::async_trait]
impl WakeSource for FixedPoll {
    async fn wait(&mut self, fallback: Duration) -> WakeReason {
        tokio::time::sleep(fallback).await;
        WakeReason::Timeout
    }
}

/// Which notifications a subscription wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeFilter {
    /// An instance became runnable (start, wake, continue-as-new, resurrect, spawn).
    Instances,
    /// A timer was armed, so the next due time may be earlier.
    Timers,
    /// A remote task became claimable (dispatched, redispatched or requeued), for remote
    /// workers.
    RemoteTasks,
}

/// A store that can push wake-ups: one listener per store, fanned out to every subscription.
pub trait Notifier: Send + Sync {
    /// A new subscription; each sees every matching notification sent after it was created.
    fn subscribe(&self, filter: WakeFilter) -> Box<dyn WakeSource>;

    /// A subscription that wakes when instance `key` reaches a terminal status (completed,
    /// failed, cancelled) after this call, or when notifications may have been missed; for
    /// callers awaiting a result. The default never wakes early (a fixed poll): stores that
    /// notify terminal transitions override it, with one [`ClosedWaiters`](crate::ClosedWaiters)
    /// registry each, so waiters share the store's one listener.
    fn subscribe_closed(&self, key: &keiro_journal::InstanceKey) -> Box<dyn WakeSource> {
        let _ = key;
        Box::new(FixedPoll)
    }
}

#[async_trait::async_trait]
impl WakeSource for Box<dyn WakeSource> {
    async fn wait(&mut self, fallback: Duration) -> WakeReason {
        self.as_mut().wait(fallback).await
    }
}
