//! For operators: list and count instances, read what one instance waits on, retention, and
//! the tools that repair a run (resurrect, requeue, re-dispatch, retry with a new input). The
//! calls are methods of [`Keiro`]; this module holds their requests and answers. The CLI and
//! the dashboard use these same calls.

use std::time::Duration;

use keiro_journal::IntoInstanceKey;
use keiro_remote::RemoteTask;
use serde::Serialize;

use crate::handle::Operate;
use crate::{Error, InstanceKey, Keiro};

pub use keiro_journal::attribute::{
    AttrError, AttrFilter, AttrOp, AttrValue, Attributes, ATTRIBUTES_MAX, ATTRIBUTE_NAME_LEN_MAX,
    ATTRIBUTE_TEXT_LEN_MAX, ATTR_FILTERS_MAX,
};
pub use keiro_journal::message::{EventRecord, Messages, StreamHead, StreamItem, StreamPage};
pub use keiro_journal::store::{
    TerminalCount, Throughput, ThroughputRequest, THROUGHPUT_BUCKETS_MAX, THROUGHPUT_BUCKET_MAX,
};
pub use keiro_journal::{
    AwakeableInfo, AwakeableStatus, CancelOutcome, Counts, Cursor, FilterError, GcBatch, GcRequest,
    GroupCount, InstanceSummary, ListFilter, ListOrder, ListRequest, Page, SignalWaitInfo,
    StatusCount, TimeRange, TimerInfo, TimerKind, TimerState, Waits, GC_BATCH_DEFAULT,
    GC_BATCH_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, WAITS_LIMIT_DEFAULT,
};
pub use keiro_lease::ResurrectOutcome;
pub use keiro_remote::{AdminError, RequeueOutcome};

/// How many updates [`Keiro::updates`] lists at most: 1,000.
pub const UPDATES_LISTED: u32 = 1000;

impl Keiro {
    fn operate(&self) -> Result<&Operate, Error> {
        self.operate.as_ref().ok_or(Error::Unsupported {
            what: "listing, counting and retention (the store was built with `KeiroBuilder::lease_only`)",
        })
    }

    /// One page of instances, newest first unless the request says otherwise; pass the page's
    /// `next_cursor` in the next request to go on (keyset pagination: pages stay consistent
    /// and cost the same however deep).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keiro::Error> {
    /// use keiro::{operate::ListRequest, Status};
    /// let keiro = keiro::Keiro::temporary()?;
    /// keiro.start("order", "order-1", &1).await?;
    /// let mut request = ListRequest::from_pairs([("status", "running"), ("limit", "10")])?;
    /// loop {
    ///     let page = keiro.list(&request).await?;
    ///     for row in &page.instances {
    ///         assert_eq!(row.status, Status::Running);
    ///     }
    ///     match page.next_cursor {
    ///         Some(cursor) => request.cursor = Some(cursor),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Filter`] for a request out of bounds, [`Error::Store`],
    /// [`Error::Unsupported`] for a store built with `KeiroBuilder::lease_only`.
    pub async fn list(&self, request: &ListRequest) -> Result<Page, Error> {
        request.validate()?;
        Ok(self.operate()?.inspect.instances_list(request).await?)
    }

    /// Instances by workflow and status, the timer backlog (due and future), and the pending
    /// and running remote tasks by group.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// keiro.start("order", "order-1", &7).await?;
    /// let counts = keiro.counts().await?;
    /// println!("{counts:?}");
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Store`], [`Error::Unsupported`] for a store built with `KeiroBuilder::lease_only`.
    pub async fn counts(&self) -> Result<Counts, Error> {
        Ok(self.operate()?.inspect.instances_counts(None).await?)
    }

    /// How many instances completed, failed and were cancelled in each time bucket of
    /// `request` (by when they went terminal), oldest bucket first, empty ones included: the
    /// dashboard's throughput chart. Buckets are aligned on the epoch and the last one holds
    /// `request.until` (now when `None`), so it is partly elapsed.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keiro::Error> {
    /// use keiro::operate::ThroughputRequest;
    /// let keiro = keiro::Keiro::temporary()?;
    /// let hour = keiro.throughput(&ThroughputRequest::last_hour()).await?;
    /// assert_eq!(hour.buckets.len(), 60);
    /// assert!(hour.buckets.iter().all(|b| b.completed + b.failed + b.cancelled == 0));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Filter`] for a bucket that is not whole seconds from 1 s to a day or a count
    /// of buckets out of `1..=`[`THROUGHPUT_BUCKETS_MAX`], [`Error::Store`],
    /// [`Error::Unsupported`] for a store built with `KeiroBuilder::lease_only`.
    pub async fn throughput(&self, request: &ThroughputRequest) -> Result<Throughput, Error> {
        request.validate()?;
        Ok(self
            .operate()?
            .inspect
            .instances_throughput(request)
            .await?)
    }

    /// What one instance waits on, or waited on: its timers (state, due time, attempts), its
    /// awakeables (id, status) and its pending signal waits (token, timeout), up to `limit` of
    /// each kind, newest first; `truncated` says whether a kind had more. Its children are
    /// [`list`](Self::list)ed with the `parent` filter, its remote tasks read by
    /// [`remote_tasks`](Self::remote_tasks). Empty for an unknown instance.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keiro::Error> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// keiro.start("order", "order-1", &1).await?;
    /// let waits = keiro.waits(("order", "order-1"), keiro::operate::WAITS_LIMIT_DEFAULT).await?;
    /// assert!(waits.timers.is_empty() && !waits.truncated);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`], [`Error::Filter`] for a limit of 0 or above
    /// [`LIST_LIMIT_MAX`], [`Error::Store`], [`Error::Unsupported`] for a store wrapped with
    /// `KeiroBuilder::lease_only`.
    pub async fn waits(&self, key: impl IntoInstanceKey, limit: u32) -> Result<Waits, Error> {
        let key = key.into_instance_key()?;
        if limit == 0 || limit > LIST_LIMIT_MAX {
            return Err(FilterError::Limit {
                limit: u64::from(limit),
                max: LIST_LIMIT_MAX,
            }
            .into());
        }
        Ok(self.operate()?.inspect.instance_waits(&key, limit).await?)
    }

    /// The events an instance set (with their current values) and the streams it wrote (with
    /// their lengths and whether they are closed), by key; empty for an unknown instance.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let messages = keiro.messages(("order", "order-1")).await?;
    /// assert!(messages.events.is_empty() && messages.streams.is_empty());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`], [`Error::Store`], [`Error::Unsupported`] for a store wrapped with
    /// `KeiroBuilder::lease_only`.
    pub async fn messages(&self, key: impl IntoInstanceKey) -> Result<Messages, Error> {
        let key = key.into_instance_key()?;
        Ok(self.operate()?.inspect.instance_messages(&key).await?)
    }

    /// The search attributes of an instance (set at its start and by its body, the latest
    /// value of each name); empty for an unknown instance.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use keiro::{operate::AttrValue, queue::StartOptions};
    /// let keiro = keiro::Keiro::temporary()?;
    /// let options = StartOptions::default().attribute("customer", "acme");
    /// keiro.start_with("order", "order-1", &1, &options).await?;
    /// let attributes = keiro.attributes(("order", "order-1")).await?;
    /// assert_eq!(attributes.get("customer"), Some(&AttrValue::from("acme")));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`], [`Error::Store`], [`Error::Unsupported`] for a store wrapped with
    /// `KeiroBuilder::lease_only`.
    pub async fn attributes(&self, key: impl IntoInstanceKey) -> Result<Attributes, Error> {
        let key = key.into_instance_key()?;
        Ok(self.operate()?.inspect.instance_attributes(&key).await?)
    }

    /// The updates sent to an instance, oldest first, at most [`UPDATES_LISTED`]: each one's
    /// id, name, request, state (requested, replied, rejected, unanswered) and times; empty
    /// for an unknown instance.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// assert!(keiro.updates(("order", "order-1")).await?.is_empty());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`], [`Error::Store`], [`Error::Unsupported`] for a store wrapped with
    /// `KeiroBuilder::lease_only`.
    pub async fn updates(
        &self,
        key: impl IntoInstanceKey,
    ) -> Result<Vec<keiro_journal::update::UpdateRecord>, Error> {
        let key = key.into_instance_key()?;
        Ok(self
            .operate()?
            .inspect
            .instance_updates(&key, UPDATES_LISTED)
            .await?)
    }

    /// One page of a stream from offset `from` (at most 256 items), with whether it is closed
    /// and the instance's status, as it is now; `None` for an unknown instance. To follow a
    /// stream live, use [`read_stream`](Keiro::read_stream).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// assert!(keiro.stream_page(("order", "order-1"), "progress", 0).await?.is_none());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`] for a bad key, [`Error::Store`], [`Error::Unsupported`] for a
    /// store wrapped with `KeiroBuilder::lease_only`.
    pub async fn stream_page(
        &self,
        key: impl IntoInstanceKey,
        stream: &str,
        from: u64,
    ) -> Result<Option<StreamPage>, Error> {
        let key = key.into_instance_key()?;
        keiro_journal::store::validate_message_key(stream)?;
        let limit = crate::messages::STREAM_PAGE_DEFAULT;
        Ok(self
            .operate()?
            .inspect
            .stream_read(&key, stream, from, limit)
            .await?)
    }

    /// Retention, one batch: deletes up to `request.batch` instances that have been terminal
    /// for longer than `request.older_than`, with their journal, timers, awakeables, signal
    /// waits and remote tasks, in one short transaction. Never a live instance, nor one whose
    /// parent is not expired too, nor a parent before its children.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// use std::time::Duration;
    /// let request = keiro::operate::GcRequest::new(Duration::from_secs(30 * 86_400));
    /// let batch = keiro.gc_batch(&request).await?;
    /// assert_eq!(batch.instances, 0);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Store`], [`Error::Unsupported`] for a store built with `KeiroBuilder::lease_only`.
    pub async fn gc_batch(&self, request: &GcRequest) -> Result<GcBatch, Error> {
        Ok(self.operate()?.retention.instances_gc(request).await?)
    }

    /// Retention, until done: batches (`pause` apart) until a batch finds fewer rows than it
    /// asked for or another collector holds the retention lock (then `locked_out` is set).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), keiro::Error> {
    /// use std::time::Duration;
    /// let keiro = keiro::Keiro::temporary()?;
    /// let request = keiro::operate::GcRequest::new(Duration::from_secs(30 * 86_400));
    /// let deleted = keiro.gc(&request, Duration::ZERO).await?;
    /// assert_eq!(deleted.instances, 0);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// The first failing batch's [`Error::Store`] (earlier batches stay deleted).
    pub async fn gc(&self, request: &GcRequest, pause: Duration) -> Result<GcBatch, Error> {
        let store = self.operate()?.retention.as_ref();
        Ok(keiro_resume::collect(store, request, u32::MAX, pause).await?)
    }

    /// How many instances [`gc`](Self::gc) with `request` would delete now (a dry run).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// use std::time::Duration;
    /// let request = keiro::operate::GcRequest::new(Duration::from_secs(30 * 86_400));
    /// assert_eq!(keiro.gc_eligible(&request).await?, 0);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Store`], [`Error::Unsupported`] for a store built with `KeiroBuilder::lease_only`.
    pub async fn gc_eligible(&self, request: &GcRequest) -> Result<u64, Error> {
        Ok(self
            .operate()?
            .retention
            .instances_gc_eligible(request)
            .await?)
    }

    /// Operator: returns a failed instance to running, keeping its failure history.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// keiro.start("order", "order-1", &7).await?;
    /// // Only a failed instance is resurrected.
    /// let outcome = keiro.resurrect(("order", "order-1")).await?;
    /// assert_eq!(outcome, keiro::operate::ResurrectOutcome::NotFailed(keiro::Status::Running));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`], [`Error::Store`].
    pub async fn resurrect(&self, key: impl IntoInstanceKey) -> Result<ResurrectOutcome, Error> {
        let key = key.into_instance_key()?;
        Ok(self.store.instance_resurrect(&key).await?)
    }

    /// Operator: drops the instance's lease; its holder stops at its next boundary.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// keiro.start("order", "order-1", &7).await?;
    /// let dropped = keiro.force_release(("order", "order-1")).await?;
    /// assert!(!dropped, "no worker held it");
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`], [`Error::Store`].
    pub async fn force_release(&self, key: impl IntoInstanceKey) -> Result<bool, Error> {
        let key = key.into_instance_key()?;
        Ok(self.store.instance_lease_force_release(&key).await?)
    }

    /// Requeues a failed instance (the operator's retry): its failed remote steps are retried
    /// from scratch, awaited child failures go back to waiting (failed children are requeued
    /// too unless a success for them is already there), the error is cleared and the run is
    /// runnable again. History is appended to, never rewritten.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), Box<dyn std::error::Error>> {
    /// match keiro.requeue(("order", "order-42")).await? {
    ///     keiro::operate::RequeueOutcome::NotFound => println!("no such instance"),
    ///     outcome => println!("{outcome:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Admin`] for an unknown instance or a store failure.
    pub async fn requeue(&self, key: impl IntoInstanceKey) -> Result<RequeueOutcome, Error> {
        let key = key.into_instance_key()?;
        Ok(keiro_remote::requeue(self.remote()?.admin.as_ref(), &key).await?)
    }

    /// Re-dispatches every pending remote step of an instance and returns how many.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), Box<dyn std::error::Error>> {
    /// let count = keiro.redispatch_pending(("order", "order-42")).await?;
    /// println!("{count} remote step(s) re-dispatched");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Admin`] for an unknown instance or a store failure.
    pub async fn redispatch_pending(&self, key: impl IntoInstanceKey) -> Result<u64, Error> {
        let key = key.into_instance_key()?;
        Ok(keiro_remote::redispatch_pending(self.remote()?.admin.as_ref(), &key).await?)
    }

    /// Fix-and-replay: starts `<id>~retry~<8 hex>` of the same workflow with `input` and a
    /// clean history; its success is also delivered to a parent awaiting the origin. Returns
    /// the new instance.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), Box<dyn std::error::Error>> {
    /// // order-42 failed on a bad SKU: run it again with the right one.
    /// let retry = keiro.retry_with_input(("order", "order-42"), &8).await?;
    /// println!("started {retry}");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Admin`] for an unknown origin, a bad input or a store failure.
    pub async fn retry_with_input<I: Serialize + ?Sized>(
        &self,
        key: impl IntoInstanceKey,
        input: &I,
    ) -> Result<InstanceKey, Error> {
        let key = key.into_instance_key()?;
        Ok(keiro_remote::retry_with_input(
            self.remote()?.admin.as_ref(),
            &key,
            input,
            self.payload_len_max,
        )
        .await?)
    }

    /// The remote tasks of an instance, oldest first.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// keiro.start("order", "order-1", &7).await?;
    /// let tasks = keiro.remote_tasks(("order", "order-1")).await?;
    /// assert!(tasks.is_empty());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn remote_tasks(&self, key: impl IntoInstanceKey) -> Result<Vec<RemoteTask>, Error> {
        let key = key.into_instance_key()?;
        Ok(self.remote()?.admin.remote_tasks(&key).await?)
    }
}
