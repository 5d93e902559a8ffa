//! Small tools the contract scenarios share: requests, claims and reads through the store
//! traits, so each scenario says only what it checks.

use std::time::Duration;

use keiro_journal::{
    store::Park, store::ParkOutcome, store::StartRequest, Append, Event, Fence, InstanceKey,
    Status, StepKind,
};
use keiro_lease::{ClaimOutcome, LeaseStore};

pub use crate::TestResult;

/// What a helper returns: `?` works on every error.
pub type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

/// Parses a key, for brevity.
pub fn key(name: &str, id: &str) -> InstanceKey {
    InstanceKey::parse(name, id).expect("test keys are valid")
}

/// A start request with `input` and no parent.
pub fn start(key: &InstanceKey, input: serde_json::Value) -> StartRequest {
    StartRequest {
        key: key.clone(),
        input,
        parent: None,
        priority: 0,
    }
}

/// An external append of a step.
pub fn step(k: &InstanceKey, name: &str, kind: StepKind, result: serde_json::Value) -> Append {
    Append::external(
        k.clone(),
        Event::StepRecorded {
            step: name.into(),
            kind,
            result,
        },
    )
}

/// Claims `k` for `owner` with a one-minute lease, failing the test when refused.
pub async fn claim(store: &dyn LeaseStore, k: &InstanceKey, owner: &str) -> Result<Fence> {
    match store
        .instance_claim(k, owner, Duration::from_secs(60), None)
        .await?
    {
        ClaimOutcome::Acquired(claim) => Ok(claim.fence),
        refused => Err(format!("claim of {k} refused: {refused:?}").into()),
    }
}

/// Starts `k` and parks it `suspended` on generation 0 (no lease, no deadline), as a run
/// waiting on a wake source leaves it.
pub async fn start_parked(store: &dyn LeaseStore, k: &InstanceKey) -> Result<()> {
    store
        .instance_start(&start(k, serde_json::Value::Null))
        .await?;
    let parked = store
        .instance_park(&Park {
            key: k.clone(),
            generation: 0,
            fence: None,
            awaited: Vec::new(),
            wake_after: None,
        })
        .await?;
    assert_eq!(parked, ParkOutcome::Suspended);
    Ok(())
}

/// The instance's status, failing the test when it is missing.
pub async fn status(store: &dyn LeaseStore, k: &InstanceKey) -> Result<Status> {
    let row = store.instance_get(k).await?;
    Ok(row.ok_or_else(|| format!("{k} is missing"))?.status)
}

/// The values journaled under `step` in any generation of `k` (a step is journaled at most
/// once per generation, so more than one entry in one generation would be a bug).
pub async fn recorded(
    store: &dyn LeaseStore,
    k: &InstanceKey,
    step: &str,
) -> Result<Vec<serde_json::Value>> {
    Ok(store
        .journal_history(k)
        .await?
        .into_iter()
        .filter_map(|entry| match entry.event {
            Event::StepRecorded {
                step: name, result, ..
            } if name == step => Some(result),
            _ => None,
        })
        .collect())
}
