//! How a store opens its file.

use std::time::Duration;

use crate::error::{Error, Result};

/// How long a connection waits for another process's write lock before an operation fails as
/// retryable.
pub const BUSY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// How many read connections a store keeps open.
pub const READERS_DEFAULT: usize = 4;
/// The most operations the writer puts in one transaction.
pub const BATCH_MAX_DEFAULT: usize = 256;
/// The longest text or JSON value the store writes, in bytes: PostgreSQL's jsonb limit
/// (268435455 bytes), so both stores refuse the same values as too big.
pub const VALUE_LEN_MAX_DEFAULT: usize = 268_435_455;
/// The smallest [`Config::value_len_max`] accepted: SQLite applies the limit to every value a
/// connection reads too, the schema's own statements among them, so a limit below the longest
/// of those could not open the file. 16 KiB is several times the longest statement keiro-sqlite
/// keeps (a test holds it so).
pub const VALUE_LEN_MIN: usize = 16 * 1024;
/// How often a store looks for notifications committed by other processes on its file: the
/// wake latency across processes (a notification in the same process is published at once).
/// 10 ms: a caller in another process gets an event or a result within about 5 ms at the
/// median, for one `PRAGMA data_version` per interval on an idle file.
pub const NOTIFY_POLL_INTERVAL_DEFAULT: Duration = Duration::from_millis(10);

/// When a commit is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// `PRAGMA synchronous = FULL`: the WAL is synced at every commit, so a commit that
    /// returned survives a power loss. The default, and the only setting under which keiro's
    /// rule holds that nothing is acted on from a commit that is not durable.
    #[default]
    Full,
    /// `PRAGMA synchronous = NORMAL`, an explicit opt-in: the WAL is synced at checkpoints
    /// only, so a power loss (not a process crash) may lose the last commits. A worker may
    /// then have run side effects whose journal rows are gone, and run them again. For
    /// throwaway databases (tests, demos) only.
    NormalLosesCommitsOnPowerLoss,
}

/// How [`SqliteStore::open`](crate::SqliteStore::open) opens the file.
#[derive(Debug, Clone)]
pub struct Config {
    /// The commit durability. Defaults to [`Synchronous::Full`].
    pub synchronous: Synchronous,
    /// How long to wait for another process's write lock. Defaults to
    /// [`BUSY_TIMEOUT_DEFAULT`].
    pub busy_timeout: Duration,
    /// Read connections kept open (at least 1). Defaults to [`READERS_DEFAULT`].
    pub readers: usize,
    /// The most queued operations one write transaction takes (at least 1). Defaults to
    /// [`BATCH_MAX_DEFAULT`].
    pub batch_max: usize,
    /// The longest value written, in bytes (SQLite's length limit), at least
    /// [`VALUE_LEN_MIN`]. Defaults to [`VALUE_LEN_MAX_DEFAULT`].
    pub value_len_max: usize,
    /// How often the store checks for notifications other processes committed on the file
    /// (one `PRAGMA data_version` when nothing changed; more than zero). Defaults to
    /// [`NOTIFY_POLL_INTERVAL_DEFAULT`].
    pub notify_poll_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: BUSY_TIMEOUT_DEFAULT,
            readers: READERS_DEFAULT,
            batch_max: BATCH_MAX_DEFAULT,
            value_len_max: VALUE_LEN_MAX_DEFAULT,
            notify_poll_interval: NOTIFY_POLL_INTERVAL_DEFAULT,
        }
    }
}

impl Config {
    /// Checks every bound.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the field and its bound.
    pub fn validate(&self) -> Result<()> {
        if self.readers == 0 {
            return Err(Error::Config("readers must be at least 1".into()));
        }
        if self.batch_max == 0 {
            return Err(Error::Config("batch_max must be at least 1".into()));
        }
        if self.value_len_max < VALUE_LEN_MIN || i32::try_from(self.value_len_max).is_err() {
            return Err(Error::Config(format!(
                "value_len_max must be between {VALUE_LEN_MIN} and {}",
                i32::MAX
            )));
        }
        if self.notify_poll_interval.is_zero() {
            return Err(Error::Config(
                "notify_poll_interval must be more than zero".into(),
            ));
        }
        Ok(())
    }
}
