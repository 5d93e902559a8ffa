//! Shorthands for the unit tests.

use std::time::Duration;

use keiro_journal::store::{Append, AppendOutcome, Result};
use keiro_journal::{store::StartRequest, Event, Fence, Generation, InstanceKey, JournalStore};
use keiro_lease::{ClaimOutcome, LeaseStore};
use serde_json::Value;
use time::macros::datetime;
use time::OffsetDateTime;

use crate::MemoryStore;

pub(crate) const TTL: Duration = Duration::from_secs(60);
pub(crate) const T0: OffsetDateTime = datetime!(2030-01-01 0:00 UTC);

/// A store pinned at [`T0`].
pub(crate) fn store() -> MemoryStore {
    let store = MemoryStore::new();
    store.set_now(Some(T0));
    store
}

pub(crate) async fn start(store: &MemoryStore, id: &str) -> InstanceKey {
    let key = InstanceKey::parse("wf", id).unwrap();
    let request = StartRequest {
        key: key.clone(),
        input: Value::Null,
        parent: None,
        priority: 0,
    };
    store.instance_start(&request).await.unwrap();
    key
}

pub(crate) async fn claim(store: &MemoryStore, key: &InstanceKey, owner: &str) -> Fence {
    match store.instance_claim(key, owner, TTL, None).await.unwrap() {
        ClaimOutcome::Acquired(claim) => claim.fence,
        refused => panic!("claim of {key} by {owner} refused: {refused:?}"),
    }
}

pub(crate) async fn append(
    store: &MemoryStore,
    key: &InstanceKey,
    generation: Option<Generation>,
    event: Event,
    fence: Option<&Fence>,
) -> Result<AppendOutcome> {
    let append = Append {
        key: key.clone(),
        generation,
        event,
        fence: fence.cloned(),
        renew: None,
    };
    store.journal_append(&append).await
}
