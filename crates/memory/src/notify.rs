//! Push wake-ups: the store's in-process notifications and the
//! [`Notifier`] that resume and timer loops subscribe through.
//!
//! Every operation queues its notifications inside its critical section and the store sends
//! them on one broadcast channel after the section ends, as Postgres delivers a NOTIFY at
//! commit. Each subscription filters that one stream: a timer loop wants timer arms, a resume
//! loop wants instance wakes. A notification only shortens a wait; the loops' fallback polls
//! are what guarantee progress, so a subscription that fell behind simply reports a wake.

use keiro_journal::InstanceKey;
use keiro_resume::{BroadcastWake, Notifier, WakeFilter, WakeMessage, WakeReason, WakeSource};

use crate::MemoryStore;

/// One in-process notification of a [`MemoryStore`]: the memory form of a payload on the
/// Postgres wake channel.
///
/// ```
/// use keiro_journal::{InstanceKey, JournalStore, store::StartRequest};
/// use keiro_memory::{MemoryStore, Notification};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let mut notifications = store.notifications();
/// let key = InstanceKey::parse("order", "order-42")?;
/// let request = StartRequest { key: key.clone(), input: serde_json::Value::Null, parent: None, priority: 0 };
/// store.instance_start(&request).await?;
/// assert_eq!(notifications.recv().await?, Notification::Instance(key));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notification {
    /// The instance became runnable: a start or spawn, a step that woke a suspended run, a
    /// continue-as-new, a park that found its wake already there, or a resurrection (the
    /// `<workflow_name>/<workflow_id>` payload in Postgres).
    Instance(InstanceKey),
    /// A timer was armed, so the earliest due time may have moved closer (the `timer` payload
    /// in Postgres).
    TimerArmed,
    /// A remote task became claimable: it was dispatched, redispatched or requeued (the
    /// `remote` payload in Postgres). Sent at most once per operation.
    RemoteTasks,
}

impl WakeMessage for Notification {
    fn wakes(&self, filter: WakeFilter) -> Option<WakeReason> {
        let wanted = match self {
            Self::Instance(_) => WakeFilter::Instances,
            Self::TimerArmed => WakeFilter::Timers,
            Self::RemoteTasks => WakeFilter::RemoteTasks,
        };
        (filter == wanted).then_some(WakeReason::Notified)
    }
}

/// Subscriptions over the store's notifications: [`WakeFilter::Instances`] wakes on
/// [`Notification::Instance`], [`WakeFilter::Timers`] on [`Notification::TimerArmed`],
/// [`WakeFilter::RemoteTasks`] on [`Notification::RemoteTasks`]. The
/// memory store never loses its channel, so a wait ends in `Notified` or `Timeout`, never
/// `Reconnected`.
///
/// ```
/// use std::time::Duration;
/// use keiro_journal::{InstanceKey, JournalStore, store::StartRequest};
/// use keiro_memory::MemoryStore;
/// use keiro_resume::{Notifier, WakeFilter, WakeReason};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let mut wakes = store.subscribe(WakeFilter::Instances);
/// let key = InstanceKey::parse("order", "order-42")?;
/// let request = StartRequest { key, input: serde_json::Value::Null, parent: None, priority: 0 };
/// store.instance_start(&request).await?;
/// assert_eq!(wakes.wait(Duration::from_secs(5)).await, WakeReason::Notified);
/// # Ok(()) }
/// ```
impl Notifier for MemoryStore {
    fn subscribe(&self, filter: WakeFilter) -> Box<dyn WakeSource> {
        Box::new(BroadcastWake::new(filter, self.notifications()))
    }

    /// Wakes when an operation closes `key` (completes, fails or cancels it), once that
    /// operation's critical section has ended.
    fn subscribe_closed(&self, key: &InstanceKey) -> Box<dyn WakeSource> {
        Box::new(self.closed_waiters().subscribe(key))
    }
}

#[cfg(test)]
mod tests {
    use keiro_journal::{store::TimerArm, JournalStore, TimerKind};
    use std::time::Duration;
    use time::Duration as Span;

    use super::*;
    use crate::fixtures::{start, store, T0};
    use crate::WAKE_BUFFER_LEN;

    const FALLBACK: Duration = Duration::from_secs(30);

    fn arm(key: &InstanceKey, step: &str) -> TimerArm {
        TimerArm {
            key: key.clone(),
            generation: 0,
            step: step.to_owned(),
            due: keiro_journal::store::TimerDue::At(T0 + Span::minutes(5)),
            kind: TimerKind::Sleep,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_filter_wakes_only_on_its_own_notifications() {
        let store = store();
        let mut timers = store.subscribe(WakeFilter::Timers);
        let mut instances = store.subscribe(WakeFilter::Instances);

        let key = start(&store, "a").await;
        assert_eq!(timers.wait(FALLBACK).await, WakeReason::Timeout);
        assert_eq!(instances.wait(FALLBACK).await, WakeReason::Notified);

        store.timer_arm(&arm(&key, "sleep:nap")).await.unwrap();
        assert_eq!(instances.wait(FALLBACK).await, WakeReason::Timeout);
        assert_eq!(timers.wait(FALLBACK).await, WakeReason::Notified);

        // Only the first arm notifies: a re-arm moves nothing.
        store.timer_arm(&arm(&key, "sleep:nap")).await.unwrap();
        assert_eq!(timers.wait(FALLBACK).await, WakeReason::Timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_costs_one_wake_and_a_lagged_receiver_counts_as_notified() {
        let store = store();
        let mut instances = store.subscribe(WakeFilter::Instances);
        for id in ["a", "b", "c"] {
            start(&store, id).await;
        }
        assert_eq!(instances.wait(FALLBACK).await, WakeReason::Notified);
        assert_eq!(instances.wait(FALLBACK).await, WakeReason::Timeout);

        // Timer arms only: a subscription to instances that lagged past them still wakes.
        let key = start(&store, "d").await;
        assert_eq!(instances.wait(FALLBACK).await, WakeReason::Notified);
        for n in 0..=WAKE_BUFFER_LEN {
            store
                .timer_arm(&arm(&key, &format!("sleep:{n}")))
                .await
                .unwrap();
        }
        assert_eq!(instances.wait(FALLBACK).await, WakeReason::Notified);
        assert_eq!(instances.wait(FALLBACK).await, WakeReason::Timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_store_degrades_to_the_fallback() {
        let store = store();
        let mut timers = store.subscribe(WakeFilter::Timers);
        drop(store);
        let before = tokio::time::Instant::now();
        assert_eq!(timers.wait(FALLBACK).await, WakeReason::Timeout);
        assert!(before.elapsed() >= FALLBACK);
    }
}
