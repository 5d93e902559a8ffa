//! What a [`Keiro`] handle holds: the halves of its store (leases, remote steps, the
//! operators' calls, schedules), its push notifier and its limits. The calls are written
//! beside what they are for (`engine`: start, cancel, deliver, inspect and the builders of
//! workers; `operate`, `result`, `schedule`, `typed`, `start_in`), each an `impl Keiro` that
//! depends on this module; this module depends on none of them, so the dependencies between
//! the facade's modules run one way.

use std::sync::Arc;

use keiro_journal::{DeliveryBacklog, InspectStore, RetentionStore};
use keiro_lease::LeaseStore;
use keiro_remote::{RemoteAdmin, Transport};
use keiro_resume::{Notifier, ScheduleStore};

use crate::store::Store;

/// The remote-step halves of a store.
#[derive(Clone)]
pub(crate) struct Remote {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) admin: Arc<dyn RemoteAdmin>,
}

/// The operator halves of a store.
#[derive(Clone)]
pub(crate) struct Operate {
    pub(crate) inspect: Arc<dyn InspectStore>,
    pub(crate) retention: Arc<dyn RetentionStore>,
    /// The stored payloads, as they are (never through the codec): re-encryption's.
    pub(crate) payloads: Arc<dyn keiro_journal::store::PayloadStore>,
}

impl Operate {
    pub(crate) fn new<S: Store>(store: Arc<S>) -> Self {
        Self {
            inspect: store.clone(),
            retention: store.clone(),
            payloads: store,
        }
    }

    pub(crate) fn retention(&self) -> Arc<dyn RetentionStore> {
        self.retention.clone()
    }
}

/// A handle on a keiro store: start and operate workflow instances, and build workers.
/// Cheap to clone.
///
/// ```
/// # #[cfg(feature = "sqlite")]
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), keiro::Error> {
/// let keiro = keiro::Keiro::temporary()?;
/// let started = keiro.start("order", "order-1", &7).await?;
/// assert!(started.created);
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))] fn main() {}
/// ```
#[derive(Clone)]
pub struct Keiro {
    pub(crate) store: Arc<dyn LeaseStore>,
    pub(crate) remote: Option<Remote>,
    pub(crate) notifier: Option<Arc<dyn Notifier>>,
    pub(crate) payload_len_max: usize,
    pub(crate) delivery_backlog: DeliveryBacklog,
    /// The operators' list, counts and retention; `None` for a store built with `KeiroBuilder::lease_only`.
    pub(crate) operate: Option<Operate>,
    /// Schedules (`None` for a store built with `KeiroBuilder::lease_only`).
    pub(crate) schedules: Option<Arc<dyn ScheduleStore>>,
    /// Queues (`None` for a store built with `KeiroBuilder::lease_only`).
    pub(crate) queues: Option<Arc<dyn keiro_lease::QueueStore>>,
    /// Application versions: the store's own, heartbeats, moves (`None` for a store built
    /// with `KeiroBuilder::lease_only`).
    pub(crate) versions: Option<Arc<dyn keiro_lease::VersionStore>>,
    /// The payload codec the store is wrapped in (`crate::codec`), for the calls that write in
    /// the caller's own transaction; `None` stores payloads as they are.
    pub(crate) codec: Option<Arc<dyn keiro_journal::codec::Codec>>,
    /// The worker loops built from this handle (and its clones) that take the runs it starts
    /// (`keiro_resume::HandOffs`), while they run.
    pub(crate) hand_offs: Arc<keiro_resume::HandOffs>,
}

impl std::fmt::Debug for Keiro {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keiro")
            .field("store", &self.store)
            .field("push", &self.notifier.is_some())
            .field("payload_len_max", &self.payload_len_max)
            .field("delivery_backlog", &self.delivery_backlog)
            .field("codec", &self.codec)
            .finish()
    }
}
