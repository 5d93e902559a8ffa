//! Natural batching: requests that arrive while earlier batches are in flight leave together.
//!
//! A store that pays a fixed cost per transaction (a round trip, a commit and its WAL flush, a
//! statement's set-up) can serve many small requests for about the price of one by sending
//! them as one batch. The question is when to cut a batch. A timer ("wait 2 ms for company")
//! makes every lone request pay the wait. Natural batching waits for nothing: while fewer than
//! [`BatchLimits::in_flight`] batches hold a [`Slot`], whatever has queued goes at once, a lone
//! request alone; only while every slot is taken do requests accumulate, and then the next
//! batch takes all of them. An idle store therefore answers as fast as without batching, and
//! a busy one pays one transaction for many requests, in proportion to how busy it is.
//!
//! A batch holds its slot until it drops it, which need not be when it is done: the Postgres
//! store lets a batch that is kept waiting (for a lock) go on without its slot, so the next
//! batch need not wait behind it.
//!
//! The loop knows nothing of what a batch is: the caller's `send` turns each batch into the
//! future that sends it and answers its requests (each request usually carries a
//! `oneshot::Sender` for its outcome). The Postgres store sends journal appends, starts and
//! parks this way; the remote worker sends its results.

use std::future::Future;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

/// How many requests one batch carries at most unless told otherwise.
pub const BATCH_LEN_MAX_DEFAULT: usize = 64;

/// How many batches hold a slot at once unless told otherwise: one, so requests that arrive
/// while a batch holds it leave together in the next one.
pub const BATCHES_IN_FLIGHT_DEFAULT: usize = 1;

/// How a natural-batching loop cuts its batches.
///
/// ```
/// let limits = keiro_journal::batch::BatchLimits::default();
/// assert_eq!(limits.len_max, keiro_journal::batch::BATCH_LEN_MAX_DEFAULT);
/// assert_eq!(limits.in_flight, keiro_journal::batch::BATCHES_IN_FLIGHT_DEFAULT);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// The most requests one batch carries (at least 1). Defaults to
    /// [`BATCH_LEN_MAX_DEFAULT`].
    pub len_max: usize,
    /// How many batches may hold a [`Slot`] at once (at least 1): fewer gives larger batches
    /// under load, more gives the database more to do in parallel. Defaults to
    /// [`BATCHES_IN_FLIGHT_DEFAULT`].
    pub in_flight: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            len_max: BATCH_LEN_MAX_DEFAULT,
            in_flight: BATCHES_IN_FLIGHT_DEFAULT,
        }
    }
}

/// A batch's place among the [`BatchLimits::in_flight`] that may be under way at once: the
/// loop cuts the next batch only when a slot is free, so requests accumulate while every slot
/// is held. Dropping it frees it; a batch that should not hold up the next one (it is kept
/// waiting) drops it early.
#[derive(Debug)]
pub struct Slot {
    /// Held for its drop, which frees the slot.
    _permit: OwnedSemaphorePermit,
    /// The lane the slot belongs to, for [`Slot::queued`].
    lane: Arc<Lane>,
}

impl Slot {
    /// Frees the slot now (the same as dropping it).
    pub fn release(self) {}

    /// How many requests wait in the slot's lane for the next batch: a batch that keeps its
    /// slot until its callers have asked again can tell whether they are still coming.
    pub fn queued(&self) -> usize {
        self.lane.queued.load(Ordering::Acquire)
    }
}

/// Sends the requests of `requests` in natural batches until every sender is gone, or until
/// `send` returns `None` (its owner went away): each batch is handed to `send` with its
/// [`Slot`], and the future `send` returns runs as a task of its own. Returns once those tasks
/// are done.
///
/// ```
/// use keiro_journal::{batch::run_batches, batch::BatchLimits};
/// use tokio::sync::{mpsc, oneshot};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // Each request is a number and where to send its double.
/// let (queue, requests) = mpsc::unbounded_channel::<(u32, oneshot::Sender<u32>)>();
/// let batcher = tokio::spawn(run_batches(requests, BatchLimits::default(), |batch, _slot| {
///     Some(async move {
///         for (n, reply) in batch {
///             let _ = reply.send(n * 2);
///         }
///     })
/// }));
/// let (reply, doubled) = oneshot::channel();
/// queue.send((21, reply)).unwrap();
/// assert_eq!(doubled.await.unwrap(), 42);
/// drop(queue);
/// batcher.await.unwrap();
/// # }
/// ```
pub async fn run_batches<R, F, Fut>(
    requests: mpsc::UnboundedReceiver<R>,
    limits: BatchLimits,
    send: F,
) where
    R: Send + 'static,
    F: FnMut(Vec<R>, Slot) -> Option<Fut>,
    Fut: Future<Output = ()> + Send + 'static,
{
    let lane = Lane::new(limits);
    lane.run(requests, limits.len_max.max(1), send).await;
}

/// What a loop shares with its [`Batcher`]: the slots, and how many requests were pushed and
/// not yet sent.
#[derive(Debug)]
struct Lane {
    slots: Arc<Semaphore>,
    queued: AtomicUsize,
    spare: Option<Spare>,
}

/// The slot of its own that a loop taking shared slots keeps ([`Batcher::spawn_with_slots`]),
/// taken only while every shared slot is held and at least `from` requests wait.
#[derive(Debug)]
struct Spare {
    slot: Arc<Semaphore>,
    from: usize,
    /// Told when a push leaves at least `from` requests waiting.
    grew: tokio::sync::Notify,
}

impl Lane {
    fn new(limits: BatchLimits) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(limits.in_flight.max(1))),
            queued: AtomicUsize::new(0),
            spare: None,
        })
    }

    /// A slot for the next batch: a free one of `slots`, or the spare while enough wait.
    /// `None` once the slots are closed (never: the lanes own them).
    async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        let Some(spare) = &self.spare else {
            return Arc::clone(&self.slots).acquire_owned().await.ok();
        };
        loop {
            if self.queued.load(Ordering::Acquire) >= spare.from {
                if let Ok(permit) = Arc::clone(&spare.slot).try_acquire_owned() {
                    return Some(permit);
                }
            }
            // Waiting for a shared slot, woken to look again when the queue grows long (a
            // spare given back while the queue stays long is found at the next push).
            tokio::select! {
                permit = Arc::clone(&self.slots).acquire_owned() => return permit.ok(),
                () = spare.grew.notified() => {}
            }
        }
    }

    /// The loop. A batch is cut when a request has come and a slot is free: what has queued by
    /// then, up to `len_max`, leaves together.
    async fn run<R, F, Fut>(
        self: Arc<Self>,
        mut requests: mpsc::UnboundedReceiver<R>,
        len_max: usize,
        mut send: F,
    ) where
        R: Send + 'static,
        F: FnMut(Vec<R>, Slot) -> Option<Fut>,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut sending = JoinSet::new();
        loop {
            let mut batch = Vec::with_capacity(len_max);
            if requests.recv_many(&mut batch, len_max).await == 0 {
                break;
            }
            // Never closed: the lane owns the semaphore.
            let Some(permit) = self.acquire().await else {
                break;
            };
            // What queued while every slot was held joins the batch.
            while batch.len() < len_max {
                match requests.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            self.queued.fetch_sub(batch.len(), Ordering::AcqRel);
            while sending.try_join_next().is_some() {}
            let slot = Slot {
                _permit: permit,
                lane: Arc::clone(&self),
            };
            let Some(future) = send(batch, slot) else {
                break;
            };
            sending.spawn(future);
        }
        while sending.join_next().await.is_some() {}
    }
}

/// The slots of a natural-batching loop, for another loop to take its slots from.
#[derive(Debug, Clone)]
pub struct SharedSlots(Arc<Semaphore>);

/// The sending end of a natural-batching loop started with [`Batcher::spawn`]: requests pushed
/// here are sent by the loop's task in natural batches (see [`run_batches`]).
///
/// ```
/// use keiro_journal::{batch::BatchLimits, batch::Batcher};
/// use tokio::sync::oneshot;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let batcher = Batcher::spawn(BatchLimits::default(), |batch: Vec<(u32, oneshot::Sender<usize>)>, _slot| {
///     let len = batch.len();
///     Some(async move {
///         for (_, reply) in batch {
///             let _ = reply.send(len); // every request learns the size of its batch
///         }
///     })
/// });
/// let (reply, len) = oneshot::channel();
/// assert!(batcher.push((7, reply)).is_ok());
/// assert_eq!(len.await.unwrap(), 1); // alone on an idle loop: sent at once, by itself
/// # }
/// ```
#[derive(Debug)]
pub struct Batcher<R> {
    queue: mpsc::UnboundedSender<R>,
    lane: Arc<Lane>,
}

impl<R: Send + 'static> Batcher<R> {
    /// Starts the loop as a task on the current tokio runtime. `send` is called with each
    /// batch and its [`Slot`] and returns the future that sends it, or `None` to stop the loop
    /// (the requests still queued are then dropped, so their reply channels close).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as `tokio::spawn` does.
    pub fn spawn<F, Fut>(limits: BatchLimits, send: F) -> Self
    where
        F: FnMut(Vec<R>, Slot) -> Option<Fut> + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (queue, requests) = mpsc::unbounded_channel();
        let lane = Lane::new(limits);
        tokio::spawn(Arc::clone(&lane).run(requests, limits.len_max.max(1), send));
        Self { queue, lane }
    }

    /// This loop's slots, for another loop to share ([`spawn_with_slots`](Self::spawn_with_slots)).
    pub fn slots(&self) -> SharedSlots {
        SharedSlots(Arc::clone(&self.lane.slots))
    }

    /// Starts a loop as [`spawn`](Self::spawn) does whose batches take their slots from
    /// another loop's, so the two loops' batches take turns; and one slot of its own, which it
    /// takes only while every shared slot is held and at least half a batch (`len_max / 2`)
    /// waits. Callers that go from one loop to the other stay together on the shared slots,
    /// and a long queue does not wait behind the other loop's batches.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as `tokio::spawn` does.
    pub fn spawn_with_slots<F, Fut>(slots: SharedSlots, limits: BatchLimits, send: F) -> Self
    where
        F: FnMut(Vec<R>, Slot) -> Option<Fut> + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (queue, requests) = mpsc::unbounded_channel();
        let lane = Arc::new(Lane {
            slots: slots.0,
            queued: AtomicUsize::new(0),
            spare: Some(Spare {
                slot: Arc::new(Semaphore::new(1)),
                from: (limits.len_max / 2).max(1),
                grew: tokio::sync::Notify::new(),
            }),
        });
        tokio::spawn(Arc::clone(&lane).run(requests, limits.len_max.max(1), send));
        Self { queue, lane }
    }

    /// Queues `request` for the next batch.
    ///
    /// # Errors
    ///
    /// The request back when the loop has stopped (its runtime shut down, or `send` returned
    /// `None`), for the caller to send some other way.
    pub fn push(&self, request: R) -> Result<(), R> {
        let queued = self.lane.queued.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(spare) = &self.lane.spare {
            if queued >= spare.from {
                spare.grew.notify_one();
            }
        }
        self.queue.send(request).map_err(|e| {
            self.lane.queued.fetch_sub(1, Ordering::AcqRel);
            e.0
        })
    }

    /// A slot for a request its caller sends itself, at once and alone, when the loop is idle:
    /// a slot is free and nothing is queued. An idle loop's lone request then costs what it
    /// would without batching (no hop through the loop's task), and requests that arrive while
    /// the caller holds the slot queue for the next batch as they would behind any batch.
    /// `None` when the loop is busy: push the request instead.
    pub fn try_slot(&self) -> Option<Slot> {
        if self.lane.queued.load(Ordering::Acquire) > 0 || self.is_closed() {
            return None;
        }
        let permit = Arc::clone(&self.lane.slots).try_acquire_owned().ok()?;
        Some(Slot {
            _permit: permit,
            lane: Arc::clone(&self.lane),
        })
    }

    /// Whether the loop has stopped, so pushing would give the request back.
    pub fn is_closed(&self) -> bool {
        self.queue.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tokio::sync::{oneshot, Semaphore};

    use super::*;

    type Request = (u32, oneshot::Sender<usize>);

    /// A loop whose batches each wait for a permit before answering, recording their sizes.
    fn gated(limits: BatchLimits) -> (Batcher<Request>, Arc<Semaphore>, Arc<Mutex<Vec<usize>>>) {
        gated_with(limits, None)
    }

    /// [`gated`], taking its slots from `slots` when given.
    fn gated_with(
        limits: BatchLimits,
        slots: Option<SharedSlots>,
    ) -> (Batcher<Request>, Arc<Semaphore>, Arc<Mutex<Vec<usize>>>) {
        let gate = Arc::new(Semaphore::new(0));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let (g, s) = (gate.clone(), sizes.clone());
        let send = move |batch: Vec<Request>, slot| {
            let (gate, sizes) = (g.clone(), s.clone());
            sizes.lock().unwrap().push(batch.len());
            Some(async move {
                gate.acquire().await.unwrap().forget();
                drop(slot);
                let len = batch.len();
                for (_, reply) in batch {
                    let _ = reply.send(len);
                }
            })
        };
        let batcher = match slots {
            Some(slots) => Batcher::spawn_with_slots(slots, limits, send),
            None => Batcher::spawn(limits, send),
        };
        (batcher, gate, sizes)
    }

    fn push(batcher: &Batcher<Request>, n: u32) -> oneshot::Receiver<usize> {
        let (reply, replied) = oneshot::channel();
        assert!(batcher.push((n, reply)).is_ok());
        replied
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn requests_accumulate_only_while_every_slot_is_busy() {
        let limits = BatchLimits {
            len_max: 64,
            in_flight: 2,
        };
        let (batcher, gate, sizes) = gated(limits);
        // Two lone requests take the two slots at once, each alone.
        let first = push(&batcher, 1);
        settle().await;
        let second = push(&batcher, 2);
        settle().await;
        assert_eq!(*sizes.lock().unwrap(), [1, 1]);
        // With both slots busy the next five wait, then leave together.
        let waiting: Vec<_> = (3..8).map(|n| push(&batcher, n)).collect();
        settle().await;
        assert_eq!(*sizes.lock().unwrap(), [1, 1]);
        gate.add_permits(1);
        assert_eq!(first.await.unwrap(), 1);
        settle().await;
        assert_eq!(*sizes.lock().unwrap(), [1, 1, 5]);
        gate.add_permits(2);
        assert_eq!(second.await.unwrap(), 1);
        for replied in waiting {
            assert_eq!(replied.await.unwrap(), 5);
        }
    }

    #[tokio::test]
    async fn a_loop_sharing_slots_waits_for_them_while_less_than_half_a_batch_waits() {
        let limits = BatchLimits {
            len_max: 64,
            in_flight: 1,
        };
        let (first, first_gate, first_sizes) = gated(limits);
        let (second, second_gate, second_sizes) = gated_with(limits, Some(first.slots()));
        second_gate.add_permits(10);
        // The first loop's lone request takes the one slot both loops share.
        let holding = push(&first, 1);
        settle().await;
        assert!(second.try_slot().is_none(), "the shared slot is taken");
        // The second loop's requests wait for it, however idle their own loop is.
        let waiting: Vec<_> = (2..6).map(|n| push(&second, n)).collect();
        settle().await;
        assert!(second_sizes.lock().unwrap().is_empty());
        first_gate.add_permits(1);
        assert_eq!(holding.await.unwrap(), 1);
        for replied in waiting {
            assert_eq!(replied.await.unwrap(), 4);
        }
        assert_eq!(*first_sizes.lock().unwrap(), [1]);
        assert_eq!(*second_sizes.lock().unwrap(), [4]);
    }

    #[tokio::test]
    async fn a_loop_sharing_slots_takes_its_spare_once_half_a_batch_waits() {
        let limits = BatchLimits {
            len_max: 8,
            in_flight: 1,
        };
        let (first, first_gate, first_sizes) = gated(limits);
        let (second, second_gate, second_sizes) = gated_with(limits, Some(first.slots()));
        let holding = push(&first, 1);
        settle().await;
        // Three wait for the shared slot: fewer than half a batch.
        let mut waiting: Vec<_> = (2..5).map(|n| push(&second, n)).collect();
        settle().await;
        assert!(second_sizes.lock().unwrap().is_empty());
        // The fourth makes half a batch: they leave on the spare, the shared slot still held.
        waiting.push(push(&second, 5));
        settle().await;
        assert_eq!(*second_sizes.lock().unwrap(), [4]);
        // While the spare is out too, the next ones wait for either.
        let later: Vec<_> = (6..10).map(|n| push(&second, n)).collect();
        settle().await;
        assert_eq!(*second_sizes.lock().unwrap(), [4]);
        first_gate.add_permits(1);
        second_gate.add_permits(2);
        assert_eq!(holding.await.unwrap(), 1);
        for replied in waiting.into_iter().chain(later) {
            assert_eq!(replied.await.unwrap(), 4);
        }
        assert_eq!(*first_sizes.lock().unwrap(), [1]);
        assert_eq!(*second_sizes.lock().unwrap(), [4, 4]);
    }

    #[tokio::test]
    async fn a_batch_never_exceeds_its_length() {
        let limits = BatchLimits {
            len_max: 3,
            in_flight: 1,
        };
        let (batcher, gate, sizes) = gated(limits);
        let first = push(&batcher, 0);
        settle().await;
        let rest: Vec<_> = (1..8).map(|n| push(&batcher, n)).collect();
        gate.add_permits(10);
        first.await.unwrap();
        for replied in rest {
            replied.await.unwrap();
        }
        assert_eq!(*sizes.lock().unwrap(), [1, 3, 3, 1]);
    }

    #[tokio::test]
    async fn a_released_slot_lets_the_next_batch_go_before_the_last_one_ends() {
        let limits = BatchLimits {
            len_max: 64,
            in_flight: 1,
        };
        // Each batch frees its slot at once, then waits for the gate to answer.
        let gate = Arc::new(Semaphore::new(0));
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let (g, s) = (gate.clone(), sizes.clone());
        let batcher = Batcher::spawn(limits, move |batch: Vec<Request>, slot: Slot| {
            let (gate, sizes) = (g.clone(), s.clone());
            sizes.lock().unwrap().push(batch.len());
            slot.release();
            Some(async move {
                gate.acquire().await.unwrap().forget();
                for (_, reply) in batch {
                    let _ = reply.send(0);
                }
            })
        });
        let first = push(&batcher, 1);
        settle().await;
        let second = push(&batcher, 2);
        settle().await;
        // Both went, each alone, though neither has answered.
        assert_eq!(*sizes.lock().unwrap(), [1, 1]);
        gate.add_permits(2);
        first.await.unwrap();
        second.await.unwrap();
    }

    #[tokio::test]
    async fn an_idle_loop_lends_its_slot_and_what_comes_meanwhile_waits_for_it() {
        let limits = BatchLimits {
            len_max: 64,
            in_flight: 1,
        };
        let (batcher, gate, sizes) = gated(limits);
        // Idle: the caller gets the slot, and only one caller at a time.
        let lent = batcher.try_slot().expect("an idle loop lends its slot");
        assert!(batcher.try_slot().is_none(), "one slot, lent once");
        // Requests pushed meanwhile wait for it, then leave together.
        let waiting: Vec<_> = (0..3).map(|n| push(&batcher, n)).collect();
        settle().await;
        assert!(sizes.lock().unwrap().is_empty());
        assert!(batcher.try_slot().is_none(), "requests are queued");
        lent.release();
        settle().await;
        assert_eq!(*sizes.lock().unwrap(), [3]);
        // While that batch holds the slot, nothing is lent.
        assert!(batcher.try_slot().is_none(), "the batch holds the slot");
        gate.add_permits(1);
        for replied in waiting {
            assert_eq!(replied.await.unwrap(), 3);
        }
        settle().await;
        assert!(batcher.try_slot().is_some(), "idle again");
    }

    #[tokio::test]
    async fn a_stopped_loop_gives_requests_back() {
        let batcher = Batcher::spawn(BatchLimits::default(), |_: Vec<Request>, _| {
            None::<std::future::Ready<()>>
        });
        let (reply, replied) = oneshot::channel();
        assert!(batcher.push((1, reply)).is_ok());
        // The loop stops on that batch and drops it unanswered.
        assert!(replied.await.is_err());
        tokio::time::timeout(Duration::from_secs(5), async {
            while !batcher.is_closed() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        let (reply, _replied) = oneshot::channel();
        assert_eq!(batcher.push((2, reply)).map_err(|r| r.0), Err(2));
    }
}
