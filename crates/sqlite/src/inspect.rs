//! The operators' reads of crates/postgres/src/inspect.rs (no plpgsql: plain SQL there too), in
//! the order of its `InspectStore` impl: one page of instances by filter, the overview counts,
//! the terminal instances per time bucket, and one instance's waits. Each runs on a read connection inside one read transaction, so
//! it answers from one snapshot.
//!
//! The list is assembled from constant fragments, one per filter that is set, every value a
//! parameter, as on Postgres; the keyset `(created_at, workflow_name, workflow_id)` ends every
//! list index of migration 0001, so a page is one index walk that stops after `limit + 1` rows.
//! An id prefix is compared byte-wise (`substr` of the id's bytes), the `^@` of the C
//! collation; the `>=` beside it lets SQLite start the walk of `workflows_list_id_idx` there.
//! An attribute filter keeps the instances among those one range of a `workflow_attributes`
//! index (migration 0008) gives, one subquery per attribute and kind (`AttrFilter::groups`).

use keiro_journal::attribute::{AttrFilter, AttrOp};
use keiro_journal::store::{Result, Throughput, ThroughputRequest};
use keiro_journal::{
    AwakeableInfo, Counts, GroupCount, InstanceSummary, ListOrder, ListRequest, Page,
    SignalWaitInfo, StatusCount, TimerInfo, TimerKind, TimerState, Waits, WorkflowName,
};
use rusqlite::types::Value as Sql;
use rusqlite::{params, params_from_iter, Connection, Row};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::{malformed, store};
use crate::row::{self, micros};

const LIST: &str = "listing instances";
const COUNTS: &str = "counting instances";
const THROUGHPUT: &str = "counting terminal instances by time";
const WAITS: &str = "reading an instance's waits";

const INSTANCES_LIST_SELECT: &str = "SELECT w.workflow_name, w.workflow_id, w.generation, \
     w.status, w.attempts, w.last_error, w.parent_name, w.parent_id, w.priority, \
     w.created_at, w.updated_at, w.completed_at, w.queue, w.queue_key, w.next_attempt_at, \
     (SELECT json_group_object(a.attr, json(a.value)) FROM workflow_attributes a \
      WHERE a.workflow_name = w.workflow_name AND a.workflow_id = w.workflow_id) \
     FROM workflows w WHERE 1";
// Served by workflows_list_name_idx.
const FILTER_NAME: &str = " AND w.workflow_name = ?";
// Served by workflows_list_status_idx.
const FILTER_STATUS: &str = " AND w.status = ?";
// Served by workflows_list_created_idx (or the keyset suffix of another filter's index).
const FILTER_CREATED_SINCE: &str = " AND w.created_at >= ?";
const FILTER_CREATED_UNTIL: &str = " AND w.created_at < ?";
// No index (updated_at changes on every append): filters the walk of another index.
const FILTER_UPDATED_SINCE: &str = " AND w.updated_at >= ?";
const FILTER_UPDATED_UNTIL: &str = " AND w.updated_at < ?";
// Served by workflows_terminal_idx: the status test makes its partial predicate apply.
const FILTER_FINISHED_SINCE: &str =
    " AND w.status NOT IN ('running', 'suspended') AND w.completed_at >= ?";
const FILTER_FINISHED_UNTIL: &str =
    " AND w.status NOT IN ('running', 'suspended') AND w.completed_at < ?";
// Served by workflows_list_parent_idx.
const FILTER_PARENT_NAME: &str = " AND w.parent_name = ?";
const FILTER_PARENT_ID: &str = " AND w.parent_id = ?";
// Served by workflows_list_id_idx from the prefix on; the bytes decide (an id is BINARY text).
const FILTER_ID_PREFIX_FROM: &str = " AND w.workflow_id >= ?";
// The same parameter again (`?n`, n the prefix's number): the id's first bytes are the prefix's.
const FILTER_ID_PREFIX_BYTES: [&str; 3] = [
    " AND substr(CAST(w.workflow_id AS BLOB), 1, length(CAST(?",
    " AS BLOB))) = CAST(?",
    " AS BLOB)",
];
// Served by workflows_list_queue_idx (migration 0003).
const FILTER_QUEUE: &str = " AND w.queue = ?";
const FILTER_QUEUE_KEY: &str = " AND w.queue_key = ?";
// Served by remote_tasks_failed_idx.
const FILTER_FAILED_REMOTE: &str = " AND EXISTS (SELECT 1 FROM remote_tasks t \
     WHERE t.workflow_name = w.workflow_name AND t.workflow_id = w.workflow_id \
     AND t.status = 'failed')";
// An attribute filter: the instance among those an index of migration 0008 gives for the
// attribute and value (workflow_attributes_text_idx, _num_idx or _time_idx, by the kind).
const FILTER_ATTR: &str = " AND (w.workflow_name, w.workflow_id) IN (SELECT a.workflow_name, \
     a.workflow_id FROM workflow_attributes a WHERE a.attr = ?";
// Text and booleans share text_value: the kind tells `"true"` from `true`.
const FILTER_ATTR_KIND: &str = " AND a.kind = ?";
const FILTER_ATTR_TEXT: &str = " AND a.text_value = ?";
// [=, >, >=, <, <=] on a number, then on a time.
const FILTER_ATTR_NUM: [&str; 5] = [
    " AND a.num_value = ?",
    " AND a.num_value > ?",
    " AND a.num_value >= ?",
    " AND a.num_value < ?",
    " AND a.num_value <= ?",
];
const FILTER_ATTR_TIME: [&str; 5] = [
    " AND a.time_value = ?",
    " AND a.time_value > ?",
    " AND a.time_value >= ?",
    " AND a.time_value < ?",
    " AND a.time_value <= ?",
];
const KEYSET_BEFORE: &str = " AND (w.created_at, w.workflow_name, w.workflow_id) < (?";
const KEYSET_AFTER: &str = " AND (w.created_at, w.workflow_name, w.workflow_id) > (?";
// The same keyset without the name, for a name-filtered page whose cursor has that name: what
// workflows_list_name_idx (name, created_at, id) can seek to.
const KEYSET_NAMED_BEFORE: &str = " AND (w.created_at, w.workflow_id) < (?";
const KEYSET_NAMED_AFTER: &str = " AND (w.created_at, w.workflow_id) > (?";
const ORDER_NEWEST: &str =
    " ORDER BY w.created_at DESC, w.workflow_name DESC, w.workflow_id DESC LIMIT ?";
const ORDER_OLDEST: &str = " ORDER BY w.created_at, w.workflow_name, w.workflow_id LIMIT ?";

/// A list statement and its parameters, assembled from the constant fragments.
#[derive(Debug)]
struct ListStatement {
    sql: String,
    params: Vec<Sql>,
}

impl ListStatement {
    /// Appends `fragment` and its placeholder's number.
    fn push(&mut self, fragment: &str, value: Sql) {
        self.params.push(value);
        self.sql.push_str(fragment);
        self.sql.push_str(&self.params.len().to_string());
    }

    /// Appends `, ?n` for one more parameter of a row value.
    fn push_more(&mut self, value: Sql) {
        self.params.push(value);
        self.sql.push_str(", ?");
        self.sql.push_str(&self.params.len().to_string());
    }

    /// The subquery of one group of attribute filters (validated: a range compares a number
    /// or a time): one attribute, one typed column, every bound of the group on it.
    fn attrs(&mut self, group: &[&AttrFilter]) {
        let Some(first) = group.first() else {
            return;
        };
        self.push(FILTER_ATTR, Sql::Text(first.name.clone()));
        for filter in group {
            let op = match filter.op {
                AttrOp::Eq => 0,
                AttrOp::Gt => 1,
                AttrOp::Ge => 2,
                AttrOp::Lt => 3,
                AttrOp::Le => 4,
            };
            if let Some(text) = filter.value.text_key() {
                self.push(FILTER_ATTR_KIND, Sql::Text(filter.value.kind().to_owned()));
                self.push(FILTER_ATTR_TEXT, Sql::Text(text));
            } else if let Some(number) = filter.value.number_key() {
                self.push(FILTER_ATTR_NUM[op], Sql::Real(number));
            } else if let Some(at) = filter.value.time_key() {
                self.push(FILTER_ATTR_TIME[op], Sql::Integer(micros(at)));
            }
        }
        self.sql.push(')');
    }

    /// The statement for `request`, fetching one row more than its limit (the probe for a
    /// next page).
    fn new(request: &ListRequest) -> Self {
        let text = |s: &str| Sql::Text(s.to_owned());
        let at = |t: OffsetDateTime| Sql::Integer(micros(t));
        let mut statement = Self {
            sql: INSTANCES_LIST_SELECT.to_owned(),
            params: Vec::new(),
        };
        let filter = &request.filter;
        if let Some(name) = &filter.name {
            statement.push(FILTER_NAME, text(name.as_str()));
        }
        if let Some(wanted) = filter.status {
            statement.push(FILTER_STATUS, text(wanted.as_str()));
        }
        if let Some(since) = filter.created.since {
            statement.push(FILTER_CREATED_SINCE, at(since));
        }
        if let Some(until) = filter.created.until {
            statement.push(FILTER_CREATED_UNTIL, at(until));
        }
        if let Some(since) = filter.updated.since {
            statement.push(FILTER_UPDATED_SINCE, at(since));
        }
        if let Some(until) = filter.updated.until {
            statement.push(FILTER_UPDATED_UNTIL, at(until));
            // A row is never updated before it was created: the created_at walk stops here.
            statement.push(FILTER_CREATED_UNTIL, at(until));
        }
        if let Some(since) = filter.finished.since {
            statement.push(FILTER_FINISHED_SINCE, at(since));
        }
        if let Some(until) = filter.finished.until {
            statement.push(FILTER_FINISHED_UNTIL, at(until));
        }
        if let Some(parent) = &filter.parent {
            statement.push(FILTER_PARENT_NAME, text(parent.name.as_str()));
            statement.push(FILTER_PARENT_ID, text(parent.id.as_str()));
        }
        if let Some(prefix) = &filter.id_prefix {
            statement.push(FILTER_ID_PREFIX_FROM, text(prefix));
            let n = statement.params.len().to_string();
            statement.sql.push_str(&FILTER_ID_PREFIX_BYTES.join(&n));
        }
        if let Some(queue) = &filter.queue {
            statement.push(FILTER_QUEUE, text(queue));
        }
        if let Some(key) = &filter.queue_key {
            statement.push(FILTER_QUEUE_KEY, text(key));
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
                at(cursor.created_at),
            );
            statement.push_more(text(cursor.key.name.as_str()));
            statement.push_more(text(cursor.key.id.as_str()));
            statement.sql.push(')');
            if filter.name.as_ref() == Some(&cursor.key.name) {
                statement.push(
                    if newest {
                        KEYSET_NAMED_BEFORE
                    } else {
                        KEYSET_NAMED_AFTER
                    },
                    at(cursor.created_at),
                );
                statement.push_more(text(cursor.key.id.as_str()));
                statement.sql.push(')');
            }
        }
        let order = match request.order {
            ListOrder::NewestFirst => ORDER_NEWEST,
            ListOrder::OldestFirst => ORDER_OLDEST,
        };
        statement.push(order, Sql::Integer(i64::from(request.limit) + 1));
        statement
    }
}

/// One listed row, as stored.
type StoredSummary = (
    String,
    String,
    i32,
    String,
    i32,
    Option<String>,
    Option<String>,
    Option<String>,
    i32,
    i64,
    i64,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<String>,
);

fn stored_summary(r: &Row<'_>) -> rusqlite::Result<StoredSummary> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
        r.get(10)?,
        r.get(11)?,
        r.get(12)?,
        r.get(13)?,
        r.get(14)?,
        r.get(15)?,
    ))
}

fn summary(stored: StoredSummary) -> Result<InstanceSummary> {
    let (name, id, generation, status, attempts, last_error, parent_name, parent_id, priority) = (
        stored.0, stored.1, stored.2, stored.3, stored.4, stored.5, stored.6, stored.7, stored.8,
    );
    let parent = match (parent_name, parent_id) {
        (Some(name), Some(id)) => Some(row::key(&name, &id, LIST)?),
        (None, None) => None,
        _ => return Err(malformed(LIST, "a parent needs both a name and an id")),
    };
    Ok(InstanceSummary {
        key: row::key(&name, &id, LIST)?,
        generation,
        status: row::status(&status, LIST)?,
        attempts,
        last_error,
        parent,
        priority,
        created_at: row::instant(stored.9, LIST)?,
        updated_at: row::instant(stored.10, LIST)?,
        completed_at: row::instant_opt(stored.11, LIST)?,
        queue: stored.12,
        queue_key: stored.13,
        not_before: row::instant_opt(stored.14, LIST)?,
        attributes: match stored.15 {
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| malformed(LIST, format_args!("attributes: {e}")))?,
            None => keiro_journal::attribute::Attributes::new(),
        },
    })
}

/// instances_list: one page of the instances `request` (validated by the caller) selects, in
/// its order, after its cursor.
pub(crate) fn instances_list(conn: &Connection, request: &ListRequest) -> Result<Page> {
    let statement = ListStatement::new(request);
    // Not cached: the text differs with the filters set, and a page is an operator's read.
    let stored = conn
        .prepare(&statement.sql)
        .and_then(|mut s| {
            s.query_map(params_from_iter(statement.params.iter()), stored_summary)?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(|e| store(LIST, e))?;
    let rows = stored
        .into_iter()
        .map(summary)
        .collect::<Result<Vec<_>>>()?;
    Ok(Page::from_probe(rows, request.limit))
}

const INSTANCES_COUNTS: &str = "SELECT workflow_name, status, count(*) FROM workflows \
     GROUP BY workflow_name, status ORDER BY workflow_name, status";
const TIMERS_BACKLOG: &str = "SELECT coalesce(sum(fire_at <= ?1), 0), \
     coalesce(sum(fire_at > ?1), 0) FROM timers WHERE status = 'scheduled'";
const REMOTE_BACKLOG: &str = "SELECT grp, sum(status = 'pending'), sum(status = 'running') \
     FROM remote_tasks WHERE status IN ('pending', 'running') GROUP BY grp ORDER BY grp";

/// A count as the traits hold it.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// instances_counts: instances by workflow and status, the timer backlog at `now`, and the
/// remote tasks waiting or running per group.
pub(crate) fn instances_counts(conn: &Connection, now: OffsetDateTime) -> Result<Counts> {
    let stored: Vec<(String, String, i64)> = conn
        .prepare_cached(INSTANCES_COUNTS)
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .map_err(|e| store(COUNTS, e))?;
    let instances = stored
        .into_iter()
        .map(|(name, status, n)| {
            Ok(StatusCount {
                name: WorkflowName::new(name.as_str())
                    .map_err(|e| malformed(COUNTS, format_args!("name {name:?}: {e}")))?,
                status: row::status(&status, COUNTS)?,
                count: count(n),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (due, future): (i64, i64) = conn
        .query_row(TIMERS_BACKLOG, params![micros(now)], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(|e| store(COUNTS, e))?;
    let remote: Vec<(String, i64, i64)> = conn
        .prepare_cached(REMOTE_BACKLOG)
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .map_err(|e| store(COUNTS, e))?;
    Ok(Counts {
        instances,
        timers_due: count(due),
        timers_future: count(future),
        remote: remote
            .into_iter()
            .map(|(group, pending, running)| GroupCount {
                group,
                pending: count(pending),
                running: count(running),
            })
            .collect(),
    })
}

// The terminal instances per bucket of ?1 microseconds in [?2, ?3): one range of
// workflows_terminal_idx (its predicate repeated so SQLite may use it; completed_at is
// microseconds since the epoch, so the integer division is the bucket's number).
const INSTANCES_THROUGHPUT: &str = "SELECT completed_at / ?1 AS n, status, count(*) \
     FROM workflows WHERE status NOT IN ('running', 'suspended') \
     AND completed_at >= ?2 AND completed_at < ?3 GROUP BY n, status";

/// instances_throughput: the terminal instances in each bucket of `request`, the last bucket
/// holding `until`.
pub(crate) fn instances_throughput(
    conn: &Connection,
    request: &ThroughputRequest,
    until: OffsetDateTime,
) -> Result<Throughput> {
    let secs = request.bucket_secs().max(1);
    let last = until.unix_timestamp().div_euclid(secs);
    let first = last - i64::from(request.buckets) + 1;
    let bucket = secs.saturating_mul(1_000_000);
    let rows: Vec<(i64, String, i64)> = conn
        .prepare_cached(INSTANCES_THROUGHPUT)
        .and_then(|mut s| {
            s.query_map(
                params![
                    bucket,
                    first.saturating_mul(bucket),
                    (last + 1).saturating_mul(bucket)
                ],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?
            .collect()
        })
        .map_err(|e| store(THROUGHPUT, e))?;
    let counts = rows
        .into_iter()
        .map(|(n, status, c)| Ok((n, row::status(&status, THROUGHPUT)?, count(c))))
        .collect::<Result<Vec<_>>>()?;
    Ok(Throughput::from_counts(request, last, counts))
}

// Each kind newest first, cut to ?3 rows, read through an index on its owner: the timers' and
// the waiters' keys, awakeables_owner_idx. A waiter's timeout is its step's signal_timeout timer.
const WAITS_TIMERS: &str = "SELECT generation, step, kind, token, status, fire_at, fired_at, \
     attempts, created_at FROM timers WHERE workflow_name = ?1 AND workflow_id = ?2 \
     ORDER BY generation DESC, created_at DESC, step DESC LIMIT ?3";
const WAITS_AWAKEABLES: &str = "SELECT id, generation, status, created_at, settled_at \
     FROM awakeables WHERE workflow_name = ?1 AND workflow_id = ?2 \
     ORDER BY generation DESC, created_at DESC, id DESC LIMIT ?3";
const WAITS_SIGNALS: &str = "SELECT sw.generation, sw.step, sw.token, sw.created_at, t.fire_at \
     FROM signal_waiters sw LEFT JOIN timers t ON t.workflow_name = sw.workflow_name \
          AND t.workflow_id = sw.workflow_id AND t.generation = sw.generation \
          AND t.step = sw.step AND t.kind = 'signal_timeout' \
     WHERE sw.workflow_name = ?1 AND sw.workflow_id = ?2 \
     ORDER BY sw.generation DESC, sw.seq DESC LIMIT ?3";

/// One timer row, as stored.
type StoredTimer = (
    i32,
    String,
    String,
    Option<String>,
    String,
    i64,
    Option<i64>,
    i32,
    i64,
);

fn timer(stored: StoredTimer) -> Result<TimerInfo> {
    let (generation, step, kind, token, state, fire_at, fired_at, attempts, created_at) = stored;
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
    Ok(TimerInfo {
        generation,
        step,
        kind,
        state: TimerState::parse(&state)
            .ok_or_else(|| malformed(WAITS, format_args!("unknown timer status {state:?}")))?,
        fire_at: row::instant(fire_at, WAITS)?,
        fired_at: row::instant_opt(fired_at, WAITS)?,
        attempts,
        created_at: row::instant(created_at, WAITS)?,
    })
}

fn awakeable(stored: (String, i32, String, i64, Option<i64>)) -> Result<AwakeableInfo> {
    let (id, generation, status, created_at, settled_at) = stored;
    Ok(AwakeableInfo {
        id: Uuid::parse_str(&id)
            .map_err(|e| malformed(WAITS, format_args!("awakeable id {id:?}: {e}")))?,
        generation,
        status: row::awakeable_status(&status, WAITS)?,
        created_at: row::instant(created_at, WAITS)?,
        settled_at: row::instant_opt(settled_at, WAITS)?,
    })
}

fn signal_wait(stored: (i32, String, String, i64, Option<i64>)) -> Result<SignalWaitInfo> {
    let (generation, step, token, since, timeout_at) = stored;
    Ok(SignalWaitInfo {
        generation,
        step,
        token,
        since: row::instant(since, WAITS)?,
        timeout_at: row::instant_opt(timeout_at, WAITS)?,
    })
}

/// Runs a waits query for `name`/`id` with `probe` rows at most.
fn waits_of<T>(
    conn: &Connection,
    sql: &str,
    (name, id, probe): (&str, &str, i64),
    read: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
) -> Result<Vec<T>> {
    conn.prepare_cached(sql)
        .and_then(|mut s| s.query_map(params![name, id, probe], read)?.collect())
        .map_err(|e| store(WAITS, e))
}

/// instance_waits: the timers, awakeables and pending signal waits of `name`/`id`, up to
/// `limit` of each kind, newest first; empty for an unknown instance.
pub(crate) fn instance_waits(conn: &Connection, name: &str, id: &str, limit: u32) -> Result<Waits> {
    let owner = (name, id, i64::from(limit) + 1);
    let timers = waits_of(conn, WAITS_TIMERS, owner, |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
            r.get(8)?,
        ))
    })?;
    let awakeables = waits_of(conn, WAITS_AWAKEABLES, owner, |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
    })?;
    let signal_waits = waits_of(conn, WAITS_SIGNALS, owner, |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
    })?;
    Ok(Waits::from_probe(
        timers.into_iter().map(timer).collect::<Result<_>>()?,
        awakeables
            .into_iter()
            .map(awakeable)
            .collect::<Result<_>>()?,
        signal_waits
            .into_iter()
            .map(signal_wait)
            .collect::<Result<_>>()?,
        limit,
    ))
}

#[cfg(test)]
mod tests {
    use keiro_journal::{Cursor, InstanceKey, ListFilter, Status, WorkflowName};

    use super::*;

    /// SQLite's plan of `request`'s statement, one detail per line.
    fn plan(conn: &Connection, request: &ListRequest) -> String {
        let statement = ListStatement::new(request);
        let mut explain = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", statement.sql))
            .expect("plans");
        let details: Vec<String> = explain
            .query_map(params_from_iter(statement.params.iter()), |r| r.get(3))
            .expect("plans")
            .collect::<rusqlite::Result<_>>()
            .expect("plans");
        details.join("\n")
    }

    /// The filters with an index of their own walk it in list order: no sort, no scan of the
    /// table, however deep the page (the cursor's keyset is a range on the same index).
    #[test]
    fn indexed_filters_walk_their_index_in_list_order() {
        let conn = Connection::open_in_memory().expect("opens");
        for (_, _, sql) in crate::open::MIGRATIONS {
            conn.execute_batch(sql).expect("migrates");
        }
        let key = InstanceKey::parse("wf", "a-1").expect("valid");
        let cursor = Cursor {
            created_at: OffsetDateTime::UNIX_EPOCH,
            key: key.clone(),
        };
        let cases = [
            (ListFilter::default(), "workflows_list_created_idx"),
            (
                ListFilter {
                    status: Some(Status::Failed),
                    ..ListFilter::default()
                },
                "workflows_list_status_idx",
            ),
            (
                ListFilter {
                    name: Some(WorkflowName::new("wf").expect("valid")),
                    ..ListFilter::default()
                },
                "workflows_list_name_idx",
            ),
            (
                ListFilter {
                    parent: Some(key.clone()),
                    ..ListFilter::default()
                },
                "workflows_list_parent_idx",
            ),
        ];
        for (filter, index) in cases {
            for order in [ListOrder::NewestFirst, ListOrder::OldestFirst] {
                for cursor in [None, Some(cursor.clone())] {
                    let request = ListRequest {
                        filter: filter.clone(),
                        order,
                        cursor,
                        ..ListRequest::default()
                    };
                    let plan = plan(&conn, &request);
                    assert!(plan.contains(index), "{request:?}:\n{plan}");
                    assert!(!plan.contains("TEMP B-TREE"), "{request:?}:\n{plan}");
                }
            }
        }
    }

    /// An attribute filter reads one range of its kind's index (migration 0008) and looks the
    /// instances up by key: never a scan of either table. (The rows are then sorted: a page
    /// costs the matching attribute rows, so a filter that matches most runs is best combined
    /// with a narrower one.)
    #[test]
    fn attribute_filters_read_their_kind_index() {
        use keiro_journal::attribute::{AttrFilter, AttrOp};
        let conn = Connection::open_in_memory().expect("opens");
        for (_, _, sql) in crate::open::MIGRATIONS {
            conn.execute_batch(sql).expect("migrates");
        }
        let at = OffsetDateTime::UNIX_EPOCH;
        let cases = [
            (
                vec![AttrFilter::eq("customer", "acme")],
                "workflow_attributes_text_idx",
            ),
            (
                vec![AttrFilter::eq("vip", true)],
                "workflow_attributes_text_idx",
            ),
            (
                vec![
                    AttrFilter::new("amount", AttrOp::Gt, 10),
                    AttrFilter::new("amount", AttrOp::Le, 20.5),
                ],
                "workflow_attributes_num_idx",
            ),
            (
                vec![AttrFilter::new("due", AttrOp::Ge, at)],
                "workflow_attributes_time_idx",
            ),
        ];
        for (attributes, index) in cases {
            for name in [None, Some(WorkflowName::new("wf").expect("valid"))] {
                let request = ListRequest {
                    filter: ListFilter {
                        name,
                        attributes: attributes.clone(),
                        ..ListFilter::default()
                    },
                    ..ListRequest::default()
                };
                let plan = plan(&conn, &request);
                assert!(plan.contains(index), "{request:?}:\n{plan}");
                assert!(!plan.contains("SCAN"), "{request:?}:\n{plan}");
            }
        }
    }
}
