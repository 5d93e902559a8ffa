//! Errors of the Postgres store, and how driver errors map onto keiro's meanings.
//!
//! The mapping lives here and nowhere else: a broken or unreachable connection (closed
//! socket, I/O error, pool timeout, server shutting down) is *unavailable*; a serialization
//! failure or deadlock is a *retryable* database error; anything else is a database error
//! that retrying the same call will not fix.

use std::error::Error as StdError;

use deadpool_postgres::PoolError;
use keiro_journal::StoreError;
use tokio_postgres::error::SqlState;

/// The boxed cause every variant keeps as its `source`.
type Source = Box<dyn StdError + Send + Sync>;

/// Errors of connecting, configuring and migrating (store operations themselves return
/// [`keiro_journal::StoreError`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A [`Config`](crate::Config) field is out of bounds.
    #[error("invalid config: {field} {problem}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong, with the bound.
        problem: String,
    },
    /// The database could not be reached or the connection broke. Retrying later may succeed.
    #[error("{operation}: the database is unavailable")]
    Unavailable {
        /// What was being done.
        operation: &'static str,
        /// The driver's or the pool's error.
        #[source]
        source: Source,
    },
    /// The database refused the operation.
    #[error("{operation} failed")]
    Database {
        /// What was being done.
        operation: &'static str,
        /// Whether retrying may succeed (serialization failure, deadlock).
        retryable: bool,
        /// The driver's error.
        #[source]
        source: Source,
    },
    /// A migration applied to the schema differs from the file this build embeds: someone
    /// edited a migration after it shipped. Nothing was applied.
    #[error(
        "migration {version} ({name}) in schema {schema} was applied with a different checksum"
    )]
    MigrationChanged {
        /// The schema.
        schema: String,
        /// The migration's number.
        version: i32,
        /// The migration's name.
        name: &'static str,
    },
    /// Applying a migration failed; its transaction was rolled back.
    #[error("applying migration {version} ({name}) to schema {schema} failed")]
    Migration {
        /// The schema.
        schema: String,
        /// The migration's number.
        version: i32,
        /// The migration's name.
        name: &'static str,
        /// Why, as an [`Error::Unavailable`] or [`Error::Database`].
        #[source]
        source: Box<Error>,
    },
}

impl Error {
    /// Whether the database was unreachable, so retrying later may succeed.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Migration { source, .. } => source.is_unavailable(),
            _ => false,
        }
    }

    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Database { retryable, .. } => *retryable,
            Self::Migration { source, .. } => source.is_retryable(),
            _ => false,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a driver failure means to keiro.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The connection is gone or was never made.
    Unavailable,
    /// The server gave up on this transaction; the same call may succeed next time.
    Retryable,
    /// The server refused; retrying will not help.
    Refused,
}

/// A classified driver failure, turned into either error type at the call site, which knows
/// the operation.
#[derive(Debug)]
pub(crate) struct Failure {
    class: Class,
    source: Source,
}

impl Failure {
    /// As a store operation's error.
    pub(crate) fn into_store(self, operation: &'static str) -> StoreError {
        match self.class {
            Class::Unavailable => StoreError::Unavailable {
                operation,
                source: self.source,
            },
            Class::Retryable | Class::Refused => StoreError::Database {
                operation,
                retryable: self.class == Class::Retryable,
                source: self.source,
            },
        }
    }

    /// As this crate's error.
    pub(crate) fn into_error(self, operation: &'static str) -> Error {
        match self.class {
            Class::Unavailable => Error::Unavailable {
                operation,
                source: self.source,
            },
            Class::Retryable | Class::Refused => Error::Database {
                operation,
                retryable: self.class == Class::Retryable,
                source: self.source,
            },
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Self {
        Self {
            class: classify(&error),
            source: Box::new(error),
        }
    }
}

impl From<PoolError> for Failure {
    fn from(error: PoolError) -> Self {
        let class = match &error {
            PoolError::Backend(e) => classify(e),
            PoolError::Timeout(_) | PoolError::Closed => Class::Unavailable,
            // Neither can happen with the pool `PgStore` builds (a runtime is set, no hooks),
            // so reaching them is a programming error, not an outage.
            PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => Class::Refused,
        };
        Self {
            class,
            source: Box::new(error),
        }
    }
}

/// Classifies a driver error: a SQLSTATE decides when the server sent one; otherwise a closed
/// connection or an I/O error anywhere in the chain (refused, reset, timed out) means the
/// database is unavailable.
pub(crate) fn classify(error: &tokio_postgres::Error) -> Class {
    if let Some(code) = error.code() {
        return classify_code(code);
    }
    if error.is_closed() || io_in_chain(error) {
        return Class::Unavailable;
    }
    Class::Refused
}

/// The meaning of a SQLSTATE.
pub(crate) fn classify_code(code: &SqlState) -> Class {
    if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED {
        return Class::Retryable;
    }
    // Class 08 is "connection exception"; 57P01-03 mean the server is shutting down, crashed
    // or still starting; 53300 means it has no connection slot left. All pass with time.
    if code.code().starts_with("08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS
    {
        return Class::Unavailable;
    }
    Class::Refused
}

fn io_in_chain(error: &tokio_postgres::Error) -> bool {
    let mut cause: Option<&(dyn StdError + 'static)> = error.source();
    while let Some(e) = cause {
        if e.is::<std::io::Error>() {
            return true;
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_meanings() {
        let cases = [
            ("40001", Class::Retryable),
            ("40P01", Class::Retryable),
            ("08006", Class::Unavailable),
            ("08001", Class::Unavailable),
            ("57P01", Class::Unavailable),
            ("57P03", Class::Unavailable),
            ("53300", Class::Unavailable),
            ("23505", Class::Refused),
            ("42P01", Class::Refused),
            ("22023", Class::Refused),
        ];
        for (code, class) in cases {
            assert_eq!(classify_code(&SqlState::from_code(code)), class, "{code}");
        }
    }

    #[test]
    fn failures_keep_the_operation_and_retryability() {
        let failure = Failure {
            class: Class::Retryable,
            source: "deadlock".into(),
        };
        let err = failure.into_store("appending to the journal");
        assert!(err.is_retryable());
        assert_eq!(err.to_string(), "appending to the journal failed");
        let failure = Failure {
            class: Class::Unavailable,
            source: "refused".into(),
        };
        let err = failure.into_error("connecting");
        assert!(err.is_unavailable() && err.is_retryable());
        assert_eq!(err.to_string(), "connecting: the database is unavailable");
    }
}
