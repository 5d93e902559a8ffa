//! Search attributes (`attribute.sql`): written by a start that creates its instance and by the
//! run's fenced, journaled sets (the latest value of a name wins), bounded per run, deleted
//! with their instance, and found by the list's attribute filters.

pub mod list;
pub mod set;

use keiro_journal::attribute::Attributes;
use keiro_journal::{Append, Event, Fence, InstanceKey, StepKind};

/// The fenced append of the run's `n`-th set of `attributes`.
pub(crate) fn attrs_step(
    k: &InstanceKey,
    fence: Option<&Fence>,
    n: u32,
    attributes: &Attributes,
) -> Append {
    Append {
        key: k.clone(),
        generation: Some(0),
        event: Event::StepRecorded {
            step: format!("attrs:#{n}"),
            kind: StepKind::Attributes,
            result: serde_json::to_value(attributes).expect("attributes serialize"),
        },
        fence: fence.cloned(),
        renew: None,
    }
}
