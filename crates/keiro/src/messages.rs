//! Talking to a running workflow: [`Keiro::get_event`] reads an event a run set
//! (`ctx.set_event`), [`Keiro::read_stream`] follows a stream it writes (`ctx.write_stream`).
//!
//! # Design
//!
//! ```text
//!   subscribe_messages(key) ──► read (one snapshot: rows + instance status) ──► value / items
//!                                  ▲                                    │ nothing (yet)
//!                                  │                                    ▼
//!                                  └── woken: the run wrote or ended, the listener reconnected,
//!                                      or the fallback poll elapsed
//! ```
//!
//! The store's rows are authoritative; a push (`msg:<name>/<id>` on the Postgres wake channel,
//! the SQLite store's notification table, or the write itself when this process's store made
//! it) only says when reading again is worthwhile, so a lost notification costs latency,
//! never an item. The subscription is made before the first read, so a write between the two
//! still wakes the reader. A stream is read in pages of [`STREAM_PAGE_DEFAULT`] items, so a
//! reader holds one page at most however long the stream.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use keiro_journal::message::StreamItem;
use keiro_journal::store::validate_message_key;
use keiro_journal::{InspectStore, InstanceKey, IntoInstanceKey, StoreError};
use keiro_resume::{FixedPoll, WakeSource};
use serde::de::DeserializeOwned;

use crate::{Error, Keiro};

/// What [`Keiro::read_stream`] returns: a boxed `futures_util` stream of `(offset, value)`
/// (`Unpin`, so `next()` works on it as it is), which ends after the stream's last item or
/// after its first error.
pub type StreamReader<T> = BoxStream<'static, Result<(u64, T), Error>>;

/// How many items [`Keiro::read_stream`] reads at a time: 256.
pub(crate) const STREAM_PAGE_DEFAULT: u32 = 256;

/// How often a reader reads again when nothing woke it: 1 s, the result waiter's default
/// (a push wakes it within milliseconds; this is the fallback).
pub(crate) const MESSAGE_POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

impl Keiro {
    /// The current value of event `event` of the instance (a key, `(name, id)`, or a typed
    /// handle `&handle`), waiting up to `timeout` for the run to set it first, woken by the
    /// store's push. `None` when the timeout passes first, or when the run ended without
    /// setting it (it never will). A zero timeout reads once.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let keiro = keiro::Keiro::temporary()?;
    /// # async fn pay(ctx: keiro::Ctx, _: ()) -> Result<(), keiro::WorkflowError> {
    /// #     ctx.set_event("payment", &"confirmed").await
    /// # }
    /// let worker = keiro.worker().register("pay", pay).build()?;
    /// keiro.start("pay", "pay-1", &()).await?;
    /// worker.drain().await?;
    /// let payment: Option<String> =
    ///     keiro.get_event(("pay", "pay-1"), "payment", Duration::from_secs(5)).await?;
    /// assert_eq!(payment.as_deref(), Some("confirmed"));
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`] for a bad instance or event key, [`Error::Store`] with
    /// [`StoreError::NotFound`] for an unknown instance (or a store failure),
    /// [`Error::Decode`] when the value does not decode into `T`, [`Error::Unsupported`] for
    /// a store built with `KeiroBuilder::lease_only`.
    pub async fn get_event<T: DeserializeOwned>(
        &self,
        key: impl IntoInstanceKey,
        event: &str,
        timeout: Duration,
    ) -> Result<Option<T>, Error> {
        let key = key.into_instance_key()?;
        validate_message_key(event)?;
        let inspect = self.messages_store()?;
        let mut wake = match self.notifier() {
            Some(notifier) => notifier.subscribe_event(&key),
            None => Box::new(FixedPoll),
        };
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let read = inspect
                .event_get(&key, event)
                .await?
                .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
            if let Some(found) = read.event {
                let value =
                    serde_json::from_value(found.value).map_err(|source| Error::Decode {
                        key: key.clone(),
                        what: format!("event {event:?}"),
                        source,
                    })?;
                return Ok(Some(value));
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if read.status.is_terminal() || left.is_zero() {
                return Ok(None);
            }
            wake.wait(MESSAGE_POLL_INTERVAL_DEFAULT.min(left)).await;
        }
    }

    /// Follows stream `stream` of the instance from offset `from` (a `futures_util` stream):
    /// the items already written,
    /// then each new one as the run writes it (woken by the store's push), as `(offset,
    /// value)` in offset order, until the run closes the stream (`ctx.close_stream`) or ends.
    /// Offsets count from 0 without gaps, so a reader that reconnects with its last offset + 1
    /// misses nothing and sees nothing twice. The stream reads in pages (bounded memory) and
    /// ends after its first error (a store failure, an item that does not decode).
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use futures_util::StreamExt;
    /// let keiro = keiro::Keiro::temporary()?;
    /// # async fn count(ctx: keiro::Ctx, n: u32) -> Result<(), keiro::WorkflowError> {
    /// #     for i in 0..n { ctx.write_stream("progress", &i).await?; }
    /// #     Ok(())
    /// # }
    /// let worker = keiro.worker().register("count", count).build()?;
    /// keiro.start("count", "count-1", &3u32).await?;
    /// worker.drain().await?;
    /// let items: Vec<(u64, u32)> = keiro
    ///     .read_stream(("count", "count-1"), "progress", 0)?
    ///     .map(|item| item.expect("an item"))
    ///     .collect()
    ///     .await;
    /// assert_eq!(items, [(0, 0), (1, 1), (2, 2)]);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`] for a bad instance or stream key, [`Error::Unsupported`] for a
    /// store built with `KeiroBuilder::lease_only`, at once. Then, as the stream's last item:
    /// [`Error::Store`] ([`StoreError::NotFound`] for an unknown instance), [`Error::Decode`].
    pub fn read_stream<T: DeserializeOwned + Send + 'static>(
        &self,
        key: impl IntoInstanceKey,
        stream: &str,
        from: u64,
    ) -> Result<StreamReader<T>, Error> {
        let key = key.into_instance_key()?;
        validate_message_key(stream)?;
        let follow = Follow {
            inspect: self.messages_store()?,
            wake: self.message_wake(&key),
            key,
            stream: stream.to_owned(),
            next: from,
            buffer: VecDeque::new(),
            ended: false,
        };
        // Boxed: a stream callers can poll with `next()` as it is (it is `Unpin`) and name.
        Ok(
            futures_util::stream::unfold(follow, |mut follow| async move {
                let item = follow.next_item::<T>().await?;
                Some((item, follow))
            })
            .boxed(),
        )
    }

    pub(crate) fn messages_store(&self) -> Result<Arc<dyn InspectStore>, Error> {
        self.operate
            .as_ref()
            .map(|operate| operate.inspect.clone())
            .ok_or(Error::Unsupported {
                what: "events and streams (the store was built with `KeiroBuilder::lease_only`)",
            })
    }

    fn message_wake(&self, key: &InstanceKey) -> Box<dyn WakeSource> {
        match self.notifier() {
            Some(notifier) => notifier.subscribe_messages(key),
            None => Box::new(FixedPoll),
        }
    }
}

/// A reader following a stream: where it is, the page it holds, and its wake-ups.
struct Follow {
    inspect: Arc<dyn InspectStore>,
    wake: Box<dyn WakeSource>,
    key: InstanceKey,
    stream: String,
    /// The offset of the next item to read from the store.
    next: u64,
    buffer: VecDeque<StreamItem>,
    /// Nothing will follow what is buffered: the stream ended, or an error was yielded.
    ended: bool,
}

impl Follow {
    /// The next item, `None` once the stream ended.
    async fn next_item<T: DeserializeOwned>(&mut self) -> Option<Result<(u64, T), Error>> {
        loop {
            if let Some(item) = self.buffer.pop_front() {
                let offset = item.offset;
                return Some(match serde_json::from_value(item.value) {
                    Ok(value) => Ok((offset, value)),
                    Err(source) => {
                        self.ended = true;
                        self.buffer.clear();
                        Err(Error::Decode {
                            key: self.key.clone(),
                            what: format!("stream {:?} offset {offset}", self.stream),
                            source,
                        })
                    }
                });
            }
            if self.ended {
                return None;
            }
            let page = match self
                .inspect
                .stream_read(&self.key, &self.stream, self.next, STREAM_PAGE_DEFAULT)
                .await
            {
                Ok(Some(page)) => page,
                Ok(None) => {
                    self.ended = true;
                    let key = self.key.clone();
                    return Some(Err(Error::Store(StoreError::NotFound { key })));
                }
                Err(error) => {
                    self.ended = true;
                    return Some(Err(Error::Store(error)));
                }
            };
            let limit = usize::try_from(STREAM_PAGE_DEFAULT).unwrap_or(usize::MAX);
            self.ended = page.ends(limit);
            match page.items.last() {
                Some(last) => {
                    self.next = last.offset + 1;
                    self.buffer.extend(page.items);
                }
                None if self.ended => return None,
                None => {
                    self.wake.wait(MESSAGE_POLL_INTERVAL_DEFAULT).await;
                }
            }
        }
    }
}
