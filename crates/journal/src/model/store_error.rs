//! The error a store operation returns: the store contract's own error, kept with the journal's
//! data so the error a body sees ([`WorkflowError::Store`](crate::WorkflowError::Store)) can
//! carry it without depending on the contract. The `store` module re-exports it as
//! `store::Error`, the crate root as `StoreError`.

use std::error::Error as StdError;

use crate::InstanceKey;

/// Errors of a store operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The writer's lease was taken over or released: it must stop before any further side effect.
    #[error("lease on {key} lost by {owner} (epoch {epoch})")]
    LeaseLost {
        /// The instance.
        key: InstanceKey,
        /// The stale owner.
        owner: String,
        /// The stale epoch.
        epoch: i64,
    },
    /// The instance does not exist.
    #[error("workflow instance {key} does not exist")]
    NotFound {
        /// The instance.
        key: InstanceKey,
    },
    /// A stored row could not be read as keiro data.
    #[error("{operation}: stored data is malformed: {detail}")]
    Malformed {
        /// What was being done.
        operation: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The database could not be reached or the connection broke. Retrying later may succeed.
    #[error("{operation}: the database is unavailable")]
    Unavailable {
        /// What was being done.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
    /// The store refused a value it was asked to write (for PostgreSQL a data exception: a NUL
    /// character in a jsonb string or a text column, an invalid byte sequence, a value past a
    /// program limit). Deterministic: writing the same value again is refused again, so the
    /// caller must not retry it; a run fails once with a typed error instead.
    #[error("{operation}: the store refused the value: {reason}")]
    ValueRefused {
        /// What was being done.
        operation: &'static str,
        /// Why, for humans (already safe to store).
        reason: String,
    },
    /// The operation refuses to run inside the caller's transaction at its isolation level
    /// (`level`, as PostgreSQL names it: `repeatable read`, `serializable`). It takes a lock
    /// and must then see what committed before it got the lock, which only READ COMMITTED's
    /// statement snapshots do: a signal send from an older snapshot would buffer the signal
    /// past a waiter it cannot see. Deterministic and checked before anything is written: the
    /// caller's transaction is still usable, and the same call from a READ COMMITTED
    /// transaction goes through.
    #[error(
        "{operation}: refused inside a {level} transaction, whose snapshot cannot see what \
         committed while it waited for a lock; call it from a read committed transaction"
    )]
    IsolationRefused {
        /// What was being done.
        operation: &'static str,
        /// The caller's isolation level.
        level: String,
    },
    /// The store's schema does not hold what this build needs: it does not exist, was never
    /// migrated, or was migrated by an older build (a migration or the function files of this
    /// build are missing). Nothing was done. Migrating the schema (`keiro migrate --schema
    /// <schema>`, or the store's own migrate call) fixes it; retrying before that fails the
    /// same way.
    #[error(
        "{operation}: schema {schema} {problem}: migrate it with \
         `keiro migrate --schema {schema}` (or `PgStore::migrate`)"
    )]
    SchemaNotMigrated {
        /// What was being done.
        operation: &'static str,
        /// The schema.
        schema: String,
        /// What is missing, for humans: "does not exist", "lacks migration 18
        /// (schedule_backoff)", or the server's own message.
        problem: String,
    },
    /// A queue operation was refused: an unknown queue, an option the queue does not take, or
    /// a duplicate dedup id. Deterministic: nothing was written, and the same call is refused
    /// again until the queue or the holder changes.
    #[error("queue {queue:?}: {refusal}")]
    QueueRefused {
        /// The queue named.
        queue: String,
        /// Why.
        refusal: crate::queue::QueueRefusal,
    },
    /// A payload the handle's codec could not seal or open (`keiro::codec`): an envelope whose
    /// key id the codec has no key for, or a key that does not open it (a wrong key under that
    /// id, a tampered envelope). Deterministic: nothing was written, and no value was guessed;
    /// configuring the key that id names fixes it.
    #[error("{operation}: {source}")]
    Codec {
        /// What was being done.
        operation: &'static str,
        /// Which key, and what went wrong.
        #[source]
        source: crate::codec::CodecError,
    },
    /// The database refused the operation.
    #[error("{operation} failed")]
    Database {
        /// What was being done.
        operation: &'static str,
        /// Whether retrying the same operation may succeed (serialization failure, deadlock).
        retryable: bool,
        /// The driver's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

impl Error {
    /// A lost lease: stop, do not count a crash.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Self::LeaseLost { .. })
    }

    /// Retrying later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Unavailable { .. } => true,
            Self::Database { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// The store refused a value; the same write will be refused again.
    pub fn is_value_refused(&self) -> bool {
        matches!(self, Self::ValueRefused { .. })
    }

    /// The call refused the caller's transaction's isolation level; the same call from a READ
    /// COMMITTED transaction goes through.
    pub fn is_isolation_refused(&self) -> bool {
        matches!(self, Self::IsolationRefused { .. })
    }

    /// A queue refused the operation.
    pub fn queue_refusal(&self) -> Option<&crate::queue::QueueRefusal> {
        match self {
            Self::QueueRefused { refusal, .. } => Some(refusal),
            _ => None,
        }
    }

    /// The codec could not seal or open a payload: the key id it names, when it is one.
    pub fn codec_key_id(&self) -> Option<&str> {
        match self {
            Self::Codec { source, .. } => Some(&source.key_id),
            _ => None,
        }
    }

    /// The instance is missing.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// The store's schema is missing or older than this build: migrate it.
    pub fn is_schema_not_migrated(&self) -> bool {
        matches!(self, Self::SchemaNotMigrated { .. })
    }
}
