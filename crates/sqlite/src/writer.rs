//! The one writer of a store: a thread that owns the write connection and drains queued
//! operations into one `BEGIN IMMEDIATE` transaction, a savepoint per operation (group commit,
//! as the Postgres store's append lane does across its connections).
//!
//! Why a thread: SQLite has one writer per file at a time anyway, so a pool of write
//! connections would only queue on the file lock (and a deferred transaction that upgrades
//! fails with "database is locked" at once, whatever the busy timeout). Queuing in-process
//! instead lets one fsync commit every operation that arrived while the previous commit ran.
//!
//! The rules of a batch:
//! - every operation runs inside `SAVEPOINT op`; one that fails is rolled back to it, so it
//!   leaves nothing, and the others are untouched (each gets the answer it would have had
//!   alone, given the operations before it in the queue);
//! - every caller is answered only after `COMMIT` returned, failed operations included (an
//!   answer may depend on what an earlier operation of the batch wrote);
//! - a commit that fails answers every operation of the batch with the commit's error
//!   (retryable: nothing of the batch was written);
//! - if SQLite rolled back the whole transaction itself (it does after some I/O errors, a full
//!   disk, an interrupt), the operations already run are answered with that error and the
//!   batch goes on in a new transaction.
//!
//! Another process's writer on the same file takes the file's write lock in turn: `BEGIN
//! IMMEDIATE` waits for it up to the busy timeout, then the batch fails as retryable.
//!
//! A committed batch publishes the notifications its operations wrote (the `notify` module),
//! after the `COMMIT` returned and before anyone is answered; a rolled-back one publishes
//! nothing.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use keiro_journal::store::{Error as StoreError, Result as StoreResult};
use rusqlite::Connection;
use time::OffsetDateTime;

use crate::cached::Cached;
use crate::clock::Clock;
use crate::notify::{self, Outlets};

/// A queued operation: runs once on the write connection, then is answered once the batch's
/// commit is known.
pub(crate) trait Job: Send {
    /// Runs the operation at `now` inside its savepoint; whether it succeeded.
    fn run(&mut self, conn: &Connection, now: OffsetDateTime) -> bool;
    /// Answers the caller: with the operation's own outcome if the batch committed (or the
    /// operation never reached it), with the commit's error otherwise.
    fn answer(self: Box<Self>, failed_commit: Option<&Arc<rusqlite::Error>>);
}

/// A [`Job`] for one typed operation.
struct Pending<T, F> {
    name: &'static str,
    operation: Option<F>,
    outcome: Option<StoreResult<T>>,
    answer: tokio::sync::oneshot::Sender<StoreResult<T>>,
}

impl<T, F> Job for Pending<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection, OffsetDateTime) -> StoreResult<T> + Send + 'static,
{
    fn run(&mut self, conn: &Connection, now: OffsetDateTime) -> bool {
        let outcome = self.operation.take().map(|operation| operation(conn, now));
        let ok = matches!(outcome, Some(Ok(_)));
        self.outcome = outcome;
        ok
    }

    fn answer(self: Box<Self>, failed_commit: Option<&Arc<rusqlite::Error>>) {
        let answer = match (failed_commit, self.outcome) {
            (Some(error), _) => Err(commit_failed(self.name, error)),
            (None, Some(outcome)) => outcome,
            (None, None) => Err(stopped(self.name)),
        };
        // A caller that stopped waiting does not want its answer.
        let _ = self.answer.send(answer);
    }
}

/// The handle callers queue operations on.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    queue: mpsc::Sender<Box<dyn Job>>,
    /// Transactions committed so far.
    commits: Arc<AtomicU64>,
}

impl Writer {
    /// Starts the writer thread on `conn`, publishing its commits' notifications to
    /// `outlets`.
    pub(crate) fn start(
        conn: Connection,
        clock: Clock,
        batch_max: usize,
        name: String,
        outlets: Outlets,
    ) -> std::io::Result<Self> {
        let (queue, jobs) = mpsc::channel::<Box<dyn Job>>();
        let commits = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&commits);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || drain(&conn, &clock, &jobs, batch_max, &counted, &outlets))?;
        Ok(Self { queue, commits })
    }

    /// How many transactions the writer committed.
    pub(crate) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Runs `operation` in the next batch and answers once that batch committed.
    pub(crate) async fn write<T, F>(&self, name: &'static str, operation: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, OffsetDateTime) -> StoreResult<T> + Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job = Box::new(Pending {
            name,
            operation: Some(operation),
            outcome: None,
            answer,
        });
        self.queue.send(job).map_err(|_| stopped(name))?;
        answered.await.map_err(|_| stopped(name))?
    }
}

/// The writer is gone (the store is closing, or an operation panicked on its thread).
fn stopped(operation: &'static str) -> StoreError {
    StoreError::Unavailable {
        operation,
        source: "the store's writer thread stopped".into(),
    }
}

/// The batch's commit (or its transaction) failed: nothing of the batch was written.
fn commit_failed(operation: &'static str, error: &Arc<rusqlite::Error>) -> StoreError {
    StoreError::Unavailable {
        operation,
        source: Box::new(Arc::clone(error)),
    }
}

/// The thread's loop: one batch per wake-up, until every handle is dropped.
fn drain(
    conn: &Connection,
    clock: &Clock,
    jobs: &mpsc::Receiver<Box<dyn Job>>,
    batch_max: usize,
    commits: &AtomicU64,
    outlets: &Outlets,
) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < batch_max {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        run_batch(conn, clock, batch, commits, outlets);
    }
}

/// Answers every job with `error`.
fn fail_all(jobs: Vec<Box<dyn Job>>, error: &Arc<rusqlite::Error>) {
    for job in jobs {
        job.answer(Some(error));
    }
}

/// Runs one batch: one transaction, a savepoint per job, then one commit, counted in `commits`
/// and published to `outlets` before anyone is answered.
fn run_batch(
    conn: &Connection,
    clock: &Clock,
    batch: Vec<Box<dyn Job>>,
    commits: &AtomicU64,
    outlets: &Outlets,
) {
    // Jobs run in the open transaction, waiting for its commit.
    let mut done: Vec<Box<dyn Job>> = Vec::with_capacity(batch.len());
    let mut open = false;
    // Where the open transaction's notifications start.
    let mut mark = None;
    for mut job in batch {
        if !open {
            if let Err(e) = conn.execute_cached("BEGIN IMMEDIATE", []).map(drop) {
                // Another process held the write lock past the busy timeout (or the file
                // failed): this job fails with that error, unrun; the next one tries again.
                job.answer(Some(&Arc::new(e)));
                continue;
            }
            open = true;
            mark = notify::mark(conn);
        }
        if let Err(e) = conn.execute_cached("SAVEPOINT op", []).map(drop) {
            job.answer(Some(&Arc::new(e)));
            continue;
        }
        let now = clock.now();
        // A panicking operation is a failed one: its savepoint is rolled back, and its caller
        // (whose answer was never set) learns the writer stopped for it.
        let ok = catch_unwind(AssertUnwindSafe(|| job.run(conn, now))).unwrap_or(false);
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back itself: the jobs run before are lost.
            let error = Arc::new(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                Some("the transaction was rolled back by SQLite".into()),
            ));
            fail_all(std::mem::take(&mut done), &error);
            if ok {
                job.answer(Some(&error));
            } else {
                job.answer(None);
            }
            open = false;
            continue;
        }
        let end = if ok {
            conn.execute_cached("RELEASE op", []).map(drop)
        } else {
            conn.execute_batch("ROLLBACK TO op; RELEASE op")
        };
        if let Err(e) = end {
            let error = Arc::new(e);
            let _ = conn.execute_batch("ROLLBACK");
            fail_all(std::mem::take(&mut done), &error);
            job.answer(Some(&error));
            open = false;
            continue;
        }
        done.push(job);
    }
    if !open {
        return;
    }
    let written = notify::written(conn, mark);
    // Noted as the writer's own before the commit, so the poller never reads them unnoted.
    let own = outlets.committing(written.as_deref());
    match conn.execute_cached("COMMIT", []).map(drop) {
        Ok(()) => {
            commits.fetch_add(1, Ordering::Relaxed);
            outlets.committed(written);
            for job in done {
                job.answer(None);
            }
        }
        Err(e) => {
            let error = Arc::new(e);
            let _ = conn.execute_batch("ROLLBACK");
            outlets.rolled_back(own);
            fail_all(done, &error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> Writer {
        let conn = Connection::open_in_memory().expect("opens");
        conn.execute_batch("CREATE TABLE t (v INTEGER PRIMARY KEY)")
            .expect("creates");
        Writer::start(
            conn,
            Clock::default(),
            64,
            "test-writer".into(),
            Outlets::new(),
        )
        .expect("starts")
    }

    fn insert(v: i64) -> impl FnOnce(&Connection, OffsetDateTime) -> StoreResult<usize> {
        move |conn, _| {
            conn.execute_cached("INSERT INTO t (v) VALUES (?1)", [v])
                .map_err(|e| crate::error::store("insert", e))
        }
    }

    fn count(writer: &Writer) -> impl std::future::Future<Output = StoreResult<i64>> + '_ {
        writer.write("count", |conn, _| {
            conn.query_row_cached("SELECT count(*) FROM t", [], |r| r.get(0))
                .map_err(|e| crate::error::store("count", e))
        })
    }

    #[tokio::test]
    async fn a_failed_operation_leaves_nothing_and_the_others_commit() {
        let writer = writer();
        let (a, failed, b) = tokio::join!(
            writer.write("insert", insert(1)),
            // Writes a row, then fails: its row is rolled back with its savepoint.
            writer.write("insert", |conn, now| {
                insert(2)(conn, now)?;
                insert(1)(conn, now)
            }),
            writer.write("insert", insert(3)),
        );
        assert_eq!(a.unwrap(), 1);
        assert!(failed.is_err());
        assert_eq!(b.unwrap(), 1);
        assert_eq!(count(&writer).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn a_panicking_operation_is_answered_as_a_stopped_writer_and_the_writer_goes_on() {
        let writer = writer();
        let (a, panicked) = tokio::join!(
            writer.write("insert", insert(1)),
            writer.write("panics", |conn, now| -> StoreResult<usize> {
                insert(2)(conn, now)?;
                panic!("a bug in a rule");
            }),
        );
        assert_eq!(a.unwrap(), 1);
        let err = panicked.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert_eq!(writer.write("insert", insert(3)).await.unwrap(), 1);
        assert_eq!(
            count(&writer).await.unwrap(),
            2,
            "the panicking write was undone"
        );
    }
}
