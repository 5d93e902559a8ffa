//! The values the SQLite store refuses: exactly those PostgreSQL refuses, a NUL character in a
//! jsonb string (SQLSTATE 22P05) or in a text column (22021).
//!
//! PostgreSQL refuses such a value when it receives the statement's parameters, before the
//! statement runs, so the Postgres store writes nothing and answers `ValueRefused` whatever
//! state the rows are in (even where it would otherwise answer `NotFound` or
//! `AlreadyPresent`). SQLite itself stores a NUL without a word, so each operation here checks
//! its arguments the same way: before it is queued to the writer. A value past the length
//! limit is refused by SQLite itself (`SQLITE_TOOBIG`, mapped to `ValueRefused`).
//!
//! Names keiro builds and validates itself (instance keys, and the owner, worker and group
//! names of leases and claims) are not checked: they cannot hold a NUL.

use keiro_journal::store::{Append, Error, Result};
use keiro_journal::{store::check_value, Event};
use serde_json::Value;

/// Refuses a jsonb value holding a NUL.
pub(crate) fn value(operation: &'static str, value: &Value) -> Result<()> {
    check_value(value).map_err(|reason| Error::ValueRefused { operation, reason })
}

/// Refuses a text column's value holding a NUL; `what` names it in the reason.
pub(crate) fn text(operation: &'static str, what: &str, text: &str) -> Result<()> {
    if text.contains('\0') {
        return Err(Error::ValueRefused {
            operation,
            reason: format!("a NUL character (\\u0000) in the {what}"),
        });
    }
    Ok(())
}

/// Refuses an event whose step name or payload a journal row cannot hold.
pub(crate) fn event(operation: &'static str, event: &Event) -> Result<()> {
    match event {
        Event::StepRecorded { step, result, .. } => {
            text(operation, "step name", step)?;
            value(operation, result)
        }
        Event::WorkflowCompleted { output } => value(operation, output),
        // Stored twice, as the marker's jsonb payload and as the row's `last_error`.
        Event::WorkflowFailed { reason } => text(operation, "failure reason", reason),
        Event::WorkflowContinuedAsNew { input, .. } => value(operation, input),
        Event::StepReset { step, superseded } => {
            text(operation, "step name", step)?;
            text(operation, "step name", superseded)
        }
        // Cancellation and resurrection carry nothing of their own.
        _ => Ok(()),
    }
}

/// Refuses an append whose event a journal row cannot hold.
pub(crate) fn append(operation: &'static str, append: &Append) -> Result<()> {
    event(operation, &append.event)
}

#[cfg(test)]
mod tests {
    use keiro_journal::StepKind;
    use serde_json::json;

    use super::*;

    #[test]
    fn a_nul_anywhere_in_a_value_or_a_text_is_refused() {
        assert!(value("op", &json!({"a": ["b", {"c": 1}]})).is_ok());
        let err = value("op", &json!({"a": ["b", {"c": "d\u{0}"}]})).unwrap_err();
        assert!(err.is_value_refused() && !err.is_retryable(), "{err}");
        assert!(text("op", "signal token", "fine").is_ok());
        let err = text("op", "signal token", "a\u{0}b").unwrap_err();
        assert_eq!(
            err.to_string(),
            "op: the store refused the value: a NUL character (\\u0000) in the signal token"
        );
    }

    #[test]
    fn events_are_refused_for_what_their_rows_store() {
        let step = |name: &str, result| Event::StepRecorded {
            step: name.into(),
            kind: StepKind::Step,
            result,
        };
        assert!(event("op", &step("s", json!("ok"))).is_ok());
        assert!(event("op", &step("s", json!("a\u{0}"))).is_err());
        assert!(event("op", &step("s\u{0}", json!(1))).is_err());
        let failed = Event::WorkflowFailed {
            reason: "\u{0}".into(),
        };
        assert!(event("op", &failed).is_err());
        let completed = Event::WorkflowCompleted {
            output: json!(["\u{0}"]),
        };
        assert!(event("op", &completed).is_err());
        assert!(event("op", &Event::WorkflowCancelled).is_ok());
    }
}
