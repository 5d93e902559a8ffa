//! Wake-source data: what the store keeps for durable sleeps, awakeables, signals and child
//! workflows, and the envelopes their values are journaled in.
//!
//! Every resolution of a wake source journals the awaited step into the owner's journal and
//! flips the owner's instance row in the same transaction, so a wake is never lost: a resume
//! pass finds the instance runnable whether or not a push notification arrived.

use std::time::Duration;

use serde_json::{json, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::{Generation, IdError, InstanceKey, ID_LEN_MAX};

/// What a due timer does when it fires.
///
/// Serialized as `{"kind": "sleep"}` or `{"kind": "signal_timeout", "token": ..}` (the
/// operators' read flattens it into a timer's fields).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum TimerKind {
    /// A durable sleep: journal the sleep step (value `null`).
    Sleep,
    /// A signal wait's timeout: if the wait is still pending, drop the waiter and journal
    /// [`Envelope::timeout`] under the wait's step, under the token's lock.
    SignalTimeout {
        /// The token waited on.
        token: String,
    },
}

impl TimerKind {
    /// The text stored in the timer's `kind` column.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Sleep => "sleep",
            Self::SignalTimeout { .. } => "signal_timeout",
        }
    }
}

/// When a timer is due, on the store's clock (the database's `now()` for Postgres), which is
/// also the clock that decides when it fires: a worker's own clock plays no part, so a worker
/// whose clock is skewed fires nothing early or late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerDue {
    /// At this instant of the store's clock.
    At(OffsetDateTime),
    /// This long after the store's clock at the arm: the store computes `now() + span`. A span
    /// longer than [`TimerDue::AFTER_MAX`] is cut to it.
    After(Duration),
}

impl TimerDue {
    /// The longest span [`TimerDue::After`] stands for: 100 years (365-day years), "never" for
    /// a workflow, so that `now() + span` fits every store's timestamps.
    pub const AFTER_MAX: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

    /// The span of [`TimerDue::After`], cut to [`TimerDue::AFTER_MAX`]; `None` for an instant.
    ///
    /// ```
    /// use std::time::Duration;
    /// use keiro_journal::store::TimerDue;
    ///
    /// assert_eq!(TimerDue::After(Duration::from_secs(5)).span(), Some(Duration::from_secs(5)));
    /// assert_eq!(TimerDue::After(Duration::MAX).span(), Some(TimerDue::AFTER_MAX));
    /// ```
    pub fn span(&self) -> Option<Duration> {
        match self {
            Self::At(_) => None,
            Self::After(span) => Some((*span).min(Self::AFTER_MAX)),
        }
    }
}

/// A timer to arm. First arm wins: re-arming never moves its due time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerArm {
    /// The owner.
    pub key: InstanceKey,
    /// The owner's generation; the fire journals into it and no other.
    pub generation: Generation,
    /// The step the fire journals (`sleep:<name>`, or the signal wait's step).
    pub step: String,
    /// When it is due. The store turns it into the stored `fire_at` with its own clock.
    pub due: TimerDue,
    /// What firing does.
    pub kind: TimerKind,
}

/// One timer fired by a timer worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiredTimer {
    /// The owner.
    pub key: InstanceKey,
    /// The step.
    pub step: String,
    /// When it was due.
    pub fire_at: OffsetDateTime,
    /// When it fired (the store clock).
    pub fired_at: OffsetDateTime,
    /// Whether this fire journaled the step (false: already journaled, the owner is terminal,
    /// or a signal beat the timeout).
    pub delivered: bool,
}

/// The result of firing a batch of due timers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerFiring {
    /// The timers fired by this call.
    pub fired: Vec<FiredTimer>,
    /// The earliest `fire_at` still scheduled after this call, so the timer loop knows how long
    /// it may sleep.
    pub next_due: Option<OffsetDateTime>,
    /// The store's clock this call fired against (the `now` it was given, or the database's
    /// `now()`). `next_due - clock` is how long until the next timer is due, whatever the
    /// caller's own clock says.
    pub clock: OffsetDateTime,
}

/// The state of an awakeable. Serialized as its column text (`pending`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AwakeableStatus {
    /// Waiting for completion or cancellation.
    Pending,
    /// Completed with a payload.
    Completed,
    /// Cancelled.
    Cancelled,
}

impl AwakeableStatus {
    /// The text stored in the awakeable's `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Completed => "completed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// What completing or cancelling an awakeable did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AwakeableOutcome {
    /// This call settled it and journaled the value into its owner (waking it).
    Delivered,
    /// It was already settled; a repeat completion is idempotent.
    AlreadySettled(AwakeableStatus),
    /// This call settled it, but the owner is terminal (or moved to another generation), so
    /// nothing was journaled.
    OwnerGone,
    /// No awakeable has this id.
    NotFound,
}

/// A signal wait to arm.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalWait {
    /// The waiting instance.
    pub key: InstanceKey,
    /// Its generation.
    pub generation: Generation,
    /// The step the signal is journaled under.
    pub step: String,
    /// The token.
    pub token: String,
    /// The run's lease, checked when a buffered signal is consumed.
    pub fence: Option<crate::Fence>,
}

/// What arming a signal wait did.
#[derive(Debug, Clone, PartialEq)]
pub enum SignalWaitOutcome {
    /// A signal was buffered (or had already been delivered): it is journaled now and here is
    /// its envelope.
    Delivered(Value),
    /// No signal yet; the waiter is registered.
    Waiting,
}

/// A signal a losing wait of a [`Ctx::select`](crate::Ctx::select) race took, given back to its
/// token when the race is decided ([`JournalStore::signal_return`](crate::JournalStore::signal_return)).
#[derive(Debug, Clone, PartialEq)]
pub struct ReturnedSignal {
    /// The token it was sent on.
    pub token: String,
    /// The payload as sent (out of its journaled envelope).
    pub payload: Value,
}

/// Checks a signal token: non-empty, at most [`ID_LEN_MAX`] bytes, no control character. Waits
/// and sends apply this one rule, so a token a send accepts is one a wait can take.
///
/// ```
/// use keiro_journal::{store::validate_signal_token, IdError};
/// assert!(validate_signal_token("order-42/paid").is_ok());
/// assert!(matches!(validate_signal_token(""), Err(IdError::Empty { .. })));
/// assert!(matches!(validate_signal_token("a\nb"), Err(IdError::ForbiddenChar { .. })));
/// ```
///
/// # Errors
///
/// [`IdError::Empty`], [`IdError::TooLong`] or [`IdError::ForbiddenChar`].
pub fn validate_signal_token(token: &str) -> Result<(), IdError> {
    const WHAT: &str = "signal token";
    if token.is_empty() {
        return Err(IdError::Empty { what: WHAT });
    }
    if token.len() > ID_LEN_MAX {
        return Err(IdError::TooLong {
            what: WHAT,
            len: token.len(),
        });
    }
    if let Some(ch) = token.chars().find(|c| c.is_control()) {
        return Err(IdError::ForbiddenChar {
            what: WHAT,
            value: token.to_owned(),
            ch,
        });
    }
    Ok(())
}

/// How long a buffered signal waits for a wait unless its send says otherwise: 7 days.
pub const SIGNAL_TTL_DEFAULT: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// The longest time a buffered signal is kept: 100 years (365-day years). A longer TTL is cut
/// to it, so the expiry always fits the stores' timestamps.
pub const SIGNAL_TTL_MAX: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// How a signal is sent.
///
/// A signal that finds no waiter is buffered for its TTL ([`SIGNAL_TTL_DEFAULT`] unless set):
/// once the TTL has passed it is never delivered, and the store deletes it.
///
/// ```
/// use std::time::Duration;
/// use keiro_journal::{SignalOptions, SIGNAL_TTL_DEFAULT};
///
/// assert_eq!(SignalOptions::default().time_to_live(), SIGNAL_TTL_DEFAULT);
/// let brief = SignalOptions::default().ttl(Duration::from_secs(60));
/// assert_eq!(brief.time_to_live(), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalOptions {
    ttl: Duration,
}

impl Default for SignalOptions {
    fn default() -> Self {
        Self {
            ttl: SIGNAL_TTL_DEFAULT,
        }
    }
}

impl SignalOptions {
    /// Sets how long the signal stays buffered when no wait takes it at once, at most
    /// [`SIGNAL_TTL_MAX`]. Zero means "deliver to a current waiter or not at all".
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.min(SIGNAL_TTL_MAX);
        self
    }

    /// How long the signal stays buffered.
    pub fn time_to_live(&self) -> Duration {
        self.ttl
    }
}

/// What sending a signal did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalSendOutcome {
    /// The oldest waiter received it (journaled and woken).
    Delivered {
        /// The instance that received it.
        to: InstanceKey,
    },
    /// No live waiter: it is buffered, first in first out per token, until its TTL passes.
    Buffered,
}

/// A child to spawn in the parent's spawn-step transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildSpawn {
    /// The child's key.
    pub child: InstanceKey,
    /// The child's input.
    pub input: Value,
    /// The parent step that receives the child's result envelope.
    pub await_step: String,
}

/// The JSON envelopes wake-source values are journaled in, so a body can tell a value from a
/// cancellation, a failure or a timeout on replay.
#[derive(Debug)]
pub struct Envelope;

impl Envelope {
    /// A delivered value.
    pub fn ok(value: Value) -> Value {
        json!({ "ok": value })
    }
    /// A cancellation.
    pub fn cancelled() -> Value {
        json!({ "cancelled": true })
    }
    /// A failure with its reason.
    pub fn failed(reason: &str) -> Value {
        json!({ "failed": reason })
    }
    /// A timeout.
    pub fn timeout() -> Value {
        json!({ "timeout": true })
    }
    /// A remote step's final failure: `error` holds `message`, `code`, `retryable` and
    /// `attempts` (see [`RemoteStepError`](crate::RemoteStepError)).
    pub fn error(error: Value) -> Value {
        json!({ "error": error })
    }
    /// A refused spawn: the child runs for `parent`, another instance.
    pub fn taken(parent: &InstanceKey) -> Value {
        json!({ "taken": { "name": parent.name, "id": parent.id } })
    }
}

/// A decoded envelope.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Opened {
    Ok(Value),
    Cancelled,
    Failed(String),
    Timeout,
    Error(Value),
    Taken(InstanceKey),
}

/// Opens an envelope; `None` for a value that is not one.
pub(crate) fn open(value: Value) -> Option<Opened> {
    let Value::Object(mut map) = value else {
        return None;
    };
    if map.len() != 1 {
        return None;
    }
    if let Some(v) = map.remove("ok") {
        return Some(Opened::Ok(v));
    }
    if map.get("cancelled") == Some(&Value::Bool(true)) {
        return Some(Opened::Cancelled);
    }
    if map.get("timeout") == Some(&Value::Bool(true)) {
        return Some(Opened::Timeout);
    }
    if let Some(Value::String(reason)) = map.remove("failed") {
        return Some(Opened::Failed(reason));
    }
    if let Some(error @ Value::Object(_)) = map.remove("error") {
        return Some(Opened::Error(error));
    }
    if let Some(parent) = map.remove("taken") {
        return serde_json::from_value(parent).ok().map(Opened::Taken);
    }
    None
}

/// The journal step an awakeable's value is recorded under.
pub fn awakeable_step(id: Uuid) -> String {
    format!("awk:{id}")
}

/// The journal step a child's result is recorded under in its parent.
pub fn child_result_step(child: &InstanceKey) -> String {
    format!("child:{}/{}:result", child.name, child.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip() {
        assert_eq!(open(Envelope::ok(json!(3))), Some(Opened::Ok(json!(3))));
        assert_eq!(open(Envelope::cancelled()), Some(Opened::Cancelled));
        assert_eq!(
            open(Envelope::failed("x")),
            Some(Opened::Failed("x".into()))
        );
        assert_eq!(open(Envelope::timeout()), Some(Opened::Timeout));
        assert_eq!(
            open(Envelope::error(json!({"message": "m"}))),
            Some(Opened::Error(json!({"message": "m"})))
        );
        let parent = InstanceKey::parse("p", "p-1").unwrap();
        assert_eq!(open(Envelope::taken(&parent)), Some(Opened::Taken(parent)));
        assert_eq!(open(json!({"taken": {"name": "p"}})), None);
        assert_eq!(open(json!(3)), None);
        assert_eq!(open(json!({"ok": 1, "extra": 2})), None);
    }
}
