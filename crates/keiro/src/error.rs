//! The facade's error.

/// Errors of [`Keiro`](crate::Keiro) and [`WorkerBuilder`](crate::WorkerBuilder) operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A workflow name, id or step name was invalid.
    #[error("invalid identifier")]
    InvalidId(#[from] keiro_journal::IdError),
    /// A payload did not encode, or exceeded the payload limit.
    #[error("invalid payload")]
    Payload(#[source] keiro_journal::WorkflowError),
    /// A store operation failed.
    #[error("store operation failed")]
    Store(#[from] keiro_journal::StoreError),
    /// A registration was refused.
    #[error("workflow registration refused")]
    Registry(#[from] keiro_resume::RegistryError),
    /// The worker options are out of bounds.
    #[error("invalid worker options")]
    Options(#[from] keiro_resume::InvalidOptions),
    /// An application version was refused (`keiro::versions`).
    #[error("invalid application version")]
    Version(#[from] keiro_lease::versions::InvalidVersion),
    /// An operator tool failed (unknown instance, bad input, store failure).
    #[error("operator action failed")]
    Admin(#[from] keiro_remote::AdminError),
    /// A delivery was refused and nothing was written: the generation named is no longer
    /// current (or, in a journal written by hand, its `await:` name holds another kind).
    #[error("delivery to step {step:?} refused: {reason}")]
    DeliveryRefused {
        /// The step delivered to.
        step: String,
        /// Why.
        reason: keiro_journal::DeliveryRefusal,
    },
    /// A list request was refused: an unknown filter or value, a malformed cursor, a limit
    /// out of range.
    #[error("invalid list request")]
    Filter(#[from] keiro_journal::FilterError),
    /// A schedule was refused: a cron expression that does not parse, an unknown time zone,
    /// a bad interval, name or catch-up bound.
    #[error("schedule refused")]
    Schedule(#[from] keiro_resume::ScheduleError),
    /// A queue declaration or a start's queue options were refused before reaching the store:
    /// an invalid name, a limit below 1, a zero rate period, a key too long.
    #[error("queue refused")]
    Queue(#[from] keiro_journal::queue::QueueError),
    /// Search attributes refused before the store: a bad name or value, or too many.
    #[error("invalid search attributes")]
    Attributes(#[from] keiro_journal::attribute::AttrError),
    /// No schedule has this name.
    #[error("no schedule {name}")]
    NoSchedule {
        /// The name asked for.
        name: String,
    },
    /// An event's value or a stream's item does not decode into the type asked for.
    #[error("{what} of {key} does not decode into the requested type")]
    Decode {
        /// The instance.
        key: keiro_journal::InstanceKey,
        /// What did not decode: `event "<key>"`, or `stream "<key>" offset <n>`.
        what: String,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// An update was refused, nothing sent: the run has ended, with this status.
    #[error("{key} has ended ({status}): it takes no update")]
    RunFinished {
        /// The instance.
        key: keiro_journal::InstanceKey,
        /// How it ended.
        status: keiro_journal::Status,
    },
    /// An update was refused, nothing sent: its id is taken by another update of the instance
    /// (another name or request).
    #[error("update id {id:?} of {key} is taken by another update")]
    UpdateConflict {
        /// The instance.
        key: keiro_journal::InstanceKey,
        /// The update id.
        id: String,
    },
    /// The body rejected the update (`ctx.reject`), with this message.
    #[error("update {update:?} ({id}) of {key} was rejected: {message}")]
    UpdateRejected {
        /// The instance.
        key: keiro_journal::InstanceKey,
        /// The update's name.
        update: String,
        /// Its id.
        id: String,
        /// The body's message.
        message: String,
    },
    /// The run ended (with this status) without answering the update.
    #[error("update {update:?} ({id}) of {key} was not answered: the run is {status}")]
    UpdateUnanswered {
        /// The instance.
        key: keiro_journal::InstanceKey,
        /// The update's name.
        update: String,
        /// Its id.
        id: String,
        /// How the run ended.
        status: keiro_journal::Status,
    },
    /// No answer came within the caller's timeout. The update stays: the run may still answer
    /// it, and a call with the same update id gets that answer.
    #[error("update {update:?} ({id}) of {key} was not answered in time")]
    UpdateTimeout {
        /// The instance.
        key: keiro_journal::InstanceKey,
        /// The update's name.
        update: String,
        /// Its id, for a retry.
        id: String,
    },
    /// The encryption keys given (`KEIRO_ENCRYPTION_KEYS`, `keiro::codec`) are refused.
    #[error("invalid encryption keys")]
    EncryptionKeys(#[from] crate::codec::KeyError),
    /// The store does not offer this capability.
    #[error("the store does not support {what}")]
    Unsupported {
        /// The capability.
        what: &'static str,
    },
    /// The test kit's workflows kept waking each other past the round limit.
    #[error("the workflows did not settle after {rounds} rounds")]
    Unsettled {
        /// The rounds driven.
        rounds: u32,
    },
    /// The instance has not completed, so it has no output.
    #[error("the instance is {status}, not completed{}", last_error.as_deref().map(|e| format!(": {e}")).unwrap_or_default())]
    NotCompleted {
        /// Its status.
        status: keiro_journal::Status,
        /// Its last error, if any.
        last_error: Option<String>,
    },
    /// A database URL names no store keiro has (the scheme alone is kept: the rest of a URL
    /// may hold a password).
    #[error("unknown database url scheme {scheme:?}: expected postgres://, postgresql:// or sqlite:PATH")]
    UnknownScheme {
        /// The scheme found (empty when the URL has none).
        scheme: String,
    },
    /// Opening or migrating the SQLite file failed.
    #[cfg(feature = "sqlite")]
    #[error("opening the sqlite database failed")]
    Sqlite(#[from] keiro_sqlite::Error),
    /// Connecting to or migrating the Postgres database failed.
    #[cfg(feature = "postgres")]
    #[error("connecting to postgres failed")]
    Postgres(#[from] keiro_postgres::Error),
}

impl Error {
    /// Why a queue refused the call, when it did (an undeclared queue, a dedup id or priority
    /// the queue does not take, a duplicate dedup id).
    pub fn queue_refusal(&self) -> Option<&keiro_journal::queue::QueueRefusal> {
        match self {
            Self::Store(error) => error.queue_refusal(),
            _ => None,
        }
    }
}

impl From<keiro_journal::Error> for Error {
    fn from(error: keiro_journal::Error) -> Self {
        match error {
            keiro_journal::Error::InvalidId(e) => Self::InvalidId(e),
            keiro_journal::Error::Payload(e) => Self::Payload(e),
            keiro_journal::Error::Store(e) => Self::Store(e),
            keiro_journal::Error::DeliveryRefused { step, reason } => {
                Self::DeliveryRefused { step, reason }
            }
            // The journal's error is non-exhaustive; keep the facade total.
            other => Self::Payload(keiro_journal::WorkflowError::app(other)),
        }
    }
}
