//! Operators' reads on Postgres: one page of instances by filter, the overview counts and the
//! terminal instances per time bucket (the overview's throughput).
//!
//! A list query is assembled from the constant fragments below, one per filter that is set,
//! every value a parameter. It runs as an unnamed statement, so Postgres plans it with the
//! values at hand (a custom plan): an unset filter costs nothing, and an id prefix becomes an
//! index range. Migration 0015 has an index for every filter, each ending with the keyset
//! `(created_at, workflow_name, workflow_id)`, so a page is one index walk that stops after
//! `limit + 1` rows however deep the page is (the test `list_plans` proves no sequential scan).
//! The one exception is the `updated` window, unindexed on purpose (see `ListFilter::updated`).
//! The attribute filters are semi-joins on `workflow_attributes`, one per attribute and kind
//! (`AttrFilter::groups`), each a range of that kind's index of migration 0026 (the test
//! `attribute_plans`); every row carries its attributes, read by a primary-key probe.
//!
//! An instance's waits (its timers, awakeables and pending signal waits) are one statement, so
//! they come from one snapshot in one round trip: a signal delivered meanwhile cannot show both
//! as a pending wait and as a fired timeout.

use keiro_journal::attribute::{AttrFilter, AttrOp};
use keiro_journal::store::{Throughput, ThroughputRequest};
use keiro_journal::{span::traced, store_span};
use keiro_journal::{
    AwakeableInfo, Counts, GroupCount, InspectStore, InstanceKey, InstanceSummary, ListOrder,
    ListRequest, Page, SignalWaitInfo, StatusCount, StoreError, TimerInfo, TimerKind, TimerState,
    Waits, WorkflowName,
};
use time::OffsetDateTime;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::row::{column, count, malformed, status};
use crate::PgStore;

type Result<T, E = StoreError> = std::result::Result<T, E>;

const LIST: &str = "listing instances";
const COUNTS: &str = "counting instances";
const THROUGHPUT: &str = "counting terminal instances by time";
const WAITS: &str = "reading an instance's waits";

const INSTANCES_LIST_SELECT: &str = "SELECT w.workflow_name, w.workflow_id, w.generation, \
     w.status, w.attempts, w.last_error, w.parent_name, w.parent_id, w.priority, \
     w.created_at, w.updated_at, w.completed_at, w.queue, w.queue_key, w.next_attempt_at, \
     (SELECT jsonb_object_agg(a.attr, a.value) FROM workflow_attributes a \
      WHERE a.workflow_name = w.workflow_name AND a.workflow_id = w.workflow_id) AS attributes \
     FROM workflows w WHERE true";
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
// With a key, served by workflows_list_queue_idx (0030: queue, key, created_at; the runs of one
// instant sorted by name and id after it); a queue alone filters the walk of
// workflows_list_created_idx (or of another filter's index).
const FILTER_QUEUE: &str = " AND w.queue = $";
const FILTER_QUEUE_KEY: &str = " AND w.queue_key = $";
// Served by remote_tasks_failed_idx (the probe per row, or the scan of failed tasks joined).
const FILTER_FAILED_REMOTE: &str = " AND EXISTS (SELECT 1 FROM remote_tasks t \
     WHERE t.workflow_name = w.workflow_name AND t.workflow_id = w.workflow_id \
     AND t.status = 'failed')";
// An attribute filter: a semi-join on workflow_attributes, its attribute and value a range of
// workflow_attributes_text_idx, _num_idx or _time_idx (migration 0026), by the kind compared.
const FILTER_ATTR: &str = " AND EXISTS (SELECT 1 FROM workflow_attributes a \
     WHERE a.workflow_name = w.workflow_name AND a.workflow_id = w.workflow_id AND a.attr = $";
// Text and booleans share text_value: the kind tells `"true"` from `true`.
const FILTER_ATTR_KIND: &str = " AND a.kind = $";
const FILTER_ATTR_TEXT: &str = " AND a.text_value = $";
// [=, >, >=, <, <=] on a number, then on a time.
const FILTER_ATTR_NUM: [&str; 5] = [
    " AND a.num_value = $",
    " AND a.num_value > $",
    " AND a.num_value >= $",
    " AND a.num_value < $",
    " AND a.num_value <= $",
];
const FILTER_ATTR_TIME: [&str; 5] = [
    " AND a.time_value = $",
    " AND a.time_value > $",
    " AND a.time_value >= $",
    " AND a.time_value < $",
    " AND a.time_value <= $",
];
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
            // A run finishes after it was created: this bound lets a newest-first walk of the
            // created_at index start at `until` instead of passing every run created since.
            statement.push(FILTER_CREATED_UNTIL, Box::new(until));
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
        if let Some(queue) = &filter.queue {
            statement.push(FILTER_QUEUE, Box::new(queue.clone()));
        }
        if let Some(key) = &filter.queue_key {
            statement.push(FILTER_QUEUE_KEY, Box::new(key.clone()));
        }
        if filter.failed_remote {
            statement.sql.push_str(FILTER_FAILED_REMOTE);
        }
        for group in AttrFilter::groups(&filter.attributes) {
            statement.attrs(&group);
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

    /// The semi-join of one group of attribute filters (validated: a range compares a number
    /// or a time): one attribute, one typed column, every bound of the group on it.
    fn attrs(&mut self, group: &[&AttrFilter]) {
        let Some(first) = group.first() else {
            return;
        };
        self.push(FILTER_ATTR, Box::new(first.name.clone()));
        for filter in group {
            let op = match filter.op {
                AttrOp::Eq => 0,
                AttrOp::Gt => 1,
                AttrOp::Ge => 2,
                AttrOp::Lt => 3,
                AttrOp::Le => 4,
            };
            if let Some(text) = filter.value.text_key() {
                self.push(FILTER_ATTR_KIND, Box::new(filter.value.kind()));
                self.push(FILTER_ATTR_TEXT, Box::new(text));
            } else if let Some(number) = filter.value.number_key() {
                self.push(FILTER_ATTR_NUM[op], Box::new(number));
            } else if let Some(at) = filter.value.time_key() {
                self.push(FILTER_ATTR_TIME[op], Box::new(at));
            }
        }
        self.sql.push(')');
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
        queue: column(row, "queue", LIST)?,
        queue_key: column(row, "queue_key", LIST)?,
        not_before: column(row, "next_attempt_at", LIST)?,
        attributes: crate::ops::attribute::listed_attributes(
            column(row, "attributes", LIST)?,
            LIST,
        )?,
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

// The terminal instances per bucket of $2 seconds, the last bucket holding $1 (the database's
// clock when null), $3 buckets in all: the window is one range of workflows_terminal_idx (its
// predicate repeated so the planner may use it). The last bucket's number comes back even when
// the window is empty (the left join's one row with nulls).
/// The overview's throughput: terminal instances per bucket of `$2` seconds, `$3` buckets, the
/// last holding `$1` (now when null). Public for the plan tests.
pub const INSTANCES_THROUGHPUT: &str = "WITH w AS (SELECT \
     floor(extract(epoch FROM coalesce($1::timestamptz, now())) / $2::bigint)::bigint AS last) \
     SELECT w.last, t.n, t.status, count(t.status) AS c FROM w LEFT JOIN LATERAL ( \
     SELECT floor(extract(epoch FROM f.completed_at) / $2::bigint)::bigint AS n, f.status \
     FROM workflows f WHERE f.status IN ('completed', 'failed', 'cancelled') \
     AND f.completed_at >= to_timestamp((w.last - $3::bigint + 1) * $2::bigint) \
     AND f.completed_at < to_timestamp((w.last + 1) * $2::bigint)) t ON true \
     GROUP BY w.last, t.n, t.status";

// One row per timer, awakeable and registered signal wait of one instance, each kind cut to
// $3 rows newest first (`ord` numbers them in that order, so the outer sort restores it). Each
// branch reads one owner's rows through an index on the owner: the timers' and the waiters'
// primary keys, `awakeables_owner_idx`; the sort is over that one instance's rows. A waiter's
// timeout is the signal_timeout timer of its step (the same primary key).
/// The statement of `InspectStore::instance_waits`: `$1` the workflow name, `$2` its id, `$3`
/// the rows per kind. Public only so the plan test can `EXPLAIN` the exact statement.
pub const INSTANCE_WAITS: &str = "\
    SELECT source, ord, generation, step, kind, token, status, awakeable, due_at, done_at, \
           attempts, created_at FROM ( \
      (SELECT 'timer' AS source, \
              row_number() OVER (ORDER BY t.generation DESC, t.created_at DESC, t.step DESC) AS ord, \
              t.generation, t.step::text AS step, t.kind, t.token::text AS token, t.status, \
              NULL::uuid AS awakeable, t.fire_at AS due_at, t.fired_at AS done_at, t.attempts, \
              t.created_at \
         FROM timers t WHERE t.workflow_name = $1 AND t.workflow_id = $2 \
         ORDER BY t.generation DESC, t.created_at DESC, t.step DESC LIMIT $3) \
      UNION ALL \
      (SELECT 'awakeable', \
              row_number() OVER (ORDER BY a.generation DESC, a.created_at DESC, a.id DESC), \
              a.generation, NULL, NULL, NULL, a.status, a.id, NULL, a.settled_at, 0, \
              a.created_at \
         FROM awakeables a WHERE a.workflow_name = $1 AND a.workflow_id = $2 \
         ORDER BY a.generation DESC, a.created_at DESC, a.id DESC LIMIT $3) \
      UNION ALL \
      (SELECT 'signal_wait', \
              row_number() OVER (ORDER BY sw.generation DESC, sw.seq DESC), \
              sw.generation, sw.step::text, NULL, sw.token::text, NULL, NULL, t.fire_at, NULL, 0, \
              sw.created_at \
         FROM signal_waiters sw \
         LEFT JOIN timers t ON t.workflow_name = sw.workflow_name \
              AND t.workflow_id = sw.workflow_id AND t.generation = sw.generation \
              AND t.step = sw.step AND t.kind = 'signal_timeout' \
         WHERE sw.workflow_name = $1 AND sw.workflow_id = $2 \
         ORDER BY sw.generation DESC, sw.seq DESC LIMIT $3) \
    ) waits ORDER BY source, ord";

fn timer(row: &Row) -> Result<TimerInfo> {
    let kind: String = column(row, "kind", WAITS)?;
    let token: Option<String> = column(row, "token", WAITS)?;
    let kind = match (kind.as_str(), token) {
        ("sleep", None) => TimerKind::Sleep,
        ("signal_timeout", Some(token)) => TimerKind::SignalTimeout { token },
        (other, _) => {
            return Err(malformed(
                WAITS,
                format_args!("timer kind {other:?} with that token"),
            ))
        }
    };
    let state: String = column(row, "status", WAITS)?;
    Ok(TimerInfo {
        generation: column(row, "generation", WAITS)?,
        step: column(row, "step", WAITS)?,
        kind,
        state: TimerState::parse(&state)
            .ok_or_else(|| malformed(WAITS, format_args!("unknown timer status {state:?}")))?,
        fire_at: column(row, "due_at", WAITS)?,
        fired_at: column(row, "done_at", WAITS)?,
        attempts: column(row, "attempts", WAITS)?,
        created_at: column(row, "created_at", WAITS)?,
    })
}

fn awakeable(row: &Row) -> Result<AwakeableInfo> {
    let status: String = column(row, "status", WAITS)?;
    Ok(AwakeableInfo {
        id: column(row, "awakeable", WAITS)?,
        generation: column(row, "generation", WAITS)?,
        status: crate::ops::awakeable::parse_status(&status, WAITS)?,
        created_at: column(row, "created_at", WAITS)?,
        settled_at: column(row, "done_at", WAITS)?,
    })
}

fn signal_wait(row: &Row) -> Result<SignalWaitInfo> {
    Ok(SignalWaitInfo {
        generation: column(row, "generation", WAITS)?,
        step: column(row, "step", WAITS)?,
        token: column(row, "token", WAITS)?,
        since: column(row, "created_at", WAITS)?,
        timeout_at: column(row, "due_at", WAITS)?,
    })
}

impl PgStore {
    async fn waits(&self, key: &InstanceKey, limit: u32) -> Result<Waits> {
        let probe = i64::from(limit) + 1;
        let rows = self
            .query(
                WAITS,
                INSTANCE_WAITS,
                &[&key.name.as_str(), &key.id.as_str(), &probe],
            )
            .await?;
        let (mut timers, mut awakeables, mut signal_waits) = (Vec::new(), Vec::new(), Vec::new());
        for row in &rows {
            let source: String = column(row, "source", WAITS)?;
            match source.as_str() {
                "timer" => timers.push(timer(row)?),
                "awakeable" => awakeables.push(awakeable(row)?),
                "signal_wait" => signal_waits.push(signal_wait(row)?),
                other => return Err(malformed(WAITS, format_args!("unknown source {other:?}"))),
            }
        }
        Ok(Waits::from_probe(timers, awakeables, signal_waits, limit))
    }

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
            .map_err(|e| self.failed(LIST, e))?;
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

    async fn throughput(&self, request: &ThroughputRequest) -> Result<Throughput> {
        let secs = request.bucket_secs();
        let buckets = i64::from(request.buckets);
        let rows = self
            .query(
                THROUGHPUT,
                INSTANCES_THROUGHPUT,
                &[&request.until, &secs, &buckets],
            )
            .await?;
        let mut last = None;
        let mut counts = Vec::with_capacity(rows.len());
        for row in &rows {
            last = Some(column::<i64>(row, "last", THROUGHPUT)?);
            let n: Option<i64> = column(row, "n", THROUGHPUT)?;
            let text: Option<String> = column(row, "status", THROUGHPUT)?;
            if let (Some(n), Some(text)) = (n, text) {
                counts.push((n, status(&text, THROUGHPUT)?, count(row, "c", THROUGHPUT)?));
            }
        }
        let last = last.ok_or_else(|| malformed(THROUGHPUT, "no row for the window"))?;
        Ok(Throughput::from_counts(request, last, counts))
    }
}

#[async_trait::async_trait]
impl InspectStore for PgStore {
    async fn instances_list(&self, request: &ListRequest) -> Result<Page> {
        traced(store_span!("instances_list"), self.list(request)).await
    }

    async fn instances_counts(&self, now: Option<OffsetDateTime>) -> Result<Counts> {
        traced(store_span!("instances_counts"), self.counts(now)).await
    }

    async fn instances_throughput(&self, request: &ThroughputRequest) -> Result<Throughput> {
        traced(
            store_span!("instances_throughput"),
            self.throughput(request),
        )
        .await
    }

    async fn instance_waits(&self, key: &InstanceKey, limit: u32) -> Result<Waits> {
        let span = store_span!("instance_waits", key = key);
        traced(span, self.waits(key, limit)).await
    }

    async fn instance_updates(
        &self,
        key: &InstanceKey,
        limit: u32,
    ) -> Result<Vec<keiro_journal::update::UpdateRecord>> {
        let span = store_span!("instance_updates", key = key);
        traced(
            span,
            crate::ops::update::instance_updates(self.db(), key, limit),
        )
        .await
    }

    async fn update_get(
        &self,
        key: &InstanceKey,
        update_id: &str,
    ) -> Result<Option<keiro_journal::update::UpdateRead>> {
        let span = store_span!("update_get", key = key);
        traced(
            span,
            crate::ops::update::update_get(self.db(), key, update_id),
        )
        .await
    }

    async fn event_get(
        &self,
        key: &InstanceKey,
        event: &str,
    ) -> Result<Option<keiro_journal::message::EventRead>> {
        let span = store_span!("event_get", key = key);
        traced(span, crate::ops::message::event_get(self.db(), key, event)).await
    }

    async fn stream_read(
        &self,
        key: &InstanceKey,
        stream: &str,
        from: u64,
        limit: u32,
    ) -> Result<Option<keiro_journal::message::StreamPage>> {
        let span = store_span!("stream_read", key = key);
        traced(
            span,
            crate::ops::message::stream_read(self.db(), key, stream, from, limit),
        )
        .await
    }

    async fn instance_attributes(
        &self,
        key: &InstanceKey,
    ) -> Result<keiro_journal::attribute::Attributes> {
        let span = store_span!("instance_attributes", key = key);
        traced(
            span,
            crate::ops::attribute::instance_attributes(self.db(), key),
        )
        .await
    }

    async fn instance_messages(
        &self,
        key: &InstanceKey,
    ) -> Result<keiro_journal::message::Messages> {
        let span = store_span!("instance_messages", key = key);
        traced(
            span,
            crate::ops::message::instance_messages(self.db(), key, MESSAGES_LIMIT),
        )
        .await
    }
}

/// The most events, and the most streams, [`InspectStore::instance_messages`] lists.
const MESSAGES_LIMIT: u32 = 1000;
