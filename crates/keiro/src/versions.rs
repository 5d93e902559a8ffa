//! Runs stay on the code that started them: application versions.
//!
//! A [`Keiro`] handle has the version of its store (for `Keiro::connect`, the environment
//! variable `KEIRO_APP_VERSION`, else unversioned); every run it starts records it, and a
//! continue-as-new records the version of the worker that continued it. A worker claims only
//! runs of the versions it serves: its store's own by default, or a list or any
//! ([`WorkerBuilder::serve`](crate::WorkerBuilder::serve)). An unversioned worker serves any
//! version, so a deployment that never sets one claims as before. During a rolling deploy
//! old runs finish on old workers and new runs start on new ones; [`Keiro::versions_move`]
//! hands the live runs of one version to another, and workers' heartbeat rows
//! ([`Keiro::workers`]) say which versions have live workers.
//!
//! ```no_run
//! # async fn demo() -> Result<(), keiro::Error> {
//! use keiro::versions::Versions;
//! // KEIRO_APP_VERSION=2024-06-01 in the environment of the new build.
//! let keiro = keiro::Keiro::connect("postgres://postgres@127.0.0.1/postgres").await?;
//! let worker = keiro.worker().build()?; // serves 2024-06-01 only
//! let both = keiro.worker().serve(Versions::only(["2024-05-20", "2024-06-01"])).build()?;
//! // Once the old build is gone: its runs to the new one.
//! let moved = keiro.versions_move("2024-05-20", "2024-06-01").await?;
//! # let _ = (worker, both, moved); Ok(()) }
//! ```

pub use keiro_lease::versions::{
    live, unserved, validate_version, InvalidVersion, VersionCount, VersionStore, Versions,
    WorkerBeat, WorkerRow, HEARTBEAT_INTERVAL_DEFAULT, LIVE_WINDOW_DEFAULT, UNVERSIONED,
    VERSION_LEN_MAX,
};

use keiro_journal::InstanceKey;

use crate::{Error, Keiro};

/// The environment variable `Keiro::connect` reads the application version from.
pub const APP_VERSION_ENV: &str = "KEIRO_APP_VERSION";

/// The application version of this process: [`APP_VERSION_ENV`] when set, else unversioned
/// (`""`).
///
/// # Errors
///
/// [`Error::Version`] for a value [`validate_version`] refuses.
pub fn app_version_from_env() -> Result<String, Error> {
    let version = std::env::var(APP_VERSION_ENV).unwrap_or_default();
    validate_version(&version)?;
    Ok(version)
}

impl Keiro {
    fn version_store(&self) -> Result<&dyn VersionStore, Error> {
        self.versions.as_deref().ok_or(Error::Unsupported {
            what: "application versions (the store has none)",
        })
    }

    /// The version the runs this handle starts record (`""`: unversioned).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// assert_eq!(keiro::Keiro::temporary()?.app_version(), "");
    /// # }
    /// # Ok::<_, keiro::Error>(())
    /// ```
    pub fn app_version(&self) -> &str {
        self.versions
            .as_deref()
            .map_or("", VersionStore::app_version)
    }

    /// How many runs of each version are in each status.
    ///
    /// # Errors
    ///
    /// [`Error::Store`]; [`Error::Unsupported`] for a store without versions.
    pub async fn versions_count(&self) -> Result<Vec<VersionCount>, Error> {
        Ok(self.version_store()?.versions_count().await?)
    }

    /// Every worker's heartbeat row, live or not ([`live`] judges).
    ///
    /// # Errors
    ///
    /// As [`versions_count`](Self::versions_count).
    pub async fn workers(&self) -> Result<Vec<WorkerRow>, Error> {
        Ok(self.version_store()?.workers_list().await?)
    }

    /// Hands the live runs (running or suspended) of version `from` to version `to` (`""`:
    /// unversioned), so workers serving `to` claim them. Returns how many moved.
    ///
    /// # Errors
    ///
    /// [`Error::Version`] for a refused version; otherwise as
    /// [`versions_count`](Self::versions_count).
    pub async fn versions_move(&self, from: &str, to: &str) -> Result<u64, Error> {
        validate_version(from)?;
        validate_version(to)?;
        Ok(self.version_store()?.versions_move(from, to).await?)
    }

    /// Up to `limit` live runs of `version`, by key: what a move would hand over.
    ///
    /// # Errors
    ///
    /// As [`versions_move`](Self::versions_move).
    pub async fn version_live_runs(
        &self,
        version: &str,
        limit: i64,
    ) -> Result<Vec<InstanceKey>, Error> {
        validate_version(version)?;
        Ok(self
            .version_store()?
            .version_live_runs(version, limit)
            .await?)
    }
}
