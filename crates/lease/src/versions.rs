//! Application versions: runs stay on the code that started them.
//!
//! Every run records the version of the process that started it (a continue-as-new, the
//! version of the process that continued it): the store's own version, set where the store is
//! opened. A worker claims only runs of the versions it serves ([`Versions`]), so during a
//! rolling deploy old runs finish on old workers and new runs start on new ones. The empty
//! version is "unversioned": the runs started before versions existed, or by a process that
//! set none. A worker serving [`Versions::Any`] claims every run, unversioned ones included,
//! as every worker did before versions existed.
//!
//! Workers write a heartbeat row ([`VersionStore::worker_beat`]), so operators can see which
//! versions have live workers ([`live`]) and which live runs no live worker serves
//! ([`unserved`]), and hand the runs of one version to another
//! ([`VersionStore::versions_move`]). The decisions are the pure functions here; the store
//! only reads and writes rows.

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{InstanceKey, Status};
use time::OffsetDateTime;

/// The version of unversioned runs and processes: the empty string (NULL in the stores).
pub const UNVERSIONED: &str = "";
/// The longest version accepted, in bytes.
pub const VERSION_LEN_MAX: usize = 64;
/// How often a worker writes its heartbeat row.
pub const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);
/// How recent a heartbeat must be for its worker to count as live.
pub const LIVE_WINDOW_DEFAULT: Duration = Duration::from_secs(30);
/// How long the row of a worker not seen (killed: a stopping worker deletes its own) is kept,
/// so operators still see it: an hour, then a live worker's heartbeat deletes it.
pub const FORGET_AFTER_DEFAULT: Duration = Duration::from_secs(3600);

/// A version that cannot be recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("application version {version:?}: {reason}")]
pub struct InvalidVersion {
    /// The version given.
    pub version: String,
    /// Why it was refused.
    pub reason: &'static str,
}

/// Checks an application version: at most [`VERSION_LEN_MAX`] bytes of ASCII letters, digits
/// and `. _ + -` (what a build id or a semantic version is made of), so it is safe in a
/// connection's startup options and on a command line. Empty is [`UNVERSIONED`].
///
/// ```
/// use keiro_lease::versions::validate_version;
///
/// assert!(validate_version("2024.06.1+abc123").is_ok());
/// assert!(validate_version("").is_ok());
/// assert!(validate_version("v 2").is_err());
/// ```
///
/// # Errors
///
/// [`InvalidVersion`] with the reason.
pub fn validate_version(version: &str) -> std::result::Result<(), InvalidVersion> {
    let refuse = |reason| {
        Err(InvalidVersion {
            version: version.to_owned(),
            reason,
        })
    };
    if version.len() > VERSION_LEN_MAX {
        return refuse("longer than 64 bytes");
    }
    if !version
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-'))
    {
        return refuse("only ASCII letters, digits and . _ + - are allowed");
    }
    Ok(())
}

/// The versions whose runs a worker claims.
///
/// ```
/// use keiro_lease::versions::Versions;
///
/// let v2 = Versions::only(["v2"]);
/// assert!(v2.serves("v2"));
/// assert!(!v2.serves("v1"));
/// assert!(!v2.serves("")); // unversioned runs: only for a worker that lists "" or serves any
/// assert!(Versions::Any.serves("v1"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Versions {
    /// Every run, whatever its version (and unversioned ones). The default of an unversioned
    /// worker.
    #[default]
    Any,
    /// Only runs of these versions; [`UNVERSIONED`] (`""`) among them takes the unversioned
    /// runs.
    Only(Vec<String>),
}

impl Versions {
    /// Runs of exactly these versions.
    pub fn only<V: Into<String>>(versions: impl IntoIterator<Item = V>) -> Self {
        let mut list: Vec<String> = versions.into_iter().map(Into::into).collect();
        list.sort();
        list.dedup();
        Self::Only(list)
    }

    /// What a worker of `version` serves unless told otherwise: its own version, or any when
    /// it is unversioned (so a deployment that never sets a version claims as before).
    pub fn own(version: &str) -> Self {
        if version.is_empty() {
            Self::Any
        } else {
            Self::only([version])
        }
    }

    /// Whether a run of `version` (`""`: unversioned) is served.
    pub fn serves(&self, version: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Only(list) => list.iter().any(|v| v == version),
        }
    }

    /// The claim's filter: `None` for any version, else the list (`""` for unversioned).
    pub fn as_filter(&self) -> Option<&[String]> {
        match self {
            Self::Any => None,
            Self::Only(list) => Some(list),
        }
    }

    /// Checks every listed version ([`validate_version`]).
    ///
    /// # Errors
    ///
    /// The first [`InvalidVersion`].
    pub fn validate(&self) -> std::result::Result<(), InvalidVersion> {
        self.as_filter()
            .unwrap_or_default()
            .iter()
            .try_for_each(|v| validate_version(v))
    }
}

/// What a worker's heartbeat records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerBeat {
    /// The worker's id (its lease owner when it has one).
    pub worker_id: String,
    /// The version it runs (`""`: unversioned).
    pub app_version: String,
    /// The versions it claims.
    pub serves: Versions,
    /// The queues it admits from.
    pub queues: Vec<String>,
}

/// A heartbeat row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRow {
    /// The worker's id.
    pub worker_id: String,
    /// The version it runs (`""`: unversioned).
    pub app_version: String,
    /// The versions it claims.
    pub serves: Versions,
    /// The queues it admits from.
    pub queues: Vec<String>,
    /// Its first heartbeat.
    pub started_at: OffsetDateTime,
    /// Its latest heartbeat.
    pub last_seen: OffsetDateTime,
}

/// How many runs of one version are in one status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionCount {
    /// The version (`""`: unversioned).
    pub app_version: String,
    /// The status.
    pub status: Status,
    /// How many runs.
    pub runs: u64,
}

/// The workers whose latest heartbeat is younger than `window` at `now`.
///
/// ```
/// use std::time::Duration;
/// use keiro_lease::versions::{live, Versions, WorkerRow};
/// use time::macros::datetime;
///
/// let row = |id: &str, seen| WorkerRow {
///     worker_id: id.into(), app_version: "v1".into(), serves: Versions::only(["v1"]),
///     queues: vec![], started_at: seen, last_seen: seen,
/// };
/// let rows = [row("a", datetime!(2026-01-01 0:00:50 UTC)), row("b", datetime!(2026-01-01 0:00 UTC))];
/// let now = datetime!(2026-01-01 0:01 UTC);
/// let alive = live(&rows, now, Duration::from_secs(30));
/// assert_eq!(alive.len(), 1);
/// assert_eq!(alive[0].worker_id, "a");
/// ```
pub fn live(rows: &[WorkerRow], now: OffsetDateTime, window: Duration) -> Vec<&WorkerRow> {
    rows.iter()
        .filter(|row| now - row.last_seen < window)
        .collect()
}

/// The live runs (running or suspended) whose version no worker of `workers` serves: what an
/// operator must deploy a worker for, or move to a served version.
///
/// ```
/// use keiro_journal::Status;
/// use keiro_lease::versions::{unserved, VersionCount, Versions, WorkerRow};
/// use time::OffsetDateTime;
///
/// let count = |v: &str, status, runs| VersionCount { app_version: v.into(), status, runs };
/// let counts = [count("v1", Status::Running, 3), count("v2", Status::Running, 5),
///               count("v1", Status::Completed, 9)];
/// let now = OffsetDateTime::UNIX_EPOCH;
/// let v2 = WorkerRow {
///     worker_id: "w".into(), app_version: "v2".into(), serves: Versions::only(["v2"]),
///     queues: vec![], started_at: now, last_seen: now,
/// };
/// assert_eq!(unserved(&counts, &[&v2]), [count("v1", Status::Running, 3)]);
/// ```
pub fn unserved(counts: &[VersionCount], workers: &[&WorkerRow]) -> Vec<VersionCount> {
    counts
        .iter()
        .filter(|c| matches!(c.status, Status::Running | Status::Suspended))
        .filter(|c| !workers.iter().any(|w| w.serves.serves(&c.app_version)))
        .cloned()
        .collect()
}

/// The storage of versions: heartbeats, counts and moves, each one statement.
#[async_trait::async_trait]
pub trait VersionStore: Send + Sync {
    /// The version this store records on the runs it starts (and continues): `""` when
    /// unversioned.
    fn app_version(&self) -> &str;

    /// Writes (or refreshes) `beat`'s row, `last_seen` at the store's clock.
    async fn worker_beat(&self, beat: &WorkerBeat) -> Result<()>;

    /// Deletes a stopping worker's row. Returns whether it was there.
    async fn worker_leave(&self, worker_id: &str) -> Result<bool>;

    /// Deletes the rows of workers whose `last_seen` is older than `not_seen_for` at the
    /// store's clock (a killed worker never deletes its own). Returns how many.
    async fn workers_forget(&self, not_seen_for: Duration) -> Result<u64>;

    /// Every heartbeat row, by worker id (live or not: [`live`] judges).
    async fn workers_list(&self) -> Result<Vec<WorkerRow>>;

    /// How many runs of each version are in each status, by version then status (as text).
    async fn versions_count(&self) -> Result<Vec<VersionCount>>;

    /// Hands the live runs (running or suspended) of version `from` to version `to` (`""`:
    /// unversioned, either side), in one statement. A run leased at that moment goes on under
    /// its holder until it parks or ends; its next claim is `to`'s. Returns how many moved.
    async fn versions_move(&self, from: &str, to: &str) -> Result<u64>;

    /// Up to `limit` live runs of `version`, by key: what a move would hand over, for a check
    /// before it.
    async fn version_live_runs(&self, version: &str, limit: i64) -> Result<Vec<InstanceKey>>;
}
