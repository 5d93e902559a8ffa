//! The store's operations, one file per file of `crates/migrations/functions/` and in the same order: each
//! SQL function keiro calls has one `async fn` here, with its statement as a `const` directly
//! above it, and the plain statements of the same concern sit beside them. An operation runs
//! one statement on the [`Db`](crate::db::Db) it is given and reads the row back into keiro's
//! types; it knows nothing of the group-commit lanes (`lanes`), which call the batch forms of
//! these functions, nor of the store traits (`impls`), which route to one or the other.

use std::time::Duration;

use keiro_journal::{Fence, InstanceKey, StoreError};

use crate::row::malformed;

pub(crate) mod attribute;
pub(crate) mod awakeable;
pub(crate) mod child;
pub(crate) mod instance;
pub(crate) mod journal;
pub(crate) mod lease;
pub(crate) mod message;
pub(crate) mod queue;
pub(crate) mod remote;
pub(crate) mod signal;
pub(crate) mod timer;
pub(crate) mod update;

/// The longest span sent to the database: longer leases and delays are cut to this, which is
/// "forever" for a workflow, so that `now() + span` can never leave the timestamp range.
const SPAN_MS_MAX: i64 = 100 * 366 * 24 * 60 * 60 * 1000;

/// A span as the whole milliseconds SQL multiplies by `interval '1 millisecond'`, capped at
/// [`SPAN_MS_MAX`].
pub(crate) fn span_ms(span: Duration) -> i64 {
    i64::try_from(span.as_millis()).map_or(SPAN_MS_MAX, |ms| ms.min(SPAN_MS_MAX))
}

/// The error for an outcome code this build does not know: the schema and the binary disagree.
pub(crate) fn unknown_outcome(operation: &'static str, outcome: &str) -> StoreError {
    malformed(
        operation,
        format_args!("unknown outcome {outcome:?} from the database"),
    )
}

/// [`StoreError::LeaseLost`] for the writer holding `fence`.
pub(crate) fn lease_lost(key: &InstanceKey, fence: &Fence) -> StoreError {
    StoreError::LeaseLost {
        key: key.clone(),
        owner: fence.owner.clone(),
        epoch: fence.epoch,
    }
}

/// [`StoreError::NotFound`] for `key`.
pub(crate) fn not_found(key: &InstanceKey) -> StoreError {
    StoreError::NotFound { key: key.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_whole_milliseconds_and_capped() {
        assert_eq!(span_ms(Duration::from_millis(1500)), 1500);
        assert_eq!(span_ms(Duration::from_micros(2999)), 2);
        assert_eq!(span_ms(Duration::MAX), SPAN_MS_MAX);
    }
}
