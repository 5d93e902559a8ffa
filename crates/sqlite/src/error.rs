//! The errors of opening a store, and how SQLite's errors become the store traits' errors.

use std::path::PathBuf;

use keiro_journal::store::Error as StoreError;
use rusqlite::ErrorCode;

/// Why [`SqliteStore::open`](crate::SqliteStore::open) refused a file. Nothing was written to
/// it, except for migrations it applied before the error (each one whole, or not at all).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The path names a directory, not a file.
    #[error("opening {path}: it is a directory, not a database file")]
    IsDirectory {
        /// The path.
        path: PathBuf,
    },
    /// The file exists but is not a SQLite database (or is encrypted, or damaged in its header).
    #[error("opening {path}: the file is not a SQLite database")]
    NotADatabase {
        /// The path.
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The file (or its directory, for the WAL and shared-memory files) cannot be written.
    #[error("opening {path}: the database is read-only: {detail}")]
    ReadOnly {
        /// The path.
        path: PathBuf,
        /// What was found read-only.
        detail: String,
    },
    /// The file was migrated by a newer keiro, whose schema this build does not know.
    #[error(
        "opening {path}: the database is at schema version {found}, written by a newer keiro; \
         this build knows versions up to {supported}"
    )]
    NewerSchema {
        /// The path.
        path: PathBuf,
        /// The newest migration recorded in the file.
        found: i64,
        /// The newest migration this build has.
        supported: i64,
    },
    /// A migration recorded in the file differs from this build's file of the same number.
    #[error("opening {path}: migration {version} in the database differs from this build's")]
    ChecksumMismatch {
        /// The path.
        path: PathBuf,
        /// The migration.
        version: i64,
    },
    /// A durability setting did not take: SQLite answered another value when read back.
    #[error("opening {path}: PRAGMA {pragma} is {found:?} after setting it to {wanted:?}")]
    Durability {
        /// The path.
        path: PathBuf,
        /// The pragma.
        pragma: &'static str,
        /// The value set.
        wanted: String,
        /// The value read back.
        found: String,
    },
    /// The configuration is invalid; the message names the field and its bound.
    #[error("invalid sqlite store configuration: {0}")]
    Config(String),
    /// SQLite failed otherwise while opening or migrating.
    #[error("{operation} {path}")]
    Sqlite {
        /// What was being done.
        operation: &'static str,
        /// The path.
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The directory of a [`SqliteStore::temporary`](crate::SqliteStore::temporary) store
    /// could not be made.
    #[error("making a temporary directory under {path}")]
    TemporaryDirectory {
        /// The system's temporary directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The writer thread could not be started.
    #[error("starting the writer thread of {path}")]
    Thread {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// `Result` with the open [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A SQLite error of a store operation as the traits' error. A value SQLite refuses as too big
/// is `ValueRefused` (PostgreSQL's 54000); "busy" and "locked" (another process held the write
/// lock past the busy timeout) and I/O errors are retryable.
pub(crate) fn store(operation: &'static str, error: rusqlite::Error) -> StoreError {
    let code = error.sqlite_error_code();
    match code {
        Some(ErrorCode::TooBig) => StoreError::ValueRefused {
            operation,
            reason: "a value longer than the store's length limit".to_owned(),
        },
        Some(
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::DiskFull
            | ErrorCode::CannotOpen,
        ) => StoreError::Unavailable {
            operation,
            source: Box::new(error),
        },
        _ => StoreError::Database {
            operation,
            retryable: false,
            source: Box::new(error),
        },
    }
}

/// A stored value keiro cannot read.
pub(crate) fn malformed(operation: &'static str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Malformed {
        operation,
        detail: detail.to_string(),
    }
}
