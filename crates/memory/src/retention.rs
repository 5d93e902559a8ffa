//! Retention in memory: the rule of keiro-journal's `retention` module, applied to the rows
//! in one critical section (which is also why no second collector can ever be running).

use keiro_journal::store::Result;
use keiro_journal::{store_span, traced};
use keiro_journal::{GcBatch, GcRequest, Instance, InstanceKey, RetentionStore};
use time::OffsetDateTime;

use crate::state::State;
use crate::MemoryStore;

/// Whether `row` is terminal and went terminal before `cutoff`.
fn expired(row: &Instance, cutoff: OffsetDateTime) -> bool {
    row.status.is_terminal() && row.completed_at.is_some_and(|at| at < cutoff)
}

/// Whether `key` may go: expired, its parent (if any is left) expired, every child expired.
fn eligible(state: &State, key: &InstanceKey, cutoff: OffsetDateTime) -> bool {
    let Some(entry) = state.instances.get(key) else {
        return false;
    };
    if !expired(&entry.row, cutoff) {
        return false;
    }
    let parent_ok = entry
        .row
        .parent
        .as_ref()
        .and_then(|parent| state.instances.get(parent))
        .is_none_or(|parent| expired(&parent.row, cutoff));
    let children_ok = state.children.get(key).is_none_or(|children| {
        children.iter().all(|child| {
            state
                .instances
                .get(child)
                .is_none_or(|child| expired(&child.row, cutoff))
        })
    });
    parent_ok && children_ok
}

/// The eligible instances, oldest terminal first (the Postgres batch's order).
fn candidates(state: &State, cutoff: OffsetDateTime) -> Vec<InstanceKey> {
    let mut keys: Vec<(OffsetDateTime, InstanceKey)> = state
        .instances
        .iter()
        .filter(|(key, _)| eligible(state, key, cutoff))
        .filter_map(|(key, entry)| entry.row.completed_at.map(|at| (at, key.clone())))
        .collect();
    keys.sort();
    keys.into_iter().map(|(_, key)| key).collect()
}

fn delete(state: &mut State, key: &InstanceKey) -> GcBatch {
    let Some(entry) = state.instances.remove(key) else {
        return GcBatch::default();
    };
    if let Some(parent) = &entry.row.parent {
        if let Some(siblings) = state.children.get_mut(parent) {
            siblings.remove(key);
            if siblings.is_empty() {
                state.children.remove(parent);
            }
        }
    }
    state.children.remove(key);
    let (timers, awakeables, signal_waiters) = state.sources.forget(key);
    GcBatch {
        instances: 1,
        journal: u64::try_from(entry.journal_len()).unwrap_or(u64::MAX),
        timers,
        awakeables,
        signal_waiters,
        remote_tasks: state.tasks.forget(key),
        locked_out: false,
    }
}

#[async_trait::async_trait]
impl RetentionStore for MemoryStore {
    async fn instances_gc(&self, request: &GcRequest) -> Result<GcBatch> {
        let span = store_span!("instances_gc");
        traced(span, async {
            self.transact("deleting expired instances", |state| {
                let cutoff = request.cutoff(request.now.unwrap_or_else(|| state.clock.now()));
                let batch = usize::try_from(request.batch_bounded()).unwrap_or(usize::MAX);
                let mut deleted = GcBatch::default();
                for key in candidates(state, cutoff).into_iter().take(batch) {
                    deleted += delete(state, &key);
                }
                Ok(deleted)
            })
        })
        .await
    }

    async fn instances_gc_eligible(&self, request: &GcRequest) -> Result<u64> {
        let span = store_span!("instances_gc_eligible");
        traced(span, async {
            self.transact("counting expired instances", |state| {
                let cutoff = request.cutoff(request.now.unwrap_or_else(|| state.clock.now()));
                Ok(u64::try_from(candidates(state, cutoff).len()).unwrap_or(u64::MAX))
            })
        })
        .await
    }
}
