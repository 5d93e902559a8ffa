//! Operators' reads on Postgres: one page of instances by filter, and the overview counts.
//!
//! A list query is assembled from the constant fragments below, one per filter that is set,
//! every value a parameter. It runs as an unnamed statement, so Postgres plans it with the
//! values at hand (a custom plan): an unset filter costs nothing, and an id prefix becomes an
//! index range. Migration 0015 has an index for every filter, each ending with the keyset
//! `(created_at, workflow_name, workflow_id)`, so a page is one index walk that stops after
//! `limit + 1` rows however deep the page is (the test `list_plans` proves no sequential scan).
//! The one exception is the `updated` window, unindexed on purpose (see `ListFilter::updated`).

use keiro_journal::{
    Counts, GroupCount, InspectStore, InstanceKey, InstanceSummary, ListOrder, ListRequest, Page,
    StatusCount, StoreError, WorkflowName,
};
use time::OffsetDateTime;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::error::Failure;
use crate::row::{column, count, malformed, status};
use crate::PgStore;

type Result<T, E = StoreError> = std::result::Result<T, E>;

const LIST: &str = "listing instances";
const COUNTS: &str = "counting instances";

const INSTANCES_LIST_SELECT: &str = "SELECT w.workflow_name, w.workflow_id, w.generation, \
     w.status, w.attempts, w.last_error, w.parent_name, w.parent_id, w.priority, \
     w.created_at, w.updated_at, w.completed_at FROM workflows w WHERE true";
// Served by workflows_list_name_idx.
const FILTER_NAME: &str = " AND w.workflow_name = $";
// Served by workflows_list_status_idx.
const FILTER_STATUS: &str = " AND w.status = $";
// Served by workflows_list_created_idx (or the keyset suffix of the index of another filter).
const FILTER_CREATED_SINCE: &str = " AND w.created_at >= $";
const FILTER_CREATED_UNTIL: &str = " AND w.created_at < $";
// No index (updated_at changes on every append, see 0015): filters the walk of another index.
const FILTER_UPDATED_SINCE: &str = " AND w.updated_at >= $";
const FILTER_UPDATED_UNTIL: &str = " AND w.updated_at < $";
// Served by workflows_terminal_idx: the status test makes its partial predicate apply.
const FILTER_FINISHED_SINCE: &str =
    " AND w.status IN ('completed', 'failed', 'cancelled') AND w.completed_at >= $";
const FILTER_FINISHED_UNTIL: &str =
    " AND w.status IN ('completed', 'failed', 'cancelled') AND w.completed_at < $";
// Served by workflows_list_parent_idx.
const FILTER_PARENT_NAME: &str = " AND w.parent_name = $";
const FILTER_PARENT_ID: &str = " AND w.parent_id = $";
// Served by workflows_list_id_idx: with the C collation `^@` is a range on a btree.
const FILTER_ID_PREFIX: &str = " AND w.workflow_id ^@ $";
// Served by remote_tasks_failed_idx (the probe per row, or the scan of failed tasks joined).
const FILTER_FAILED_REMOTE: &str = " AND EXISTS (SELECT 1 FROM remote_tasks t \
     WHERE t.workflow_name = w.workflow_name AND t.workflow_id = w.workflow_id \
     AND t.status = 'failed')";
const KEYSET_BEFORE: &str = " AND (w.created_at, w.workflow_name, w.workflow_id) < ($";
const KEYSET_AFTER: &str = " AND (w.created_at, w.workflow_name, w.workflow_id) > ($";
// The same keyset without the name, for a name-filtered page whose cursor has that name: it is
// what workflows_list_name_idx can seek to (its columns are name, created_at, id).
const KEYSET_NAMED_BEFORE: &str = " AND (w.created_at, w.workflow_id) < ($";
const KEYSET_NAMED_AFTER: &str = " AND (w.created_at, w.workflow_id) > ($";
const ORDER_NEWEST: &str =
    " ORDER BY w.created_at DESC, w.workflow_name DESC, w.workflow_id DESC LIMIT $";
const ORDER_OLDEST: &str = " ORDER BY w.created_at, w.workflow_name, w.workflow_id LIMIT $";

/// A list statement and its parameters, assembled from the constant fragments.
#[doc(hidden)]
pub struct ListStatement {
    /// The SQL text.
    pub sql: String,
    /// The parameters, in placeholder order.
    pub params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl std::fmt::Debug for ListStatement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListStatement")
            .field("sql", &self.sql)
            .finish_non_exhaustive()
    }
}

impl ListStatement {
    fn push(&mut self, fragment: &str, value: Box<dyn ToSql + Sync + Send>) {
        self.params.push(value);
        self.sql.push_str(fragment);
        self.sql.push_str(&self.params.len().to_string());
    }

    /// Appends `, $n` for one more parameter of a row value.
    fn push_more(&mut self, value: Box<dyn ToSql + Sync + Send>) {
        self.params.push(value);
        self.sql.push_str(", $");
        self.sql.push_str(&self.params.len().to_string());
    }

    /// The statement for `request`, fetching one row more than its limit (the probe for a next
    /// page).
    pub fn new(request: &ListRequest) -> Self {
        let mut statement = Self {
            sql: INSTANCES_LIST_SELECT.to_owned(),
            params: Vec::new(),
        };
        let filter = &request.filter;
        if let Some(name) = &filter.name {
            statement.push(FILTER_NAME, Box::new(name.as_str().to_owned()));
        }
        if let Some(wanted) = filter.status {
            statement.push(FILTER_STATUS, Box::new(wanted.as_str()));
        }
        if let Some(since) = filter.created.since {
            statement.push(FILTER_CREATED_SINCE, Box::new(since));
        }
        if let Some(until) = filter.created.until {
            statement.push(FILTER_CREATED_UNTIL, Box::new(until));
        }
        if let Some(since) = filter.updated.since {
            statement.push(FILTER_UPDATED_SINCE, Box::new(since));
        }
        if let Some(until) = filter.updated.until {
            statement.push(FILTER_UPDATED_UNTIL, Box::new(until));
            // A row is never updated before it was created: this bound lets the walk of the
            // created_at index stop at `until`.
            statement.push(FILTER_CREATED_UNTIL, Box::new(until));
        }
        if let Some(since) = filter.finished.since {
            statement.push(FILTER_FINISHED_SINCE, Box::new(since));
        }
        if let Some(until) = filter.finished.until {
            statement.push(FILTER_FINISHED_UNTIL, Box::new(until));
        }
        if let Some(parent) = &filter.parent {
            statement.push(
                FILTER_PARENT_NAME,
                Box::new(parent.name.as_str().to_owned()),
            );
            statement.push(FILTER_PARENT_ID, Box::new(parent.id.as_str().to_owned()));
        }
        if let Some(prefix) = &filter.id_prefix {
            statement.push(FILTER_ID_PREFIX, Box::new(prefix.clone()));
        }
        if filter.failed_remote {
            statement.sql.push_str(FILTER_FAILED_REMOTE);
        }
        if let Some(cursor) = &request.cursor {
            let newest = request.order == ListOrder::NewestFirst;
            statement.push(
                if newest { KEYSET_BEFORE } else { KEYSET_AFTER },
                Box::new(cursor.created_at),
            );
            statement.push_more(Box::new(cursor.key.name.as_str().to_owned()));
            statement.push_more(Box::new(cursor.key.id.as_str().to_owned()));
            statement.sql.push(')');
            if filter.name.as_ref() == Some(&cursor.key.name) {
                statement.push(
                    if newest {
                        KEYSET_NAMED_BEFORE
                    } else {
                        KEYSET_NAMED_AFTER
                    },
                    Box::new(cursor.created_at),
                );
                statement.push_more(Box::new(cursor.key.id.as_str().to_owned()));
                statement.sql.push(')');
            }
        }
        let order = match request.order {
            ListOrder::NewestFirst => ORDER_NEWEST,
            ListOrder::OldestFirst => ORDER_OLDEST,
        };
        statement.push(order, Box::new(i64::from(request.limit) + 1));
        statement
    }

    /// The parameters as `query` takes them.
    pub fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|param| param.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

fn key(name: String, id: String) -> Result<InstanceKey> {
    InstanceKey::parse(&name, &id)
        .map_err(|e| malformed(LIST, format_args!("instance key {name:?}/{id:?}: {e}")))
}

fn summary(row: &Row) -> Result<InstanceSummary> {
    let parent = match (
        column::<Option<String>>(row, "parent_name", LIST)?,
        column::<Option<String>>(row, "parent_id", LIST)?,
    ) {
        (Some(name), Some(id)) => Some(key(name, id)?),
        (None, None) => None,
        _ => return Err(malformed(LIST, "a parent needs both a name and an id")),
    };
    let text: String = column(row, "status", LIST)?;
    Ok(InstanceSummary {
        key: key(
            column(row, "workflow_name", LIST)?,
            column(row, "workflow_id", LIST)?,
        )?,
        generation: column(row, "generation", LIST)?,
        status: status(&text, LIST)?,
        attempts: column(row, "attempts", LIST)?,
        last_error: column(row, "last_error", LIST)?,
        parent,
        priority: column(row, "priority", LIST)?,
        created_at: column(row, "created_at", LIST)?,
        updated_at: column(row, "updated_at", LIST)?,
        completed_at: column(row, "completed_at", LIST)?,
    })
}

// Every index-only or partial-index count: the status index for the instances, the partial
// index on scheduled timers, the pending and running partial indexes of the tasks.
const INSTANCES_COUNTS: &str = "SELECT workflow_name, status, count(*) AS n FROM workflows \
     GROUP BY workflow_name, status ORDER BY workflow_name, status";
const TIMERS_BACKLOG: &str = "SELECT \
     count(*) FILTER (WHERE fire_at <= coalesce($1, now())) AS due, \
     count(*) FILTER (WHERE fire_at > coalesce($1, now())) AS future \
     FROM timers WHERE status = 'scheduled'";
const REMOTE_BACKLOG: &str = "SELECT grp, \
     count(*) FILTER (WHERE status = 'pending') AS pending, \
     count(*) FILTER (WHERE status = 'running') AS running \
     FROM remote_tasks WHERE status IN ('pending', 'running') GROUP BY grp ORDER BY grp";

impl PgStore {
    async fn list(&self, request: &ListRequest) -> Result<Page> {
        let statement = ListStatement::new(request);
        let client = self.client(LIST).await?;
        // An unprepared query with parameters is a parse, then a bind and execute: two.
        self.count_round_trips(2);
        // Unprepared on purpose: an unnamed statement is planned with its values (see the
        // module docs); a cached prepared one could fall back to a generic plan.
        let rows = client
            .query(statement.sql.as_str(), &statement.params())
            .await
            .map_err(|e| Failure::from(e).into_store(LIST))?;
        let rows = rows.iter().map(summary).collect::<Result<Vec<_>>>()?;
        Ok(Page::from_probe(rows, request.limit))
    }

    async fn counts(&self, now: Option<OffsetDateTime>) -> Result<Counts> {
        let instances = self.query(COUNTS, INSTANCES_COUNTS, &[]).await?;
        let timers = self.query_one(COUNTS, TIMERS_BACKLOG, &[&now]).await?;
        let remote = self.query(COUNTS, REMOTE_BACKLOG, &[]).await?;
        let instances = instances
            .iter()
            .map(|row| {
                let name: String = column(row, "workflow_name", COUNTS)?;
                let text: String = column(row, "status", COUNTS)?;
                Ok(StatusCount {
                    name: WorkflowName::new(name.as_str())
                        .map_err(|e| malformed(COUNTS, format_args!("name {name:?}: {e}")))?,
                    status: status(&text, COUNTS)?,
                    count: count(row, "n", COUNTS)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let remote = remote
            .iter()
            .map(|row| {
                Ok(GroupCount {
                    group: column(row, "grp", COUNTS)?,
                    pending: count(row, "pending", COUNTS)?,
                    running: count(row, "running", COUNTS)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Counts {
            instances,
            timers_due: count(&timers, "due", COUNTS)?,
            timers_future: count(&timers, "future", COUNTS)?,
            remote,
        })
    }
}

#[async_trait::async_trait]
impl InspectStore for PgStore {
    async fn instances_list(&self, request: &ListRequest) -> Result<Page> {
        self.list(request).await
    }

    async fn instances_counts(&self, now: Option<OffsetDateTime>) -> Result<Counts> {
        self.counts(now).await
    }
}
