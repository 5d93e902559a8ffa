//! For people writing a store, or reading one's records: the traits a store implements
//! ([`Store`] is all of them at once, what [`Keiro::builder`](crate::Keiro::builder) takes),
//! the records it keeps (instances, journal entries, events), and the requests and outcomes of
//! its operations. The contract every store keeps is `docs/store-contract.md`.

pub use crate::connect::Database;
pub use keiro_journal::store::*;
pub use keiro_journal::{
    Append, AppendOutcome, Envelope, Event, Fence, Generation, InspectStore, Instance,
    JournalEntry, Marker, RetentionStore, Started, StepKind, StoreError, TimerFiring,
};
pub use keiro_lease::{
    ClaimOutcome, CrashOutcome, LeaseStore, OpenRefusal, QueueStore, RefusalOutcome, StartClaim,
    VersionStore, CRASH_BACKOFF_DEFAULT,
};
pub use keiro_remote::{RemoteAdmin, Transport};
pub use keiro_resume::ScheduleStore;

/// A store with every capability keiro uses: the journal and wake sources, leases, remote
/// steps (their transport and the operator's tools), the operators' list, counts and
/// retention, schedules, queues, and the payloads re-encryption rewrites. `PgStore` and `SqliteStore` are ones.
pub trait Store:
    LeaseStore
    + QueueStore
    + VersionStore
    + Transport
    + RemoteAdmin
    + InspectStore
    + RetentionStore
    + ScheduleStore
    + PayloadStore
{
}

impl<
        T: LeaseStore
            + QueueStore
            + VersionStore
            + Transport
            + RemoteAdmin
            + InspectStore
            + RetentionStore
            + ScheduleStore
            + PayloadStore,
    > Store for T
{
}

/// The SQLite store: keiro on one file, no server (here rather than at the crate root, which
/// holds what a workflow's author writes every day; [`Keiro::connect`](crate::Keiro::connect)
/// with `sqlite:PATH` is the everyday way in).
#[cfg(feature = "sqlite")]
pub use keiro_sqlite as sqlite;
