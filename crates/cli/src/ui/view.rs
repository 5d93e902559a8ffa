//! What the dashboard shows, as plain data: one instance (the row, the journal as a timeline,
//! what it waits on, its events and streams, the remote tasks and the children, read with the facade calls `keiro show`
//! makes) and one queue (the store's figures and what follows from them: the limits it is at,
//! its admissions per second).

use keiro::queue::{QueueInfo, Rate};
use keiro::{
    operate::InstanceSummary, operate::ListRequest, operate::Messages, operate::TimerInfo,
    operate::TimerKind, operate::Waits, operate::WAITS_LIMIT_DEFAULT, remote::RemoteTask,
    store::Instance, store::JournalEntry, Keiro, Status,
};
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

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
    pub(crate) messages: Messages,
    /// The run's search attributes.
    pub(crate) attributes: keiro::operate::Attributes,
    /// The updates sent to the run, oldest first, with their state and answer.
    pub(crate) updates: Vec<keiro::workflow::UpdateRecord>,
    pub(crate) tasks: Vec<RemoteTask>,
    pub(crate) children: Vec<InstanceSummary>,
    /// For a live run: whether a live worker serves its version (`keiro versions`); a run no
    /// live worker serves waits until one does.
    pub(crate) version_served: bool,
}

impl InstanceView {
    /// Reads the instance; 404 when there is none.
    pub(crate) async fn read(keiro: &Keiro, name: &str, id: &str) -> Result<Self, ApiError> {
        let Some(instance) = keiro.instance((name, id)).await? else {
            return Err(ApiError::not_found(format!("no instance {name}/{id}")));
        };
        let journal = keiro.journal((name, id)).await?;
        let waits = keiro.waits((name, id), WAITS_LIMIT_DEFAULT).await?;
        let messages = keiro.messages((name, id)).await?;
        let attributes = keiro.attributes((name, id)).await?;
        let updates = keiro.updates((name, id)).await?;
        let tasks = keiro.remote_tasks((name, id)).await?;
        let parent = instance.key.to_string();
        let children = keiro
            .list(
                &ListRequest::from_pairs([("parent", parent.as_str()), ("limit", CHILDREN_SHOWN)])
                    .map_err(keiro::Error::from)?,
            )
            .await?
            .instances;
        let version_served = if matches!(instance.status, Status::Running | Status::Suspended) {
            let workers = keiro.workers().await?;
            let version = instance.app_version.as_deref().unwrap_or_default();
            keiro::versions::live(
                &workers,
                OffsetDateTime::now_utc(),
                keiro::versions::LIVE_WINDOW_DEFAULT,
            )
            .iter()
            .any(|worker| worker.serves.serves(version))
        } else {
            true
        };
        Ok(Self {
            version_served,
            instance,
            journal,
            waits,
            messages,
            attributes,
            updates,
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
                    is_step: matches!(entry.event, keiro::store::Event::StepRecorded { .. }),
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
            "open_refusals": row.open_refusals,
            "last_error": row.last_error,
            "next_attempt_at": timestamp(row.next_attempt_at),
            "lease_owner": row.lease_owner,
            "lease_epoch": row.lease_epoch,
            "parent": row.parent.as_ref().map(ToString::to_string),
            "priority": row.priority,
            "app_version": row.app_version,
            "version_served": self.version_served,
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
            "attributes": self.attributes,
            "events": self.messages.events,
            "streams": self.messages.streams,
            "updates": self.updates.iter().map(update_json).collect::<Vec<_>>(),
            "remote_tasks": self.tasks.iter().map(task_json).collect::<Vec<_>>(),
            "children": self.children,
        })
    }
}

/// One journal row on the timeline.
pub(crate) struct TimelineRow {
    /// A step's row (not a marker of the run's life): one bar of the drawing.
    pub(crate) is_step: bool,
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

/// The window a queue's `admitted_recently` counts over when it has no rate: a minute, as the
/// stores count it.
const ADMITTED_WINDOW_DEFAULT: std::time::Duration = std::time::Duration::from_secs(60);

/// One queue as the dashboard shows it: the store's figures (`Keiro::queues`), and what follows
/// from them alone: which limits it is at, its admissions per second, the oldest run's wait.
/// Pure: the clock is an argument wherever it matters.
pub(crate) struct QueueView {
    pub(crate) info: QueueInfo,
}

/// One of the queue's busiest keys: the runs it has waiting and the slots it holds.
pub(crate) struct KeyView<'a> {
    /// The key; `None` for the runs started with no key (per-key limits count them as one).
    pub(crate) key: Option<&'a str>,
    pub(crate) waiting: i64,
    pub(crate) running: i64,
    /// Whether it holds as many slots as the per-key concurrency allows (its waiting runs wait
    /// for one of its own to end); `None` when the queue has no per-key concurrency.
    pub(crate) at_key_concurrency: Option<bool>,
}

impl QueueView {
    /// The queue's name.
    pub(crate) fn name(&self) -> &str {
        &self.info.spec.name
    }

    /// The window `admitted_recently` counts over: the queue's rate period, else a minute.
    pub(crate) fn window(&self) -> std::time::Duration {
        self.info
            .spec
            .rate
            .as_ref()
            .map_or(ADMITTED_WINDOW_DEFAULT, Rate::period)
    }

    /// First admissions per second, averaged over [`window`](Self::window).
    pub(crate) fn admitted_per_second(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52 convert exactly
        let admitted = self.info.admitted_recently as f64;
        admitted / self.window().as_secs_f64()
    }

    /// Waiting runs whose delay has passed: the ones admission would take next.
    pub(crate) fn ready(&self) -> i64 {
        self.info.waiting - self.info.delayed
    }

    /// Every declared limit, by its name in the API (`concurrency`, `worker_concurrency`,
    /// `key_concurrency`, `rate`, `key_rate`), with whether the queue is at it now: running
    /// at least the concurrency, first admissions in the window at least the rate's limit, a
    /// busiest key holding its per-key concurrency. `None` where the store's figures cannot
    /// tell (the per-worker concurrency and the per-key rate are counted per worker and per
    /// key, which the figures do not carry).
    pub(crate) fn limits_at(&self) -> Vec<(&'static str, Option<bool>)> {
        let spec = &self.info.spec;
        let mut limits = Vec::new();
        if let Some(limit) = spec.concurrency {
            limits.push(("concurrency", Some(self.info.running >= i64::from(limit))));
        }
        if spec.worker_concurrency.is_some() {
            limits.push(("worker_concurrency", None));
        }
        if spec.key_concurrency.is_some() {
            let at = self
                .keys()
                .iter()
                .any(|key| key.at_key_concurrency == Some(true));
            limits.push(("key_concurrency", Some(at)));
        }
        if let Some(rate) = &spec.rate {
            limits.push((
                "rate",
                Some(self.info.admitted_recently >= i64::from(rate.limit())),
            ));
        }
        if spec.key_rate.is_some() {
            limits.push(("key_rate", None));
        }
        limits
    }

    /// The names of the limits the queue is at now (the page's badges).
    pub(crate) fn at_limits(&self) -> Vec<&'static str> {
        self.limits_at()
            .into_iter()
            .filter_map(|(name, at)| (at == Some(true)).then_some(name))
            .collect()
    }

    /// The busiest keys, most waiting first, as the store listed them.
    pub(crate) fn keys(&self) -> Vec<KeyView<'_>> {
        let limit = self.info.spec.key_concurrency.map(i64::from);
        self.info
            .top_keys
            .iter()
            .map(|(key, waiting, running)| KeyView {
                // The stores list the runs with no key under ''; a key is never empty.
                key: (!key.is_empty()).then_some(key.as_str()),
                waiting: *waiting,
                running: *running,
                at_key_concurrency: limit.map(|limit| *running >= limit),
            })
            .collect()
    }

    /// How long the oldest waiting run has waited at `now` (since it was started).
    pub(crate) fn oldest_wait(&self, now: OffsetDateTime) -> Option<std::time::Duration> {
        self.info
            .oldest_waiting
            .map(|at| std::time::Duration::try_from(now - at).unwrap_or_default())
    }

    /// The API's JSON at `now`: the figures, the limits as declared, which of them the queue is
    /// at (`at_limit`, see [`limits_at`](Self::limits_at)), admissions per second, the busiest
    /// keys. Instants are RFC 3339, as the list's are.
    pub(crate) fn to_json(&self, now: OffsetDateTime) -> Value {
        let info = &self.info;
        let spec = &info.spec;
        let rate = |rate: &Option<Rate>| {
            rate.map(|r| json!({"limit": r.limit(), "period_ms": r.period_ms()}))
        };
        let at_limit: serde_json::Map<String, Value> = self
            .limits_at()
            .into_iter()
            .map(|(name, at)| (name.to_owned(), json!(at)))
            .collect();
        json!({
            "name": spec.name,
            "paused": info.paused,
            "limits": {
                "concurrency": spec.concurrency,
                "worker_concurrency": spec.worker_concurrency,
                "key_concurrency": spec.key_concurrency,
                "rate": rate(&spec.rate),
                "key_rate": rate(&spec.key_rate),
                "priority": spec.priority,
                "fairness": spec.fairness.as_str(),
                "dedup": spec.dedup.map(|d| d.as_str()),
                "release_on_park": spec.release_on_park,
            },
            "at_limit": at_limit,
            "waiting": info.waiting,
            "delayed": info.delayed,
            "ready": self.ready(),
            "running": info.running,
            "admitted_recently": info.admitted_recently,
            "admitted_window_ms": i64::try_from(self.window().as_millis()).unwrap_or(i64::MAX),
            "admitted_per_second": self.admitted_per_second(),
            "oldest_waiting": info.oldest_waiting.and_then(|at| at.format(&Rfc3339).ok()),
            "oldest_waiting_ms": self
                .oldest_wait(now)
                .map(|wait| i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)),
            "top_keys": self.keys().iter().map(|key| json!({
                "key": key.key,
                "waiting": key.waiting,
                "running": key.running,
                "at_key_concurrency": key.at_key_concurrency,
            })).collect::<Vec<_>>(),
        })
    }
}

/// A span as a page shows it, in its largest two units, a zero second one left out: `45s`,
/// `3m 12s`, `1m`, `2h 5m`, `3d 4h`.
/// A payload as the dashboard prints it: pretty JSON, or `encrypted (key "k1")` for a value
/// sealed with a key this process was not given (`KEIRO_ENCRYPTION_KEYS`).
pub(crate) fn payload_text(value: &Value) -> String {
    match keiro::codec::first_sealed_key_id(value) {
        Some(key_id) => format!("encrypted (key {key_id:?})"),
        None => serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string()),
    }
}

pub(crate) fn span(span: std::time::Duration) -> String {
    let secs = span.as_secs();
    let (major, major_unit, minor, minor_unit) = match secs {
        0..60 => return format!("{secs}s"),
        60..3600 => (secs / 60, "m", secs % 60, "s"),
        3600..86_400 => (secs / 3600, "h", secs % 3600 / 60, "m"),
        _ => (secs / 86_400, "d", secs % 86_400 / 3600, "h"),
    };
    if minor == 0 {
        format!("{major}{major_unit}")
    } else {
        format!("{major}{major_unit} {minor}{minor_unit}")
    }
}

/// An update's state as the page and the API show it: its name, and the answer (the reply,
/// the rejection's message, or the status the run ended with).
pub(crate) fn update_state(state: &keiro::workflow::UpdateState) -> (&'static str, Value) {
    use keiro::workflow::UpdateState;
    match state {
        UpdateState::Requested => ("requested", Value::Null),
        UpdateState::Replied(reply) => ("replied", reply.clone()),
        UpdateState::Rejected(message) => ("rejected", Value::String(message.clone())),
        UpdateState::Unanswered(status) => ("unanswered", Value::String(status.as_str().into())),
    }
}

/// One update on `GET /api/v1/instances/{name}/{id}`.
fn update_json(update: &keiro::workflow::UpdateRecord) -> Value {
    let (state, answer) = update_state(&update.state);
    json!({
        "id": update.id,
        "name": update.name,
        "request": update.request,
        "state": state,
        "answer": answer,
        "requested_at": timestamp(Some(update.requested_at)),
        "settled_at": update.settled_at.map(|at| timestamp(Some(at))),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use keiro::queue::{QueueSpec, Rate};
    use time::macros::datetime;

    #[test]
    fn a_payload_sealed_with_a_key_not_given_reads_encrypted_naming_the_key() {
        let sealed = serde_json::json!({"ok": {"$keiro_enc": 1, "kid": "k2", "ct": "AAAA"}});
        assert_eq!(super::payload_text(&sealed), "encrypted (key \"k2\")");
        assert_eq!(super::payload_text(&serde_json::json!([1])), "[\n  1\n]");
    }

    use super::*;

    fn queue(spec: QueueSpec) -> QueueView {
        QueueView {
            info: QueueInfo {
                spec,
                paused: false,
                waiting: 7,
                delayed: 2,
                running: 3,
                admitted_recently: 30,
                oldest_waiting: Some(datetime!(2025-01-01 12:00:00 UTC)),
                top_keys: vec![
                    ("acme".into(), 4, 2),
                    (String::new(), 2, 0),
                    ("globex".into(), 1, 1),
                ],
            },
        }
    }

    #[test]
    fn a_queue_is_at_the_limits_its_figures_reach() -> Result<(), Box<dyn std::error::Error>> {
        let spec = QueueSpec::new("llm")?
            .concurrency(3)
            .worker_concurrency(2)
            .key_concurrency(2)
            .rate(Rate::new(30, Duration::from_secs(10))?)
            .key_rate(Rate::new(5, Duration::from_secs(1))?);
        let view = queue(spec);
        assert_eq!(
            view.limits_at(),
            [
                ("concurrency", Some(true)),
                ("worker_concurrency", None),
                ("key_concurrency", Some(true)),
                ("rate", Some(true)),
                ("key_rate", None),
            ]
        );
        assert_eq!(view.at_limits(), ["concurrency", "key_concurrency", "rate"]);
        assert!((view.admitted_per_second() - 3.0).abs() < 1e-9);
        let keys = view.keys();
        assert_eq!(
            keys.iter()
                .map(|k| (k.key, k.at_key_concurrency))
                .collect::<Vec<_>>(),
            [
                (Some("acme"), Some(true)),
                (None, Some(false)),
                (Some("globex"), Some(false))
            ]
        );

        // Below every limit; no rate: a minute's window.
        let mut view = queue(QueueSpec::new("llm")?.concurrency(4).key_concurrency(3));
        view.info.running = 3;
        assert_eq!(
            view.limits_at(),
            [
                ("concurrency", Some(false)),
                ("key_concurrency", Some(false))
            ]
        );
        assert!(view.at_limits().is_empty());
        assert!((view.admitted_per_second() - 0.5).abs() < 1e-9);
        Ok(())
    }

    #[test]
    fn the_json_carries_figures_limits_and_keys() -> Result<(), Box<dyn std::error::Error>> {
        let view = queue(QueueSpec::new("llm")?.rate(Rate::new(100, Duration::from_secs(60))?));
        let json = view.to_json(datetime!(2025-01-01 12:03:00 UTC));
        assert_eq!(json["name"], "llm");
        assert_eq!(
            (
                &json["waiting"],
                &json["delayed"],
                &json["ready"],
                &json["running"]
            ),
            (&json!(7), &json!(2), &json!(5), &json!(3))
        );
        assert_eq!(
            json["limits"]["rate"],
            json!({"limit": 100, "period_ms": 60_000})
        );
        assert_eq!(json["limits"]["concurrency"], Value::Null);
        assert_eq!(json["at_limit"], json!({"rate": false}));
        assert_eq!(json["admitted_window_ms"], 60_000);
        assert_eq!(json["admitted_per_second"], 0.5);
        assert_eq!(json["oldest_waiting"], "2025-01-01T12:00:00Z");
        assert_eq!(json["oldest_waiting_ms"], 180_000);
        assert_eq!(
            json["top_keys"][1],
            json!({"key": null, "waiting": 2, "running": 0, "at_key_concurrency": null})
        );
        Ok(())
    }

    #[test]
    fn spans_read_in_two_units() {
        assert_eq!(span(Duration::from_secs(45)), "45s");
        assert_eq!(span(Duration::from_secs(192)), "3m 12s");
        assert_eq!(span(Duration::from_secs(60)), "1m");
        assert_eq!(span(Duration::from_secs(7500)), "2h 5m");
        assert_eq!(span(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d 4h");
    }
}
