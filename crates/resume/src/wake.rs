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

    /// For a result waiter's source: how its instance closed, when the close was committed
    /// by this process (so the waiter need not read the row). `None` by default: read it.
    fn closed_outcome(&self) -> Option<ClosedOutcome> {
        None
    }

    /// For a result waiter's source: the shortest fallback its caller should read at, so the
    /// waiters of one store spread their fallback reads (see
    /// [`ClosedWaiters::fallback_floor`](crate::ClosedWaiters::fallback_floor)). Zero by
    /// default: no floor.
    fn fallback_floor(&self) -> Duration {
        Duration::ZERO
    }
}

/// How an instance closed, as the process that closed it knows it: what a result waiter would
/// otherwise read from the row.
#[derive(Debug, Clone, PartialEq)]
pub enum ClosedOutcome {
    /// Completed with this output.
    Completed(serde_json::Value),
    /// Failed for this reason.
    Failed(String),
    /// Cancelled.
    Cancelled,
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

    /// A subscription that wakes when instance `key` sets an event, writes to or closes a
    /// stream, or reaches a terminal status after this call, or when notifications may have
    /// been missed; for readers of its events and streams. The default never wakes early (a
    /// fixed poll); the built-in stores override it.
    fn subscribe_messages(&self, key: &keiro_journal::InstanceKey) -> Box<dyn WakeSource> {
        let _ = key;
        Box::new(FixedPoll)
    }

    /// [`subscribe_messages`](Self::subscribe_messages) for a caller waiting for one event's
    /// value (`Keiro::get_event`), a one-shot wait like a result's: a store that pays to be
    /// told of writes made elsewhere may start paying sooner for it than for a stream's
    /// reader. The default is `subscribe_messages`.
    fn subscribe_event(&self, key: &keiro_journal::InstanceKey) -> Box<dyn WakeSource> {
        self.subscribe_messages(key)
    }
}

/// A boxed source is the source it holds: every method forwards, the provided ones too (a
/// call on the box picks this impl, not the boxed source's).
#[async_trait::async_trait]
impl WakeSource for Box<dyn WakeSource> {
    async fn wait(&mut self, fallback: Duration) -> WakeReason {
        self.as_mut().wait(fallback).await
    }

    fn closed_outcome(&self) -> Option<ClosedOutcome> {
        self.as_ref().closed_outcome()
    }

    fn fallback_floor(&self) -> Duration {
        self.as_ref().fallback_floor()
    }
}

/// A message on a store's wake broadcast, as a subscription with a given filter sees it.
///
/// Each store has its own message type (Postgres payloads, the memory store's notifications);
/// this is all a [`BroadcastWake`] needs to know of it.
pub trait WakeMessage: Clone + Send + 'static {
    /// What this message means to a subscription with `filter`: `Some(reason)` ends its wait,
    /// `None` is ignored.
    fn wakes(&self, filter: WakeFilter) -> Option<WakeReason>;
}

/// The one [`WakeSource`] over a store's broadcast channel, shared by every store that pushes.
///
/// A wait ends at the first message that wakes its filter, or at the fallback. A burst costs
/// one pass: whatever else is queued is drained, and a `Reconnected` among it wins, being the
/// stronger request. A subscription that fell behind (a lag) wakes: notifications were lost,
/// never work, and the pass finds it. A closed channel (the store is gone) degrades to the
/// fixed poll.
///
/// ```
/// use std::time::Duration;
/// use keiro_resume::{BroadcastWake, WakeFilter, WakeMessage, WakeReason, WakeSource};
///
/// #[derive(Clone)]
/// struct Ping;
/// impl WakeMessage for Ping {
///     fn wakes(&self, filter: WakeFilter) -> Option<WakeReason> {
///         (filter == WakeFilter::Instances).then_some(WakeReason::Notified)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let (sender, receiver) = tokio::sync::broadcast::channel(16);
/// let mut wakes = BroadcastWake::new(WakeFilter::Instances, receiver);
/// sender.send(Ping).ok();
/// sender.send(Ping).ok();
/// assert_eq!(wakes.wait(Duration::from_secs(5)).await, WakeReason::Notified);
/// // The second ping was drained with the first: one pass for the burst.
/// assert_eq!(wakes.wait(Duration::from_millis(10)).await, WakeReason::Timeout);
/// # }
/// ```
pub struct BroadcastWake<M> {
    filter: WakeFilter,
    receiver: tokio::sync::broadcast::Receiver<M>,
    before_wait: Option<Box<dyn FnMut() + Send>>,
}

impl<M> std::fmt::Debug for BroadcastWake<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BroadcastWake")
            .field("filter", &self.filter)
            .finish_non_exhaustive()
    }
}

impl<M: WakeMessage> BroadcastWake<M> {
    /// A subscription with `filter` over `receiver`. Subscribe the receiver before whatever
    /// starts sending, so no message sent after the caller asked is missed.
    pub fn new(filter: WakeFilter, receiver: tokio::sync::broadcast::Receiver<M>) -> Self {
        Self {
            filter,
            receiver,
            before_wait: None,
        }
    }

    /// Runs `hook` at the start of every wait: a store whose sender is fed by a background
    /// task (the Postgres listener) restarts it there if it could not be started before.
    #[must_use]
    pub fn before_wait(mut self, hook: impl FnMut() + Send + 'static) -> Self {
        self.before_wait = Some(Box::new(hook));
        self
    }

    /// Discards whatever is queued, keeping the strongest reason seen.
    fn drain(&mut self, mut reason: WakeReason) -> WakeReason {
        use tokio::sync::broadcast::error::TryRecvError;
        loop {
            match self.receiver.try_recv() {
                Ok(message) => {
                    if message.wakes(self.filter) == Some(WakeReason::Reconnected) {
                        reason = WakeReason::Reconnected;
                    }
                }
                // A lag only means more was queued than kept; the rest is still to drain.
                Err(TryRecvError::Lagged(_)) => {}
                Err(TryRecvError::Empty | TryRecvError::Closed) => return reason,
            }
        }
    }
}

#[async_trait::async_trait]
impl<M: WakeMessage> WakeSource for BroadcastWake<M> {
    async fn wait(&mut self, fallback: Duration) -> WakeReason {
        use tokio::sync::broadcast::error::RecvError;
        if let Some(hook) = self.before_wait.as_mut() {
            hook();
        }
        let deadline = tokio::time::sleep(fallback);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                // A queued message wins over an expired fallback: it is the more precise
                // answer, the caller polls either way, and a `Reconnected` must not be lost.
                biased;
                received = self.receiver.recv() => match received {
                    Ok(message) => {
                        if let Some(reason) = message.wakes(self.filter) {
                            return self.drain(reason);
                        }
                    }
                    Err(RecvError::Lagged(_)) => return self.drain(WakeReason::Notified),
                    // Nothing will be sent again: the fallback alone paces the loop.
                    Err(RecvError::Closed) => {
                        deadline.as_mut().await;
                        return WakeReason::Timeout;
                    }
                },
                () = deadline.as_mut() => return WakeReason::Timeout,
            }
        }
    }
}
