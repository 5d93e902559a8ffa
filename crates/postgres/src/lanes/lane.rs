//! The group-commit lane: concurrent calls of one store operation share a statement and a
//! transaction. It is generic over the request ([`Batched`]); each batched operation's file in
//! `lanes/` says what its requests are and which statement carries them.
//!
//! A call pushes its request onto its lane, whose loop (keiro-journal's natural batching: no
//! timer, a lone call leaves at once) sends what has queued while the lane's earlier batch was
//! running as ONE call of a plpgsql function over arrays, which runs every request exactly as
//! the operation's own function would, in a stable order (the instances' keys), and answers
//! each with its own outcome. One statement and one commit, whose WAL flush PostgreSQL waits
//! for as always, serve the whole batch: nobody is answered before the batch is durable.
//!
//! The slot (one per lane by default, `Config::batch_in_flight`) is held until the batch's
//! commit is acknowledged and its callers are answered, and then for turns of the runtime
//! while the answered callers are still queueing what they do next (until three turns in a
//! row bring nothing new): runs that wait for one commit come back together, a few
//! microseconds apart, so the runs that shared a commit share the next one too, and so do the
//! runs a worker starts as those end. A batch is one statement in an implicit transaction: one
//! round trip, whose rows come once the commit is durable. A request that finds its lane idle
//! (a free slot, nothing queued) is sent by its caller at once, alone, holding the slot
//! meanwhile: it costs what a call without batching costs, with no hop through the lane's
//! task. A lane may take its slots from another lane's ([`Lane::call_on_slots_of`]), so that
//! two lanes whose callers are the same runs take turns instead of splitting them.
//!
//! A lane never waits long behind one batch: a batch still running after [`SLOT_HOLD_MAX`]
//! gives its slot back (it is waiting for a lock, most likely), and the append batch skips
//! instance rows other transactions hold (see `crates/migrations/functions/journal.sql`), so one caller's
//! long transaction delays the appends to its own instance only.
//!
//! A batch that fails as a whole rolled back entirely (a value PostgreSQL refuses aborts the
//! statement; so does a deadlock the server broke, or a dropped connection), and each of its
//! requests is then sent alone, so every caller gets exactly the answer a call of its own
//! would have given: the request holding the refused value is refused, the others land.
//! A request that was in a batch whose commit failed ambiguously is idempotent when sent
//! again (a recorded step answers `AlreadyPresent`, a start finds its row, a park re-arms).
//!
//! Why the slot covers the commit, and how these choices were measured:
//! docs/benchmarks-history.md ("Moved from the code").

use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use keiro_journal::store::Result;
use keiro_journal::{
    batch::BatchLimits, batch::Batcher, batch::SharedSlots, batch::Slot, span::STORE_SPAN_TARGET,
    store_span, InstanceKey, StoreError,
};
use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::stats::{add_nanos, LaneCounters, LaneStats};
use crate::db::Db;

/// The longest a group-commit batch keeps its lane's slot: far longer than a batch takes, short
/// enough that one kept waiting for a lock does not hold up the lane.
const SLOT_HOLD_MAX: Duration = Duration::from_millis(20);

/// An operation whose concurrent calls can share a statement.
pub(crate) trait Batched: Send + Sync + Sized + 'static {
    /// What one call answers when it succeeds.
    type Output: Send + 'static;

    /// The operation, for errors.
    const OPERATION: &'static str;

    /// The store operation whose calls the lane carries (`journal_append`): the
    /// `keiro.store.operation` of its batches' spans.
    const NAME: &'static str;

    /// Whether a request sent alone gives the lane's slot back when it is kept waiting
    /// ([`SLOT_HOLD_MAX`]); one that does not holds the slot to its end.
    const ALONE_GIVES_SLOT_BACK: bool = true;

    /// Whether this request may join a batch; one that may not is sent alone (an operation
    /// whose lock order a batch cannot keep, for instance).
    fn batchable(&self) -> bool {
        true
    }

    /// One statement for the whole batch, an outcome per request in the batch's order; `None`
    /// for a request the batch left alone (its row was held by another transaction), which
    /// is then sent alone. An error means the statement failed, so nothing of it was written.
    fn send_many(
        db: &Db,
        batch: &[Self],
    ) -> impl Future<Output = Result<Vec<Option<Result<Self::Output>>>>> + Send;

    /// The request alone, as the operation's own call.
    fn send_one(db: &Db, request: &Self) -> impl Future<Output = Result<Self::Output>> + Send;
}

/// One request waiting in a lane, with where its outcome goes.
struct Waiting<T: Batched> {
    request: T,
    reply: oneshot::Sender<Result<T::Output>>,
    /// The caller's span, which the span of the batch that carries the request follows from.
    caller: tracing::Span,
    /// When it joined the lane's queue.
    pushed: Instant,
}

/// A batch's hold on its lane's slot. The lane gives the slot back once the batch's commit is
/// acknowledged and its callers are answered (and have had a turn to ask again), so the
/// requests they make next leave together; a statement gives it back early when it is kept
/// waiting ([`in_slot`]), so the lane never waits behind a batch stuck on a lock.
struct SlotHold {
    slot: Mutex<Option<Slot>>,
    /// When the batch took the slot, and where the time it held it is counted.
    taken: Instant,
    counters: Arc<LaneCounters>,
}

impl SlotHold {
    fn new(slot: Slot, counters: &Arc<LaneCounters>) -> Self {
        Self {
            slot: Mutex::new(Some(slot)),
            taken: Instant::now(),
            counters: Arc::clone(counters),
        }
    }

    /// How many requests wait in the lane for the next batch (0 once the slot is back).
    fn queued(&self) -> usize {
        self.slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or(0, Slot::queued)
    }

    /// Gives the slot back now (once; later calls do nothing).
    fn release(&self) {
        let slot = self
            .slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if slot.is_some() {
            add_nanos(&self.counters.slot_ns, self.taken.elapsed());
        }
        drop(slot);
    }
}

/// The lane of one operation: its loop starts with the first call, and again if its runtime
/// went away (a store shared by several runtimes, as tests do).
pub(crate) struct Lane<T: Batched> {
    batcher: Mutex<Option<Batcher<Waiting<T>>>>,
    /// What the lane sent so far, shared with its loop.
    counters: Arc<LaneCounters>,
    /// Whether calls go through the lane ([`Config::batching`](crate::Config::batching)).
    batching: bool,
    /// How the lane cuts its batches.
    limits: BatchLimits,
}

/// Where a lane that does not have slots of its own takes them from.
type SlotsOf<'a> = Option<&'a (dyn Fn() -> SharedSlots + Sync)>;

impl<T: Batched> Lane<T> {
    /// A lane whose loop starts with its first call; with `batching` off every call is sent
    /// alone.
    pub(crate) fn new(batching: bool, limits: BatchLimits) -> Self {
        Self {
            batcher: Mutex::new(None),
            counters: Arc::default(),
            batching,
            limits,
        }
    }

    /// Whether calls go through the lane.
    pub(crate) fn batching(&self) -> bool {
        self.batching
    }

    /// What the lane sent so far.
    pub(crate) fn stats(&self) -> LaneStats {
        self.counters.read()
    }

    /// Sends `request` through this lane, or alone when the store does not batch.
    pub(crate) async fn call(&self, db: &Arc<Db>, request: T) -> Result<T::Output> {
        self.call_with(db, request, None).await
    }

    /// [`call`](Self::call) on a lane that takes its slots from `other`'s rather than having
    /// its own: for an operation whose callers go on to call `other` (a direct start, whose
    /// caller's steps follow), so the two lanes' batches take turns and the callers stay
    /// together.
    pub(crate) async fn call_on_slots_of<U: Batched>(
        &self,
        db: &Arc<Db>,
        request: T,
        other: &Lane<U>,
    ) -> Result<T::Output> {
        let slots = || other.with_batcher(db, None, Batcher::slots);
        self.call_with(db, request, Some(&slots)).await
    }

    async fn call_with(&self, db: &Arc<Db>, request: T, slots: SlotsOf<'_>) -> Result<T::Output> {
        if !self.batching || !request.batchable() {
            return T::send_one(db, &request).await;
        }
        let called = Instant::now();
        let idle = self.with_batcher(db, slots, Batcher::try_slot);
        if let Some(slot) = idle {
            self.counters.count(1, Duration::ZERO);
            let outcome = send_idle(db, &request, slot, &self.counters).await;
            self.counters.call(called.elapsed());
            return outcome;
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
            pushed: called,
        };
        let pushed = self.with_batcher(db, slots, |batcher| batcher.push(waiting));
        match pushed {
            Ok(()) => {
                let answer = outcome.await;
                self.counters.call(called.elapsed());
                answer.unwrap_or_else(|_| {
                    // The loop dropped the request unanswered: its runtime is shutting down. The
                    // batch may or may not have committed; the caller retries as after any
                    // dropped connection.
                    Err(StoreError::Unavailable {
                        operation: T::OPERATION,
                        source: "the store's batching task stopped before answering".into(),
                    })
                })
            }
            Err(waiting) => T::send_one(db, &waiting.request).await,
        }
    }

    /// Runs `f` on the lane's loop, started first (on slots of its own, or on `slots`) if it is
    /// not running.
    fn with_batcher<O>(
        &self,
        db: &Arc<Db>,
        slots: SlotsOf<'_>,
        f: impl FnOnce(&Batcher<Waiting<T>>) -> O,
    ) -> O {
        let mut batcher = self
            .batcher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let batcher = match batcher.as_ref() {
            Some(running) if !running.is_closed() => running,
            _ => {
                let slots = slots.map(|slots| slots());
                batcher.insert(spawn(db, self.limits, slots, self.counters.clone()))
            }
        };
        f(batcher)
    }
}

/// A request that found its lane idle, sent by its caller at once, alone, holding the lane's
/// slot: the requests that arrive meanwhile queue for the next batch, and this one costs what
/// it would without batching (no hop through the lane's task). Its `keiro.store.batch` span
/// (of length 1) follows from the caller's span, as a batch's does.
async fn send_idle<T: Batched>(
    db: &Db,
    request: &T,
    slot: Slot,
    counters: &Arc<LaneCounters>,
) -> Result<T::Output> {
    let span = store_span!(
        "batch",
        keiro.store.operation = T::NAME,
        keiro.store.batch_len = 1_usize
    );
    if !span.is_disabled() {
        span.follows_from(tracing::Span::current());
    }
    let hold = SlotHold::new(slot, counters);
    let outcome = alone_in_slot(db, request, &hold).instrument(span).await;
    counters.statement(1, hold.taken.elapsed());
    hold.release();
    outcome
}

/// Starts a lane's loop, with slots of its own or taking them from `slots`; it stops when the
/// last clone of the store is dropped.
fn spawn<T: Batched>(
    db: &Arc<Db>,
    limits: BatchLimits,
    slots: Option<SharedSlots>,
    counters: Arc<LaneCounters>,
) -> Batcher<Waiting<T>> {
    let db: Weak<Db> = Arc::downgrade(db);
    let send = move |batch: Vec<Waiting<T>>, slot| {
        let db = db.upgrade()?;
        let cut = Instant::now();
        let queued = batch.iter().map(|w| cut.duration_since(w.pushed)).sum();
        counters.count(batch.len(), queued);
        let counters = Arc::clone(&counters);
        Some(async move { send(&db, batch, slot, &counters).await })
    };
    match slots {
        Some(slots) => Batcher::spawn_with_slots(slots, limits, send),
        None => Batcher::spawn(limits, send),
    }
}

/// Sends one batch in a `keiro.store.batch` span of its own, which follows from the span of
/// each call it carries: the batch runs in the lane's task, apart from every caller, and one
/// commit serves them all.
async fn send<T: Batched>(
    db: &Db,
    batch: Vec<Waiting<T>>,
    slot: Slot,
    counters: &Arc<LaneCounters>,
) {
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
    send_batch(db, requests, replies, slot, counters)
        .instrument(span)
        .await;
}

/// Sends one batch and answers each request; a batch that fails as a whole is sent again
/// request by request.
async fn send_batch<T: Batched>(
    db: &Db,
    requests: Vec<T>,
    replies: Vec<oneshot::Sender<Result<T::Output>>>,
    slot: Slot,
    counters: &Arc<LaneCounters>,
) {
    let hold = SlotHold::new(slot, counters);
    if let [request] = requests.as_slice() {
        // A lone request: the lane was idle when it came, so nobody is waiting to join its
        // caller's next one. The slot goes before the answer, which that next request then
        // finds free, as it would without batching.
        let outcome = alone_in_slot(db, request, &hold).await;
        counters.statement(1, hold.taken.elapsed());
        hold.release();
        if let Some(reply) = replies.into_iter().next() {
            let _ = reply.send(outcome);
        }
        return;
    }
    let len = requests.len();
    send_many(db, requests, replies, &hold).await;
    counters.statement(len, hold.taken.elapsed());
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
/// first step), and a slot given back on the first quiet turn would send the first of them
/// alone, holding up the rest for a whole round.
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
    db: &Db,
    requests: Vec<T>,
    replies: Vec<oneshot::Sender<Result<T::Output>>>,
    hold: &SlotHold,
) {
    match in_slot(T::send_many(db, &requests), hold).await {
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
            alone(db, left, hold).await;
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
    alone(db, requests.iter().zip(replies).collect(), hold).await;
}

/// Sends each request alone, all at once (they come from independent callers, so none waits
/// behind another, as without batching), and answers each. They go with the batch's slot: one
/// kept waiting (a row another transaction holds, which a batch answers as busy) gives the
/// slot back after [`SLOT_HOLD_MAX`], so the lane's next batch never waits for that
/// transaction.
async fn alone<T: Batched>(
    db: &Db,
    requests: Vec<(&T, oneshot::Sender<Result<T::Output>>)>,
    hold: &SlotHold,
) {
    futures_util::future::join_all(requests.into_iter().map(|(request, reply)| async move {
        let _ = reply.send(alone_in_slot(db, request, hold).await);
    }))
    .await;
}

/// A request sent alone while its lane's slot is held: it gives the slot back if kept waiting,
/// unless its operation holds the slot to the end ([`Batched::ALONE_GIVES_SLOT_BACK`]).
async fn alone_in_slot<T: Batched>(db: &Db, request: &T, hold: &SlotHold) -> Result<T::Output> {
    if T::ALONE_GIVES_SLOT_BACK {
        in_slot(T::send_one(db, request), hold).await
    } else {
        T::send_one(db, request).await
    }
}

/// Runs `call`, a statement sent while its lane's slot is held, giving the slot back if it is
/// still running after [`SLOT_HOLD_MAX`]. The statement runs in an implicit transaction, whose
/// rows come once its commit is durable, so nobody is answered before; holding the slot until
/// then is what keeps a lane's callers together (an explicit `BEGIN` and `COMMIT` around it
/// would let the slot go before the commit, and cost two more statements a batch).
async fn in_slot<O>(call: impl Future<Output = O>, slot: &SlotHold) -> O {
    let mut call = std::pin::pin!(call);
    tokio::select! {
        done = &mut call => return done,
        () = tokio::time::sleep(SLOT_HOLD_MAX) => slot.release(),
    }
    call.await
}

/// Sends the requests at positions `pending` one at a time: those of one instance in their
/// order, the instances side by side, so none waits behind another instance's lock.
pub(super) async fn alone_by_instance<'a, O, Fut>(
    pending: &[usize],
    key: impl Fn(usize) -> &'a InstanceKey,
    send: impl Fn(usize) -> Fut,
) -> Vec<(usize, O)>
where
    Fut: Future<Output = O>,
{
    let mut by_instance: Vec<(&InstanceKey, Vec<usize>)> = Vec::new();
    for &i in pending {
        match by_instance.iter_mut().find(|(k, _)| *k == key(i)) {
            Some((_, at)) => at.push(i),
            None => by_instance.push((key(i), vec![i])),
        }
    }
    let send = &send;
    futures_util::future::join_all(by_instance.into_iter().map(|(_, at)| async move {
        let mut answers = Vec::with_capacity(at.len());
        for i in at {
            answers.push((i, send(i).await));
        }
        answers
    }))
    .await
    .into_iter()
    .flatten()
    .collect()
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
