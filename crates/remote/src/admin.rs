//! The operator's recovery tools: re-dispatch a run's pending remote steps, requeue a failed
//! run, and fix-and-replay a run with a corrected input.

use serde::Serialize;

use keiro_journal::{IdError, InstanceKey, StoreError, WorkflowId};

use crate::store::{RemoteAdmin, RequeueOutcome, RetryOutcome};

/// Errors of the operator tools.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// No such instance.
    #[error("workflow instance {key} does not exist")]
    NotFound {
        /// The instance.
        key: InstanceKey,
    },
    /// The input did not encode as JSON or exceeded the payload limit.
    #[error("invalid input: {0}")]
    Payload(String),
    /// The retry's id would be invalid (too long).
    #[error("invalid retry id")]
    InvalidId(#[from] IdError),
    /// The store failed.
    #[error("store operation failed")]
    Store(#[from] StoreError),
}

/// Re-dispatches every pending remote step of the instance's current generation (the escape
/// hatch for a dispatch that a broker lost, or a worker that hangs while heartbeating) and
/// returns how many. The same step ids are reused, so a slow handler may run twice.
///
/// # Errors
///
/// [`AdminError::NotFound`], [`AdminError::Store`].
pub async fn redispatch_pending(
    store: &dyn RemoteAdmin,
    key: &InstanceKey,
) -> Result<u64, AdminError> {
    store
        .remote_redispatch_pending(key)
        .await?
        .ok_or_else(|| AdminError::NotFound { key: key.clone() })
}

/// Requeues a failed instance (the operator's retry): failed remote steps and awaited child
/// failures are superseded (history is appended to, never rewritten), failed children are
/// requeued with it unless a success for them is already there, and the run is runnable again.
/// See [`RemoteAdmin::instance_requeue`].
///
/// # Errors
///
/// [`AdminError::NotFound`], [`AdminError::Store`].
pub async fn requeue(
    store: &dyn RemoteAdmin,
    key: &InstanceKey,
) -> Result<RequeueOutcome, AdminError> {
    match store.instance_requeue(key).await? {
        RequeueOutcome::NotFound => Err(AdminError::NotFound { key: key.clone() }),
        outcome => Ok(outcome),
    }
}

/// The key of a fresh fix-and-replay of `origin`: `<id>~retry~<8 hex>`.
///
/// # Errors
///
/// [`IdError`] when the origin id is too long to take the suffix.
pub fn retry_key(origin: &InstanceKey) -> Result<InstanceKey, IdError> {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let id = WorkflowId::new(format!("{}~retry~{}", origin.id, &suffix[..8]))?;
    Ok(InstanceKey::new(origin.name.clone(), id))
}

/// Fix-and-replay: starts `<id>~retry~<8 hex>` of the origin's workflow with `input` and a
/// clean history. The origin is left as it is; if a parent awaits the origin, the retry's
/// success (not its failure) is journaled there too, and a later [`requeue`] of the parent
/// adopts it. Returns the new instance's key. An input larger than `payload_len_max` bytes
/// (encoded) is refused and nothing is started.
///
/// # Errors
///
/// [`AdminError::NotFound`] for an unknown origin, [`AdminError::Payload`],
/// [`AdminError::InvalidId`], [`AdminError::Store`].
pub async fn retry_with_input<I: Serialize + ?Sized>(
    store: &dyn RemoteAdmin,
    origin: &InstanceKey,
    input: &I,
    payload_len_max: usize,
) -> Result<InstanceKey, AdminError> {
    // The same checks as every other payload: encodes, fits the limit, holds nothing a store
    // refuses.
    let input = keiro_journal::store::encode_payload(
        keiro_journal::store::INPUT_STEP,
        input,
        payload_len_max,
    )
    .map_err(|e| AdminError::Payload(e.to_string()))?;
    let retry = retry_key(origin)?;
    match store
        .instance_retry_with_input(origin, &retry, &input)
        .await?
    {
        RetryOutcome::Started(key) | RetryOutcome::Exists(key) => Ok(key),
        RetryOutcome::OriginNotFound => Err(AdminError::NotFound {
            key: origin.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_keys_keep_the_name_and_suffix_the_id() {
        let origin = InstanceKey::parse("ship", "order-7").unwrap();
        let retry = retry_key(&origin).unwrap();
        assert_eq!(retry.name, origin.name);
        let id = retry.id.as_str();
        assert!(id.starts_with("order-7~retry~"), "{id}");
        assert_eq!(id.len(), "order-7~retry~".len() + 8);
        assert_ne!(retry_key(&origin).unwrap(), retry);
    }

    #[test]
    fn an_origin_id_at_the_length_limit_is_a_typed_error() {
        let long = "x".repeat(keiro_journal::ID_LEN_MAX);
        let origin = InstanceKey::parse("ship", &long).unwrap();
        assert!(retry_key(&origin).is_err());
    }
}
