//! Push wake-ups: what the rules announce, how a commit publishes it in this process, and the
//! poller that hears other processes on the same file.
//!
//! # Design
//!
//! ```text
//!   rule (in the writer's transaction) ──► INSERT keiro_notifications (migration 0002)
//!                                                     │
//!        writer, after COMMIT ◄── rows of its batch ──┤
//!             │                                       │ other processes' commits
//!             ▼                                       ▼
//!   broadcast<Wake> + ClosedWaiters ◄── poller thread: PRAGMA data_version changed? read rows
//! ```
//!
//! Every rule writes, where its plpgsql twin calls `keiro_notify_wake`, `keiro_notify_timer` or
//! `keiro_notify_remote`, a row of the notification table; a trigger (the twin of
//! `workflows_notify_terminal`) writes `closed` at every terminal transition. The rows are part
//! of the operation's savepoint, so a refused or failed operation announces nothing, and part
//! of the batch's transaction, so a reader sees them only once committed.
//!
//! - **In this process**, the writer thread notes the highest row number when it opens a
//!   transaction, reads the rows above it just before `COMMIT` (it holds the write lock, so
//!   they are its own), and publishes them only once the `COMMIT` returned: nothing is acted on
//!   from a commit that is not durable. A failed commit publishes nothing.
//! - **Across processes**, each store runs a poller thread on a read connection of its own.
//!   Every [`Config::notify_poll_interval`](crate::Config::notify_poll_interval) it asks
//!   `PRAGMA data_version`, which changes only when another connection committed, and reads
//!   the new rows only then, so an idle file costs one cheap pragma per interval. Rows its own
//!   writer wrote are skipped (the writer notes them as its own before its `COMMIT`), so
//!   nothing is published twice.
//!
//! What is published is what the Postgres listener forwards: [`Wake::Instance`],
//! [`Wake::Timer`], [`Wake::Remote`] on one `tokio::sync::broadcast` that every
//! [`BroadcastWake`](keiro_resume::BroadcastWake) subscription filters, and `closed` rows to the
//! store's one [`ClosedWaiters`] registry, which wakes only the waiters of that instance. A
//! batch (a transaction, or a poll) is coalesced: one message per kind, one close per instance,
//! since a message carries no instance and a subscription drains a burst in one pass anyway.
//!
//! A notification only shortens a wait; the loops' fallback polls are what guarantee progress.
//! So when the poller fails to read, or finds that rows it never read were pruned (it fell more
//! than the table's 4096 rows behind), it publishes [`Wake::Reconnected`] and wakes every
//! result waiter, as the Postgres listener does when it (re)establishes `LISTEN`: poll now.
//!
//! # What one file on one host gives
//!
//! Stores (processes) on one file on one host's local filesystem hear each other's changes
//! within about one poll interval (plus the time to read the rows); within a process, at the
//! commit. SQLite's WAL shared memory, which `data_version` and the readers rely on, does not
//! work across hosts: a network filesystem is not supported, for notifications as for
//! locking. Processes on the same file are not told of each other beyond these rows: a process
//! that is stopped simply misses what was published meanwhile, and its loops' first pass finds
//! the work.
//!
//! The poller and the writer stop when the last handle of the store is dropped; a
//! subscription outliving its store then waits out its fallback, as a fixed poll does.

use crate::cached::Cached;
use std::collections::{HashSet, VecDeque};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::InstanceKey;
use keiro_resume::{ClosedWait, ClosedWaiters, WakeFilter, WakeMessage, WakeReason};
use rusqlite::{params, Connection};
use tokio::sync::broadcast;

use crate::config::Config;
use crate::error::store;
use crate::open;

/// How many messages a subscription may fall behind before older ones are dropped; a
/// subscription that lagged counts as notified, so nothing but precision is lost.
const WAKE_BUFFER_LEN: usize = 256;

/// The most rows the poller reads in one statement; it reads again while pages are full.
const PAGE: i64 = 512;

/// The most row ranges of its own writer a store remembers for its poller to skip; past it
/// the oldest is forgotten, and its rows are at worst published twice.
const OWN_RANGES_MAX: usize = 1024;

const NOTIFY_INSERT: &str =
    "INSERT INTO keiro_notifications (kind, workflow_name, workflow_id) VALUES (?1, ?2, ?3)";

const NOTIFY_MAX: &str = "SELECT coalesce(max(seq), 0) FROM keiro_notifications";

/// The newest number ever given, deleted rows included (what the poller starts after).
const NOTIFY_SEQUENCE: &str = "SELECT coalesce((SELECT seq FROM sqlite_sequence \
     WHERE name = 'keiro_notifications'), 0)";

const NOTIFY_SINCE: &str = "SELECT seq, kind, workflow_name, workflow_id \
     FROM keiro_notifications WHERE seq > ?1 ORDER BY seq LIMIT ?2";

/// keiro_notify_wake: instance `name`/`id` may be runnable. Part of the caller's savepoint.
pub(crate) fn wake(conn: &Connection, operation: &'static str, name: &str, id: &str) -> Result<()> {
    insert(conn, operation, "wake", Some((name, id)))
}

/// queue.sql's `queue/<queue>` wake: a run of `queue` may be admitted now (the queue was
/// resumed; migration 0003's trigger writes the same row when a slot is freed). Postgres
/// listeners read that payload as an instance's wake, so this is a `wake` row, named
/// `queue`/`<queue>`.
pub(crate) fn queue(conn: &Connection, operation: &'static str, queue: &str) -> Result<()> {
    insert(conn, operation, "wake", Some(("queue", queue)))
}

/// The prefix of the name of a `wake` row that announces an event or a stream write of an
/// instance (`keiro_notify_message`'s `msg:<name>/<id>`): no workflow name holds a `:`.
const MESSAGE_PREFIX: &str = "msg:";

/// keiro_notify_message: instance `name`/`id` set an event or wrote to a stream. A `wake` row
/// named `msg:<name>` (migration 0002's CHECK allows no other kind with an instance), which
/// is routed to the readers of that instance only.
pub(crate) fn message(
    conn: &Connection,
    operation: &'static str,
    name: &str,
    id: &str,
) -> Result<()> {
    let name = format!("{MESSAGE_PREFIX}{name}");
    insert(conn, operation, "wake", Some((name.as_str(), id)))
}

/// keiro_notify_timer: a timer was armed, so the earliest due time may have moved closer.
pub(crate) fn timer(conn: &Connection, operation: &'static str) -> Result<()> {
    insert(conn, operation, "timer", None)
}

/// keiro_notify_remote: a remote task became claimable.
pub(crate) fn remote(conn: &Connection, operation: &'static str) -> Result<()> {
    insert(conn, operation, "remote", None)
}

fn insert(
    conn: &Connection,
    operation: &'static str,
    kind: &str,
    key: Option<(&str, &str)>,
) -> Result<()> {
    conn.prepare_cached(NOTIFY_INSERT)
        .and_then(|mut s| s.execute(params![kind, key.map(|k| k.0), key.map(|k| k.1)]))
        .map(drop)
        .map_err(|e| store(operation, e))
}

/// One message of a store's wake broadcast, as the Postgres listener's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// An instance may be runnable (a `wake` row).
    Instance,
    /// A timer was armed (a `timer` row).
    Timer,
    /// A remote task became claimable (a `remote` row).
    Remote,
    /// The poller failed or fell behind: notifications may have been missed.
    Reconnected,
}

impl WakeMessage for Wake {
    fn wakes(&self, filter: WakeFilter) -> Option<WakeReason> {
        let wanted = match self {
            Self::Instance => WakeFilter::Instances,
            Self::Timer => WakeFilter::Timers,
            Self::Remote => WakeFilter::RemoteTasks,
            Self::Reconnected => return Some(WakeReason::Reconnected),
        };
        (filter == wanted).then_some(WakeReason::Notified)
    }
}

/// One row of the notification table.
#[derive(Debug)]
pub(crate) struct Note {
    seq: i64,
    kind: String,
    name: Option<String>,
    id: Option<String>,
}

/// The rows after `after`, at most `limit`, in order.
fn since(conn: &Connection, after: i64, limit: i64) -> rusqlite::Result<Vec<Note>> {
    let mut statement = conn.prepare_cached(NOTIFY_SINCE)?;
    let rows = statement.query_map(params![after, limit], |r| {
        Ok(Note {
            seq: r.get(0)?,
            kind: r.get(1)?,
            name: r.get(2)?,
            id: r.get(3)?,
        })
    })?;
    rows.collect()
}

/// Taken by the writer when it opens a transaction: the highest row number, above which every
/// row of the transaction will be. `None` when it cannot be read (then the commit publishes
/// [`Wake::Reconnected`]).
pub(crate) fn mark(conn: &Connection) -> Option<i64> {
    conn.query_row_cached(NOTIFY_MAX, [], |r| r.get(0)).ok()
}

/// Read by the writer just before `COMMIT`: the rows its transaction wrote (it holds the write
/// lock, so every row above the mark is its own). `None` when unknown.
pub(crate) fn written(conn: &Connection, mark: Option<i64>) -> Option<Vec<Note>> {
    since(conn, mark?, i64::MAX).ok()
}

/// Where notifications go: the broadcast of every subscription, the result waiters, and the
/// row ranges this store's writer published, for its poller to skip. Clones share them.
#[derive(Debug, Clone)]
pub(crate) struct Outlets {
    sender: broadcast::Sender<Wake>,
    closed: ClosedWaiters,
    /// Readers of events and streams: a message row (and a close) wakes those of its instance.
    messages: ClosedWaiters,
    own: Arc<Mutex<VecDeque<(i64, i64)>>>,
}

impl Outlets {
    /// Outlets nobody listens to yet.
    pub(crate) fn new() -> Self {
        Self {
            sender: broadcast::channel(WAKE_BUFFER_LEN).0,
            closed: ClosedWaiters::default(),
            messages: ClosedWaiters::default(),
            own: Arc::default(),
        }
    }

    /// Notes the rows a transaction of this store's writer wrote as its own, just before its
    /// `COMMIT`, so the poller skips them however soon it reads them; the range noted, for
    /// [`rolled_back`](Self::rolled_back).
    pub(crate) fn committing(&self, written: Option<&[Note]>) -> Option<(i64, i64)> {
        let range = match written? {
            [first, .., last] => (first.seq, last.seq),
            [only] => (only.seq, only.seq),
            [] => return None,
        };
        let mut own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
        if own.len() == OWN_RANGES_MAX {
            own.pop_front();
        }
        own.push_back(range);
        Some(range)
    }

    /// Forgets a range noted by [`committing`](Self::committing) whose commit failed: its
    /// numbers will be given again, to rows that are not this writer's.
    pub(crate) fn rolled_back(&self, range: Option<(i64, i64)>) {
        if let Some(range) = range {
            let mut own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
            own.retain(|noted| *noted != range);
        }
    }

    /// Publishes what a transaction of this store's writer wrote, once its `COMMIT` returned;
    /// `None` (the rows could not be read) publishes [`Wake::Reconnected`].
    pub(crate) fn committed(&self, written: Option<Vec<Note>>) {
        match written {
            Some(notes) => self.publish(notes.iter()),
            None => self.reconnected(),
        }
    }

    /// Whether row `seq` was written (and published) by this store's writer. Called with
    /// rising `seq`, so the ranges below it are forgotten.
    fn is_own(&self, seq: i64) -> bool {
        let mut own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
        while own.front().is_some_and(|&(_, last)| last < seq) {
            own.pop_front();
        }
        own.front().is_some_and(|&(first, _)| first <= seq)
    }

    /// Publishes rows, coalesced: one message per kind, one close per instance. Nobody
    /// subscribed is fine: a later subscription only wants later messages.
    fn publish<'a>(&self, notes: impl Iterator<Item = &'a Note>) {
        let (mut instance, mut timer, mut remote) = (false, false, false);
        let mut closed = HashSet::new();
        let mut written = HashSet::new();
        for note in notes {
            match note.kind.as_str() {
                "wake" => {
                    let message = note
                        .name
                        .as_deref()
                        .and_then(|n| n.strip_prefix(MESSAGE_PREFIX));
                    match (message, &note.id) {
                        (Some(name), Some(id)) => {
                            if let Ok(key) = InstanceKey::parse(name, id) {
                                written.insert(key);
                            }
                        }
                        _ => instance = true,
                    }
                }
                "timer" => timer = true,
                "remote" => remote = true,
                "closed" => {
                    // A row no instance could have written (the CHECK allows none) is ignored.
                    if let (Some(name), Some(id)) = (&note.name, &note.id) {
                        if let Ok(key) = InstanceKey::parse(name, id) {
                            closed.insert(key);
                        }
                    }
                }
                _ => {}
            }
        }
        for (sent, wake) in [
            (instance, Wake::Instance),
            (timer, Wake::Timer),
            (remote, Wake::Remote),
        ] {
            if sent {
                let _ = self.sender.send(wake);
            }
        }
        for key in &closed {
            self.closed.closed(key);
            self.messages.closed(key);
        }
        for key in &written {
            self.messages.closed(key);
        }
    }

    /// Tells every subscription and every result waiter that notifications may have been
    /// missed.
    fn reconnected(&self) {
        let _ = self.sender.send(Wake::Reconnected);
        self.closed.reconnected();
        self.messages.reconnected();
    }
}

/// A store's side of notifications: its outlets, and the stop signal of its poller thread,
/// which ends when this (held by the store's last handle) is dropped.
#[derive(Debug)]
pub(crate) struct Hub {
    outlets: Outlets,
    /// Never sent on: dropping it disconnects the poller's receiver, which ends the thread.
    _stop: mpsc::Sender<()>,
}

impl Hub {
    /// Opens the poller's read connection on `path`, notes where the table ends now (rows
    /// already there are old news), and starts the poller thread.
    pub(crate) fn start(path: &Path, config: &Config) -> crate::Result<Self> {
        let conn = open::reader(path, config)?;
        let sqlite = |operation| {
            move |source| crate::Error::Sqlite {
                operation,
                path: open::owned(path),
                source,
            }
        };
        // The version first: a commit between the two reads then shows as a change, and its
        // rows, after the cursor, are read at the first poll.
        let version: i64 = conn
            .query_row_cached("PRAGMA data_version", [], |r| r.get(0))
            .map_err(sqlite("reading the data version of"))?;
        let cursor: i64 = conn
            .query_row_cached(NOTIFY_SEQUENCE, [], |r| r.get(0))
            .map_err(sqlite("reading the notifications of"))?;
        let outlets = Outlets::new();
        let (stop, stopped) = mpsc::channel();
        let poller = Poller {
            conn,
            outlets: outlets.clone(),
            cursor,
            version: Some(version),
            failing: false,
        };
        let interval = config.notify_poll_interval;
        std::thread::Builder::new()
            .name("keiro-sqlite-poll".into())
            .spawn(move || poller.run(&stopped, interval))
            .map_err(|source| crate::Error::Thread {
                path: open::owned(path),
                source,
            })?;
        Ok(Self {
            outlets,
            _stop: stop,
        })
    }

    /// The outlets, for the writer.
    pub(crate) fn outlets(&self) -> &Outlets {
        &self.outlets
    }

    /// A receiver of the wake broadcast, for a new subscription.
    pub(crate) fn receiver(&self) -> broadcast::Receiver<Wake> {
        self.outlets.sender.subscribe()
    }

    /// A new result waiter on `key`.
    pub(crate) fn closed(&self, key: &InstanceKey) -> ClosedWait {
        self.outlets.closed.subscribe(key)
    }

    /// A new reader of `key`'s events and streams.
    pub(crate) fn messages(&self, key: &InstanceKey) -> ClosedWait {
        self.outlets.messages.subscribe(key)
    }
}

/// The poller thread's state.
struct Poller {
    conn: Connection,
    outlets: Outlets,
    /// The last row read.
    cursor: i64,
    /// `data_version` at the last successful read; `None` forces a read.
    version: Option<i64>,
    /// Whether the last poll failed.
    failing: bool,
}

impl Poller {
    /// Polls every `interval` until `stop` is disconnected.
    fn run(mut self, stop: &mpsc::Receiver<()>, interval: Duration) {
        while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(interval) {
            self.poll();
        }
    }

    /// One poll: publishes the new rows of other stores, and [`Wake::Reconnected`] when rows
    /// were missed (pruned before they were read) or after a failed poll.
    fn poll(&mut self) {
        match self.read() {
            Ok(behind) => {
                if behind || self.failing {
                    self.outlets.reconnected();
                }
                self.failing = false;
            }
            Err(error) => {
                if !self.failing {
                    tracing::warn!(
                        error = %error,
                        "the sqlite notification poller cannot read; waiters poll"
                    );
                }
                self.failing = true;
                self.version = None;
            }
        }
    }

    /// Reads the rows committed since the last read, if anything was committed; whether some
    /// were pruned before they could be read.
    fn read(&mut self) -> rusqlite::Result<bool> {
        let version: i64 = self
            .conn
            .query_row_cached("PRAGMA data_version", [], |r| r.get(0))?;
        if self.version == Some(version) {
            return Ok(false);
        }
        let mut behind = false;
        loop {
            let notes = since(&self.conn, self.cursor, PAGE)?;
            let (Some(first), Some(last)) = (notes.first(), notes.last()) else {
                break;
            };
            // Committed rows are numbered without gaps: a gap is rows pruned unread.
            behind |= first.seq > self.cursor.saturating_add(1);
            self.cursor = last.seq;
            let outlets = &self.outlets;
            outlets.publish(notes.iter().filter(|n| !outlets.is_own(n.seq)));
            if notes.len() < PAGE as usize {
                break;
            }
        }
        self.version = Some(version);
        Ok(behind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_wake_reaches_its_filter_and_a_reconnection_reaches_all() {
        let filters = [
            WakeFilter::Instances,
            WakeFilter::Timers,
            WakeFilter::RemoteTasks,
        ];
        for (wake, only) in [
            (Wake::Instance, WakeFilter::Instances),
            (Wake::Timer, WakeFilter::Timers),
            (Wake::Remote, WakeFilter::RemoteTasks),
        ] {
            for filter in filters {
                assert_eq!(
                    wake.wakes(filter),
                    (filter == only).then_some(WakeReason::Notified),
                    "{wake:?} {filter:?}"
                );
            }
        }
        for filter in filters {
            assert_eq!(
                Wake::Reconnected.wakes(filter),
                Some(WakeReason::Reconnected)
            );
        }
    }

    #[test]
    fn own_ranges_are_skipped_and_forgotten_once_passed() {
        let outlets = Outlets::new();
        let note = |seq| Note {
            seq,
            kind: "timer".into(),
            name: None,
            id: None,
        };
        assert_eq!(outlets.committing(Some(&[note(3), note(4)])), Some((3, 4)));
        let failed = outlets.committing(Some(&[note(5)]));
        outlets.rolled_back(failed);
        assert_eq!(outlets.committing(Some(&[note(7)])), Some((7, 7)));
        assert_eq!(outlets.committing(Some(&[])), None);
        assert_eq!(outlets.committing(None), None);
        assert!(!outlets.is_own(2));
        assert!(outlets.is_own(3));
        assert!(outlets.is_own(4));
        assert!(!outlets.is_own(5));
        assert!(outlets.is_own(7));
        assert!(!outlets.is_own(8));
        assert!(outlets.own.lock().unwrap().is_empty());
    }

    #[test]
    fn a_poll_that_recovers_from_an_error_tells_everyone_to_poll() {
        let outlets = Outlets::new();
        let mut receiver = outlets.sender.subscribe();
        let key = InstanceKey::parse("wf", "a").unwrap();
        let mut waiter = outlets.closed.subscribe(&key);
        // No notification table yet: every read fails.
        let mut poller = Poller {
            conn: Connection::open_in_memory().unwrap(),
            outlets: outlets.clone(),
            cursor: 0,
            version: None,
            failing: false,
        };
        poller.poll();
        poller.poll();
        assert!(poller.failing);
        assert!(receiver.try_recv().is_err(), "nothing while failing");

        poller
            .conn
            .execute_batch(
                "CREATE TABLE keiro_notifications (seq INTEGER PRIMARY KEY, kind TEXT, \
                 workflow_name TEXT, workflow_id TEXT); \
                 INSERT INTO keiro_notifications VALUES (1, 'timer', NULL, NULL)",
            )
            .unwrap();
        poller.poll();
        assert!(!poller.failing);
        assert_eq!(receiver.try_recv().unwrap(), Wake::Timer);
        assert_eq!(receiver.try_recv().unwrap(), Wake::Reconnected);
        assert!(receiver.try_recv().is_err());
        let woken = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(async {
                use keiro_resume::WakeSource;
                waiter.wait(Duration::from_secs(5)).await
            });
        assert_eq!(woken, WakeReason::Notified);

        // Rows pruned before they were read: a gap, told as a reconnection.
        poller
            .conn
            .execute_batch("INSERT INTO keiro_notifications VALUES (5, 'remote', NULL, NULL)")
            .unwrap();
        poller.version = None;
        poller.poll();
        assert_eq!(receiver.try_recv().unwrap(), Wake::Remote);
        assert_eq!(receiver.try_recv().unwrap(), Wake::Reconnected);
        assert_eq!(poller.cursor, 5);
    }

    #[tokio::test]
    async fn a_batch_is_coalesced_and_unreadable_rows_read_as_missed() {
        let outlets = Outlets::new();
        let mut receiver = outlets.sender.subscribe();
        let wake = |seq, kind: &str| Note {
            seq,
            kind: kind.into(),
            name: Some("wf".into()),
            id: Some(format!("i-{seq}")),
        };
        outlets.committed(Some(vec![
            wake(1, "wake"),
            wake(2, "wake"),
            wake(3, "remote"),
        ]));
        assert_eq!(receiver.try_recv().unwrap(), Wake::Instance);
        assert_eq!(receiver.try_recv().unwrap(), Wake::Remote);
        assert!(receiver.try_recv().is_err());
        outlets.committed(None);
        assert_eq!(receiver.try_recv().unwrap(), Wake::Reconnected);
    }
}
