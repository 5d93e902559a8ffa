//! Queues (`queue.sql`): starts on a queue, admission under every limit, admission order and
//! fairness, and when a slot comes back.

pub mod admit;
pub mod debounce;
pub mod fleet;
pub mod light;
pub mod order;
pub mod slots;
pub mod start;

use std::time::Duration;

use keiro::queue::{QueueSpec, StartOptions};
use keiro_journal::{Event, Fence, InstanceKey};
use keiro_lease::{Claim, LeaseStore};
use serde_json::json;
use time::OffsetDateTime;

use crate::contract::support::{append, key, Result};
use crate::Harness;

/// The lease the scenarios claim with.
pub const TTL: Duration = Duration::from_secs(60);

/// Declares `spec`.
pub async fn declare(h: &Harness, spec: QueueSpec) -> Result<()> {
    h.keiro.declare_queue(&spec).await?;
    Ok(())
}

/// Starts `wf/<id>` on `queue` under `key` (none when empty), and returns its key.
pub async fn start_on(h: &Harness, queue: &str, id: &str, run_key: &str) -> Result<InstanceKey> {
    let mut options = StartOptions::on_queue(queue);
    if !run_key.is_empty() {
        options = options.key(run_key);
    }
    let started = h.keiro.start_with("wf", id, &json!(null), &options).await?;
    Ok(started.instance.key)
}

/// What `owner`, a worker serving `queue`, claims of workflow `wf`, at most `limit`, at `now`
/// (`None`: the store's clock): its claim (`LeaseStore::claim_and_admit`), the runs the
/// ordinary claim takes (those holding their slot, and the free runs of a queue that counts
/// nothing) first, then the runs the queue admits.
pub async fn admit(
    store: &dyn LeaseStore,
    queue: &str,
    owner: &str,
    limit: i64,
    now: Option<OffsetDateTime>,
) -> Result<Vec<Claim>> {
    let names = [keiro_journal::WorkflowName::new("wf")?];
    let batch = store
        .claim_and_admit(&names, &[queue.to_owned()], owner, TTL, limit, now)
        .await?;
    let mut claims = batch.claimed;
    claims.extend(batch.admitted);
    Ok(claims)
}

/// The ids of `claims`, in order.
pub fn ids(claims: &[Claim]) -> Vec<String> {
    claims
        .iter()
        .map(|c| c.instance.key.id.as_str().to_owned())
        .collect()
}

/// Completes the run `claim` holds.
pub async fn complete(store: &dyn LeaseStore, claim: &Claim) -> Result<()> {
    let outcome = append(
        store,
        &claim.instance.key,
        None,
        Event::WorkflowCompleted { output: json!(1) },
        Some(&claim.fence),
    )
    .await?;
    assert!(
        matches!(outcome, keiro_journal::AppendOutcome::Appended),
        "{outcome:?}"
    );
    Ok(())
}

/// `wf/<id>`.
pub fn wf(id: &str) -> InstanceKey {
    key("wf", id)
}

/// The fence a claim holds.
pub fn fence(claim: &Claim) -> Fence {
    claim.fence.clone()
}
