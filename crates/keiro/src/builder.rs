//! `KeiroBuilder`: how a store becomes a [`Keiro`] handle, with its push wake-ups found for it.

use std::any::Any;
use std::sync::Arc;

use keiro_journal::codec::Codec;
use keiro_journal::{DeliveryBacklog, PAYLOAD_LEN_MAX_DEFAULT};
use keiro_lease::{LeaseStore, QueueStore};
use keiro_resume::{Notifier, ScheduleStore};

use crate::codec::Sealing;
use crate::handle::{Keiro, Operate, Remote};
use crate::store::Store;

/// Builds a [`Keiro`] handle: from [`Keiro::builder`] over a full store, or
/// [`lease_only`](Self::lease_only) over a store with leases alone.
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use keiro::{Keiro, KeiroBuilder};
/// let keiro: Keiro = Keiro::builder(keiro::store::sqlite::SqliteStore::temporary()?).build();
/// let bare: Keiro = KeiroBuilder::lease_only(std::sync::Arc::new(keiro::store::sqlite::SqliteStore::temporary()?))
///     .without_push()
///     .build();
/// assert!(keiro.notifier().is_some() && bare.notifier().is_none());
/// # }
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
#[must_use]
pub struct KeiroBuilder {
    store: Arc<dyn LeaseStore>,
    remote: Option<Remote>,
    operate: Option<Operate>,
    schedules: Option<Arc<dyn keiro_resume::ScheduleStore>>,
    queues: Option<Arc<dyn keiro_lease::QueueStore>>,
    versions: Option<Arc<dyn keiro_lease::VersionStore>>,
    notifier: Option<Arc<dyn Notifier>>,
    payload_len_max: usize,
    delivery_backlog: DeliveryBacklog,
    codec: Option<Arc<dyn Codec>>,
}

impl std::fmt::Debug for KeiroBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeiroBuilder")
            .field("store", &self.store)
            .field("push", &self.notifier.is_some())
            .field("payload_len_max", &self.payload_len_max)
            .field("delivery_backlog", &self.delivery_backlog)
            .field("codec", &self.codec)
            .finish_non_exhaustive()
    }
}

impl KeiroBuilder {
    pub(crate) fn new<S: Store>(store: Arc<S>) -> Self {
        Self {
            notifier: builtin_push(store.as_ref()),
            store: store.clone(),
            operate: Some(Operate::new(store.clone())),
            remote: Some(Remote {
                transport: store.clone(),
                admin: store.clone(),
            }),
            schedules: Some(store.clone()),
            queues: Some(store.clone()),
            versions: Some(store),
            payload_len_max: PAYLOAD_LEN_MAX_DEFAULT,
            delivery_backlog: DeliveryBacklog::default(),
            codec: None,
        }
    }

    /// A builder over a store that has leases but none of the rest (a test double or a
    /// wrapper of your own): remote steps, the operators' list and retention, schedules and queues
    /// then return [`Error::Unsupported`](crate::Error::Unsupported). Push is found as for
    /// [`Keiro::builder`]; a wrapper passes its inner store's with [`push`](Self::push).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// // A store of your own that has leases (here the SQLite store, standing in for one).
    /// let store: Arc<dyn keiro::store::LeaseStore> = Arc::new(keiro::store::sqlite::SqliteStore::temporary()?);
    /// let keiro = keiro::KeiroBuilder::lease_only(store).build();
    /// # let _ = keiro;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn lease_only(store: Arc<dyn LeaseStore>) -> Self {
        Self {
            notifier: store.as_any().and_then(builtin_push),
            store,
            remote: None,
            operate: None,
            schedules: None,
            queues: None,
            versions: None,
            payload_len_max: PAYLOAD_LEN_MAX_DEFAULT,
            delivery_backlog: DeliveryBacklog::default(),
            codec: None,
        }
    }

    /// Wakes workers and result waiters through `notifier`, for a store whose push keiro
    /// cannot find by itself (a wrapper around a `PgStore`, say).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// let store = keiro::store::sqlite::SqliteStore::temporary()?;
    /// let notifier: Arc<dyn keiro::worker::Notifier> = Arc::new(store.clone());
    /// let keiro = keiro::KeiroBuilder::lease_only(Arc::new(store)).push(notifier).build();
    /// assert!(keiro.notifier().is_some());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn push(mut self, notifier: Arc<dyn Notifier>) -> Self {
        self.notifier = Some(notifier);
        self
    }

    /// No push: workers and result waiters poll (for tests of the poll fallback).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::builder(keiro::store::sqlite::SqliteStore::temporary()?)
    ///     .without_push()
    ///     .build();
    /// assert!(keiro.notifier().is_none());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn without_push(mut self) -> Self {
        self.notifier = None;
        self
    }

    /// The largest payload accepted by `start`, `deliver`, signals and awakeable completions,
    /// and the default limit of what the workers built from the handle journal. Defaults to
    /// [`PAYLOAD_LEN_MAX_DEFAULT`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::builder(keiro::store::sqlite::SqliteStore::temporary()?)
    ///     .payload_len_max(256 * 1024)
    ///     .build();
    /// # let _ = keiro;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn payload_len_max(mut self, payload_len_max: usize) -> Self {
        self.payload_len_max = payload_len_max;
        self
    }

    /// How many deliveries that no await has read the handle's `deliver` lets a generation
    /// hold (see [`Keiro::with_delivery_backlog`]). Defaults to [`DeliveryBacklog::default`].
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::builder(keiro::store::sqlite::SqliteStore::temporary()?)
    ///     .delivery_backlog(keiro::workflow::DeliveryBacklog { deliveries: 100, bytes: 1 << 20 })
    ///     .build();
    /// # let _ = keiro;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn delivery_backlog(mut self, backlog: DeliveryBacklog) -> Self {
        self.delivery_backlog = backlog;
        self
    }

    /// Seals every payload the handle stores with `codec` and opens it on the way out (see
    /// [`codec`](crate::codec)): inputs, outputs, step results, deliveries, signals, updates,
    /// events, streams, remote tasks, schedules. The workers, remote workers and operators'
    /// reads built from the handle inherit it. Defaults to none: payloads are stored as they
    /// are.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// let codec = keiro::codec::AesGcmCodec::new("k1", [7; 32])?;
    /// let keiro = keiro::Keiro::builder(keiro::store::sqlite::SqliteStore::temporary()?)
    ///     .codec(Arc::new(codec))
    ///     .build();
    /// assert!(keiro.codec().is_some());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn codec(mut self, codec: Arc<dyn Codec>) -> Self {
        self.codec = Some(codec);
        self
    }

    /// [`codec`](Self::codec) with the AES-256-GCM key ring of `KEIRO_ENCRYPTION_KEYS`
    /// ([`AesGcmCodec::from_env`](crate::codec::AesGcmCodec::from_env)); unset or empty, no
    /// codec. What [`Keiro::connect`](crate::Keiro::connect) and the `keiro` CLI do.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::builder(keiro::store::sqlite::SqliteStore::temporary()?)
    ///     .codec_from_env()?
    ///     .build();
    /// # let _ = keiro;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::EncryptionKeys`](crate::Error::EncryptionKeys) for a key list it cannot read.
    pub fn codec_from_env(self) -> Result<Self, crate::Error> {
        Ok(match crate::codec::AesGcmCodec::from_env()? {
            Some(codec) => self.codec(Arc::new(codec)),
            None => self,
        })
    }

    /// The handle.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::builder(keiro::store::sqlite::SqliteStore::temporary()?).build();
    /// # let _ = keiro;
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn build(self) -> Keiro {
        let Some(codec) = self.codec.clone() else {
            return self.assemble();
        };
        Self {
            store: Arc::new(Sealing::new(self.store, codec.clone())),
            remote: self.remote.map(|remote| Remote {
                transport: Arc::new(Sealing::new(remote.transport, codec.clone())),
                admin: Arc::new(Sealing::new(remote.admin, codec.clone())),
            }),
            operate: self.operate.map(|operate| Operate {
                inspect: Arc::new(Sealing::new(operate.inspect, codec.clone())),
                retention: operate.retention,
                payloads: operate.payloads,
            }),
            schedules: self
                .schedules
                .map(|s| Arc::new(Sealing::new(s, codec.clone())) as Arc<dyn ScheduleStore>),
            queues: self
                .queues
                .map(|q| Arc::new(Sealing::new(q, codec.clone())) as Arc<dyn QueueStore>),
            ..self
        }
        .assemble()
    }

    fn assemble(self) -> Keiro {
        Keiro {
            store: self.store,
            remote: self.remote,
            notifier: self.notifier,
            payload_len_max: self.payload_len_max,
            delivery_backlog: self.delivery_backlog,
            operate: self.operate,
            schedules: self.schedules,
            queues: self.queues,
            versions: self.versions,
            codec: self.codec,
            hand_offs: Arc::default(),
        }
    }
}

/// The push of a built-in store: `PgStore`'s LISTEN hub or `SqliteStore`'s notification poller. Both are
/// handles on shared state, so a clone of the handle notifies for the store itself.
fn builtin_push(store: &dyn Any) -> Option<Arc<dyn Notifier>> {
    #[cfg(feature = "postgres")]
    if let Some(pg) = store.downcast_ref::<keiro_postgres::PgStore>() {
        return Some(Arc::new(pg.clone()));
    }
    #[cfg(feature = "sqlite")]
    if let Some(sqlite) = store.downcast_ref::<keiro_sqlite::SqliteStore>() {
        return Some(Arc::new(sqlite.clone()));
    }
    let _ = store;
    None
}
