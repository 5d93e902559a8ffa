//! Group commit: concurrent calls of one store operation share a statement and a transaction.
//!
//! Each batched operation has a lane. A call pushes its request onto the lane, whose loop
//! (keiro-journal's natural batching: no timer, a lone call leaves at once) sends what has
//! queued while the lane's earlier batch was running as ONE call of a plpgsql function over
//! arrays (`keiro_journal_append_batch`, `keiro_instances_start`,
//! `keiro_instances_park_dispatch`), which runs every request exactly as the operation's own
//! function would, in a stable order (the instances' keys), and answers each with its own
//! outcome. One statement and one commit, whose WAL flush PostgreSQL waits for as always,
//! serve the whole batch: nobody is answered before the batch is durable.
//!
//! The slot (one per lane by default, `Config::batch_in_flight`) is held until the batch's
//! commit is acknowledged and its callers are answered, and then for turns of the runtime
//! while the answered callers are still queueing what they do next (until three turns in a
//! row bring nothing new): so the runs that shared a commit share the next one too, and so do
//! the runs a worker starts as those end. A batch is one statement in an implicit
//! transaction: one round trip, whose rows come once the commit is durable. A request that finds its lane idle (a
//! free slot, nothing queued) is sent by its caller at once, alone, holding the slot
//! meanwhile: it costs what a call without batching costs, with no hop through the lane's
//! task.
//!
//! Direct starts take their slot from the append lane's rather than having their own. A
//! direct run's caller starts it and then appends its steps, so the callers of both lanes are
//! the same runs: on two slots they split into two groups, each paying its own commit while the
//! other's is in flight; on one they stay together, a batch of starts taking turns with a
//! batch of steps (`keiro bench --mode direct`, C=16: 0.37 commits a workflow instead of 0.8,
//! PostgreSQL CPU 0.26-0.28 ms a workflow instead of 0.40-0.435; BENCHMARKS.md, issue 15, stop
//! 20). The direct start lane keeps one spare slot of its own for when half a batch of starts
//! waits behind the append lane's batches (many runs in flight: at C=64 the shared slot alone
//! left the second core idler, 0.87-0.98x the workflows a second; with the spare 0.98-1.08x,
//! on less PostgreSQL CPU either way). Plain starts keep their own slot: their callers are
//! producers, not the runs that append, and on the append lane's slot they held a worker's
//! steps up (0.58-0.74x the workflows a second in `keiro bench`).
//!
//! Why the slot covers the commit (measured, BENCHMARKS.md "Issue 15, stop 14"): runs that
//! wait for one commit come back together, a few microseconds apart. A slot given back when
//! the statement's rows came (before its commit, in a transaction of its own) let the first
//! of them, or a straggler, leave alone and hold the lane through its own commit while the
//! rest queued behind it: every other batch carried one request, at the price of a statement
//! and a commit. Held to the end, the lane sends one batch per round of its callers (0.7
//! commits per three-step workflow in `keiro bench` instead of 1.14), and the round takes as
//! long, since the callers wait for their commit either way.
//!
//! A lane never waits long behind one batch: a batch still running after a few milliseconds
//! gives its slot back (it is waiting for a lock, most likely), and the append batch skips
//! instance rows other transactions hold (see `sql/functions/journal.sql`), so one caller's
//! long transaction delays the appends to its own instance only.
//!
//! A batch that fails as a whole rolled back entirely (a value PostgreSQL refuses aborts the
//! statement; so does a deadlock the server broke, or a dropped connection), and each of its
//! requests is then sent alone, so every caller gets exactly the answer a call of its own
//! would have given: the request holding the refused value is refused, the others land.
//! A request that was in a batch whose commit failed ambiguously is idempotent when sent
//! again (a recorded step answers `AlreadyPresent`, a start finds its row, a park re-arms).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use keiro_journal::store::Result;
use keiro_journal::{store_span, Batcher, SharedSlots, Slot, StoreError, STORE_SPAN_TARGET};
use tokio::sync::oneshot;
use tracing::Instrument as _;

use crate::PgStore;

/// An operation whose concurrent calls can share a statement.
pub(crate) trait Batched: Send + Sync + Sized + 'static {
    /// What one call answers when it succeeds.
    type Output: Send + 'static;

    /// The operation, for errors.
    const OPERATION: &'static str;

    /// The store operation whose calls the lane carries (`journal_append`): the
    /// `keiro.store.operation` of its batches' spans.
    const NAME: &'static str;

    /// Whether the lane takes its slots from the append lane's instead of having its own:
    /// for an operation whose callers go on to append (a direct start, whose caller's steps
    /// follow), so the two lanes' batches take turns and the callers stay together.
    const SHARES_APPEND_SLOTS: bool = false;

    /// Whether this request may join a batch; one that may not is sent alone (an operation
    /// whose lock order a batch cannot keep, for instance).
    fn batchable(&self) -> bool {
        true
    }

    /// One statement for the whole batch, an outcome per request in the batch's order, giving
    /// `slot` back early if kept waiting (see [`PgStore::query_in_slot`]); `None`
    /// for a request the batch left alone (its row was held by another transaction), which
    /// is then sent alone. An error means the statement failed, so nothing of it was written.
    fn send_many(
        store: &PgStore,
        batch: &[Self],
        slot: Option<&SlotHold>,
    ) -> impl Future<Output = Result<Vec<Option<Result<Self::Output>>>>> + Send;

    /// The request alone, as the operation's own call, giving `slot` back likewise.
    fn send_one(
        store: &PgStore,
        request: &Self,
        slot: Option<&SlotHold>,
    ) -> impl Future<Output = Result<Self::Output>> + Send;
}

/// One request waiting in a lane, with where its outcome goes.
struct Waiting<T: Batched> {
    request: T,
    reply: oneshot::Sender<Result<T::Output>>,
    /// The caller's span, which the span of the batch that carries the request follows from.
    caller: tracing::Span,
}

/// A batch's hold on its lane's slot. The lane gives the slot back once the batch's commit is
/// acknowledged and its callers are answered (and have had a turn to ask again), so the
/// requests they make next leave together; the statement gives it back early when it is kept
/// waiting ([`PgStore::query_in_slot`]), so the lane never waits behind a batch stuck on a lock.
pub(crate) struct SlotHold(Mutex<Option<Slot>>);

impl SlotHold {
    fn new(slot: Slot) -> Self {
        Self(Mutex::new(Some(slot)))
    }

    /// How many requests wait in the lane for the next batch (0 once the slot is back).
    fn queued(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or(0, Slot::queued)
    }

    /// Gives the slot back now (once; later calls do nothing).
    pub(crate) fn release(&self) {
        drop(
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
    }
}

/// The lane of one operation: its loop starts with the first call, and again if its runtime
/// went away (a store shared by several runtimes, as tests do).
pub(crate) struct Lane<T: Batched> {
    batcher: Mutex<Option<Batcher<Waiting<T>>>>,
    /// What the lane sent so far, shared with its loop.
    counters: Arc<LaneCounters>,
}

impl<T: Batched> Default for Lane<T> {
    fn default() -> Self {
        Self {
            batcher: Mutex::new(None),
            counters: Arc::default(),
        }
    }
}

/// Batches a lane cut and the requests they carried, counted as they leave.
#[derive(Debug, Default)]
struct LaneCounters {
    batches: AtomicU64,
    requests: AtomicU64,
}

impl LaneCounters {
    fn count(&self, requests: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(
            u64::try_from(requests).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn read(&self) -> LaneStats {
        LaneStats {
            batches: self.batches.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
        }
    }
}

/// What one group-commit lane sent: each batch is one statement and one commit, so
/// `requests / batches` is how many calls shared a commit on average. A call sent by itself
/// because its lane was idle counts as a batch of one; calls made with batching off, or of a
/// kind a lane never carries, are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// Batches sent (statements, each in a transaction of its own).
    pub batches: u64,
    /// Calls those batches carried.
    pub requests: u64,
}

impl LaneStats {
    /// Calls per batch; `None` before the first batch.
    #[must_use]
    pub fn mean_len(&self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
        (self.batches > 0).then(|| self.requests as f64 / self.batches as f64)
    }

    /// What was sent between `earlier` and `self` (two reads of the same lane).
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            batches: self.batches.saturating_sub(earlier.batches),
            requests: self.requests.saturating_sub(earlier.requests),
        }
    }
}

/// What each group-commit lane of a store sent so far ([`PgStore::batch_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Journal appends and completions (`keiro_journal_append_batch`).
    pub appends: LaneStats,
    /// Starts (`keiro_instances_start`).
    pub starts: LaneStats,
    /// Direct starts, leased to their callers (`keiro_instances_start_claimed`).
    pub direct_starts: LaneStats,
    /// Parks with their remote dispatches (`keiro_instances_park_dispatch`).
    pub parks: LaneStats,
}

impl BatchStats {
    /// What was sent between `earlier` and `self` (two reads of the same store).
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            appends: self.appends.since(&earlier.appends),
            starts: self.starts.since(&earlier.starts),
            direct_starts: self.direct_starts.since(&earlier.direct_starts),
            parks: self.parks.since(&earlier.parks),
        }
    }
}

impl<T: Batched> Lane<T> {
    /// Sends `request` through this lane of `store`, or alone when the store does not batch.
    pub(crate) async fn call(&self, store: &PgStore, request: T) -> Result<T::Output> {
        if !store.batching() || !request.batchable() {
            return T::send_one(store, &request, None).await;
        }
        let idle = self.with_batcher(store, Batcher::try_slot);
        if let Some(slot) = idle {
            self.counters.count(1);
            return send_idle(store, &request, slot).await;
        }
        let (reply, outcome) = oneshot::channel();
        // Taken only while store spans are on: a clone of the current span is not free, and
        // the link is all it is for.
        let caller = if tracing::enabled!(target: STORE_SPAN_TARGET, tracing::Level::DEBUG) {
            tracing::Span::current()
        } else {
            tracing::Span::none()
        };
        let waiting = Waiting {
            request,
            reply,
            caller,
        };
        let pushed = self.with_batcher(store, |batcher| batcher.push(waiting));
        match pushed {
            Ok(()) => outcome.await.unwrap_or_else(|_| {
                // The loop dropped the request unanswered: its runtime is shutting down. The
                // batch may or may not have committed; the caller retries as after any
                // dropped connection.
                Err(StoreError::Unavailable {
                    operation: T::OPERATION,
                    source: "the store's batching task stopped before answering".into(),
                })
            }),
            Err(waiting) => T::send_one(store, &waiting.request, None).await,
        }
    }

    /// Runs `f` on the lane's loop, started first if it is not running.
    fn with_batcher<O>(&self, store: &PgStore, f: impl FnOnce(&Batcher<Waiting<T>>) -> O) -> O {
        let mut batcher = self
            .batcher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let batcher = match batcher.as_ref() {
            Some(running) if !running.is_closed() => running,
            _ => {
                let slots = T::SHARES_APPEND_SLOTS.then(|| append_slots(store));
                batcher.insert(spawn(store, slots, self.counters.clone()))
            }
        };
        f(batcher)
    }
}

/// A request that found its lane idle, sent by its caller at once, alone, holding the lane's
/// slot: the requests that arrive meanwhile queue for the next batch, and this one costs what
/// it would without batching (no hop through the lane's task). Its `keiro.store.batch` span
/// (of length 1) follows from the caller's span, as a batch's does.
async fn send_idle<T: Batched>(store: &PgStore, request: &T, slot: Slot) -> Result<T::Output> {
    let span = store_span!(
        "batch",
        keiro.store.operation = T::NAME,
        keiro.store.batch_len = 1_usize
    );
    if !span.is_disabled() {
        span.follows_from(tracing::Span::current());
    }
    let hold = SlotHold::new(slot);
    let outcome = T::send_one(store, request, Some(&hold))
        .instrument(span)
        .await;
    hold.release();
    outcome
}

/// The append lane's slots, started first if it is not running.
fn append_slots(store: &PgStore) -> SharedSlots {
    store.lanes().appends.with_batcher(store, Batcher::slots)
}

/// Starts a lane's loop, with slots of its own or taking them from `slots`; it stops when the
/// last clone of the store is dropped.
fn spawn<T: Batched>(
    store: &PgStore,
    slots: Option<SharedSlots>,
    counters: Arc<LaneCounters>,
) -> Batcher<Waiting<T>> {
    let limits = store.batch_limits();
    let store = store.downgrade();
    let send = move |batch: Vec<Waiting<T>>, slot| {
        let store = store.upgrade()?;
        counters.count(batch.len());
        Some(async move { send(&store, batch, slot).await })
    };
    match slots {
        Some(slots) => Batcher::spawn_with_slots(slots, limits, send),
        None => Batcher::spawn(limits, send),
    }
}

/// Sends one batch in a `keiro.store.batch` span of its own, which follows from the span of
/// each call it carries: the batch runs in the lane's task, apart from every caller, and one
/// commit serves them all.
async fn send<T: Batched>(store: &PgStore, batch: Vec<Waiting<T>>, slot: Slot) {
    let span = store_span!(
        "batch",
        keiro.store.operation = T::NAME,
        keiro.store.batch_len = batch.len()
    );
    if !span.is_disabled() {
        for waiting in &batch {
            span.follows_from(&waiting.caller);
        }
    }
    let (requests, replies): (Vec<T>, Vec<_>) =
        batch.into_iter().map(|w| (w.request, w.reply)).unzip();
    send_batch(store, requests, replies, slot)
        .instrument(span)
        .await;
}

/// Sends one batch and answers each request; a batch that fails as a whole is sent again
/// request by request.
async fn send_batch<T: Batched>(
    store: &PgStore,
    requests: Vec<T>,
    replies: Vec<oneshot::Sender<Result<T::Output>>>,
    slot: Slot,
) {
    let hold = SlotHold::new(slot);
    if let [request] = requests.as_slice() {
        // A lone request: the lane was idle when it came, so nobody is waiting to join its
        // caller's next one. The slot goes before the answer, which that next request then
        // finds free, as it would without batching.
        let outcome = T::send_one(store, request, Some(&hold)).await;
        hold.release();
        if let Some(reply) = replies.into_iter().next() {
            let _ = reply.send(outcome);
        }
        return;
    }
    send_many(store, requests, replies, &hold).await;
    // The answered callers run on this runtime: turns for them to queue what they do next
    // before the slot frees, so that it leaves as one batch rather than a lone first request
    // and the rest behind it.
    linger(|| hold.queued(), tokio::task::yield_now).await;
    hold.release();
}

/// Quiet turns after which a batch's callers count as done asking again.
const LINGER_QUIET_TURNS: usize = 3;

/// Turns a batch keeps its slot after its answers, at most, however long its callers keep
/// asking (a steady stream queues for the next batch anyway).
const LINGER_TURNS_MAX: usize = 64;

/// Takes turns of the runtime (`turn`) while the answered callers are still asking again:
/// until [`LINGER_QUIET_TURNS`] turns in a row brought nothing new to the lane (`queued`), at
/// most [`LINGER_TURNS_MAX`]; returns the turns taken. What an answer sets off takes a few
/// hops (a finished run's task ends, its worker starts the next run, that run asks for its
/// first step), and a slot given back on the first quiet turn sent the first of them alone,
/// holding up the rest for a whole round: measured, one append batch in seven at K=100 carried
/// a single request (BENCHMARKS.md, "Issue 15, stop 15").
async fn linger<F: Future<Output = ()>>(
    queued: impl Fn() -> usize,
    mut turn: impl FnMut() -> F,
) -> usize {
    let (mut seen, mut quiet) = (queued(), 0);
    for taken in 1..=LINGER_TURNS_MAX {
        turn().await;
        let now = queued();
        if now == seen {
            quiet += 1;
            if quiet == LINGER_QUIET_TURNS {
                return taken;
            }
        } else {
            (seen, quiet) = (now, 0);
        }
    }
    LINGER_TURNS_MAX
}

/// Sends a batch of several requests while it holds its slot, and answers each.
async fn send_many<T: Batched>(
    store: &PgStore,
    requests: Vec<T>,
    replies: Vec<oneshot::Sender<Result<T::Output>>>,
    hold: &SlotHold,
) {
    match T::send_many(store, &requests, Some(hold)).await {
        Ok(outcomes) if outcomes.len() == requests.len() => {
            let mut left = Vec::new();
            for ((request, reply), outcome) in requests.iter().zip(replies).zip(outcomes) {
                match outcome {
                    Some(outcome) => {
                        let _ = reply.send(outcome);
                    }
                    None => left.push((request, reply)),
                }
            }
            alone(store, left, hold).await;
            return;
        }
        Ok(outcomes) => {
            tracing::warn!(
                operation = T::OPERATION,
                requests = requests.len(),
                outcomes = outcomes.len(),
                "a batch answered the wrong number of outcomes; sending one by one"
            );
        }
        Err(error) => {
            tracing::Span::current().record("error", tracing::field::display(&error));
            tracing::debug!(
                operation = T::OPERATION,
                %error,
                requests = requests.len(),
                "a batch failed as a whole; sending one by one"
            );
        }
    }
    alone(store, requests.iter().zip(replies).collect(), hold).await;
}

/// Sends each request alone, all at once (they come from independent callers, so none waits
/// behind another, as without batching), and answers each. They go with the batch's slot: one
/// kept waiting (a row another transaction holds, which a batch answers as busy) gives the
/// slot back after `SLOT_HOLD_MAX` (crates/postgres/src/store.rs), so the lane's next batch
/// never waits for that transaction.
async fn alone<T: Batched>(
    store: &PgStore,
    requests: Vec<(&T, oneshot::Sender<Result<T::Output>>)>,
    hold: &SlotHold,
) {
    futures_util::future::join_all(requests.into_iter().map(|(request, reply)| async move {
        let _ = reply.send(T::send_one(store, request, Some(hold)).await);
    }))
    .await;
}

/// A 1-based array position, as the batch functions number their requests.
pub(crate) fn position(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Places the outcome rows of a batch function (each naming its request's 1-based position in
/// `n_column`) in the batch's order; `outcome` reads one row (`None`: the request is to be
/// sent alone), and a request with no row gets a malformed-data error.
pub(crate) fn in_batch_order<O>(
    rows: &[tokio_postgres::Row],
    len: usize,
    operation: &'static str,
    n_column: &str,
    mut outcome: impl FnMut(&tokio_postgres::Row, usize) -> Option<Result<O>>,
) -> Vec<Option<Result<O>>> {
    let mut outcomes: Vec<Option<Option<Result<O>>>> = (0..len).map(|_| None).collect();
    for row in rows {
        let at = crate::row::column::<i32>(row, n_column, operation)
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|n| n.checked_sub(1))
            .filter(|&i| i < len);
        if let Some(i) = at {
            outcomes[i] = Some(outcome(row, i));
        }
    }
    outcomes
        .into_iter()
        .map(|o| {
            o.unwrap_or_else(|| {
                Some(Err(crate::row::malformed(
                    operation,
                    "no outcome for this request of the batch",
                )))
            })
        })
        .collect()
}

/// The store's lanes, one per batched operation.
#[derive(Default)]
pub(crate) struct Lanes {
    /// Parks with their remote dispatches (`keiro_instances_park_dispatch`).
    pub(crate) parks: Lane<crate::park_batch::ParkRequest>,
    /// Journal appends (`keiro_journal_append_batch`).
    pub(crate) appends: Lane<crate::append_lane::AppendRequest>,
    /// Instance starts (`keiro_instances_start`).
    pub(crate) starts: Lane<keiro_journal::StartRequest>,
    /// Direct starts, leased to their callers (`keiro_instances_start_claimed`).
    pub(crate) direct_starts: Lane<crate::start_claimed::StartClaimedRequest>,
}

impl Lanes {
    /// What each lane sent so far.
    pub(crate) fn stats(&self) -> BatchStats {
        BatchStats {
            appends: self.appends.counters.read(),
            starts: self.starts.counters.read(),
            direct_starts: self.direct_starts.counters.read(),
            parks: self.parks.counters.read(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// `linger` over a scripted queue: the count the lane shows after each turn.
    async fn turns_taken(script: &[usize]) -> usize {
        let at = Cell::new(0usize);
        let queued = || script[at.get().min(script.len() - 1)];
        linger(queued, || {
            at.set(at.get() + 1);
            std::future::ready(())
        })
        .await
    }

    #[tokio::test]
    async fn nobody_asking_again_frees_the_slot_after_the_quiet_turns() {
        assert_eq!(turns_taken(&[0]).await, LINGER_QUIET_TURNS);
    }

    #[tokio::test]
    async fn callers_still_coming_keep_the_slot_until_they_stop() {
        // Before the first turn 0; then 2, 2, 9 and 16 came, and nothing more.
        let script = [0, 2, 2, 9, 16, 16, 16, 16, 16, 16];
        assert_eq!(turns_taken(&script).await, 4 + LINGER_QUIET_TURNS);
    }

    #[tokio::test]
    async fn a_steady_stream_keeps_the_slot_no_longer_than_the_cap() {
        let script: Vec<usize> = (0..=LINGER_TURNS_MAX * 2).collect();
        assert_eq!(turns_taken(&script).await, LINGER_TURNS_MAX);
    }
}
