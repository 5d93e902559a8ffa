//! Operators' reads: list instances by filter with keyset pagination, and count them.
//!
//! The types here are what a CLI, a JSON API and a web page exchange, so all of them are
//! serde-serializable; the request is built from query pairs ([`ListRequest::from_pairs`]) or
//! deserialized, and either way an unknown filter, an unknown value or a malformed cursor is a
//! typed [`FilterError`], never a silently ignored parameter.
//!
//! Pagination is keyset, never OFFSET: a page ends with a [`Cursor`] naming its last row's
//! `(created_at, name, id)`, and the next page starts strictly after it in the same order. A
//! cursor is opaque to callers (hex of a versioned text), so its layout may change.
//!
//! One instance's wake sources ([`Waits`]: its timers, awakeables and pending signal waits)
//! are read by [`InspectStore::instance_waits`], newest first and bounded per kind, so an
//! instance page shows what the run is waiting on, not only the journal rows it left.

use std::fmt;

use serde::{Deserialize, Serialize};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::model::attribute::Attributes;
use crate::model::message::{EventRead, Messages, StreamPage};
use crate::model::update::{UpdateRead, UpdateRecord};
use crate::store::contract::Result;
use crate::{
    AwakeableStatus, Generation, IdError, Instance, InstanceKey, Status, TimerKind, WorkflowName,
};

mod attrs;
mod cursor;
mod throughput;

pub use attrs::{AttrFilter, AttrOp, ATTR_FILTERS_MAX};
pub use cursor::Cursor;
pub use throughput::{
    TerminalCount, Throughput, ThroughputRequest, THROUGHPUT_BUCKETS_MAX, THROUGHPUT_BUCKET_MAX,
};

/// Rows a page holds when the request does not say. Defaults to 50.
pub const LIST_LIMIT_DEFAULT: u32 = 50;
/// The most rows one page may hold: a page is one bounded index walk.
pub const LIST_LIMIT_MAX: u32 = 1000;
/// The longest id prefix accepted (an id is at most [`ID_LEN_MAX`](crate::ID_LEN_MAX) bytes).
pub const ID_PREFIX_LEN_MAX: usize = crate::ID_LEN_MAX;

/// A request the list refuses: named so a JSON API can answer 400 with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FilterError {
    /// A parameter that is no filter of the list.
    #[error("unknown filter {field:?}")]
    UnknownFilter {
        /// The parameter's name.
        field: String,
    },
    /// A filter value that does not parse.
    #[error("filter {field}: invalid value {value:?}: {reason}")]
    InvalidValue {
        /// The filter.
        field: &'static str,
        /// The value given.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A cursor that this list did not hand out (or that was altered).
    #[error("malformed cursor: {reason}")]
    MalformedCursor {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A page size of zero or above [`LIST_LIMIT_MAX`].
    #[error("limit {limit} is out of range 1..={max}")]
    Limit {
        /// The limit asked for.
        limit: u64,
        /// The largest allowed.
        max: u32,
    },
}

impl FilterError {
    fn invalid(field: &'static str, value: &str, reason: impl fmt::Display) -> Self {
        Self::InvalidValue {
            field,
            value: value.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// A time window; either end may be open. `since` is inclusive, `until` exclusive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimeRange {
    /// The earliest instant included.
    #[serde(with = "time::serde::rfc3339::option")]
    pub since: Option<OffsetDateTime>,
    /// The first instant excluded.
    #[serde(with = "time::serde::rfc3339::option")]
    pub until: Option<OffsetDateTime>,
}

impl TimeRange {
    /// Whether `at` is inside the window.
    pub fn contains(&self, at: OffsetDateTime) -> bool {
        self.since.is_none_or(|since| at >= since) && self.until.is_none_or(|until| at < until)
    }

    /// Whether both ends are open.
    pub fn is_open(&self) -> bool {
        self.since.is_none() && self.until.is_none()
    }
}

/// Which instances a list returns; every field set narrows it (they combine with AND).
///
/// ```
/// use keiro_journal::{ListFilter, Status};
/// let filter = ListFilter { status: Some(Status::Failed), failed_remote: true, ..ListFilter::default() };
/// assert!(filter.status.is_some());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListFilter {
    /// Only this workflow.
    pub name: Option<WorkflowName>,
    /// Only this status.
    #[serde(with = "status_option")]
    pub status: Option<Status>,
    /// Only instances started in this window.
    pub created: TimeRange,
    /// Only instances whose row last changed in this window. Not index-served on Postgres by
    /// design: `updated_at` changes on every step append, and an index on it would cost every
    /// append its HOT update; the list walks another filter's index and checks this on each
    /// row, so combine it with a narrower filter on large tables (or use `finished`).
    pub updated: TimeRange,
    /// Only terminal instances that went terminal in this window (index-served).
    pub finished: TimeRange,
    /// Only the children of this instance.
    pub parent: Option<InstanceKey>,
    /// Only ids starting with this text (byte-wise).
    pub id_prefix: Option<String>,
    /// Only instances with at least one remote task that failed for good.
    pub failed_remote: bool,
    /// Only runs started on this queue (index-served).
    pub queue: Option<String>,
    /// Only runs with this key on their queue; needs `queue`.
    pub queue_key: Option<String>,
    /// Only runs whose search attributes pass every one of these (at most
    /// [`ATTR_FILTERS_MAX`]); index-served on both stores (`workflow_attributes`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<AttrFilter>,
}

impl ListFilter {
    /// Whether `instance` passes every filter but `failed_remote` and `attributes` (which need
    /// the tasks and the attributes).
    pub fn matches_row(&self, instance: &Instance) -> bool {
        self.name
            .as_ref()
            .is_none_or(|name| instance.key.name == *name)
            && self.status.is_none_or(|status| instance.status == status)
            && self.created.contains(instance.created_at)
            && self.updated.contains(instance.updated_at)
            && (self.finished.is_open()
                || (instance.status.is_terminal()
                    && instance
                        .completed_at
                        .is_some_and(|at| self.finished.contains(at))))
            && self
                .parent
                .as_ref()
                .is_none_or(|parent| instance.parent.as_ref() == Some(parent))
            && self
                .id_prefix
                .as_ref()
                .is_none_or(|prefix| instance.key.id.as_str().starts_with(prefix.as_str()))
            && self
                .queue
                .as_ref()
                .is_none_or(|queue| instance.queue.as_ref() == Some(queue))
            && self
                .queue_key
                .as_ref()
                .is_none_or(|key| instance.queue_key.as_ref() == Some(key))
    }
}

/// The order of a list: by start time, then name, then id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListOrder {
    /// Most recently started first. The default.
    #[default]
    NewestFirst,
    /// Oldest first.
    OldestFirst,
}

/// One page request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListRequest {
    /// Which instances.
    pub filter: ListFilter,
    /// In which order. Defaults to [`ListOrder::NewestFirst`].
    pub order: ListOrder,
    /// At most this many rows, 1 to [`LIST_LIMIT_MAX`]. Defaults to [`LIST_LIMIT_DEFAULT`].
    pub limit: u32,
    /// Start after this cursor (the previous page's `next_cursor`). Defaults to the start.
    pub cursor: Option<Cursor>,
}

impl Default for ListRequest {
    fn default() -> Self {
        Self {
            filter: ListFilter::default(),
            order: ListOrder::default(),
            limit: LIST_LIMIT_DEFAULT,
            cursor: None,
        }
    }
}

impl ListRequest {
    /// Checks the bounds a store relies on.
    ///
    /// # Errors
    ///
    /// [`FilterError::Limit`] for a limit of 0 or above [`LIST_LIMIT_MAX`],
    /// [`FilterError::InvalidValue`] for an empty or oversized id prefix.
    pub fn validate(&self) -> Result<(), FilterError> {
        if self.limit == 0 || self.limit > LIST_LIMIT_MAX {
            return Err(FilterError::Limit {
                limit: u64::from(self.limit),
                max: LIST_LIMIT_MAX,
            });
        }
        if let Some(prefix) = &self.filter.id_prefix {
            if prefix.is_empty() || prefix.len() > ID_PREFIX_LEN_MAX {
                return Err(FilterError::invalid(
                    "id_prefix",
                    prefix,
                    format_args!("must be 1 to {ID_PREFIX_LEN_MAX} bytes"),
                ));
            }
            if prefix.chars().any(char::is_control) {
                return Err(FilterError::invalid(
                    "id_prefix",
                    prefix,
                    "contains a control character",
                ));
            }
        }
        for (what, value) in [
            ("queue", &self.filter.queue),
            ("queue_key", &self.filter.queue_key),
        ] {
            if let Some(value) = value {
                if value.is_empty() || value.len() > crate::ID_LEN_MAX {
                    return Err(FilterError::invalid(
                        what,
                        value,
                        format_args!("must be 1 to {} bytes", crate::ID_LEN_MAX),
                    ));
                }
            }
        }
        if self.filter.attributes.len() > ATTR_FILTERS_MAX {
            return Err(FilterError::invalid(
                "attr",
                &self.filter.attributes.len().to_string(),
                format_args!("at most {ATTR_FILTERS_MAX} attribute filters"),
            ));
        }
        for filter in &self.filter.attributes {
            filter.validate()?;
        }
        if let (Some(key), None) = (&self.filter.queue_key, &self.filter.queue) {
            return Err(FilterError::invalid(
                "queue_key",
                key,
                "needs a queue filter too",
            ));
        }
        Ok(())
    }

    /// Builds a request from text parameters, as a URL query or command-line flags carry them:
    /// `name`, `status`, `created_since`, `created_until`, `updated_since`, `updated_until`,
    /// `finished_since`, `finished_until` (RFC 3339), `parent` (`<name>/<id>`), `id_prefix`, `queue`, `queue_key`, `failed_remote` (`true`/`false`),
    /// `attr` (repeatable: `customer=acme`, `amount>=1000`, as [`AttrFilter::parse`] reads it), `order` (`newest_first`/`oldest_first`), `limit`, `cursor`. An empty value is ignored.
    ///
    /// ```
    /// use keiro_journal::{FilterError, ListRequest, Status};
    /// let request = ListRequest::from_pairs([("status", "failed"), ("limit", "10")])?;
    /// assert_eq!(request.filter.status, Some(Status::Failed));
    /// assert!(matches!(
    ///     ListRequest::from_pairs([("colour", "red")]),
    ///     Err(FilterError::UnknownFilter { .. })
    /// ));
    /// # Ok::<(), FilterError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`FilterError`] naming the first refused parameter.
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Self, FilterError> {
        let mut request = Self::default();
        for (key, value) in pairs {
            let (key, value) = (key.as_ref(), value.as_ref());
            if value.is_empty() {
                continue;
            }
            let filter = &mut request.filter;
            match key {
                "name" => {
                    filter.name = Some(
                        WorkflowName::new(value)
                            .map_err(|e: IdError| FilterError::invalid("name", value, e))?,
                    );
                }
                "status" => filter.status = Some(parse_status(value)?),
                "created_since" => filter.created.since = Some(parse_time("created_since", value)?),
                "created_until" => filter.created.until = Some(parse_time("created_until", value)?),
                "updated_since" => filter.updated.since = Some(parse_time("updated_since", value)?),
                "updated_until" => filter.updated.until = Some(parse_time("updated_until", value)?),
                "finished_since" => {
                    filter.finished.since = Some(parse_time("finished_since", value)?);
                }
                "finished_until" => {
                    filter.finished.until = Some(parse_time("finished_until", value)?);
                }
                "parent" => filter.parent = Some(parse_key("parent", value)?),
                "id_prefix" => filter.id_prefix = Some(value.to_owned()),
                "queue" => filter.queue = Some(value.to_owned()),
                "queue_key" => filter.queue_key = Some(value.to_owned()),
                "attr" => filter.attributes.push(AttrFilter::parse(value)?),
                "failed_remote" => {
                    filter.failed_remote = match value {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => {
                            return Err(FilterError::invalid(
                                "failed_remote",
                                value,
                                "not a boolean",
                            ))
                        }
                    };
                }
                "order" => {
                    request.order = match value {
                        "newest_first" => ListOrder::NewestFirst,
                        "oldest_first" => ListOrder::OldestFirst,
                        _ => return Err(FilterError::invalid("order", value, "unknown order")),
                    };
                }
                "limit" => {
                    let limit: u64 = value
                        .parse()
                        .map_err(|_| FilterError::invalid("limit", value, "not a number"))?;
                    request.limit = u32::try_from(limit)
                        .ok()
                        .filter(|limit| (1..=LIST_LIMIT_MAX).contains(limit))
                        .ok_or(FilterError::Limit {
                            limit,
                            max: LIST_LIMIT_MAX,
                        })?;
                }
                "cursor" => request.cursor = Some(Cursor::parse(value)?),
                other => {
                    return Err(FilterError::UnknownFilter {
                        field: other.to_owned(),
                    })
                }
            }
        }
        request.validate()?;
        Ok(request)
    }
}

/// Parses a status filter value.
///
/// # Errors
///
/// [`FilterError::InvalidValue`] for a status keiro does not have.
pub fn parse_status(value: &str) -> Result<Status, FilterError> {
    Status::parse(value).ok_or_else(|| {
        FilterError::invalid(
            "status",
            value,
            "expected running, suspended, completed, failed or cancelled",
        )
    })
}

fn parse_time(field: &'static str, value: &str) -> Result<OffsetDateTime, FilterError> {
    OffsetDateTime::parse(value, &Rfc3339).map_err(|e| FilterError::invalid(field, value, e))
}

fn parse_key(field: &'static str, value: &str) -> Result<InstanceKey, FilterError> {
    let (name, id) = value
        .split_once('/')
        .ok_or_else(|| FilterError::invalid(field, value, "expected <name>/<id>"))?;
    InstanceKey::parse(name, id).map_err(|e| FilterError::invalid(field, value, e))
}

/// One listed instance: the row without its input and output (a page stays small; the
/// instance itself has them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceSummary {
    /// Name and id.
    #[serde(flatten)]
    pub key: InstanceKey,
    /// The current generation.
    pub generation: i32,
    /// Lifecycle status.
    #[serde(with = "status_text")]
    pub status: Status,
    /// Crashes since the last progress.
    pub attempts: i32,
    /// The last crash's error, or the failure reason.
    pub last_error: Option<String>,
    /// The parent, for a child workflow.
    pub parent: Option<InstanceKey>,
    /// Discovery priority.
    pub priority: i32,
    /// When it was started.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Last change to the row.
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    /// When it went terminal.
    #[serde(with = "time::serde::rfc3339::option")]
    pub completed_at: Option<OffsetDateTime>,
    /// The queue it was started on, if any.
    #[serde(default)]
    pub queue: Option<String>,
    /// Its key on that queue.
    #[serde(default)]
    pub queue_key: Option<String>,
    /// No claim or admission before this instant: a delayed start or a crash backoff.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub not_before: Option<OffsetDateTime>,
    /// Its search attributes.
    #[serde(default, skip_serializing_if = "Attributes::is_empty")]
    pub attributes: Attributes,
}

impl From<&Instance> for InstanceSummary {
    fn from(row: &Instance) -> Self {
        Self {
            key: row.key.clone(),
            generation: row.generation,
            status: row.status,
            attempts: row.attempts,
            last_error: row.last_error.clone(),
            parent: row.parent.clone(),
            priority: row.priority,
            created_at: row.created_at,
            updated_at: row.updated_at,
            completed_at: row.completed_at,
            queue: row.queue.clone(),
            queue_key: row.queue_key.clone(),
            not_before: row.next_attempt_at,
            attributes: Attributes::default(),
        }
    }
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page {
    /// The rows, in the request's order.
    pub instances: Vec<InstanceSummary>,
    /// Where the next page starts; `None` when this page is the last.
    pub next_cursor: Option<Cursor>,
}

impl Page {
    /// The page for `rows` fetched with one row more than `limit` (the probe that tells
    /// whether a next page exists without a second query).
    pub fn from_probe(mut rows: Vec<InstanceSummary>, limit: u32) -> Self {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next_cursor = if more {
            rows.last().map(Cursor::after)
        } else {
            None
        };
        Self {
            instances: rows,
            next_cursor,
        }
    }
}

/// Instances of one workflow in one status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCount {
    /// The workflow.
    pub name: WorkflowName,
    /// The status.
    #[serde(with = "status_text")]
    pub status: Status,
    /// How many.
    pub count: u64,
}

/// Remote tasks of one worker group that are waiting or running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupCount {
    /// The worker group.
    pub group: String,
    /// Tasks waiting to be claimed (including those backing off before a retry).
    pub pending: u64,
    /// Tasks claimed by a worker.
    pub running: u64,
}

/// What an operator's overview shows: instances by workflow and status, the timer backlog,
/// and the remote tasks waiting per group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Instances by (workflow, status), sorted by workflow then status; absent pairs are 0.
    pub instances: Vec<StatusCount>,
    /// Scheduled timers already due (a backlog the timer worker has not fired yet).
    pub timers_due: u64,
    /// Scheduled timers due later.
    pub timers_future: u64,
    /// Pending and running remote tasks by group, sorted by group; groups with neither are
    /// left out.
    pub remote: Vec<GroupCount>,
}

/// How many rows of each kind [`InspectStore::instance_waits`] returns when the caller does
/// not say. Defaults to 100.
pub const WAITS_LIMIT_DEFAULT: u32 = 100;

/// Where a durable timer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TimerState {
    /// Armed, waiting for its due time (or for a timer worker, once due).
    Scheduled,
    /// Picked by a timer worker whose transaction has not committed (Postgres only; a row
    /// left in it by something outside keiro is requeued after a while).
    Firing,
    /// Fired: the step was journaled, or found already resolved. The row stays, so a re-arm of
    /// the same step finds the first deadline.
    Fired,
}

impl TimerState {
    /// The text stored in the timer's `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "scheduled",
            Self::Firing => "firing",
            Self::Fired => "fired",
        }
    }

    /// Reads the column text.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "scheduled" => Some(Self::Scheduled),
            "firing" => Some(Self::Firing),
            "fired" => Some(Self::Fired),
            _ => None,
        }
    }
}

/// One durable timer of an instance: a sleep's deadline or a signal wait's timeout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerInfo {
    /// The generation it fires into.
    pub generation: Generation,
    /// The step its fire journals (`sleep:<name>`, or the signal wait's step).
    pub step: String,
    /// A sleep, or a signal wait's timeout with the token waited on.
    #[serde(flatten)]
    pub kind: TimerKind,
    /// Where it is.
    pub state: TimerState,
    /// When it is (or was) due, on the store's clock.
    #[serde(with = "time::serde::rfc3339")]
    pub fire_at: OffsetDateTime,
    /// When a timer worker fired it.
    #[serde(with = "time::serde::rfc3339::option")]
    pub fired_at: Option<OffsetDateTime>,
    /// Fire attempts: 1 once fired (a fire is one transaction, so a failed one leaves none).
    pub attempts: i32,
    /// When it was armed.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

/// One awakeable an instance allocated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwakeableInfo {
    /// Its id, the token a completer passes (journaled under `awk:<id>`).
    pub id: Uuid,
    /// The generation its value goes to.
    pub generation: Generation,
    /// Pending, completed or cancelled (a cancelled or continued run settles its pending ones
    /// as cancelled).
    pub status: AwakeableStatus,
    /// When it was allocated.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When it was completed or cancelled.
    #[serde(with = "time::serde::rfc3339::option")]
    pub settled_at: Option<OffsetDateTime>,
}

/// One signal wait of an instance that no signal (or timeout) has resolved yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalWaitInfo {
    /// The generation waiting.
    pub generation: Generation,
    /// The step the signal will be journaled under.
    pub step: String,
    /// The token waited on.
    pub token: String,
    /// When the wait was registered.
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
    /// When the wait times out, if it has a timeout (its timer is in [`Waits::timers`] too).
    #[serde(with = "time::serde::rfc3339::option")]
    pub timeout_at: Option<OffsetDateTime>,
}

/// What one instance waits on, or waited on: its timers, its awakeables and its pending signal
/// waits, each kind newest first (by generation, then arm or allocation time, then step, id
/// or arrival) and at most the limit asked for. Children and remote tasks have reads of their
/// own (the list filtered on `parent`, and the remote tasks of the instance).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waits {
    /// Timers, fired ones included.
    pub timers: Vec<TimerInfo>,
    /// Awakeables, settled ones included.
    pub awakeables: Vec<AwakeableInfo>,
    /// Signal waits still registered (a delivered or timed-out wait leaves its journal row,
    /// not a waiter).
    pub signal_waits: Vec<SignalWaitInfo>,
    /// Whether some kind had more rows than the limit (its oldest are left out).
    pub truncated: bool,
}

impl Waits {
    /// Cuts each kind to `limit` rows (they come with one more as a probe), setting
    /// [`truncated`](Self::truncated) when any kind had more.
    pub fn from_probe(
        mut timers: Vec<TimerInfo>,
        mut awakeables: Vec<AwakeableInfo>,
        mut signal_waits: Vec<SignalWaitInfo>,
        limit: u32,
    ) -> Self {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        let truncated =
            timers.len() > limit || awakeables.len() > limit || signal_waits.len() > limit;
        timers.truncate(limit);
        awakeables.truncate(limit);
        signal_waits.truncate(limit);
        Self {
            timers,
            awakeables,
            signal_waits,
            truncated,
        }
    }
}

/// The store operations behind the operators' list, counts and instance page. Reads only.
#[async_trait::async_trait]
pub trait InspectStore: Send + Sync + fmt::Debug + 'static {
    /// One page of instances matching `request` (already validated by the caller), in its
    /// order, after its cursor. Postgres serves every filter from an index (migration 0015).
    async fn instances_list(&self, request: &ListRequest) -> Result<Page>;

    /// The counts, with timers due at `now` (`None`: the store's clock).
    async fn instances_counts(&self, now: Option<OffsetDateTime>) -> Result<Counts>;

    /// The instances that went terminal in each bucket of `request` (already validated by the
    /// caller), by `completed_at`, read over the terminal index (`workflows_terminal_idx`).
    async fn instances_throughput(&self, request: &ThroughputRequest) -> Result<Throughput>;

    /// The timers, awakeables and pending signal waits of `key`, up to `limit` of each kind
    /// (1 to [`LIST_LIMIT_MAX`], checked by the caller), newest first; empty for an unknown
    /// instance. Postgres reads each kind through an index on its owner.
    async fn instance_waits(&self, key: &InstanceKey, limit: u32) -> Result<Waits>;

    /// Event `event` of `key` with the instance's status, in one snapshot; `None` for an
    /// unknown instance.
    async fn event_get(&self, key: &InstanceKey, event: &str) -> Result<Option<EventRead>>;

    /// Up to `limit` items of stream `stream` of `key` from offset `from`, in order, with the
    /// stream's and the instance's state, in one snapshot; `None` for an unknown instance. An
    /// unknown stream reads as empty and open.
    async fn stream_read(
        &self,
        key: &InstanceKey,
        stream: &str,
        from: u64,
        limit: u32,
    ) -> Result<Option<StreamPage>>;

    /// The events and streams of `key`, by key; empty for an unknown instance.
    async fn instance_messages(&self, key: &InstanceKey) -> Result<Messages>;

    /// Update `update_id` of `key` with the instance's status, in one snapshot; `None` for an
    /// unknown instance.
    async fn update_get(&self, key: &InstanceKey, update_id: &str) -> Result<Option<UpdateRead>>;

    /// The updates of `key`, oldest first, at most `limit`; empty for an unknown instance.
    async fn instance_updates(&self, key: &InstanceKey, limit: u32) -> Result<Vec<UpdateRecord>>;

    /// The search attributes of `key` (the start's and the body's sets, the latest value of
    /// each name); empty for an unknown instance.
    async fn instance_attributes(&self, key: &InstanceKey) -> Result<Attributes>;
}

/// Serde for a status as its column text.
mod status_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::Status;

    pub(super) fn serialize<S: Serializer>(status: &Status, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(status.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Status, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_status(&text).map_err(serde::de::Error::custom)
    }
}

/// Serde for an optional status as its column text.
mod status_option {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::Status;

    pub(super) fn serialize<S: Serializer>(
        status: &Option<Status>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match status {
            Some(status) => s.serialize_some(status.as_str()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Status>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| super::parse_status(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_a_tampered_one_is_refused() {
        let cursor = Cursor {
            created_at: OffsetDateTime::from_unix_timestamp_nanos(1_700_000_000_123_456_000)
                .expect("in range"),
            key: InstanceKey::parse("order", "o-1").expect("valid"),
        };
        let text = cursor.encode();
        assert_eq!(Cursor::parse(&text), Ok(cursor));
        for bad in [
            "",
            "zz",
            "abc",
            &text[..text.len() - 1],
            "76323a313a613a62",
            "76313a313a613a",
        ] {
            assert!(
                matches!(Cursor::parse(bad), Err(FilterError::MalformedCursor { .. })),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn unknown_filters_and_values_are_typed_errors() {
        assert!(matches!(
            ListRequest::from_pairs([("since", "1h")]),
            Err(FilterError::UnknownFilter { field }) if field == "since"
        ));
        assert!(matches!(
            ListRequest::from_pairs([("status", "bogus")]),
            Err(FilterError::InvalidValue {
                field: "status",
                ..
            })
        ));
        assert!(matches!(
            ListRequest::from_pairs([("limit", "0")]),
            Err(FilterError::Limit { .. })
        ));
        assert!(matches!(
            ListRequest::from_pairs([("limit", "1001")]),
            Err(FilterError::Limit { .. })
        ));
        assert!(matches!(
            ListRequest::from_pairs([("parent", "nope")]),
            Err(FilterError::InvalidValue {
                field: "parent",
                ..
            })
        ));
        assert!(serde_json::from_str::<ListRequest>(r#"{"filter":{"colour":"red"}}"#).is_err());
        assert!(serde_json::from_str::<ListRequest>(r#"{"filter":{"status":"bogus"}}"#).is_err());
        assert!(serde_json::from_str::<ListRequest>(r#"{"cursor":"00"}"#).is_err());
    }

    #[test]
    fn a_request_serializes_to_json_and_back() {
        let request = ListRequest::from_pairs([
            ("name", "order"),
            ("status", "failed"),
            ("created_since", "2030-01-01T00:00:00Z"),
            ("parent", "batch/b-1"),
            ("failed_remote", "true"),
        ])
        .expect("valid");
        let json = serde_json::to_string(&request).expect("serializes");
        assert_eq!(
            serde_json::from_str::<ListRequest>(&json).expect("parses"),
            request
        );
    }
}
