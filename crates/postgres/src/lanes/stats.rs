//! What a group-commit lane counts as its batches leave: how many, how full, and where their
//! callers' time went (in the queue, in the statement, in the hand-off back), as sums of
//! `Instant` differences in atomics. A few clock reads a call, no allocation and no lock: cheap
//! enough to stay on in production, so a bench reads them from the store it measured
//! ([`PgStore::batch_stats`](crate::PgStore::batch_stats)).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Batches a lane cut, the requests they carried, and the time spent on them, counted as they
/// leave and as they are answered.
#[derive(Debug, Default)]
pub(super) struct LaneCounters {
    batches: AtomicU64,
    requests: AtomicU64,
    /// Σ over requests: joining the queue to their batch leaving.
    queued_ns: AtomicU64,
    /// Σ over batches: the statement's round trip.
    statement_ns: AtomicU64,
    /// Σ over requests: their batch's statement round trip.
    request_statement_ns: AtomicU64,
    /// Σ over calls: the call to its answer in the caller's hands.
    call_ns: AtomicU64,
    /// Σ over batches: the time they held a slot of the lane.
    pub(super) slot_ns: AtomicU64,
}

/// Adds `elapsed` to a nanosecond sum.
pub(super) fn add_nanos(sum: &AtomicU64, elapsed: Duration) {
    sum.fetch_add(
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

impl LaneCounters {
    /// A batch of `requests` leaves, after they waited `queued` in all.
    pub(super) fn count(&self, requests: usize, queued: Duration) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(
            u64::try_from(requests).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        add_nanos(&self.queued_ns, queued);
    }

    /// A batch's statement (with any request of it sent again alone) took `elapsed` for
    /// `requests` callers.
    pub(super) fn statement(&self, requests: usize, elapsed: Duration) {
        add_nanos(&self.statement_ns, elapsed);
        add_nanos(
            &self.request_statement_ns,
            elapsed.saturating_mul(u32::try_from(requests).unwrap_or(u32::MAX)),
        );
    }

    /// A call through the lane was answered `elapsed` after it was made.
    pub(super) fn call(&self, elapsed: Duration) {
        add_nanos(&self.call_ns, elapsed);
    }

    pub(super) fn read(&self) -> LaneStats {
        let load = |sum: &AtomicU64| sum.load(Ordering::Relaxed);
        LaneStats {
            batches: load(&self.batches),
            requests: load(&self.requests),
            queued_ns: load(&self.queued_ns),
            statement_ns: load(&self.statement_ns),
            request_statement_ns: load(&self.request_statement_ns),
            call_ns: load(&self.call_ns),
            slot_ns: load(&self.slot_ns),
        }
    }
}

/// What one group-commit lane sent: each batch is one statement and one commit, so
/// `requests / batches` is how many calls shared a commit on average. A call sent by itself
/// because its lane was idle counts as a batch of one; calls made with batching off, or of a
/// kind a lane never carries, are not counted.
///
/// The time sums say where a call's time went: `queued_ns` waiting for its batch to leave
/// (behind the batch holding the lane's slot), `request_statement_ns` in its batch's statement
/// (the round trip: the server's execution, the commit and its WAL flush, the wire), and the
/// rest of `call_ns` in the hand-off (the lane's task cutting the batch, the answer reaching
/// the caller's task). `statement_ns` and `slot_ns` are per batch: over the length of a
/// measured phase they are the mean number of the lane's statements in flight and of its slots
/// held (a slot is held from the batch leaving until its callers have asked again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneStats {
    /// Batches sent (statements, each in a transaction of its own).
    pub batches: u64,
    /// Calls those batches carried.
    pub requests: u64,
    /// Nanoseconds the calls waited in the lane's queue before their batch left, summed over
    /// the calls (0 for a call that found its lane idle).
    pub queued_ns: u64,
    /// Nanoseconds the batches' statements took, from sending to every outcome back, summed
    /// over the batches.
    pub statement_ns: u64,
    /// The same, summed over the calls: each call counts its batch's statement.
    pub request_statement_ns: u64,
    /// Nanoseconds from each call to its answer in the caller's hands, summed over the calls.
    pub call_ns: u64,
    /// Nanoseconds the batches held a slot of the lane, summed over the batches.
    pub slot_ns: u64,
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
            queued_ns: self.queued_ns.saturating_sub(earlier.queued_ns),
            statement_ns: self.statement_ns.saturating_sub(earlier.statement_ns),
            request_statement_ns: self
                .request_statement_ns
                .saturating_sub(earlier.request_statement_ns),
            call_ns: self.call_ns.saturating_sub(earlier.call_ns),
            slot_ns: self.slot_ns.saturating_sub(earlier.slot_ns),
        }
    }

    /// Where a call's time went on average: in the queue, in its batch's statement, and in
    /// the hand-off (the rest of the call); `None` before the first call.
    #[must_use]
    pub fn per_call(&self) -> Option<CallTime> {
        let calls = u32::try_from(self.requests).ok().filter(|n| *n > 0)?;
        let mean = |sum: u64| Duration::from_nanos(sum) / calls;
        let (queued, statement, call) = (
            mean(self.queued_ns),
            mean(self.request_statement_ns),
            mean(self.call_ns),
        );
        Some(CallTime {
            queued,
            statement,
            hand_off: call.saturating_sub(queued + statement),
            call,
        })
    }

    /// The mean number of the lane's statements in flight, and of its slots held, over a phase
    /// of length `phase`; `None` for an empty phase.
    #[must_use]
    pub fn in_flight(&self, phase: Duration) -> Option<(f64, f64)> {
        let phase = u64::try_from(phase.as_nanos()).ok().filter(|n| *n > 0)?;
        #[allow(clippy::cast_precision_loss)] // a ratio; rounding is immaterial
        let share = |sum: u64| sum as f64 / phase as f64;
        Some((share(self.statement_ns), share(self.slot_ns)))
    }
}

/// Where a lane's calls spent their time, on average ([`LaneStats::per_call`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTime {
    /// Waiting in the lane's queue for the batch to leave.
    pub queued: Duration,
    /// In the batch's statement: execution, commit and WAL flush, the round trip.
    pub statement: Duration,
    /// The rest: the lane's task cutting the batch, the answer reaching the caller.
    pub hand_off: Duration,
    /// The whole call.
    pub call: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_splits_into_queue_statement_and_hand_off() {
        let counters = LaneCounters::default();
        // Two batches: one of three calls that queued 1 ms each and whose statement took
        // 2 ms; one of one call, alone on an idle lane, 1 ms.
        counters.count(3, Duration::from_millis(3));
        counters.statement(3, Duration::from_millis(2));
        counters.count(1, Duration::ZERO);
        counters.statement(1, Duration::from_millis(1));
        for call in [4, 4, 4, 2] {
            counters.call(Duration::from_millis(call));
        }
        counters
            .slot_ns
            .fetch_add(4_000_000, std::sync::atomic::Ordering::Relaxed);
        let stats = counters.read();
        assert_eq!(stats.mean_len(), Some(2.0));
        let per_call = stats.per_call().expect("calls were made");
        // Queue (3 + 0) / 4, statement (2 * 3 + 1) / 4, call 14 / 4.
        assert_eq!(per_call.queued, Duration::from_micros(750));
        assert_eq!(per_call.statement, Duration::from_micros(1750));
        assert_eq!(per_call.call, Duration::from_micros(3500));
        assert_eq!(per_call.hand_off, Duration::from_micros(1000));
        // 3 ms of statements and 4 ms of slots held over a 10 ms phase.
        let (statements, slots) = stats.in_flight(Duration::from_millis(10)).expect("a phase");
        assert!((statements - 0.3).abs() < 1e-9 && (slots - 0.4).abs() < 1e-9);
        assert_eq!(stats.since(&stats), LaneStats::default());
        assert_eq!(LaneStats::default().per_call(), None);
    }
}
