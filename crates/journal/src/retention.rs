//! Retention: deleting terminal instances once they are older than a window, with everything
//! that belongs to them, in bounded batches.
//!
//! What may go (the rule both stores apply, and re-check under the instance row's lock):
//!
//! - the instance is terminal (`completed`, `failed`, `cancelled`) and went terminal before
//!   the cutoff (`now - older_than`);
//! - it has no parent row, or its parent is terminal and past the cutoff too: a live parent
//!   may still read the child's result (and a requeue of a recent failed parent cascades to
//!   its failed child);
//! - no child names it any more: a tree goes leaves first (in one batch when it fits), so no
//!   child is ever left naming a deleted parent, even when the parent finished first (a child
//!   it did not wait for) or a grandchild still runs.
//!
//! Deleting an instance deletes its journal, timers, awakeables, signal waits and remote
//! tasks with it. Buffered signals belong to a token, not an instance, and keep their own TTL.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::store::contract::Result;

/// Instances one batch deletes at most when not told otherwise. Defaults to 500.
pub const GC_BATCH_DEFAULT: u32 = 500;
/// The largest batch: one batch is one short transaction.
pub const GC_BATCH_MAX: u32 = 10_000;

/// One batch's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcRequest {
    /// Terminal for at least this long.
    pub older_than: Duration,
    /// At most this many instances, 1 to [`GC_BATCH_MAX`]. Defaults to [`GC_BATCH_DEFAULT`].
    pub batch: u32,
    /// "now" for the cutoff; `None`: the store's clock (the database's, for Postgres).
    pub now: Option<OffsetDateTime>,
}

impl GcRequest {
    /// A request for instances terminal for at least `older_than`, in default batches.
    pub fn new(older_than: Duration) -> Self {
        Self {
            older_than,
            batch: GC_BATCH_DEFAULT,
            now: None,
        }
    }

    /// The cutoff at `now`: instances that went terminal strictly before it may go.
    pub fn cutoff(&self, now: OffsetDateTime) -> OffsetDateTime {
        let window = time::Duration::try_from(self.older_than).unwrap_or(time::Duration::MAX);
        now.checked_sub(window)
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    /// The batch size bounded to `1..=GC_BATCH_MAX`.
    pub fn batch_bounded(&self) -> u32 {
        self.batch.clamp(1, GC_BATCH_MAX)
    }
}

/// What one batch deleted, table by table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcBatch {
    /// Instance rows.
    pub instances: u64,
    /// Journal rows.
    pub journal: u64,
    /// Timers.
    pub timers: u64,
    /// Awakeables.
    pub awakeables: u64,
    /// Registered signal waits.
    pub signal_waiters: u64,
    /// Remote tasks.
    pub remote_tasks: u64,
    /// `true` when another collector held the retention lock, so this batch did nothing.
    pub locked_out: bool,
}

impl GcBatch {
    /// Rows deleted in every table together.
    pub fn rows(&self) -> u64 {
        self.instances
            + self.journal
            + self.timers
            + self.awakeables
            + self.signal_waiters
            + self.remote_tasks
    }
}

impl std::ops::AddAssign for GcBatch {
    fn add_assign(&mut self, other: Self) {
        self.instances += other.instances;
        self.journal += other.journal;
        self.timers += other.timers;
        self.awakeables += other.awakeables;
        self.signal_waiters += other.signal_waiters;
        self.remote_tasks += other.remote_tasks;
        self.locked_out |= other.locked_out;
    }
}

/// The store operations behind retention.
#[async_trait::async_trait]
pub trait RetentionStore: Send + Sync + fmt::Debug + 'static {
    /// Deletes one batch of eligible instances (the rule is in this module's docs) with
    /// everything they own, in one short transaction. At most one batch runs at a time per
    /// store: a batch that finds another running returns at once with `locked_out`. A batch
    /// that deleted fewer than `request.batch` instances found no more (at that moment).
    async fn instances_gc(&self, request: &GcRequest) -> Result<GcBatch>;

    /// How many instances a collection with `request`'s window would delete now, without
    /// deleting any (a dry run). `request.batch` is ignored.
    async fn instances_gc_eligible(&self, request: &GcRequest) -> Result<u64>;
}
