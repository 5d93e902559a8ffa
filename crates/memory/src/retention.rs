//! Retention in memory: the rule of keiro-journal's `retention` module, applied to the rows
//! in one critical section (which is also why no second collector can ever be running).

use keiro_journal::store::Result;
use keiro_journal::{span::traced, store_span};
use keiro_journal::{GcBatch, GcRequest, Instance, InstanceKey, RetentionStore};
use time::OffsetDateTime;

use crate::MemoryStore;
use crate::State;

/// Whether `row` is terminal and went terminal before `cutoff`.
fn expired(row: &Instance, cutoff: OffsetDateTime) -> bool {
    row.status.is_terminal() && row.completed_at.is_some_and(|at| at < cutoff)
}

/// Whether `row` is expired under an expired parent (or one that is gone, or none).
fn expired_under_expired_parent(state: &State, row: &Instance, cutoff: OffsetDateTime) -> bool {
    expired(row, cutoff)
        && row
            .parent
            .as_ref()
            .and_then(|parent| state.instances.get(parent))
            .is_none_or(|parent| expired(&parent.row, cutoff))
}

/// The children of `key` that are still there.
fn children<'a>(state: &'a State, key: &InstanceKey) -> impl Iterator<Item = &'a InstanceKey> {
    state
        .children
        .get(key)
        .into_iter()
        .flatten()
        .filter(|child| state.instances.contains_key(*child))
}

/// Whether `key` may go now: expired under an expired parent, with no child left.
fn candidate(state: &State, key: &InstanceKey, cutoff: OffsetDateTime) -> bool {
    state.instances.get(key).is_some_and(|entry| {
        expired_under_expired_parent(state, &entry.row, cutoff)
            && children(state, key).next().is_none()
    })
}

/// Whether `key` goes in a collection, batch after batch: expired under an expired parent,
/// with nothing unexpired below it (its descendants then go first).
fn collectable(state: &State, key: &InstanceKey, cutoff: OffsetDateTime) -> bool {
    let Some(entry) = state.instances.get(key) else {
        return false;
    };
    if !expired_under_expired_parent(state, &entry.row, cutoff) {
        return false;
    }
    let mut seen = std::collections::HashSet::from([key]);
    let mut below: Vec<&InstanceKey> = children(state, key).collect();
    while let Some(next) = below.pop() {
        if !seen.insert(next) {
            continue;
        }
        if !state
            .instances
            .get(next)
            .is_some_and(|e| expired(&e.row, cutoff))
        {
            return false;
        }
        below.extend(children(state, next));
    }
    true
}

/// The candidates, oldest terminal first (the Postgres batch's order).
fn candidates(state: &State, cutoff: OffsetDateTime) -> Vec<InstanceKey> {
    let mut keys: Vec<(OffsetDateTime, InstanceKey)> = state
        .instances
        .iter()
        .filter(|(key, _)| candidate(state, key, cutoff))
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
                let mut room = usize::try_from(request.batch_bounded()).unwrap_or(usize::MAX);
                let mut deleted = GcBatch::default();
                // Rounds, as the Postgres batch: a child deleted may leave its parent a
                // candidate, which goes in the same batch if there is room.
                while room > 0 {
                    let round: Vec<InstanceKey> =
                        candidates(state, cutoff).into_iter().take(room).collect();
                    if round.is_empty() {
                        break;
                    }
                    room -= round.len();
                    for key in &round {
                        deleted += delete(state, key);
                    }
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
                let n = state
                    .instances
                    .keys()
                    .filter(|key| collectable(state, key, cutoff))
                    .count();
                Ok(u64::try_from(n).unwrap_or(u64::MAX))
            })
        })
        .await
    }
}
