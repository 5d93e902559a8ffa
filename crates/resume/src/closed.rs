//! Waiting for one instance to close: the registry a store's notifier wakes when an instance
//! reaches a terminal status, for callers awaiting a result.
//!
//! A resume loop wants every wake-up; a caller awaiting `order/order-42` wants only that one.
//! Fanning each terminal notification out to every waiter would wake all of them for each
//! instance that closes, and each would re-read its row: with hundreds of waiters that is a
//! storm of reads. So waiters register under their instance key, and a notification wakes only
//! the waiters of its key, in O(waiters of that key). One registry per store, fed by the
//! store's one listener (Postgres) or its operations (memory): however many callers wait, the
//! store keeps one `LISTEN` connection.
//!
//! A notification is an optimisation over the waiter's fallback poll, never the only way it
//! learns the outcome: a notification lost (the listener was reconnecting) costs latency, and
//! a reconnection wakes every waiter once, since what was sent meanwhile is unknown.
//!
//! The fallback reads are spread: however many waiters a registry holds, together they read
//! about [`CLOSED_FALLBACK_READS_PER_S`] times a second, since each waiter's caller reads at
//! a fallback of at least `waiters / CLOSED_FALLBACK_READS_PER_S` seconds
//! ([`WakeSource::fallback_floor`]; a store's own short waits before it marks an instance are
//! its business and are not stretched). Ten waiters keep the caller's
//! fallback; ten thousand each read once every 100 s instead of once a second, which would be
//! ten thousand reads a second of instances that have not closed. What that costs is only the
//! latency of a notification lost without a reconnection, which the listener does not lose.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keiro_journal::InstanceKey;
use tokio::sync::Notify;

use crate::{ClosedOutcome, WakeReason, WakeSource};

/// The waiters of a store, by the instance they wait on. Cheap to clone (clones share it).
///
/// ```
/// use std::time::Duration;
/// use keiro_journal::InstanceKey;
/// use keiro_resume::{ClosedWaiters, WakeReason, WakeSource};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keiro_journal::IdError> {
/// let waiters = ClosedWaiters::default();
/// let key = InstanceKey::parse("order", "order-42")?;
/// let mut wait = waiters.subscribe(&key);
/// waiters.closed(&key); // the store saw the instance close
/// assert_eq!(wait.wait(Duration::from_secs(30)).await, WakeReason::Notified);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct ClosedWaiters {
    inner: Arc<Mutex<Registry>>,
}

/// How many fallback reads a second the waiters of one registry make together, at most (about:
/// each waiter's own fallback is stretched to `waiters / this`, never shortened): 100.
pub const CLOSED_FALLBACK_READS_PER_S: u32 = 100;

#[derive(Debug, Default)]
struct Registry {
    next_id: u64,
    /// Waiters over every key (the sum of `by_key`'s lists, kept so a wait need not add it up).
    count: usize,
    by_key: HashMap<InstanceKey, Vec<(u64, Arc<Waiter>)>>,
}

/// What a waiter is woken with: the permit, and the outcome when the close was seen in this
/// process ([`ClosedWaiters::closed_with`]).
#[derive(Debug, Default)]
struct Waiter {
    notify: Notify,
    outcome: Mutex<Option<ClosedOutcome>>,
}

impl ClosedWaiters {
    /// Registers a waiter on `key`: its [`wait`](WakeSource::wait) returns
    /// [`WakeReason::Notified`] once [`closed`](Self::closed) names `key` (or
    /// [`reconnected`](Self::reconnected) is called) after this call, even when that happens
    /// before the wait starts. Dropping the returned source unregisters it.
    pub fn subscribe(&self, key: &InstanceKey) -> ClosedWait {
        let waiter = Arc::new(Waiter::default());
        let mut registry = self.lock();
        registry.next_id += 1;
        registry.count += 1;
        let id = registry.next_id;
        registry
            .by_key
            .entry(key.clone())
            .or_default()
            .push((id, waiter.clone()));
        ClosedWait {
            waiters: self.clone(),
            key: key.clone(),
            id,
            waiter,
        }
    }

    /// Wakes the waiters of `key`: the instance reached a terminal status.
    pub fn closed(&self, key: &InstanceKey) {
        if let Some(waiters) = self.lock().by_key.get(key) {
            for (_, waiter) in waiters {
                // Stores a permit when the waiter is between waits, so nothing is missed.
                waiter.notify.notify_one();
            }
        }
    }

    /// Wakes the waiters of `key` with how it closed, which this process committed: each
    /// waiter's [`ClosedWait::outcome`] answers it, so the waiter need not read the row.
    pub fn closed_with(&self, key: &InstanceKey, outcome: &ClosedOutcome) {
        if let Some(waiters) = self.lock().by_key.get(key) {
            for (_, waiter) in waiters {
                *waiter
                    .outcome
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(outcome.clone());
                waiter.notify.notify_one();
            }
        }
    }

    /// Wakes every waiter: notifications may have been missed (the listener reconnected).
    pub fn reconnected(&self) {
        for waiters in self.lock().by_key.values() {
            for (_, waiter) in waiters {
                waiter.notify.notify_one();
            }
        }
    }

    /// How many waiters are registered, over every key.
    pub fn len(&self) -> usize {
        self.lock().count
    }

    /// The shortest fallback a waiter of this registry waits: its waiters over
    /// [`CLOSED_FALLBACK_READS_PER_S`], in seconds (10 ms a waiter; below a second, so below
    /// every default fallback, for fewer than 100 waiters).
    pub fn fallback_floor(&self) -> Duration {
        let waiters = u32::try_from(self.len()).unwrap_or(u32::MAX);
        Duration::from_secs(1) * waiters / CLOSED_FALLBACK_READS_PER_S
    }

    /// Whether no waiter is registered.
    pub fn is_empty(&self) -> bool {
        self.lock().by_key.is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        // The registry holds plain handles, valid whatever a panicking holder did.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn unregister(&self, key: &InstanceKey, id: u64) {
        let mut registry = self.lock();
        if let Some(waiters) = registry.by_key.get_mut(key) {
            let before = waiters.len();
            waiters.retain(|(waiter, _)| *waiter != id);
            let removed = before - waiters.len();
            if waiters.is_empty() {
                registry.by_key.remove(key);
            }
            registry.count -= removed;
        }
    }
}

/// One waiter of a [`ClosedWaiters`] registry: a [`WakeSource`] that wakes when its instance
/// closes, or after the fallback.
#[derive(Debug)]
pub struct ClosedWait {
    waiters: ClosedWaiters,
    key: InstanceKey,
    id: u64,
    waiter: Arc<Waiter>,
}

impl ClosedWait {
    /// How the instance closed, when this process closed it after this waiter subscribed.
    pub fn outcome(&self) -> Option<ClosedOutcome> {
        self.waiter
            .outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for ClosedWait {
    fn drop(&mut self) {
        self.waiters.unregister(&self.key, self.id);
    }
}

#[async_trait::async_trait]
impl WakeSource for ClosedWait {
    fn closed_outcome(&self) -> Option<ClosedOutcome> {
        self.outcome()
    }

    fn fallback_floor(&self) -> Duration {
        self.waiters.fallback_floor()
    }

    async fn wait(&mut self, fallback: Duration) -> WakeReason {
        tokio::select! {
            biased;
            () = self.waiter.notify.notified() => WakeReason::Notified,
            () = tokio::time::sleep(fallback) => WakeReason::Timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> InstanceKey {
        InstanceKey::parse("order", id).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_boxed_waiter_answers_with_the_outcome_its_close_brought() {
        let waiters = ClosedWaiters::default();
        // As a notifier hands it out, and as a result waiter holds it.
        let mut wait: Box<dyn WakeSource> = Box::new(waiters.subscribe(&key("a")));
        let done = ClosedOutcome::Completed(serde_json::json!(42));
        waiters.closed_with(&key("a"), &done);
        assert_eq!(
            wait.wait(Duration::from_secs(30)).await,
            WakeReason::Notified
        );
        assert_eq!(wait.closed_outcome(), Some(done));
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_wakes_only_the_waiters_of_its_key() {
        let waiters = ClosedWaiters::default();
        let mut a1 = waiters.subscribe(&key("a"));
        let mut a2 = waiters.subscribe(&key("a"));
        let mut b = waiters.subscribe(&key("b"));
        assert_eq!(waiters.len(), 3);
        waiters.closed(&key("a"));
        let fallback = Duration::from_secs(30);
        assert_eq!(a1.wait(fallback).await, WakeReason::Notified);
        assert_eq!(a2.wait(fallback).await, WakeReason::Notified);
        assert_eq!(b.wait(fallback).await, WakeReason::Timeout);
        // One permit per close: the next wait runs to the fallback.
        assert_eq!(a1.wait(fallback).await, WakeReason::Timeout);
        waiters.reconnected();
        assert_eq!(b.wait(fallback).await, WakeReason::Notified);
    }

    #[tokio::test(start_paused = true)]
    async fn many_waiters_spread_their_fallback_reads() {
        let waiters = ClosedWaiters::default();
        // Fewer waiters than the reads a second: a floor below every default fallback.
        let mut few: Vec<_> = (0..10)
            .map(|i| waiters.subscribe(&key(&format!("f{i}"))))
            .collect();
        assert_eq!(few[0].fallback_floor(), Duration::from_millis(100));
        // 1,000 waiters: together about 100 fallback reads a second, so 10 s each.
        let mut many: Vec<_> = (0..990)
            .map(|i| waiters.subscribe(&key(&format!("m{i}"))))
            .collect();
        assert_eq!(waiters.fallback_floor(), Duration::from_secs(10));
        let boxed: Box<dyn WakeSource> = Box::new(waiters.subscribe(&key("boxed")));
        assert_eq!(boxed.fallback_floor(), Duration::from_millis(10_010));
        drop(boxed);
        // The wait itself is not stretched (a store's own short waits stay short), and a
        // close still wakes at once.
        let started = tokio::time::Instant::now();
        assert_eq!(
            many[0].wait(Duration::from_secs(1)).await,
            WakeReason::Timeout
        );
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        waiters.closed(&key("m5"));
        assert_eq!(
            many[5].wait(Duration::from_secs(1)).await,
            WakeReason::Notified
        );
        // As the waiters leave, the floor falls back.
        many.clear();
        few.truncate(1);
        assert_eq!(waiters.len(), 1);
        assert_eq!(few[0].fallback_floor(), Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_waiter_unregisters() {
        let waiters = ClosedWaiters::default();
        let first = waiters.subscribe(&key("a"));
        let second = waiters.subscribe(&key("a"));
        drop(first);
        assert_eq!(waiters.len(), 1);
        drop(second);
        assert!(waiters.is_empty());
        // Closing a key nobody waits on is a no-op.
        waiters.closed(&key("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_close_seen_in_process_hands_its_outcome_to_the_waiters() {
        let waiters = ClosedWaiters::default();
        let mut a = waiters.subscribe(&key("a"));
        let b = waiters.subscribe(&key("b"));
        assert_eq!(a.outcome(), None);
        let done = ClosedOutcome::Completed(serde_json::json!({"total": 42}));
        waiters.closed_with(&key("a"), &done);
        assert_eq!(a.wait(Duration::from_secs(30)).await, WakeReason::Notified);
        assert_eq!(a.closed_outcome(), Some(done));
        assert_eq!(b.outcome(), None);
    }
}
