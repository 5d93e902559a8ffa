//! Operators' reads in memory: the list filters every row and sorts the matches (the Postgres
//! store walks an index instead; the results are the same, page by page). An instance's waits
//! are read from the wake-source tables, through `Sources::waits`.

use keiro_journal::store::Result;
use keiro_journal::{span::traced, store_span};
use keiro_journal::{
    Counts, GroupCount, InspectStore, InstanceKey, InstanceSummary, ListOrder, ListRequest, Page,
    StatusCount, Waits,
};
use time::OffsetDateTime;

use crate::MemoryStore;
use crate::State;

fn list(state: &State, request: &ListRequest) -> Page {
    let filter = &request.filter;
    let mut rows: Vec<InstanceSummary> = state
        .instances
        .values()
        .map(|entry| &entry.row)
        .filter(|row| filter.matches_row(row))
        .filter(|row| !filter.failed_remote || state.tasks.has_failed(&row.key))
        .filter(|row| {
            request
                .cursor
                .as_ref()
                .is_none_or(|cursor| cursor.precedes(request.order, row.created_at, &row.key))
        })
        .map(InstanceSummary::from)
        .collect();
    rows.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
    if request.order == ListOrder::NewestFirst {
        rows.reverse();
    }
    rows.truncate(
        usize::try_from(request.limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1),
    );
    Page::from_probe(rows, request.limit)
}

fn counts(state: &State, now: OffsetDateTime) -> Counts {
    let mut instances: Vec<StatusCount> = Vec::new();
    for entry in state.instances.values() {
        let row = &entry.row;
        match instances
            .iter_mut()
            .find(|count| count.name == row.key.name && count.status == row.status)
        {
            Some(count) => count.count += 1,
            None => instances.push(StatusCount {
                name: row.key.name.clone(),
                status: row.status,
                count: 1,
            }),
        }
    }
    // As Postgres sorts them: by name, then by the status text.
    instances.sort_by(|a, b| (&a.name, a.status.as_str()).cmp(&(&b.name, b.status.as_str())));
    let (timers_due, timers_future) = state.sources.timer_backlog(now);
    let remote = state
        .tasks
        .backlog()
        .into_iter()
        .map(|(group, (pending, running))| GroupCount {
            group,
            pending,
            running,
        })
        .collect();
    Counts {
        instances,
        timers_due,
        timers_future,
        remote,
    }
}

#[async_trait::async_trait]
impl InspectStore for MemoryStore {
    async fn instances_list(&self, request: &ListRequest) -> Result<Page> {
        let span = store_span!("instances_list");
        traced(span, async {
            self.transact("listing instances", |state| Ok(list(state, request)))
        })
        .await
    }

    async fn instances_counts(&self, now: Option<OffsetDateTime>) -> Result<Counts> {
        let span = store_span!("instances_counts");
        traced(span, async {
            self.transact("counting instances", |state| {
                let now = now.unwrap_or_else(|| state.clock.now());
                Ok(counts(state, now))
            })
        })
        .await
    }

    async fn instance_waits(&self, key: &InstanceKey, limit: u32) -> Result<Waits> {
        let span = store_span!("instance_waits", key = key);
        traced(span, async {
            self.transact("reading an instance's waits", |state| {
                Ok(state.sources.waits(key, limit))
            })
        })
        .await
    }
}
