//! [`MemoryStore`]: the shared handle, its lock, its clock and its wake channel.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use keiro_journal::store::Result;
use time::OffsetDateTime;
use tokio::sync::broadcast;

use crate::notify::Notification;
use crate::state::refused;
use crate::State;

/// How many notifications a [`MemoryStore::notifications`] receiver (and so a
/// [`Notifier`](keiro_resume::Notifier) subscription) may fall behind before it starts losing
/// the oldest ones (it then sees [`broadcast::error::RecvError::Lagged`]).
///
/// A lost notification costs latency, never work: the receiver should treat `Lagged` as "run a
/// pass now", as a Postgres listener does after reconnecting; the store's subscriptions do.
///
/// ```
/// assert!(keiro_memory::WAKE_BUFFER_LEN >= 1);
/// ```
pub const WAKE_BUFFER_LEN: usize = 1024;

/// keiro's store in memory: [`JournalStore`](keiro_journal::JournalStore) and
/// [`LeaseStore`](keiro_lease::LeaseStore) with the same semantics as the Postgres store.
///
/// Cloning is cheap and every clone sees the same data. Every trait method is one critical
/// section of a `std::sync::Mutex` that is never held across an `.await`, which is what makes
/// each operation atomic; timestamps come from the store's clock (the wall clock, or the
/// instant pinned with [`set_now`](Self::set_now)), read once per operation.
///
/// ```
/// use std::time::Duration;
/// use keiro_journal::{InstanceKey, JournalStore, store::StartRequest};
/// use keiro_lease::{ClaimOutcome, LeaseStore};
/// use keiro_memory::MemoryStore;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new();
/// let key = InstanceKey::parse("order", "order-42")?;
/// let request = StartRequest { key: key.clone(), input: serde_json::json!(42), parent: None, priority: 0 };
/// store.instance_start(&request).await?;
///
/// let ttl = Duration::from_secs(60);
/// let ClaimOutcome::Acquired(claim) = store.instance_claim(&key, "worker-a", ttl, None).await? else {
///     unreachable!("a fresh instance is free");
/// };
/// assert_eq!(store.instance_claim(&key, "worker-b", ttl, None).await?, ClaimOutcome::LeaseHeld);
/// assert!(store.instance_release(&key, &claim.fence, true).await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    notifications: broadcast::Sender<Notification>,
    /// Result waiters by instance, woken when an operation closes their instance.
    closed: keiro_resume::ClosedWaiters,
}

impl MemoryStore {
    /// An empty store on the wall clock.
    ///
    /// ```
    /// let store = keiro_memory::MemoryStore::new();
    /// # let _ = store;
    /// ```
    pub fn new() -> Self {
        // The channel's own first receiver is dropped: notifications with nobody subscribed
        // are simply not delivered, as a NOTIFY with no listener.
        let (notifications, _) = broadcast::channel(WAKE_BUFFER_LEN);
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                notifications,
                closed: keiro_resume::ClosedWaiters::default(),
            }),
        }
    }

    /// Pins the store's clock to `now`, or returns it to the wall clock with `None`.
    ///
    /// Every timestamp the store writes (`created_at`, `recorded_at`, `updated_at`,
    /// `completed_at`, lease expiry, `next_attempt_at`) and every "now" it compares against
    /// comes from this clock, except where a method is passed its own `now`. That includes
    /// [`timers_fire_due`](keiro_journal::JournalStore::timers_fire_due) and
    /// [`timers_due_count`](keiro_journal::JournalStore::timers_due_count) called with `None`:
    /// a test moves the clock past a sleep's `fire_at` and the timers come due. Tests simulate
    /// lease expiry, backoff and timers by moving it, never by sleeping.
    ///
    /// ```
    /// use time::macros::datetime;
    /// let store = keiro_memory::MemoryStore::new();
    /// store.set_now(Some(datetime!(2030-01-01 0:00 UTC)));
    /// assert_eq!(store.now(), datetime!(2030-01-01 0:00 UTC));
    /// store.set_now(None);
    /// ```
    pub fn set_now(&self, now: Option<OffsetDateTime>) {
        // Pinning the clock touches no instance data, so a lock poisoned by an earlier panic
        // is no reason to refuse it.
        let mut state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.clock.pin(now);
    }

    /// Runs the store's clock `offset` ahead of the wall clock (behind, when negative), as a
    /// database server's clock may be ahead of or behind its workers': a test of what a worker
    /// does with a skewed clock runs its worker on the wall clock against this store. An
    /// instant pinned with [`set_now`](Self::set_now) wins while it is set. Defaults to zero.
    ///
    /// ```
    /// let store = keiro_memory::MemoryStore::new();
    /// store.set_clock_offset(time::Duration::minutes(1));
    /// assert!(store.now() > time::OffsetDateTime::now_utc() + time::Duration::seconds(59));
    /// ```
    pub fn set_clock_offset(&self, offset: time::Duration) {
        // As for `set_now`: the clock is no instance data.
        let mut state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.clock.skew(offset);
    }

    /// The store's current time: the pinned instant, or the wall clock (moved by the offset
    /// of [`set_clock_offset`](Self::set_clock_offset)).
    ///
    /// ```
    /// let store = keiro_memory::MemoryStore::new();
    /// assert!(store.now() <= time::OffsetDateTime::now_utc());
    /// ```
    pub fn now(&self) -> OffsetDateTime {
        let state = self
            .shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.clock.now()
    }

    /// Receives every notification, unfiltered: [`Notification::Instance`] for each instance
    /// that became runnable (a start or spawn, a step that woke a suspended run, a
    /// continue-as-new, a park that found its wake already there, a resurrection) and
    /// [`Notification::TimerArmed`] for each newly armed timer, the points where the Postgres
    /// store NOTIFYs, sent after the operation's critical section ends. Loops subscribe
    /// through [`Notifier`](keiro_resume::Notifier) instead, which filters and waits.
    ///
    /// A broadcast channel, because several loops may share one store and each must see every
    /// notification; a `Notify` reaches only one loop or only loops already waiting, and a
    /// `watch` keeps only the latest one. A receiver sees notifications sent after it
    /// subscribed; one that falls more than [`WAKE_BUFFER_LEN`] behind gets `Lagged` and should
    /// run a pass.
    ///
    /// ```
    /// use keiro_journal::{InstanceKey, JournalStore, store::StartRequest};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use keiro_memory::Notification;
    /// let store = keiro_memory::MemoryStore::new();
    /// let mut notifications = store.notifications();
    /// let key = InstanceKey::parse("order", "order-42")?;
    /// let request = StartRequest { key: key.clone(), input: serde_json::Value::Null, parent: None, priority: 0 };
    /// store.instance_start(&request).await?;
    /// assert_eq!(notifications.recv().await?, Notification::Instance(key));
    /// # Ok(()) }
    /// ```
    pub fn notifications(&self) -> broadcast::Receiver<Notification> {
        self.shared.notifications.subscribe()
    }

    /// The result waiters of this store, woken as instances close.
    pub(crate) fn closed_waiters(&self) -> &keiro_resume::ClosedWaiters {
        &self.shared.closed
    }

    /// Runs one operation as one critical section, then sends the notifications it raised and
    /// wakes the result waiters of the instances it closed.
    pub(crate) fn transact<T>(
        &self,
        operation: &'static str,
        op: impl FnOnce(&mut State) -> Result<T>,
    ) -> Result<T> {
        let (result, notifications, closed) = {
            // A panic inside an earlier operation may have left it half applied; refusing
            // further work is safer than building on a state nobody can vouch for.
            let mut state = self.shared.state.lock().map_err(|_| {
                refused(
                    operation,
                    "an earlier operation panicked inside the memory store",
                )
            })?;
            let result = op(&mut state);
            (result, state.take_notifications(), state.take_closed())
        };
        if result.is_ok() {
            for key in &closed {
                self.shared.closed.closed(key);
            }
            for notification in notifications {
                // Sending fails only when nobody is subscribed; a notification is an
                // optimisation over the passes, so an unheard one is fine.
                let _ = self.shared.notifications.send(notification);
            }
        }
        result
    }

    /// Reads the raw state, for tests of what the trait methods do not expose (row names).
    #[cfg(test)]
    pub(crate) fn inspect<T>(&self, read: impl FnOnce(&State) -> T) -> T {
        read(
            &self
                .shared
                .state
                .lock()
                .expect("no unit test panics inside the store"),
        )
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A summary, not the contents: a store in a test may hold thousands of rows, and
        // try_lock keeps a Debug call from ever waiting on an operation.
        let instances = self
            .shared
            .state
            .try_lock()
            .ok()
            .map(|state| state.instances.len());
        f.debug_struct("MemoryStore")
            .field("instances", &instances)
            .field("subscribers", &self.shared.notifications.receiver_count())
            .finish_non_exhaustive()
    }
}
