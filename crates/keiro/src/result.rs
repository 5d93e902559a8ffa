//! Awaiting an instance's result: [`Keiro::result`] and its options and error.
//!
//! # Design
//!
//! ```text
//!   subscribe_closed(key) ──► read the row ──► terminal? ──► Ok(output as T) / Failed / Cancelled
//!                                  ▲               │ no
//!                                  │               ▼
//!                                  └── woken: the instance closed, the listener reconnected,
//!                                      or the fallback (jittered, never shorter) elapsed
//! ```
//!
//! A close this process committed (its worker ran the last step) wakes the waiter with the
//! outcome itself, which then answers without reading the row again.
//!
//! The instance row is authoritative: a waiter decides only on what it reads there. The
//! store's push (`done:<name>/<id>` on the Postgres wake channel, sent by migration 0016's
//! trigger when the row closes; the SQLite store's notification table) only says when reading again
//! is worthwhile, so a lost notification costs latency, never a result. The subscription is
//! made before the first read, so a close that lands between the two still wakes the waiter.
//! Waiters share the store's one listener and are woken by key: one waiter's instance closing
//! makes no other waiter read. Without push (a store of your own built without
//! [`KeiroBuilder::push`](crate::KeiroBuilder::push)) a waiter reads once per fallback interval.

use std::time::Duration;

use std::sync::Arc;

use keiro_journal::{IdError, Instance, InstanceKey, IntoInstanceKey, Status, StoreError};
use keiro_lease::LeaseStore;
use keiro_resume::{FixedPoll, Notifier, WakeSource};
use serde::de::DeserializeOwned;

use crate::Keiro;

/// The default of [`ResultOptions::poll_interval`]: 1 s, the resume loop's own default poll.
pub const RESULT_POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// The smallest [`ResultOptions::poll_interval`] accepted: 10 ms. Shorter fallbacks are
/// raised to it, so a waiter never reads more often than 100 times a second.
pub const RESULT_POLL_INTERVAL_MIN: Duration = Duration::from_millis(10);

/// How [`Keiro::result_with`] waits.
///
/// ```
/// use std::time::Duration;
/// let options = keiro::ResultOptions {
///     timeout: Some(Duration::from_secs(30)),
///     ..keiro::ResultOptions::default()
/// };
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultOptions {
    /// How long to wait for the instance to close before [`ResultError::Timeout`]; `None`
    /// waits as long as it takes. Defaults to `None`.
    pub timeout: Option<Duration>,
    /// The fallback: how long to wait for a notification before reading the row anyway
    /// (stretched by up to 20% so waiters started together do not read in lockstep; never
    /// below [`RESULT_POLL_INTERVAL_MIN`]). With the store's push, also never below the
    /// process's waiters over [`CLOSED_FALLBACK_READS_PER_S`](keiro_resume::CLOSED_FALLBACK_READS_PER_S)
    /// seconds, so ten thousand waiters do not read ten thousand rows a second while nothing
    /// closes. Defaults to [`RESULT_POLL_INTERVAL_DEFAULT`].
    pub poll_interval: Duration,
}

impl Default for ResultOptions {
    fn default() -> Self {
        Self {
            timeout: None,
            poll_interval: RESULT_POLL_INTERVAL_DEFAULT,
        }
    }
}

/// Why awaiting a result gave no output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResultError {
    /// The workflow name or instance id is invalid.
    #[error("invalid identifier")]
    InvalidId(#[from] IdError),
    /// No such instance.
    #[error("instance {key} not found")]
    NotFound {
        /// The instance.
        key: InstanceKey,
    },
    /// The run failed (a business failure, the crash ceiling, divergence); an operator may
    /// still requeue or resurrect it.
    #[error("instance {key} failed: {reason}")]
    Failed {
        /// The instance.
        key: InstanceKey,
        /// The failure recorded on the instance.
        reason: String,
    },
    /// The run was cancelled.
    #[error("instance {key} was cancelled")]
    Cancelled {
        /// The instance.
        key: InstanceKey,
    },
    /// The instance did not close within the timeout; it may still.
    #[error("instance {key} did not finish within {waited:?}")]
    Timeout {
        /// The instance.
        key: InstanceKey,
        /// The timeout.
        waited: Duration,
    },
    /// The run completed, but its output does not decode as the type asked for.
    #[error("decoding the output of instance {key}")]
    Decode {
        /// The instance.
        key: InstanceKey,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// Reading the instance failed.
    #[error("reading instance {key}")]
    Store {
        /// The instance.
        key: InstanceKey,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

impl ResultError {
    /// Whether the instance is known to have failed or been cancelled (not a timeout, not a
    /// store error): waiting again gives the same answer until an operator acts.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let key = keiro::InstanceKey::parse("order", "order-1")?;
    /// assert!(keiro::ResultError::Cancelled { key: key.clone() }.is_final());
    /// let waited = std::time::Duration::from_secs(1);
    /// assert!(!keiro::ResultError::Timeout { key, waited }.is_final());
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Failed { .. } | Self::Cancelled { .. })
    }
}

impl Keiro {
    /// Waits until instance `id` of workflow `name` is terminal, at most `timeout`, and returns
    /// its output decoded as `T`. Woken by the store's push when it has one (every waiter
    /// shares the store's one listener), else by a poll once a second.
    ///
    /// ```no_run
    /// # async fn demo(keiro: keiro::Keiro) -> Result<(), keiro::ResultError> {
    /// use std::time::Duration;
    /// let receipt: String = keiro.result(("order", "order-42"), Duration::from_secs(30)).await?;
    /// # let _ = receipt; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`ResultError::Failed`] (with the reason) or [`ResultError::Cancelled`] for a run that
    /// ended so, [`ResultError::NotFound`], [`ResultError::Timeout`], [`ResultError::Decode`]
    /// when the output is no `T`, [`ResultError::InvalidId`], [`ResultError::Store`].
    pub async fn result<T: DeserializeOwned>(
        &self,
        key: impl IntoInstanceKey,
        timeout: Duration,
    ) -> Result<T, ResultError> {
        let options = ResultOptions {
            timeout: Some(timeout),
            ..ResultOptions::default()
        };
        self.result_with(key, &options).await
    }

    /// [`result`](Self::result) with options: no timeout, or another fallback interval.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = keiro::Keiro::temporary()?;
    /// # async fn hello(_ctx: keiro::Ctx, name: String) -> Result<String, keiro::WorkflowError> {
    /// #     Ok(format!("hello {name}"))
    /// # }
    /// let worker = keiro.worker().register("hello", hello).build()?;
    /// keiro.start("hello", "h-1", &"ada").await?;
    /// worker.drain().await?;
    /// let options = keiro::ResultOptions { timeout: None, ..keiro::ResultOptions::default() };
    /// let greeting: String = keiro.result_with(("hello", "h-1"), &options).await?;
    /// assert_eq!(greeting, "hello ada");
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// As [`result`](Self::result).
    pub async fn result_with<T: DeserializeOwned>(
        &self,
        key: impl IntoInstanceKey,
        options: &ResultOptions,
    ) -> Result<T, ResultError> {
        let key = key.into_instance_key()?;
        self.result_of(&key, options).await
    }

    pub(crate) async fn result_of<T: DeserializeOwned>(
        &self,
        key: &InstanceKey,
        options: &ResultOptions,
    ) -> Result<T, ResultError> {
        await_result(self.store().as_ref(), self.notifier(), key, options).await
    }
}

/// Waits until `key` is terminal in `store`, woken by `notifier` when there is one, and
/// decodes its output: [`Keiro::result_with`]'s loop, shared with direct execution.
pub(crate) async fn await_result<T: DeserializeOwned>(
    store: &dyn LeaseStore,
    notifier: Option<&Arc<dyn Notifier>>,
    key: &InstanceKey,
    options: &ResultOptions,
) -> Result<T, ResultError> {
    // Subscribed before the first read: a close between the two still wakes us.
    let mut wake: Box<dyn WakeSource> = match notifier {
        Some(notifier) => notifier.subscribe_closed(key),
        None => Box::new(FixedPoll),
    };
    let deadline = options
        .timeout
        .map(|timeout| (tokio::time::Instant::now() + timeout, timeout));
    let poll = options.poll_interval.max(RESULT_POLL_INTERVAL_MIN);
    loop {
        let row = store
            .instance_get(key)
            .await
            .map_err(|source| ResultError::Store {
                key: key.clone(),
                source,
            })?
            .ok_or_else(|| ResultError::NotFound { key: key.clone() })?;
        if let Some(outcome) = outcome(row) {
            return outcome;
        }
        // Stretched, never shortened: no waiter reads more often than once per `poll`; and
        // not below the floor that spreads the fallback reads of a store's many waiters.
        let mut wait = keiro_journal::store::stretched(poll).max(wake.fallback_floor());
        if let Some((deadline, timeout)) = deadline {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(ResultError::Timeout {
                    key: key.clone(),
                    waited: timeout,
                });
            }
            wait = wait.min(left);
        }
        if wake.wait(wait).await == keiro_resume::WakeReason::Notified {
            // Closed by this process: its outcome came with the wake, no read needed.
            if let Some(closed) = wake.closed_outcome() {
                let key = key.clone();
                return match closed {
                    keiro_resume::ClosedOutcome::Completed(output) => {
                        serde_json::from_value(output)
                            .map_err(|source| ResultError::Decode { key, source })
                    }
                    keiro_resume::ClosedOutcome::Failed(reason) => {
                        Err(ResultError::Failed { key, reason })
                    }
                    keiro_resume::ClosedOutcome::Cancelled => Err(ResultError::Cancelled { key }),
                };
            }
        }
    }
}

/// The answer a row gives, if it is terminal.
fn outcome<T: DeserializeOwned>(row: Instance) -> Option<Result<T, ResultError>> {
    let key = row.key;
    match row.status {
        Status::Completed => Some(
            serde_json::from_value(row.output.unwrap_or(serde_json::Value::Null))
                .map_err(|source| ResultError::Decode { key, source }),
        ),
        Status::Failed => Some(Err(ResultError::Failed {
            key,
            reason: row.last_error.unwrap_or_default(),
        })),
        Status::Cancelled => Some(Err(ResultError::Cancelled { key })),
        Status::Running | Status::Suspended => None,
    }
}
