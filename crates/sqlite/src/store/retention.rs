//! [`SqliteStore`]'s retention (`RetentionStore`): one batch on the writer, the dry run's count
//! on a reader.
//!
//! At most one batch runs at a time. Across stores (processes) on one file, SQLite's write
//! lock gives that: a batch is one write transaction, and another store's batch waits for the
//! lock (up to the busy timeout, then `Unavailable`), then finds what the first left. Within
//! one store (and its clones), a second batch asked for while one is queued or running returns
//! at once with `locked_out`, as a second collector on Postgres does, instead of queueing
//! behind it on the writer.

use std::sync::atomic::{AtomicBool, Ordering};

use keiro_journal::store::Result;
use keiro_journal::{GcBatch, GcRequest};

use crate::retention;

use super::SqliteStore;

const GC: &str = "deleting expired instances";
const GC_ELIGIBLE: &str = "counting expired instances";

/// Holds a store's retention flag until dropped (the batch answered, or its caller gone).
struct Collecting<'a>(&'a AtomicBool);

impl<'a> Collecting<'a> {
    /// Takes the flag, or `None` when another batch holds it.
    fn take(flag: &'a AtomicBool) -> Option<Self> {
        flag.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Self(flag))
    }
}

impl Drop for Collecting<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl SqliteStore {
    /// Deletes one batch of expired instances with everything they own, in one transaction
    /// (`RetentionStore::instances_gc`); `locked_out` when another batch of this store is
    /// under way.
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed (nothing was deleted).
    pub async fn instances_gc(&self, request: &GcRequest) -> Result<GcBatch> {
        let Some(_collecting) = Collecting::take(&self.inner.collecting) else {
            return Ok(GcBatch {
                locked_out: true,
                ..GcBatch::default()
            });
        };
        let request = *request;
        self.inner
            .writer
            .write(GC, move |conn, now| {
                let cutoff = request.cutoff(request.now.unwrap_or(now));
                retention::instances_gc(conn, cutoff, request.batch_bounded())
            })
            .await
    }

    /// How many instances a collection with `request`'s window would delete now
    /// (`RetentionStore::instances_gc_eligible`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when a read connection cannot be opened.
    pub async fn instances_gc_eligible(&self, request: &GcRequest) -> Result<u64> {
        let request = *request;
        self.read(GC_ELIGIBLE, move |conn, now| {
            retention::instances_gc_eligible(conn, request.cutoff(request.now.unwrap_or(now)))
        })
        .await
    }
}
