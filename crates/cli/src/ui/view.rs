//! One instance as the dashboard shows it: the row, the journal as a timeline, what it waits
//! on (timers, awakeables, signal waits), the remote tasks and the children, read with the
//! facade calls `keiro show` makes.

use keiro::{
    operate::InstanceSummary, operate::ListRequest, operate::TimerInfo, operate::TimerKind,
    operate::Waits, operate::WAITS_LIMIT_DEFAULT, remote::RemoteTask, store::Instance,
    store::JournalEntry, Keiro,
};
use serde_json::{json, Value};

use super::error::ApiError;
use crate::ops::timestamp;
use crate::timeline::{gap, Gap};

/// How many children the instance page lists (the list page, filtered on the parent, has
/// them all).
const CHILDREN_SHOWN: &str = "100";

/// Everything the instance page and `GET /api/v1/instances/{name}/{id}` show.
pub(crate) struct InstanceView {
    pub(crate) instance: Instance,
    pub(crate) journal: Vec<JournalEntry>,
    pub(crate) waits: Waits,
    pub(crate) tasks: Vec<RemoteTask>,
    pub(crate) children: Vec<InstanceSummary>,
}

impl InstanceView {
    /// Reads the instance; 404 when there is none.
    pub(crate) async fn read(keiro: &Keiro, name: &str, id: &str) -> Result<Self, ApiError> {
        let Some(instance) = keiro.instance((name, id)).await? else {
            return Err(ApiError::not_found(format!("no instance {name}/{id}")));
        };
        let journal = keiro.journal((name, id)).await?;
        let waits = keiro.waits((name, id), WAITS_LIMIT_DEFAULT).await?;
        let tasks = keiro.remote_tasks((name, id)).await?;
        let parent = instance.key.to_string();
        let children = keiro
            .list(
                &ListRequest::from_pairs([("parent", parent.as_str()), ("limit", CHILDREN_SHOWN)])
                    .map_err(keiro::Error::from)?,
            )
            .await?
            .instances;
        Ok(Self {
            instance,
            journal,
            waits,
            tasks,
            children,
        })
    }

    /// The timeline rows: offset from the start, the gap before the row and what it was spent
    /// on (`ran`, `parked` or empty), as `keiro show` prints them.
    pub(crate) fn timeline(&self) -> Vec<TimelineRow> {
        let created = self.instance.created_at;
        let mut previous = created;
        self.journal
            .iter()
            .map(|entry| {
                let row = entry.event.encode();
                let span = (entry.recorded_at - previous).max(time::Duration::ZERO);
                previous = entry.recorded_at;
                TimelineRow {
                    seq: entry.seq,
                    generation: i64::from(entry.generation),
                    recorded_at: timestamp(Some(entry.recorded_at)),
                    offset_ms: millis(entry.recorded_at - created),
                    gap_ms: millis(span),
                    spent: match gap(&entry.event) {
                        Gap::Ran => "ran",
                        Gap::Parked => "parked",
                        Gap::Other => "",
                    },
                    kind: row.kind.to_string(),
                    step: row.step_name.to_string(),
                    payload: row.payload.clone(),
                }
            })
            .collect()
    }

    /// The API's JSON.
    pub(crate) fn to_json(&self) -> Value {
        let row = &self.instance;
        json!({
            "name": row.key.name.as_str(),
            "id": row.key.id.as_str(),
            "status": row.status.as_str(),
            "generation": row.generation,
            "attempts": row.attempts,
            "last_error": row.last_error,
            "lease_owner": row.lease_owner,
            "lease_epoch": row.lease_epoch,
            "parent": row.parent.as_ref().map(ToString::to_string),
            "priority": row.priority,
            "created_at": timestamp(Some(row.created_at)),
            "updated_at": timestamp(Some(row.updated_at)),
            "completed_at": row.completed_at.map(|at| timestamp(Some(at))),
            "wake_after": row.wake_after.map(|at| timestamp(Some(at))),
            "input": row.input,
            "output": row.output,
            "timeline": self.timeline().iter().map(TimelineRow::to_json).collect::<Vec<_>>(),
            "timers": self.waits.timers,
            "awakeables": self.waits.awakeables,
            "signal_waits": self.waits.signal_waits,
            "waits_truncated": self.waits.truncated,
            "remote_tasks": self.tasks.iter().map(task_json).collect::<Vec<_>>(),
            "children": self.children,
        })
    }
}

/// One journal row on the timeline.
pub(crate) struct TimelineRow {
    pub(crate) seq: i64,
    pub(crate) generation: i64,
    pub(crate) recorded_at: String,
    pub(crate) offset_ms: i64,
    pub(crate) gap_ms: i64,
    pub(crate) spent: &'static str,
    pub(crate) kind: String,
    pub(crate) step: String,
    pub(crate) payload: Value,
}

impl TimelineRow {
    fn to_json(&self) -> Value {
        json!({
            "seq": self.seq,
            "generation": self.generation,
            "recorded_at": self.recorded_at,
            "offset_ms": self.offset_ms,
            "gap_ms": self.gap_ms,
            "spent": self.spent,
            "kind": self.kind,
            "step": self.step,
            "payload": self.payload,
        })
    }
}

fn millis(span: time::Duration) -> i64 {
    i64::try_from(span.whole_milliseconds()).unwrap_or(i64::MAX)
}

/// A remote task's JSON.
fn task_json(task: &RemoteTask) -> Value {
    json!({
        "step_id": task.step_id,
        "step": task.step,
        "journal_step": task.journal_step,
        "group": task.group,
        "status": task.status.as_str(),
        "attempts": task.attempts,
        "max_attempts": task.max_attempts,
        "dispatches": task.dispatches,
        "claimed_by": task.claimed_by,
        "last_error": task.last_error,
        "output": task.output,
    })
}

/// A timer's kind as a page shows it: `sleep`, or `signal timeout` with its token.
pub(crate) fn timer_kind(timer: &TimerInfo) -> (&'static str, &str) {
    match &timer.kind {
        TimerKind::SignalTimeout { token } => ("signal timeout", token.as_str()),
        _ => ("sleep", ""),
    }
}
