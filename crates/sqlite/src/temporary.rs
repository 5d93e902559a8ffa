//! The directory of a [`SqliteStore::temporary`](crate::SqliteStore::temporary) store: made
//! fresh under the system's temporary directory, removed with everything in it (the database
//! file, its WAL and shared-memory files) when the last clone of the store is dropped.

use std::path::{Path, PathBuf};

/// A directory this process made, removed when dropped.
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// A new directory `keiro-sqlite-<process>-<random>` under [`std::env::temp_dir`].
    pub(crate) fn new() -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "keiro-sqlite-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir(&dir)?;
        Ok(Self(dir))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Nothing to report to: the store is gone, and a directory left behind is only litter.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
