//! The operator actions, one facade call each, as the CLI's commands make them: on an
//! instance, cancel, cancel cascade, requeue, resurrect, force release, redispatch and retry
//! with input, each appending history (the facade's own journal events), none rewriting it; on
//! a queue, pause and resume (`keiro queue pause|resume`), which set the queue's paused flag
//! and touch no run. Both kinds are authorized alike (see [`auth`](super::auth)).

use axum::http::StatusCode;
use keiro::{operate::CancelOutcome, operate::RequeueOutcome, operate::ResurrectOutcome, Keiro};
use serde::Serialize;
use serde_json::Value;

use super::error::ApiError;

/// An action's name as it appears in URLs, and its confirmation text.
pub(crate) const ACTIONS: [(&str, &str); 7] = [
    ("cancel", "Cancel"),
    ("cancel-cascade", "Cancel with children"),
    ("requeue", "Requeue"),
    ("resurrect", "Resurrect"),
    ("release", "Force release"),
    ("redispatch", "Redispatch"),
    ("retry-with-input", "Retry with input"),
];

/// A queue action's name as it appears in URLs, and its confirmation text.
pub(crate) const QUEUE_ACTIONS: [(&str, &str); 2] = [("pause", "Pause"), ("resume", "Resume")];

/// What an action did.
#[derive(Debug, Serialize)]
pub(crate) struct Done {
    /// The action.
    pub(crate) action: String,
    /// For people, as the CLI prints it.
    pub(crate) message: String,
    /// The new instance, for retry with input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) started: Option<String>,
}

/// Runs `action` on `name/id`. A refusal (the instance is not in a state the action applies
/// to) is 409 Conflict; an unknown instance is 404.
pub(crate) async fn run(
    keiro: &Keiro,
    action: &str,
    name: &str,
    id: &str,
    input: Option<Value>,
) -> Result<Done, ApiError> {
    let what = format!("{name}/{id}");
    let conflict = |message: String| ApiError::new(StatusCode::CONFLICT, "refused", message);
    let not_found = || ApiError::not_found(format!("no instance {what}"));
    let mut started = None;
    let message = match action {
        "cancel" | "cancel-cascade" => {
            let outcome = if action == "cancel" {
                keiro.cancel((name, id)).await?
            } else {
                keiro.cancel_cascade((name, id)).await?
            };
            match outcome {
                CancelOutcome::Recorded => {
                    format!("{what}: cancelled; a running worker stops at its next step boundary")
                }
                CancelOutcome::AlreadyTerminal(status) => {
                    return Err(conflict(format!(
                        "{what}: not cancelled, it is already {status}"
                    )))
                }
            }
        }
        "requeue" => match keiro.requeue((name, id)).await? {
            RequeueOutcome::Requeued {
                reset_steps,
                children,
            } => format!(
                "{what}: running again; {reset_steps} step(s) reset, {} child(ren) requeued",
                children.len()
            ),
            RequeueOutcome::NotFailed(status) => {
                return Err(conflict(format!(
                    "{what}: not requeued, it is {status}, not failed"
                )))
            }
            RequeueOutcome::NotFound => return Err(not_found()),
        },
        "resurrect" => match keiro.resurrect((name, id)).await? {
            ResurrectOutcome::Resurrected => {
                format!("{what}: running again; its failure stays in the journal")
            }
            ResurrectOutcome::NotFailed(status) => {
                return Err(conflict(format!(
                    "{what}: not resurrected, it is {status}, not failed"
                )))
            }
            ResurrectOutcome::NotFound => return Err(not_found()),
        },
        "release" => {
            if keiro.force_release((name, id)).await? {
                format!("{what}: lease dropped; its holder stops at its next step boundary")
            } else {
                format!("{what}: no lease was held")
            }
        }
        "redispatch" => {
            let count = keiro.redispatch_pending((name, id)).await?;
            format!("{what}: {count} remote step(s) re-dispatched")
        }
        "retry-with-input" => {
            let Some(input) = input else {
                return Err(ApiError::bad_request(
                    "input",
                    "retry-with-input needs an `input` (JSON)",
                ));
            };
            let retry = keiro.retry_with_input((name, id), &input).await?;
            let message = format!("{what}: started {retry} with the corrected input");
            started = Some(retry.to_string());
            message
        }
        other => {
            return Err(ApiError::not_found(format!("no action {other:?}")));
        }
    };
    Ok(Done {
        action: action.to_owned(),
        message,
        started,
    })
}

/// Runs queue action `action` (`pause`, `resume`) on `queue`. Idempotent: pausing a paused
/// queue leaves it paused. An unknown queue or action is 404.
pub(crate) async fn run_queue(keiro: &Keiro, action: &str, queue: &str) -> Result<Done, ApiError> {
    let message = match action {
        "pause" => {
            keiro.pause_queue(queue).await?;
            format!("{queue}: paused; admitted runs go on, waiting ones wait until it is resumed")
        }
        "resume" => {
            keiro.resume_queue(queue).await?;
            format!("{queue}: resumed; waiting runs are admitted within its limits")
        }
        other => {
            return Err(ApiError::not_found(format!("no queue action {other:?}")));
        }
    };
    Ok(Done {
        action: action.to_owned(),
        message,
        started: None,
    })
}
