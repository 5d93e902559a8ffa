//! [`SqliteStore`]: the handle, its writer and readers, and its clock. Its operations, grouped
//! as the store traits group them, are in `journal.rs` (instances, the journal, deliveries),
//! `timer.rs`, `sources.rs`, `remote.rs`, `admin.rs`, `lease.rs`, `queue.rs`, `inspect.rs`,
//! `retention.rs` and `schedule.rs`; each turns a rule's outcome into the traits' outcome or
//! error.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keiro_journal::store::{Error as StoreError, Result};
use keiro_journal::InstanceKey;
use rusqlite::Connection;
use time::OffsetDateTime;

use crate::clock::Clock;
use crate::config::{Config, Synchronous};
use crate::error;
use crate::notify::Hub;
use crate::open;
use crate::row;
use crate::temporary::TempDir;
use crate::writer::Writer;

mod admin;
mod attribute;
mod inspect;
mod journal;
mod lease;
mod message;
mod notify;
mod payloads;
mod queue;
mod remote;
mod retention;
mod schedule;
mod sources;
mod timer;
mod traits;
mod transport;
mod update;
mod versions;

/// The longest span the store adds to an instant, in milliseconds: the Postgres store's bound
/// (100 years), so both stores cut the same `Duration::MAX`.
const SPAN_MS_MAX: i64 = 100 * 366 * 24 * 60 * 60 * 1000;

/// A span in milliseconds, as the plpgsql rules take it.
pub(crate) fn span_ms(span: Duration) -> i64 {
    i64::try_from(span.as_millis()).map_or(SPAN_MS_MAX, |ms| ms.min(SPAN_MS_MAX))
}

/// keiro's store on one SQLite file. Cheap to clone: clones share the writer, the readers, the
/// clock and the notifications. The writer and notification poller threads stop when the last
/// clone is dropped.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    path: PathBuf,
    config: Config,
    clock: Clock,
    pub(crate) writer: Writer,
    /// Idle read connections.
    readers: Mutex<Vec<Connection>>,
    /// The notifications' broadcast and result waiters, and the poller's stop signal.
    pub(crate) notify: Hub,
    /// Set while a retention batch of this store is queued or running (`store/retention.rs`).
    collecting: AtomicBool,
    /// The directory of a [`SqliteStore::temporary`] store, removed with it. Last, so the
    /// connections above close first.
    _temporary: Option<TempDir>,
}

pub(crate) fn not_found(key: &InstanceKey) -> StoreError {
    StoreError::NotFound { key: key.clone() }
}

pub(crate) fn lease_lost(key: &InstanceKey, owner: &str, epoch: i64) -> StoreError {
    StoreError::LeaseLost {
        key: key.clone(),
        owner: owner.to_owned(),
        epoch,
    }
}

impl SqliteStore {
    /// Opens the database file at `path`, creating it if needed: refuses a directory, a file
    /// that is not a SQLite database, a read-only file and a file migrated by a newer keiro;
    /// sets WAL mode, the synchronous level of `config` (FULL unless opted out), the busy
    /// timeout and foreign keys, and reads each back; applies pending migrations.
    ///
    /// # Errors
    ///
    /// The [`Error`](crate::Error) naming what was refused.
    pub fn open(path: impl AsRef<Path>, config: Config) -> crate::Result<Self> {
        Self::open_in(path.as_ref(), config, None)
    }

    /// A store on a new file in a new directory under the system's temporary directory, both
    /// removed when the last clone of the store is dropped: for tests, examples and scratch
    /// runs, where a real file (WAL, locks, several connections) behaves as in production but
    /// nothing is kept. Commits are [`Synchronous::NormalLosesCommitsOnPowerLoss`], since a
    /// power loss loses the directory's purpose anyway.
    ///
    /// ```
    /// let store = keiro_sqlite::SqliteStore::temporary()?;
    /// let dir = store.path().parent().map(std::path::Path::to_path_buf);
    /// assert!(store.path().exists());
    /// drop(store);
    /// assert!(!dir.is_some_and(|dir| dir.exists()));
    /// # Ok::<_, keiro_sqlite::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::TemporaryDirectory`](crate::Error::TemporaryDirectory) when the directory cannot be made; otherwise as
    /// [`open`](Self::open).
    pub fn temporary() -> crate::Result<Self> {
        let dir = TempDir::new().map_err(|source| crate::Error::TemporaryDirectory {
            path: std::env::temp_dir(),
            source,
        })?;
        let config = Config {
            synchronous: Synchronous::NormalLosesCommitsOnPowerLoss,
            ..Config::default()
        };
        let path = dir.path().join("keiro.db");
        Self::open_in(&path, config, Some(dir))
    }

    fn open_in(path: &Path, config: Config, temporary: Option<TempDir>) -> crate::Result<Self> {
        config.validate()?;
        let clock = Clock::default();
        let conn = open::writer(path, &config, row::micros(clock.now()))?;
        let reader = open::reader(path, &config)?;
        let notify = Hub::start(path, &config)?;
        let writer = Writer::start(
            conn,
            clock.clone(),
            config.batch_max,
            "keiro-sqlite-writer".into(),
            notify.outlets().clone(),
        )
        .map_err(|source| crate::Error::Thread {
            path: open::owned(path),
            source,
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                path: open::owned(path),
                config,
                clock,
                writer,
                readers: Mutex::new(vec![reader]),
                notify,
                collecting: AtomicBool::new(false),
                _temporary: temporary,
            }),
        })
    }

    /// The database file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Pins the store's clock at `at` (every operation then reads that instant), or lets it run
    /// again with `None`. For tests: leases, backoff gates and wake times are judged on it.
    pub fn pin_clock(&self, at: Option<OffsetDateTime>) {
        self.inner.clock.pin(at);
    }

    /// Moves the store's clock `by` ahead (a pinned one too). For tests.
    pub fn advance_clock(&self, by: Duration) {
        self.inner.clock.advance(by);
    }

    /// Sets how far the store's running clock is from the wall clock (negative: behind it),
    /// replacing what [`advance_clock`](Self::advance_clock) added. For tests: a worker whose
    /// clock disagrees with its store's.
    pub fn set_clock_offset(&self, offset: time::Duration) {
        self.inner.clock.set_offset(offset);
    }

    /// How many write transactions this store's writer committed since it opened: with
    /// [`SqliteStore`]'s group commit, fewer than the write operations it answered.
    pub fn commits(&self) -> u64 {
        self.inner.writer.commits()
    }

    /// The store's clock now.
    pub fn now(&self) -> OffsetDateTime {
        self.inner.clock.now()
    }

    /// Runs `read` on a read connection, in one read transaction (one snapshot), off the
    /// async runtime.
    pub(crate) async fn read<T, F>(&self, operation: &'static str, read: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, OffsetDateTime) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let now = inner.clock.now();
        let joined = tokio::task::spawn_blocking(move || {
            let idle = inner
                .readers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            let conn = match idle {
                Some(conn) => conn,
                None => open::reader(&inner.path, &inner.config).map_err(|e| {
                    StoreError::Unavailable {
                        operation,
                        source: Box::new(e),
                    }
                })?,
            };
            conn.execute_batch("BEGIN")
                .map_err(|e| error::store(operation, e))?;
            let answer = read(&conn, now);
            // A read transaction writes nothing; ending it only frees its snapshot.
            let ended = conn.execute_batch("COMMIT");
            if ended.is_ok() {
                let mut idle = inner.readers.lock().unwrap_or_else(PoisonError::into_inner);
                if idle.len() < inner.config.readers {
                    idle.push(conn);
                }
            }
            answer
        })
        .await;
        joined.map_err(|e| StoreError::Unavailable {
            operation,
            source: Box::new(e),
        })?
    }
}

/// Awaits every future, answers in order. The writer batches whatever is queued together, so
/// futures polled together share a commit.
pub(crate) async fn join_all<T, F: std::future::Future<Output = T>>(
    futures: impl Iterator<Item = F>,
) -> Vec<T> {
    let futures: Vec<_> = futures.map(Box::pin).collect();
    let mut answers = Vec::with_capacity(futures.len());
    // Each `write` queues its job on its first poll; polling them in turn queues every job
    // before the first answer is awaited.
    let mut pending: Vec<_> = futures.into_iter().map(Some).collect();
    let mut results: Vec<Option<T>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (slot, result) in pending.iter_mut().zip(results.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(answer) => {
                        *result = Some(answer);
                        *slot = None;
                    }
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    answers.extend(results.into_iter().flatten());
    answers
}
