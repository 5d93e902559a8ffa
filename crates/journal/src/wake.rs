//! Wake-source data: what the store keeps for durable sleeps, awakeables, signals and child
//! workflows, and the envelopes their values are journaled in.
//!
//! Every resolution of a wake source journals the awaited step into the owner's journal and
//! flips the owner's instance row in the same transaction, so a wake is never lost: a resume
//! pass finds the instance runnable whether or not a push notification arrived.

use serde_json::{json, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::{Generation, InstanceKey};

/// What a due timer does when it fires.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// A timer to arm. First arm wins: re-arming never moves `fire_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerArm {
    /// The owner.
    pub key: InstanceKey,
    /// The owner's generation; the fire journals into it and no other.
    pub generation: Generation,
    /// The step the fire journals (`sleep:<name>`, or the signal wait's step).
    pub step: String,
    /// When it is due.
    pub fire_at: OffsetDateTime,
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimerFiring {
    /// The timers fired by this call.
    pub fired: Vec<FiredTimer>,
    /// The earliest `fire_at` still scheduled after this call, so the timer loop knows how long
    /// it may sleep.
    pub next_due: Option<OffsetDateTime>,
}

/// The state of an awakeable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AwakeableStatus {
    /// Waiting for completion or cancellation.
    Pending,
    /// Completed with a payload.
    Completed,
    /// Cancelled.
    Cancelled,
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

/// What sending a signal did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalSendOutcome {
    /// The oldest waiter received it (journaled and woken).
    Delivered {
        /// The instance that received it.
        to: InstanceKey,
    },
    /// No live waiter: it is buffered, first in first out per token.
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
}

/// A decoded envelope.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Opened {
    Ok(Value),
    Cancelled,
    Failed(String),
    Timeout,
    Error(Value),
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
        assert_eq!(open(json!(3)), None);
        assert_eq!(open(json!({"ok": 1, "extra": 2})), None);
    }
}
