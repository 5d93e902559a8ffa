//! Journal events: what the append-only log records, and how a row's `(step_name, kind,
//! payload)` triple encodes each event.

use serde_json::Value;
use time::OffsetDateTime;

/// A journal generation: 0 for a fresh instance, bumped by each continue-as-new.
pub type Generation = i32;

/// Reserved step names of the lifecycle markers.
pub mod marker_name {
    /// `WorkflowCompleted`.
    pub const COMPLETED: &str = "__workflow_completed__";
    /// `WorkflowFailed`.
    pub const FAILED: &str = "__workflow_failed__";
    /// `WorkflowCancelled`.
    pub const CANCELLED: &str = "__workflow_cancelled__";
    /// `WorkflowContinuedAsNew`.
    pub const CONTINUED: &str = "__workflow_continued_as_new__";
    /// The operator's `Resurrected` event.
    pub const RESURRECTED: &str = "__workflow_resurrected__";
    /// The prefix of a `StepReset` row; the superseded row's stored name follows it.
    pub const STEP_RESET_PREFIX: &str = "__workflow_step_reset__:";
}

/// The journal name of the value delivered to `ctx.await_step(step)`: deliveries have their
/// own namespace, so a delivery that names a step the body runs itself (`ctx.step`) waits for
/// an await of that name instead of standing in for the step.
pub(crate) fn await_step_name(step: &str) -> String {
    format!("await:{step}")
}

/// The logical step a stored step name records.
///
/// An operator's requeue supersedes a delivered remote result or child result with a
/// [`Event::StepReset`], and the next delivery of that step is stored under `<step>#<n>`
/// (`n` counts the resets), because the journal keeps one row per stored name and never
/// rewrites one. Replay reads `<step>#<n>` as `<step>`. Only `remote:` and `child:` steps are
/// ever revised, and their names cannot contain `#` otherwise (instance names and ids forbid it,
/// remote step names too), so no user step is mistaken for a revision.
pub fn logical_step(stored: &str) -> &str {
    if !(stored.starts_with("remote:") || stored.starts_with("child:")) {
        return stored;
    }
    match stored.rsplit_once('#') {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => base,
        _ => stored,
    }
}

/// The revision a stored step name holds: `n` for `<step>#<n>`, 0 for the step's own name.
pub fn step_revision(stored: &str) -> u32 {
    let logical = logical_step(stored);
    if logical.len() == stored.len() {
        return 0;
    }
    stored[logical.len() + 1..].parse().unwrap_or(0)
}

/// The stored name of revision `revision` of `step` (revision 0 is the step's own name).
pub fn revised_step(step: &str, revision: u32) -> String {
    if revision == 0 {
        step.to_owned()
    } else {
        format!("{step}#{revision}")
    }
}

/// What kind of call recorded a step. Replay compares it with the call that reads the step,
/// so a step recorded by `ctx.step` is never silently consumed by an await of the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StepKind {
    /// `ctx.step`: an action run by the workflow itself.
    Step,
    /// `ctx.await_step`: a value journaled from outside the run.
    Await,
    /// A durable sleep's completion.
    Sleep,
    /// An awakeable's allocation or its completion.
    Awakeable,
    /// A signal delivered by token.
    Signal,
    /// A child workflow's spawn or result.
    Child,
    /// A remote step's result.
    Remote,
    /// A journaled patch decision.
    Patch,
    /// A failed attempt of a step run under a retry policy, or its final failure.
    Attempt,
    /// The winner of a [`Ctx::select`](crate::Ctx::select) race.
    Race,
    /// An event set by [`Ctx::set_event`](crate::Ctx::set_event).
    Event,
    /// A stream's append or close ([`Ctx::write_stream`](crate::Ctx::write_stream),
    /// [`Ctx::close_stream`](crate::Ctx::close_stream)).
    Stream,
    /// An update's answer ([`Ctx::reply`](crate::Ctx::reply),
    /// [`Ctx::reject`](crate::Ctx::reject)).
    Update,
    /// A set of search attributes ([`Ctx::set_attributes`](crate::Ctx::set_attributes)).
    Attributes,
}

impl StepKind {
    /// The text stored in the journal's `kind` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Step => "step",
            Self::Await => "await",
            Self::Sleep => "sleep",
            Self::Awakeable => "awakeable",
            Self::Signal => "signal",
            Self::Child => "child",
            Self::Remote => "remote",
            Self::Patch => "patch",
            Self::Attempt => "attempt",
            Self::Race => "race",
            Self::Event => "event",
            Self::Stream => "stream",
            Self::Update => "update",
            Self::Attributes => "attributes",
        }
    }

    fn parse(kind: &str) -> Option<Self> {
        Some(match kind {
            "step" => Self::Step,
            "await" => Self::Await,
            "sleep" => Self::Sleep,
            "awakeable" => Self::Awakeable,
            "signal" => Self::Signal,
            "child" => Self::Child,
            "remote" => Self::Remote,
            "patch" => Self::Patch,
            "attempt" => Self::Attempt,
            "race" => Self::Race,
            "event" => Self::Event,
            "stream" => Self::Stream,
            "update" => Self::Update,
            "attributes" => Self::Attributes,
            _ => return None,
        })
    }
}

/// A lifecycle marker: the one event that closes a generation. First writer wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Marker {
    /// The body returned a value.
    Completed,
    /// The run was failed (crash ceiling, operator, or a failed child).
    Failed,
    /// The run was cancelled.
    Cancelled,
    /// The generation was closed by continue-as-new.
    ContinuedAsNew,
}

impl Marker {
    /// The reserved step name the marker is stored under.
    pub fn step_name(self) -> &'static str {
        match self {
            Self::Completed => marker_name::COMPLETED,
            Self::Failed => marker_name::FAILED,
            Self::Cancelled => marker_name::CANCELLED,
            Self::ContinuedAsNew => marker_name::CONTINUED,
        }
    }

    /// The text stored in the journal's `kind` column.
    pub fn kind_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::ContinuedAsNew => "continued",
        }
    }

    /// Parses the `kind` column text of a marker.
    pub fn parse(kind: &str) -> Option<Self> {
        Some(match kind {
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            "continued" => Self::ContinuedAsNew,
            _ => return None,
        })
    }
}

/// One event of the journal.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// A step's result, recorded once per `(instance, generation, step)`.
    StepRecorded {
        /// The full step name (user name, or a reserved-prefix name for wake sources).
        step: String,
        /// Which call recorded it.
        kind: StepKind,
        /// The result as JSON.
        result: Value,
    },
    /// The body returned `output`.
    WorkflowCompleted {
        /// The output as JSON.
        output: Value,
    },
    /// The run failed for `reason`.
    WorkflowFailed {
        /// Why.
        reason: String,
    },
    /// The run was cancelled.
    WorkflowCancelled,
    /// The generation was closed; the run continues on `next_generation` with `input`.
    WorkflowContinuedAsNew {
        /// The generation that continues the run.
        next_generation: Generation,
        /// The new generation's input.
        input: Value,
    },
    /// An operator returned a failed instance to running; the failure stays in history.
    Resurrected,
    /// An operator's requeue superseded a recorded step (a failed remote step, an awaited
    /// child's failure): replay forgets it, so the step is awaited again, and its next value
    /// is stored as the next revision (see [`logical_step`]). The superseded row stays.
    StepReset {
        /// The logical step superseded.
        step: String,
        /// The stored name of the superseded row.
        superseded: String,
    },
}

/// The `(step_name, kind, payload)` triple an event is stored as.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedEvent {
    /// The step name or reserved marker name.
    pub step_name: String,
    /// The `kind` column.
    pub kind: &'static str,
    /// The payload column.
    pub payload: Value,
}

/// A journal row whose kind or payload keiro cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("journal row {step_name:?} of kind {kind:?} is malformed: {detail}")]
pub struct MalformedEvent {
    /// The row's step name.
    pub step_name: String,
    /// The row's kind.
    pub kind: String,
    /// What is wrong with it.
    pub detail: String,
}

impl Event {
    /// The marker this event is, if it is one.
    pub fn marker(&self) -> Option<Marker> {
        match self {
            Self::WorkflowCompleted { .. } => Some(Marker::Completed),
            Self::WorkflowFailed { .. } => Some(Marker::Failed),
            Self::WorkflowCancelled => Some(Marker::Cancelled),
            Self::WorkflowContinuedAsNew { .. } => Some(Marker::ContinuedAsNew),
            _ => None,
        }
    }

    /// The step name the event is stored under (before a store's own suffix for repeatable
    /// markers).
    pub fn step_name(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Self::StepRecorded { step, .. } => step.into(),
            Self::Resurrected => marker_name::RESURRECTED.into(),
            Self::StepReset { superseded, .. } => {
                format!("{}{superseded}", marker_name::STEP_RESET_PREFIX).into()
            }
            other => other
                .marker()
                .expect("every other event is a marker")
                .step_name()
                .into(),
        }
    }

    /// Encodes the event as the row keiro stores.
    pub fn encode(&self) -> EncodedEvent {
        let (kind, payload) = match self {
            Self::StepRecorded { kind, result, .. } => (kind.as_str(), result.clone()),
            Self::WorkflowCompleted { output } => ("completed", output.clone()),
            Self::WorkflowFailed { reason } => ("failed", Value::String(reason.clone())),
            Self::WorkflowCancelled => ("cancelled", Value::Null),
            Self::WorkflowContinuedAsNew {
                next_generation,
                input,
            } => (
                "continued",
                serde_json::json!({ "next_generation": next_generation, "input": input }),
            ),
            Self::Resurrected => ("resurrected", Value::Null),
            Self::StepReset { step, superseded } => (
                "reset",
                serde_json::json!({ "step": step, "superseded": superseded }),
            ),
        };
        EncodedEvent {
            step_name: self.step_name().into_owned(),
            kind,
            payload,
        }
    }

    /// Decodes a stored row.
    ///
    /// # Errors
    ///
    /// [`MalformedEvent`] for an unknown kind or a payload of the wrong shape.
    pub fn decode(step_name: &str, kind: &str, payload: Value) -> Result<Self, MalformedEvent> {
        let malformed = |detail: &str| MalformedEvent {
            step_name: step_name.to_owned(),
            kind: kind.to_owned(),
            detail: detail.to_owned(),
        };
        if let Some(step_kind) = StepKind::parse(kind) {
            return Ok(Self::StepRecorded {
                step: step_name.to_owned(),
                kind: step_kind,
                result: payload,
            });
        }
        match kind {
            "completed" => Ok(Self::WorkflowCompleted { output: payload }),
            "failed" => match payload {
                Value::String(reason) => Ok(Self::WorkflowFailed { reason }),
                _ => Err(malformed("a failure's reason must be a string")),
            },
            "cancelled" => Ok(Self::WorkflowCancelled),
            "continued" => {
                let next_generation = payload
                    .get("next_generation")
                    .and_then(Value::as_i64)
                    .and_then(|g| Generation::try_from(g).ok())
                    .ok_or_else(|| malformed("next_generation must be a 32-bit integer"))?;
                let input = payload.get("input").cloned().unwrap_or(Value::Null);
                Ok(Self::WorkflowContinuedAsNew {
                    next_generation,
                    input,
                })
            }
            "resurrected" => Ok(Self::Resurrected),
            "reset" => {
                let field = |name: &str| {
                    payload
                        .get(name)
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .ok_or_else(|| malformed("a step reset names its step and superseded row"))
                };
                Ok(Self::StepReset {
                    step: field("step")?,
                    superseded: field("superseded")?,
                })
            }
            _ => Err(malformed("unknown event kind")),
        }
    }
}

/// One stored journal event with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalEntry {
    /// Global, increasing order of appends.
    pub seq: i64,
    /// The generation it belongs to.
    pub generation: Generation,
    /// The event.
    pub event: Event,
    /// When it was appended (the database clock).
    pub recorded_at: OffsetDateTime,
}

/// The journal name of failed attempt `n` of `step`.
pub(crate) fn attempt_step(step: &str, n: u32) -> String {
    format!("attempt:{step}:{n}")
}

/// The journal name of `step`'s final failure.
pub(crate) fn attempt_failed_step(step: &str) -> String {
    format!("attempt:{step}:failed")
}

/// Whether a journal row of kind `attempt` is a step's final failure (which the body acts
/// on, so it counts for divergence detection like a recorded step).
pub(crate) fn is_final_attempt(step: &str) -> bool {
    step.ends_with(":failed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_event_round_trips_through_its_row() {
        let events = [
            Event::StepRecorded {
                step: "charge".into(),
                kind: StepKind::Step,
                result: json!({"id": 7}),
            },
            Event::WorkflowCompleted { output: json!(1) },
            Event::WorkflowFailed {
                reason: "boom".into(),
            },
            Event::WorkflowCancelled,
            Event::WorkflowContinuedAsNew {
                next_generation: 3,
                input: json!([1]),
            },
            Event::Resurrected,
            Event::StepReset {
                step: "remote:label".into(),
                superseded: "remote:label#1".into(),
            },
        ];
        for event in events {
            let row = event.encode();
            let back = Event::decode(&row.step_name, row.kind, row.payload).unwrap();
            assert_eq!(back, event);
        }
    }

    #[test]
    fn revisions_of_remote_and_child_steps_read_as_their_step() {
        assert_eq!(logical_step("remote:label#2"), "remote:label");
        assert_eq!(
            logical_step("child:ship/o-1:result#1"),
            "child:ship/o-1:result"
        );
        assert_eq!(logical_step("remote:label"), "remote:label");
        assert_eq!(logical_step("user#3"), "user#3");
        assert_eq!(logical_step("remote:a#b"), "remote:a#b");
        assert_eq!(step_revision("remote:x#12"), 12);
        assert_eq!(step_revision("remote:x"), 0);
        assert_eq!(revised_step("remote:x", 0), "remote:x");
        assert_eq!(revised_step("remote:x", 2), "remote:x#2");
    }

    #[test]
    fn malformed_rows_are_typed_errors() {
        assert!(Event::decode("x", "nonsense", Value::Null).is_err());
        assert!(Event::decode(marker_name::FAILED, "failed", json!(3)).is_err());
        assert!(Event::decode(marker_name::CONTINUED, "continued", json!({})).is_err());
    }
}
