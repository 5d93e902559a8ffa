//! Errors of the Postgres store, and how driver errors map onto keiro's meanings.
//!
//! The mapping lives here and nowhere else: a broken or unreachable connection (closed
//! socket, I/O error, pool timeout, server shutting down) is *unavailable*; a serialization
//! failure or deadlock is a *retryable* database error; a data exception (SQLSTATE class 22:
//! a NUL in a jsonb string or a text value, an invalid byte sequence, a value out of range)
//! or a program limit (54000: a jsonb or index row too large) is a *refused value*, which the
//! same call will meet again with the same value; a missing schema, table, column or function
//! (3F000, 42P01, 42703, 42883) in keiro's own statements means the schema is not migrated for
//! this build, which the store reports as such, naming the schema; anything else is a
//! database error that retrying the same call will not fix.
//!
//! keiro's own SQL functions raise no SQLSTATE of their own (no `RAISE` in `crates/migrations/functions/`),
//! so every class 22 or 54000 error comes from a value a caller passed in.

use std::error::Error as StdError;

use deadpool_postgres::PoolError;
use keiro_journal::{store::storable_text, StoreError};
use tokio_postgres::error::{DbError, SqlState};

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
    /// The TLS handshake failed: with `verify-ca` or `verify-full`, most often a server
    /// certificate that the trusted roots do not vouch for or that does not name the host.
    /// The source says which. Retrying will not help until the certificate or the connection
    /// string changes.
    #[error("{operation}: the TLS handshake with the server failed (sslmode={mode})")]
    Tls {
        /// What was being done.
        operation: &'static str,
        /// The connection string's `sslmode`.
        mode: crate::SslMode,
        /// The driver's error, with rustls' reason at the end of its chain.
        #[source]
        source: Source,
    },
    /// The connection string says `sslrootcert=system` with an `sslmode` weaker than
    /// `verify-full`. As in libpq, `sslrootcert=system` alone means `verify-full`, and a
    /// weaker mode next to it is refused: the platform's roots vouch for any public name, so
    /// only checking that the certificate names the host authenticates the server.
    #[error(
        "sslmode={mode} may not be used with sslrootcert=system: use sslmode=verify-full \
         (the mode sslrootcert=system implies when none is given)"
    )]
    WeakSslMode {
        /// The mode the connection string gave.
        mode: crate::SslMode,
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
    /// A migration is pending, but the connecting role lacks a privilege applying it needs;
    /// nothing was applied. Migrate with the role that owns the schema (or connect the running
    /// role with [`Config::migrate`](crate::Config#structfield.migrate) off until then).
    #[error(
        "migration {version} ({name}) is pending in schema {schema}, but the role lacks \
         {privilege}, which applying it needs; migrate with the role that owns the schema"
    )]
    MigrationPrivilege {
        /// The schema.
        schema: String,
        /// The first pending migration's number.
        version: i32,
        /// The first pending migration's name.
        name: &'static str,
        /// The missing privilege, as PostgreSQL grants it, such as
        /// `CREATE on schema keiro`.
        privilege: String,
    },
    /// Another runner held the schema's migration lock for longer than
    /// [`Config::migrate_lock_timeout`](crate::Config#structfield.migrate_lock_timeout);
    /// nothing was applied. Retrying once that runner is done (or gone) succeeds: a runner's
    /// lock goes with its session.
    #[error(
        "waited {waited:?} for the migration lock of schema {schema}, which another runner holds"
    )]
    MigrationLocked {
        /// The schema.
        schema: String,
        /// How long this runner waited.
        waited: std::time::Duration,
    },
    /// A function file is new to the schema or changed, but the connecting role lacks a
    /// privilege applying it needs; nothing was applied. Migrate with the role that owns the
    /// schema.
    #[error(
        "function file {file} is pending in schema {schema}, but the role lacks {privilege}, \
         which applying it needs; migrate with the role that owns the schema"
    )]
    FunctionFilePrivilege {
        /// The schema.
        schema: String,
        /// The first pending file's name (`journal` for `crates/migrations/functions/journal.sql`).
        file: &'static str,
        /// The missing privilege, as PostgreSQL grants it, such as
        /// `CREATE on schema keiro`.
        privilege: String,
    },
    /// The schema records this build's function-files revision with other files: a file of
    /// `crates/migrations/functions/` changed without the revision being raised (the unit test
    /// `the_function_files_revision_is_raised_with_every_change` says how to raise it).
    /// Nothing was applied, so the two builds do not overwrite each other's functions.
    #[error(
        "function files revision {revision} in schema {schema} was applied with other files \
         than this build's; a file of crates/migrations/functions/ changed without raising the revision"
    )]
    FunctionRevisionChanged {
        /// The schema.
        schema: String,
        /// The revision both builds claim.
        revision: i32,
    },
    /// Applying a function file failed; its transaction was rolled back.
    #[error("applying function file {file} to schema {schema} failed")]
    FunctionFile {
        /// The schema.
        schema: String,
        /// The file's name (`journal` for `crates/migrations/functions/journal.sql`).
        file: &'static str,
        /// Why, as an [`Error::Unavailable`] or [`Error::Database`].
        #[source]
        source: Box<Error>,
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
            Self::Migration { source, .. } | Self::FunctionFile { source, .. } => {
                source.is_unavailable()
            }
            _ => false,
        }
    }

    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Database { retryable, .. } => *retryable,
            Self::Migration { source, .. } | Self::FunctionFile { source, .. } => {
                source.is_retryable()
            }
            Self::MigrationLocked { .. } => true,
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
    /// The server refused a value passed in; the same value is refused every time.
    ValueRefused,
    /// A schema, table, column or function keiro's statement names does not exist.
    MissingObject,
    /// The server refused; retrying will not help.
    Refused,
}

/// A classified driver failure, turned into either error type at the call site, which knows
/// the operation.
#[derive(Debug)]
pub(crate) struct Failure {
    class: Class,
    source: Source,
    /// Why the server refused a value, for [`Class::ValueRefused`].
    reason: Option<String>,
}

impl Failure {
    /// As a store operation's error.
    pub(crate) fn into_store(self, operation: &'static str) -> StoreError {
        match self.class {
            Class::Unavailable => StoreError::Unavailable {
                operation,
                source: self.source,
            },
            Class::ValueRefused => StoreError::ValueRefused {
                operation,
                reason: self.reason.unwrap_or_else(|| self.source.to_string()),
            },
            Class::Retryable | Class::Refused | Class::MissingObject => StoreError::Database {
                operation,
                retryable: self.class == Class::Retryable,
                source: self.source,
            },
        }
    }

    /// Whether the statement named an object that does not exist.
    pub(crate) fn is_missing_object(&self) -> bool {
        self.class == Class::MissingObject
    }

    /// As [`into_store`](Self::into_store), for a statement of keiro's own in `schema`: a
    /// missing object is [`StoreError::SchemaNotMigrated`], with the server's message.
    pub(crate) fn into_store_in(self, operation: &'static str, schema: &str) -> StoreError {
        if self.class != Class::MissingObject {
            return self.into_store(operation);
        }
        let reason = self.reason.unwrap_or_else(|| self.source.to_string());
        StoreError::SchemaNotMigrated {
            operation,
            schema: schema.to_owned(),
            problem: format!(
                "lacks what this build needs, so it was never migrated or an older build \
                 migrated it ({reason})"
            ),
        }
    }

    /// As this crate's error, where a refused value is a plain database error: connecting
    /// and migrating pass no user value, so there is no run to fail with it.
    pub(crate) fn into_error(self, operation: &'static str) -> Error {
        match self.class {
            Class::Unavailable => Error::Unavailable {
                operation,
                source: self.source,
            },
            Class::Retryable | Class::ValueRefused | Class::Refused | Class::MissingObject => {
                Error::Database {
                    operation,
                    retryable: self.class == Class::Retryable,
                    source: self.source,
                }
            }
        }
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Self {
        Self {
            class: classify(&error),
            reason: error.as_db_error().map(server_reason),
            source: Box::new(error),
        }
    }
}

impl From<PoolError> for Failure {
    fn from(error: PoolError) -> Self {
        let (class, reason) = match &error {
            PoolError::Backend(e) => (classify(e), e.as_db_error().map(server_reason)),
            PoolError::Timeout(_) | PoolError::Closed => (Class::Unavailable, None),
            // Neither can happen with the pool `PgStore` builds (a runtime is set, no hooks),
            // so reaching them is a programming error, not an outage.
            PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => (Class::Refused, None),
        };
        Self {
            class,
            source: Box::new(error),
            reason,
        }
    }
}

/// The longest reason kept from a server's message, in characters: the detail of a data
/// exception can quote the refused value, which may be large.
const REASON_CHARS_MAX: usize = 200;

pub(crate) fn server_reason(error: &DbError) -> String {
    refusal_reason(error.message(), error.detail())
}

/// A short reason from the server's message and detail, such as `unsupported Unicode escape
/// sequence: \u0000 cannot be converted to text`, safe to store in a text column (the
/// detail may quote the refused value, NUL included).
fn refusal_reason(message: &str, detail: Option<&str>) -> String {
    let trim = |text: &str| text.trim().trim_end_matches('.').to_owned();
    let mut reason = trim(message);
    if let Some(detail) = detail.map(trim).filter(|d| !d.is_empty()) {
        reason = format!("{reason}: {detail}");
    }
    let reason = storable_text(&reason);
    match reason.char_indices().nth(REASON_CHARS_MAX) {
        Some((cut, _)) => format!("{}…", &reason[..cut]),
        None => reason.into_owned(),
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
    // Class 22 is "data exception" (22P05: a NUL in jsonb; 22021: a NUL or a bad byte in
    // text); 54000 is a value past a program limit (a jsonb or an index row too large).
    // Both are decided by the value alone, so the same call is refused again.
    if code.code().starts_with("22") || *code == SqlState::PROGRAM_LIMIT_EXCEEDED {
        return Class::ValueRefused;
    }
    // keiro's statements name only keiro's schema, tables, columns and functions: one that is
    // missing means the schema is not (or not yet) what this build migrates it to.
    if *code == SqlState::INVALID_SCHEMA_NAME
        || *code == SqlState::UNDEFINED_TABLE
        || *code == SqlState::UNDEFINED_COLUMN
        || *code == SqlState::UNDEFINED_FUNCTION
    {
        return Class::MissingObject;
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
            ("22P05", Class::ValueRefused),
            ("22021", Class::ValueRefused),
            ("22P02", Class::ValueRefused),
            ("22023", Class::ValueRefused),
            ("22001", Class::ValueRefused),
            ("54000", Class::ValueRefused),
            ("54001", Class::Refused),
            ("23505", Class::Refused),
            ("42P01", Class::MissingObject),
            ("42883", Class::MissingObject),
            ("42703", Class::MissingObject),
            ("3F000", Class::MissingObject),
            ("42501", Class::Refused),
            ("P0001", Class::Refused),
        ];
        for (code, class) in cases {
            assert_eq!(classify_code(&SqlState::from_code(code)), class, "{code}");
        }
    }

    #[test]
    fn a_refused_value_keeps_a_short_storable_reason() {
        assert_eq!(
            refusal_reason(
                "unsupported Unicode escape sequence",
                Some("\\u0000 cannot be converted to text.")
            ),
            "unsupported Unicode escape sequence: \\u0000 cannot be converted to text"
        );
        assert_eq!(
            refusal_reason("invalid byte sequence for encoding \"UTF8\": 0x00", None),
            "invalid byte sequence for encoding \"UTF8\": 0x00"
        );
        let quoted = refusal_reason("invalid input", Some(&format!("a\0{}", "x".repeat(500))));
        assert!(!quoted.contains('\0'), "{quoted}");
        assert_eq!(quoted.chars().count(), REASON_CHARS_MAX + 1, "{quoted}");
    }

    #[test]
    fn a_refused_value_is_its_own_store_error_but_a_database_error_when_migrating() {
        let refused = || Failure {
            class: Class::ValueRefused,
            source: "22P05".into(),
            reason: Some("unsupported Unicode escape sequence".into()),
        };
        let err = refused().into_store("appending to the journal");
        assert!(err.is_value_refused() && !err.is_retryable());
        assert_eq!(
            err.to_string(),
            "appending to the journal: the store refused the value: unsupported Unicode escape sequence"
        );
        let err = refused().into_error("migrating");
        assert!(matches!(
            err,
            Error::Database {
                retryable: false,
                ..
            }
        ));
    }

    #[test]
    fn failures_keep_the_operation_and_retryability() {
        let failure = Failure {
            class: Class::Retryable,
            source: "deadlock".into(),
            reason: None,
        };
        let err = failure.into_store("appending to the journal");
        assert!(err.is_retryable());
        assert_eq!(err.to_string(), "appending to the journal failed");
        let failure = Failure {
            class: Class::Unavailable,
            source: "refused".into(),
            reason: None,
        };
        let err = failure.into_error("connecting");
        assert!(err.is_unavailable() && err.is_retryable());
        assert_eq!(err.to_string(), "connecting: the database is unavailable");
    }
}
