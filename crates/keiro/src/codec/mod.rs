//! Payload encryption: a [`Codec`] the [`Keiro`](crate::Keiro) handle applies to every payload
//! it stores, and the provided one, [`AesGcmCodec`] (AES-256-GCM with rotating keys).
//!
//! Configure it once on the handle ([`KeiroBuilder::codec`](crate::KeiroBuilder::codec)); the
//! workers, remote workers and operators' reads built from the handle inherit it. This example
//! is the README's "Encrypting payloads" snippet (a test keeps the two equal):
//!
//! ```rust,no_run
//! use std::sync::Arc;
//! use keiro::codec::AesGcmCodec;
//!
//! # async fn demo(store: keiro::postgres::PgStore, new_key: [u8; 32], old_key: [u8; 32]) -> Result<(), Box<dyn std::error::Error>> {
//! // New payloads are sealed with k2; payloads sealed with k1 still open.
//! let codec = AesGcmCodec::new("k2", new_key)?.with_old_key("k1", old_key)?;
//! let keiro = keiro::Keiro::builder(store).codec(Arc::new(codec)).build();
//! keiro.start("charge", "order-42", &"4242 4242 4242 4242").await?; // stored sealed
//! # Ok(()) }
//! ```
//!
//! # Where it is applied, and why there
//!
//! The handle wraps its store in a decorator that implements every store trait and seals the
//! payload fields of each request on the way in and opens every sealed value on the way out.
//! Nothing above the store (the run, replay, the workers, the facade's calls) ever sees a sealed
//! value, and nothing below it (the SQL functions, the SQLite rules) ever sees a plain payload.
//! Hooks at the encode and decode points were the alternative; the decorator was chosen because
//! a payload reaches a store through some forty operations and leaves it through as many, and
//! one place that knows every request and outcome leaves no path that forgets the codec. The
//! Postgres-only paths that write in the caller's transaction (`start_in`, transaction steps,
//! `write_stream_in`) seal through the same codec, carried by the handle and the run's options.
//!
//! What is sealed: workflow inputs and outputs (including `continue_as_new` inputs, children's,
//! schedules', queued and debounced starts'), step results, deliveries, signals, awakeable
//! results, update requests and replies, events, stream items, remote task inputs and outputs.
//! What stays readable without a key: ids, names, statuses, times, step names, queue keys,
//! patch and race decisions, and failure texts (crash messages, a run's failure reason, a
//! step's or remote step's error message, an update's rejection): an operator needs them to
//! act on a failure, so an application must not put secrets in its error messages.
//!
//! A store's SQL sometimes copies a payload into a value of its own (a child's output into its
//! parent's journal as `{"ok": <output>}`, a remote output likewise). The sealed envelope
//! travels inside unchanged, and reading opens envelopes wherever they are in a value
//! ([`open_all`]); both sides share the handle's keys.
//!
//! # Errors
//!
//! A run path (claims, journal reads, appends' recorded values, result reads) that meets an
//! envelope its codec cannot open fails with [`StoreError::Codec`] naming the
//! key id: a store error, so the run is retried later and nothing is guessed or lost. A claim
//! whose run cannot be opened is handed back (`LeaseStore::instance_refuse_open`), which is not
//! a crash and never fails the run: its last error (shown by `keiro show`, `keiro list` and the
//! dashboard) begins with [`OPEN_REFUSED`] and names the key, and its next claim waits on
//! [`OPEN_REFUSED_BACKOFF`], so a worker without the key claims it at most about once every
//! two minutes instead of at every poll, and one with the key runs it once the wait has passed.
//! The refusals are counted apart from crashes (the run's `open_refusals`, reset when it next
//! parks or completes), so they spend none of its crash budget (`max_attempts`). An
//! operator's read (list, events, streams, updates, remote tasks) leaves such an envelope in
//! place instead, so `keiro show` and the dashboard can say "encrypted". A remote worker that
//! claims a task whose input it cannot open fails the attempt with code `payload_encrypted`,
//! retryable, naming the key id, so a worker that has the key can run it.

mod aes;
mod journal;
mod lease;
mod operate;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use keiro_journal::store::StartRequest;
use keiro_journal::update::{UpdateSend, UpdateSendOutcome, UpdateState};
use keiro_journal::{
    Append, AppendOutcome, Backoff, Event, Instance, JournalEntry, Started, StepKind, StoreError,
};
use keiro_lease::Claim;
use serde_json::Value;

pub use aes::{AesGcmCodec, KeyError, ENCRYPTION_KEYS_ENV};
pub use keiro_journal::codec::{
    first_sealed_key_id, open_all, open_readable, sealed_key_id, Codec, CodecError,
};

/// How long a run whose payload a claim could not open waits before it may be claimed again,
/// by the number of such refusals it has had since it last progressed: about 1 s after
/// the first, doubling, at most 2 min, jittered so a fleet's refusals spread. A worker that
/// holds the key claims it once the wait has passed.
///
/// ```
/// use std::time::Duration;
/// use keiro::codec::OPEN_REFUSED_BACKOFF;
/// assert_eq!(OPEN_REFUSED_BACKOFF.delay(1), Duration::from_secs(1));
/// assert_eq!(OPEN_REFUSED_BACKOFF.delay(20), Duration::from_secs(120));
/// ```
pub const OPEN_REFUSED_BACKOFF: Backoff =
    Backoff::exponential(Duration::from_secs(1), Duration::from_secs(120));

/// How the last error of a run whose payload a claim could not open begins; the codec's error
/// (which key, what went wrong) follows, e.g. `payload cannot be opened by this worker:
/// payload sealed with key "k2": no key with this id is configured`.
pub const OPEN_REFUSED: &str = "payload cannot be opened by this worker: ";

/// The field of an update answer's value that holds the reply (`{"ok": reply}`).
const REPLY: &str = "ok";

/// The field of an update's offer that holds the request (`{"id", "name", "request"}`).
const REQUEST: &str = "request";

/// The prefix of an update's token (`update_token`): its offers seal the request alone.
const UPDATE_TOKEN_PREFIX: &str = "\u{1f}update/";

/// A store with every payload sealed by `codec` on the way in and opened on the way out. It
/// implements each store trait its inner store does (`T` is a store or a `dyn` of one of its
/// traits), each operation forwarding to the inner store's, batching included.
pub(crate) struct Sealing<T: ?Sized> {
    inner: Arc<T>,
    codec: Arc<dyn Codec>,
}

impl<T: ?Sized> Sealing<T> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: Arc<T>, codec: Arc<dyn Codec>) -> Self {
        Self { inner, codec }
    }

    fn error(operation: &'static str, source: CodecError) -> StoreError {
        StoreError::Codec { operation, source }
    }

    /// `value` sealed; a value that is sealed already (copied from a store, or left sealed by
    /// an operator's read) as it is.
    pub(crate) fn seal(&self, operation: &'static str, value: &Value) -> Result<Value, StoreError> {
        if sealed_key_id(value).is_some() {
            return Ok(value.clone());
        }
        self.codec
            .seal(value)
            .map_err(|source| Self::error(operation, source))
    }

    /// `value` with every envelope opened (a run's read: an envelope it cannot open fails).
    fn open(&self, operation: &'static str, value: Value) -> Result<Value, StoreError> {
        open_all(self.codec.as_ref(), value).map_err(|source| Self::error(operation, source))
    }

    /// `value` with every envelope the codec can open opened (an operator's read).
    fn readable(&self, value: Value) -> Value {
        open_readable(self.codec.as_ref(), value)
    }

    /// The field `field` of an object `value` sealed; any other value as it is.
    fn seal_field(
        &self,
        operation: &'static str,
        value: &Value,
        field: &str,
    ) -> Result<Value, StoreError> {
        let mut value = value.clone();
        if let Some(inner) = value.get_mut(field) {
            *inner = self.seal(operation, inner)?;
        }
        Ok(value)
    }

    /// `event` with its payload sealed. Only a user's data is sealed: a step's result, a
    /// delivery, an event's value, a stream item, an update's reply, a completion's output and a
    /// continuation's input. keiro's own values (a child's name, a patch or race decision, an
    /// awakeable's id, a sleep, a failed attempt's message) stay as they are, since the stores'
    /// rules read some of them.
    fn seal_event(&self, operation: &'static str, event: &Event) -> Result<Event, StoreError> {
        Ok(match event {
            Event::StepRecorded { step, kind, result } => {
                let result = match kind {
                    StepKind::Step | StepKind::Await | StepKind::Event | StepKind::Stream => {
                        self.seal(operation, result)?
                    }
                    StepKind::Update => self.seal_field(operation, result, REPLY)?,
                    _ => result.clone(),
                };
                Event::StepRecorded {
                    step: step.clone(),
                    kind: *kind,
                    result,
                }
            }
            Event::WorkflowCompleted { output } => Event::WorkflowCompleted {
                output: self.seal(operation, output)?,
            },
            Event::WorkflowContinuedAsNew {
                next_generation,
                input,
            } => Event::WorkflowContinuedAsNew {
                next_generation: *next_generation,
                input: self.seal(operation, input)?,
            },
            other => other.clone(),
        })
    }

    /// `event` with every envelope in its payload opened.
    fn open_event(&self, operation: &'static str, event: Event) -> Result<Event, StoreError> {
        Ok(match event {
            Event::StepRecorded { step, kind, result } => Event::StepRecorded {
                step,
                kind,
                result: self.open(operation, result)?,
            },
            Event::WorkflowCompleted { output } => Event::WorkflowCompleted {
                output: self.open(operation, output)?,
            },
            Event::WorkflowContinuedAsNew {
                next_generation,
                input,
            } => Event::WorkflowContinuedAsNew {
                next_generation,
                input: self.open(operation, input)?,
            },
            other => other,
        })
    }

    pub(crate) fn seal_append(
        &self,
        operation: &'static str,
        append: &Append,
    ) -> Result<Append, StoreError> {
        Ok(Append {
            event: self.seal_event(operation, &append.event)?,
            ..append.clone()
        })
    }

    pub(crate) fn open_outcome(
        &self,
        operation: &'static str,
        outcome: AppendOutcome,
    ) -> Result<AppendOutcome, StoreError> {
        Ok(match outcome {
            AppendOutcome::AlreadyPresent(value) => {
                AppendOutcome::AlreadyPresent(self.open(operation, value)?)
            }
            other => other,
        })
    }

    /// A signal's payload sealed: an update's offer seals its request alone (the stores read
    /// its id and name), any other payload as a whole.
    pub(crate) fn seal_signal(
        &self,
        operation: &'static str,
        token: &str,
        payload: &Value,
    ) -> Result<Value, StoreError> {
        if token.starts_with(UPDATE_TOKEN_PREFIX) {
            self.seal_field(operation, payload, REQUEST)
        } else {
            self.seal(operation, payload)
        }
    }

    pub(crate) fn seal_start(
        &self,
        operation: &'static str,
        request: &StartRequest,
    ) -> Result<StartRequest, StoreError> {
        Ok(StartRequest {
            input: self.seal(operation, &request.input)?,
            ..request.clone()
        })
    }

    fn open_instance(
        &self,
        operation: &'static str,
        mut instance: Instance,
    ) -> Result<Instance, StoreError> {
        instance.input = self.open(operation, instance.input)?;
        instance.output = instance
            .output
            .map(|output| self.open(operation, output))
            .transpose()?;
        Ok(instance)
    }

    pub(crate) fn open_started(
        &self,
        operation: &'static str,
        started: Started,
    ) -> Result<Started, StoreError> {
        Ok(Started {
            instance: self.open_instance(operation, started.instance)?,
            created: started.created,
        })
    }

    fn open_journal(
        &self,
        operation: &'static str,
        journal: Vec<JournalEntry>,
    ) -> Result<Vec<JournalEntry>, StoreError> {
        journal
            .into_iter()
            .map(|mut entry| {
                entry.event = self.open_event(operation, entry.event)?;
                Ok(entry)
            })
            .collect()
    }

    fn open_claim(&self, operation: &'static str, claim: Claim) -> Result<Claim, StoreError> {
        Ok(Claim {
            fence: claim.fence,
            instance: self.open_instance(operation, claim.instance)?,
            journal: self.open_journal(operation, claim.journal)?,
        })
    }

    fn seal_update(
        &self,
        operation: &'static str,
        send: &UpdateSend,
    ) -> Result<UpdateSend, StoreError> {
        Ok(UpdateSend {
            request: self.seal(operation, &send.request)?,
            start: send
                .start
                .as_ref()
                .map(|start| self.seal_start(operation, start))
                .transpose()?,
            ..send.clone()
        })
    }

    fn open_update_state(
        &self,
        operation: &'static str,
        state: UpdateState,
    ) -> Result<UpdateState, StoreError> {
        Ok(match state {
            UpdateState::Replied(reply) => UpdateState::Replied(self.open(operation, reply)?),
            other => other,
        })
    }

    fn open_update_outcome(
        &self,
        operation: &'static str,
        outcome: UpdateSendOutcome,
    ) -> Result<UpdateSendOutcome, StoreError> {
        Ok(match outcome {
            UpdateSendOutcome::Sent {
                created,
                state,
                started,
            } => UpdateSendOutcome::Sent {
                created,
                state: self.open_update_state(operation, state)?,
                started,
            },
            other => other,
        })
    }
}

impl Sealing<()> {
    /// The codec's half alone, for the calls that write through the Postgres store in the
    /// caller's own transaction (`start_in` and its siblings), which the decorator cannot see.
    pub(crate) fn bare(codec: Arc<dyn Codec>) -> Self {
        Self::new(Arc::new(()), codec)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Sealing<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealing")
            .field("inner", &self.inner)
            .field("codec", &self.codec)
            .finish()
    }
}
