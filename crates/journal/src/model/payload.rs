//! Payloads: how a value a run or a caller writes is encoded and checked, and how a journaled
//! value is read back.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::WorkflowError;

/// Encodes a payload a run or a caller writes under `step`: it must encode as JSON, fit
/// `limit` bytes, and hold nothing a store refuses (see `store::check_value`).
///
/// ```
/// use keiro_journal::{store::encode_payload, WorkflowError};
/// assert!(encode_payload("input", &"ok", 1024).is_ok());
/// let refused = encode_payload("input", &"a\u{0}b", 1024);
/// assert!(matches!(refused, Err(WorkflowError::PayloadRefused { .. })));
/// ```
///
/// # Errors
///
/// [`WorkflowError::Encode`], [`WorkflowError::PayloadTooLarge`] or
/// [`WorkflowError::PayloadRefused`], naming `step`.
pub fn encode_payload<T: Serialize + ?Sized>(
    step: &str,
    value: &T,
    limit: usize,
) -> Result<Value, WorkflowError> {
    let json = serde_json::to_value(value).map_err(|source| WorkflowError::Encode {
        step: step.to_owned(),
        source,
    })?;
    check_payload(step, &json, limit)?;
    crate::check_value(&json).map_err(|reason| WorkflowError::PayloadRefused {
        step: step.to_owned(),
        reason,
    })?;
    Ok(json)
}

/// Checks an encoded payload against the limit.
pub(crate) fn check_payload(step: &str, json: &Value, limit: usize) -> Result<(), WorkflowError> {
    let len = crate::encoded_len(json);
    if len > limit {
        return Err(WorkflowError::PayloadTooLarge {
            step: step.to_owned(),
            len,
            limit,
        });
    }
    Ok(())
}

pub(crate) fn decode<T: DeserializeOwned>(step: &str, value: Value) -> Result<T, WorkflowError> {
    serde_json::from_value(value).map_err(|source| WorkflowError::Decode {
        step: step.to_owned(),
        source,
    })
}
