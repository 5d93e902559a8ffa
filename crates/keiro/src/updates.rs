//! Updates into a running workflow: [`Keiro::update`] sends a request the body takes with
//! `ctx.next_update` and answers with `ctx.reply` (or `ctx.reject`), and waits for the answer;
//! [`Keiro::update_with_start`] and [`Keiro::signal_with_start`] start the run first when it
//! does not exist, in the same transaction.
//!
//! # Design
//!
//! ```text
//!   update_send (one transaction: row + offer on the instance's update token)
//!        │ answered already? ──► the answer (a retry with the same id)
//!        ▼
//!   subscribe_messages(key) ──► update_get (one snapshot) ──► replied / rejected / unanswered
//!                                  ▲                                    │ requested
//!                                  └── woken: the run answered or ended, the listener
//!                                      reconnected, or the fallback poll elapsed
//! ```
//!
//! The caller's wait is durable because everything it waits for is in the store: the update's
//! row is written before the call returns from its send, the run's answer is a journal step
//! written with the row's answer, and a worker that crashes between the take and the answer
//! leaves the take journaled, so the next worker's replay takes the same update and answers
//! it. A timeout ends the caller's wait only: the update stays, the run may still answer it,
//! and a later call with the same update id gets that answer.

use std::time::Duration;

use keiro_journal::store::{validate_signal_token, StartRequest};
use keiro_journal::update::{
    validate_update_id, validate_update_name, SignalStarted, UpdateSend, UpdateSendOutcome,
    UpdateState,
};
use keiro_journal::{InstanceKey, IntoInstanceKey, SignalOptions, StoreError};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::messages::MESSAGE_POLL_INTERVAL_DEFAULT;
use crate::{Error, Keiro};

/// How long [`Keiro::update`] waits for the answer unless told: 60 s.
pub const UPDATE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// An update to send: its name, the request, the caller's update id (a retry with the same id
/// gets the same answer) and how long to wait for the answer.
///
/// ```
/// use std::time::Duration;
/// let call = keiro::workflow::UpdateCall::new("approve", &42)
///     .id("approve-order-42")
///     .timeout(Duration::from_secs(5));
/// assert_eq!(call.update_id(), Some("approve-order-42"));
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct UpdateCall<'a, R: ?Sized> {
    name: &'a str,
    request: &'a R,
    id: Option<String>,
    timeout: Duration,
}

impl<'a, R: Serialize + ?Sized> UpdateCall<'a, R> {
    /// Update `name` with `request`, under a fresh random id, waiting
    /// [`UPDATE_TIMEOUT_DEFAULT`].
    pub fn new(name: &'a str, request: &'a R) -> Self {
        Self {
            name,
            request,
            id: None,
            timeout: UPDATE_TIMEOUT_DEFAULT,
        }
    }

    /// Sends under `id`: a second call with the same id (a retry after a crash or a timeout)
    /// finds the first and gets its answer. Defaults to a fresh random id.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Waits at most `timeout` for the answer. Defaults to [`UPDATE_TIMEOUT_DEFAULT`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The update id set with [`id`](Self::id), if any.
    pub fn update_id(&self) -> Option<&str> {
        self.id.as_deref()
    }
}

/// How many of an instance's updates a sealed retry looks through for its own
/// (`sealed_retry`).
const UPDATES_SCANNED_MAX: u32 = 10_000;

impl Keiro {
    /// Sends update `name` with `request` to the instance (a key, `(name, id)`, or a typed
    /// handle) under a fresh update id and waits up to `timeout` for the body's answer
    /// (`ctx.reply`), woken by the store's push. [`update_with`](Self::update_with) sets the
    /// update id, for retries.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let keiro = keiro::Keiro::temporary()?;
    /// async fn counter(ctx: keiro::Ctx, _: ()) -> Result<u32, keiro::WorkflowError> {
    ///     let add = ctx.next_update::<u32>("add").await?;
    ///     ctx.reply(&add, &(add.request + 1)).await?;
    ///     Ok(add.request)
    /// }
    /// let worker = keiro.worker().register("counter", counter).build()?;
    /// keiro.start("counter", "c-1", &()).await?;
    /// let caller = keiro.clone();
    /// let reply = tokio::spawn(async move {
    ///     caller.update::<_, u32>(("counter", "c-1"), "add", &41, Duration::from_secs(5)).await
    /// });
    /// while !reply.is_finished() {
    ///     worker.drain().await?; // the run takes the update and answers it
    ///     tokio::time::sleep(Duration::from_millis(10)).await;
    /// }
    /// assert_eq!(reply.await??, 42);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`update_with`](Self::update_with).
    pub async fn update<R: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        key: impl IntoInstanceKey,
        name: &str,
        request: &R,
        timeout: Duration,
    ) -> Result<T, Error> {
        self.update_with(key, UpdateCall::new(name, request).timeout(timeout))
            .await
    }

    /// Sends `call` to the instance and waits for the answer: a retry with the same update id
    /// gets the same answer, whether it came before or after.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), keiro::Error> {
    /// use keiro::workflow::UpdateCall;
    /// let approved: bool = keiro
    ///     .update_with(("order", "order-42"), UpdateCall::new("approve", &100).id("approve-42"))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`] for a bad key, update name or id; [`Error::Payload`] for a request
    /// that does not encode or is too large; [`Error::Store`] with [`StoreError::NotFound`] for
    /// an unknown instance; [`Error::RunFinished`] when the run has ended (nothing is sent);
    /// [`Error::UpdateConflict`] when the id is taken by another update;
    /// [`Error::UpdateRejected`] when the body rejected it; [`Error::UpdateUnanswered`] when
    /// the run ended without answering; [`Error::UpdateTimeout`] when no answer came in time
    /// (the update stays: a retry with its id may still get the answer); [`Error::Decode`]
    /// when the answer does not decode into `T`.
    pub async fn update_with<R: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        key: impl IntoInstanceKey,
        call: UpdateCall<'_, R>,
    ) -> Result<T, Error> {
        let key = key.into_instance_key()?;
        self.send_and_wait(key, None, call).await
    }

    /// [`update_with`](Self::update_with), starting the instance `name`/`id` with `input`
    /// first when it does not exist, in the same transaction as the update's send
    /// (update-with-start): the run never exists without the update, nor the update without
    /// the run.
    ///
    /// # Errors
    ///
    /// As [`update_with`](Self::update_with), and as [`start`](Self::start) for the input.
    pub async fn update_with_start<I: Serialize + ?Sized, R: Serialize + ?Sized, T>(
        &self,
        key: impl IntoInstanceKey,
        input: &I,
        call: UpdateCall<'_, R>,
    ) -> Result<T, Error>
    where
        T: DeserializeOwned,
    {
        let key = key.into_instance_key()?;
        let start = self.plain_start(&key, input)?;
        self.send_and_wait(key, Some(start), call).await
    }

    /// Starts the instance with `input` when it does not exist and sends signal `payload` on
    /// `token`, in one transaction (signal-with-start): a body that waits on the token
    /// (`ctx.wait_signal`) gets it, whether the run was just started or was running.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// let sent = keiro.signal_with_start(("cart", "cart-7"), &(), "cart-7/add", &"apple").await?;
    /// assert!(sent.started);
    /// let again = keiro.signal_with_start(("cart", "cart-7"), &(), "cart-7/add", &"pear").await?;
    /// assert!(!again.started);
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`] for a bad key or token, [`Error::Payload`] for an input or payload
    /// that does not encode or is too large, [`Error::Store`]. Nothing is written then.
    pub async fn signal_with_start<I: Serialize + ?Sized, T: Serialize + ?Sized>(
        &self,
        key: impl IntoInstanceKey,
        input: &I,
        token: &str,
        payload: &T,
    ) -> Result<SignalStarted, Error> {
        let key = key.into_instance_key()?;
        validate_signal_token(token)?;
        let start = self.plain_start(&key, input)?;
        let payload = self.encoded(token, payload)?;
        Ok(self
            .store()
            .signal_with_start(&start, token, &payload, &SignalOptions::default())
            .await?)
    }

    fn plain_start<I: Serialize + ?Sized>(
        &self,
        key: &InstanceKey,
        input: &I,
    ) -> Result<StartRequest, Error> {
        Ok(StartRequest {
            attributes: Default::default(),
            key: key.clone(),
            input: self.encoded("input", input)?,
            parent: None,
            priority: 0,
            queue: None,
        })
    }

    fn encoded<T: Serialize + ?Sized>(
        &self,
        what: &str,
        value: &T,
    ) -> Result<serde_json::Value, Error> {
        keiro_journal::store::encode_payload(what, value, self.payload_len_max)
            .map_err(Error::Payload)
    }

    /// With a payload codec, a retry of an update sends its request sealed under a fresh
    /// nonce, which the store cannot tell from another request: its conflict is checked here
    /// against the stored update, opened. The same name and request is the same update: its
    /// state. `None` for a real conflict, or without a codec.
    async fn sealed_retry(&self, send: &UpdateSend) -> Result<Option<UpdateState>, Error> {
        let (Some(_), Some(operate)) = (&self.codec, &self.operate) else {
            return Ok(None);
        };
        let records = operate
            .inspect
            .instance_updates(&send.key, UPDATES_SCANNED_MAX)
            .await?;
        Ok(records
            .into_iter()
            .find(|r| r.id == send.id && r.name == send.name && r.request == send.request)
            .map(|r| r.state))
    }

    async fn send_and_wait<R: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        key: InstanceKey,
        start: Option<StartRequest>,
        call: UpdateCall<'_, R>,
    ) -> Result<T, Error> {
        validate_update_name(call.name)?;
        let id = match call.id {
            Some(id) => id,
            None => uuid::Uuid::new_v4().to_string(),
        };
        validate_update_id(&id)?;
        let send = UpdateSend {
            key: key.clone(),
            name: call.name.to_owned(),
            id: id.clone(),
            request: self.encoded(call.name, call.request)?,
            start,
        };
        let inspect = self.messages_store()?;
        // Subscribed before the send, so an answer between the two still wakes the wait; a
        // one-shot wait, like an event's (a store may start paying for pushes sooner for it).
        let mut wake = match self.notifier() {
            Some(notifier) => notifier.subscribe_event(&key),
            None => Box::new(keiro_resume::FixedPoll),
        };
        let deadline = tokio::time::Instant::now() + call.timeout;
        let mut state = match self.store().update_send(&send).await? {
            UpdateSendOutcome::Sent { state, .. } => state,
            UpdateSendOutcome::Conflict => match self.sealed_retry(&send).await? {
                Some(state) => state,
                None => return Err(Error::UpdateConflict { key, id }),
            },
            UpdateSendOutcome::Finished(status) => return Err(Error::RunFinished { key, status }),
            UpdateSendOutcome::NotFound => return Err(Error::Store(StoreError::NotFound { key })),
        };
        loop {
            match state {
                UpdateState::Replied(value) => {
                    return serde_json::from_value(value).map_err(|source| Error::Decode {
                        key,
                        what: format!("the answer to update {:?} ({id})", call.name),
                        source,
                    })
                }
                UpdateState::Rejected(message) => {
                    return Err(Error::UpdateRejected {
                        key,
                        update: call.name.to_owned(),
                        id,
                        message,
                    })
                }
                UpdateState::Unanswered(status) => {
                    return Err(Error::UpdateUnanswered {
                        key,
                        update: call.name.to_owned(),
                        id,
                        status,
                    })
                }
                UpdateState::Requested => {}
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(Error::UpdateTimeout {
                    key,
                    update: call.name.to_owned(),
                    id,
                });
            }
            wake.wait(MESSAGE_POLL_INTERVAL_DEFAULT.min(left)).await;
            let read = inspect
                .update_get(&key, &id)
                .await?
                .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
            state = match read.update {
                Some((_, state)) => state,
                None => return Err(Error::Store(StoreError::NotFound { key })),
            };
        }
    }
}
