//! Application versions (migration 0025, `keiro_lease::versions`): what a run records, which
//! runs a claim serving some versions takes, the move of a version's runs, and workers'
//! heartbeat rows.

pub mod claims;
pub mod moves;
pub mod workers;

use std::time::Duration;

use keiro_journal::WorkflowName;
use keiro_lease::{Claim, LeaseStore, Versions};

use crate::contract::support::Result;

/// The lease of the claims here.
pub const TTL: Duration = Duration::from_secs(60);

/// What a batch claim of `wf` runs serving `versions` takes for `owner`.
pub async fn claim_serving(
    store: &dyn LeaseStore,
    versions: &Versions,
    owner: &str,
) -> Result<Vec<Claim>> {
    let names = [WorkflowName::new("wf")?];
    Ok(store
        .instances_claim_batch_serving(&names, versions, owner, TTL, 10, None)
        .await?)
}

/// The ids of `claims`, sorted.
pub fn ids(claims: &[Claim]) -> Vec<String> {
    let mut ids: Vec<String> = claims
        .iter()
        .map(|c| c.instance.key.id.as_str().to_owned())
        .collect();
    ids.sort();
    ids
}
