//! The instance page's timeline drawing: the journal as one lane per step across the run's
//! time, then as inline SVG. A journal row is written when its step ends, so a row's bar runs
//! from the previous row to it: the time the run spent executing the step, or parked waiting
//! for its result (a sleep, an await, a signal, an awakeable, a child, a remote step); a sleep
//! whose timer is listed starts when its timer was armed. Failed
//! attempts of a retried step share its lane, each marked with a tick; a final failure is red.
//! What the run waits on now (scheduled sleeps, pending signal waits and awakeables, children
//! still live) is drawn as open bars from when the wait began to now.
//!
//! [`chart`] decides everything over plain data; [`svg`] only draws it. Every label is
//! interpolated by maud, which escapes it; colours come from the stylesheet (the page's CSP
//! allows no inline style).

use keiro::operate::{AwakeableStatus, InstanceSummary, TimerKind, TimerState, Waits};
use keiro::store::{Event, Instance, JournalEntry, StepKind};
use maud::{html, Markup};
use time::OffsetDateTime;

use crate::timeline::{gap, Gap};

/// The most lanes drawn; the table below the drawing lists every row.
pub(crate) const LANES_MAX: usize = 200;

/// What a bar stands for: its CSS classes say so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BarKind {
    /// The run executed the step.
    Ran,
    /// The run was parked until the result arrived (the step kind's name).
    Parked(&'static str),
    /// A failed attempt of a retried step (its number).
    Attempt(u32),
    /// A step's final failure, or the run's.
    Failed,
    /// A wait still open now (`sleep`, `signal`, `awakeable`).
    Open(&'static str),
    /// An instant in the run's life: `completed`, `cancelled`, `continued`, `resurrected`,
    /// `reset`.
    Mark(&'static str),
}

impl BarKind {
    /// The element's classes: `bar` for a journaled step (one per step row of the table),
    /// `open` for a wait still open, `mark` for an instant.
    pub(crate) fn class(self) -> String {
        match self {
            Self::Ran => "bar ran".to_owned(),
            Self::Parked(kind) => format!("bar parked {kind}"),
            Self::Attempt(_) => "bar attempt".to_owned(),
            Self::Failed => "bar failed".to_owned(),
            Self::Open(kind) => format!("open {kind}"),
            Self::Mark(kind) => format!("mark {kind}"),
        }
    }
}

/// One bar: milliseconds from the run's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bar {
    pub(crate) start_ms: i64,
    pub(crate) end_ms: i64,
    pub(crate) kind: BarKind,
    /// The tooltip: what, how long, which attempt.
    pub(crate) title: String,
}

/// One row of the drawing: a step (its attempts included), a wait, or the run's own marks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Lane {
    pub(crate) label: String,
    pub(crate) bars: Vec<Bar>,
}

/// The whole drawing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chart {
    pub(crate) lanes: Vec<Lane>,
    /// The time axis' length: from the run's start to its end, or to now while it waits.
    pub(crate) span_ms: i64,
    /// Whether lanes beyond [`LANES_MAX`] were left out.
    pub(crate) truncated: bool,
}

/// The lanes in their order of first appearance, found by label; at most [`LANES_MAX`], a bar
/// of any further lane is left out (and said so).
#[derive(Default)]
struct Lanes {
    lanes: Vec<Lane>,
    index: std::collections::HashMap<String, usize>,
    truncated: bool,
}

impl Lanes {
    fn push(&mut self, label: String, bar: Bar) {
        if let Some(&i) = self.index.get(&label) {
            self.lanes[i].bars.push(bar);
        } else if self.lanes.len() < LANES_MAX {
            self.index.insert(label.clone(), self.lanes.len());
            self.lanes.push(Lane {
                label,
                bars: vec![bar],
            });
        } else {
            self.truncated = true;
        }
    }
}

fn millis(span: time::Duration) -> i64 {
    i64::try_from(span.whole_milliseconds()).unwrap_or(i64::MAX)
}

/// A duration as a tooltip or an axis shows it: `850ms`, `2.4s`, `3m 12s`.
pub(crate) fn duration(ms: i64) -> String {
    match ms {
        ..1_000 => format!("{ms}ms"),
        1_000..60_000 => {
            #[allow(clippy::cast_precision_loss)] // below a minute: exact
            let secs = ms as f64 / 1000.0;
            format!("{secs:.1}s")
        }
        _ => super::view::span(std::time::Duration::from_millis(
            u64::try_from(ms).unwrap_or(0),
        )),
    }
}

/// The lane a step row belongs to, and what its bar is: a retried step's attempts are stored
/// as `attempt:<step>:<n>` and `attempt:<step>:failed`, and share the step's lane.
fn classify(step: &str, kind: StepKind, event: &Event) -> (String, BarKind) {
    if kind == StepKind::Attempt {
        let inner = step.strip_prefix("attempt:").unwrap_or(step);
        if let Some((name, n)) = inner.rsplit_once(':') {
            return match n.parse::<u32>() {
                Ok(n) => (name.to_owned(), BarKind::Attempt(n)),
                Err(_) => (name.to_owned(), BarKind::Failed),
            };
        }
        return (inner.to_owned(), BarKind::Failed);
    }
    let bar = match gap(event) {
        Gap::Parked => BarKind::Parked(kind.as_str()),
        _ => BarKind::Ran,
    };
    (step.to_owned(), bar)
}

/// The lanes of `instance`'s run from its journal and what it waits on (its waits, its
/// children still live), at `now`.
pub(crate) fn chart(
    instance: &Instance,
    journal: &[JournalEntry],
    waits: &Waits,
    children: &[InstanceSummary],
    now: OffsetDateTime,
) -> Chart {
    let start = instance.created_at;
    let at = |t: OffsetDateTime| millis(t - start).max(0);
    let mut lanes = Lanes::default();
    let mut lane = |label: String, bar: Bar| lanes.push(label, bar);
    let mut previous = 0;
    let mut end = 0;
    for entry in journal {
        let t = at(entry.recorded_at);
        let (label, kind) = match &entry.event {
            Event::StepRecorded { step, kind, .. } => classify(step, *kind, &entry.event),
            Event::WorkflowCompleted { .. } => ("run".to_owned(), BarKind::Mark("completed")),
            Event::WorkflowFailed { .. } => ("run".to_owned(), BarKind::Failed),
            Event::WorkflowCancelled => ("run".to_owned(), BarKind::Mark("cancelled")),
            Event::WorkflowContinuedAsNew { .. } => ("run".to_owned(), BarKind::Mark("continued")),
            Event::Resurrected => ("run".to_owned(), BarKind::Mark("resurrected")),
            Event::StepReset { step, .. } => (step.clone(), BarKind::Mark("reset")),
            _ => ("run".to_owned(), BarKind::Mark("other")),
        };
        // A sleep began when its timer was armed, which may be before the previous row (a
        // sleep raced against other work); else the gap since the previous row is the wait.
        let armed = match kind {
            BarKind::Parked("sleep") => waits
                .timers
                .iter()
                .find(|timer| timer.step == label && timer.generation == entry.generation)
                .map(|timer| at(timer.created_at)),
            _ => None,
        };
        let start_ms = match kind {
            BarKind::Mark(_) => t,
            BarKind::Failed if label == "run" => t,
            _ => armed.unwrap_or(previous).min(t),
        };
        let what = match kind {
            BarKind::Ran => "ran".to_owned(),
            BarKind::Parked(kind) => format!("waited ({kind})"),
            BarKind::Attempt(n) => format!("attempt {n} failed"),
            BarKind::Failed if label == "run" => "the run failed".to_owned(),
            BarKind::Failed => "failed for good".to_owned(),
            BarKind::Mark(mark) => mark.to_owned(),
            BarKind::Open(kind) => kind.to_owned(),
        };
        let title = format!(
            "{label}: {what}, {} (at +{}, #{})",
            duration(t - start_ms),
            duration(t),
            entry.seq
        );
        lane(
            label,
            Bar {
                start_ms,
                end_ms: t,
                kind,
                title,
            },
        );
        previous = t;
        end = end.max(t);
    }
    let now_ms = at(now);
    let mut open = |label: String, since: OffsetDateTime, kind: &'static str, detail: String| {
        let start_ms = at(since);
        let title = format!(
            "{label}: waiting ({kind}) for {}{detail}",
            duration(now_ms - start_ms)
        );
        lane(
            label,
            Bar {
                start_ms,
                end_ms: now_ms.max(start_ms),
                kind: BarKind::Open(kind),
                title,
            },
        );
        end = end.max(now_ms);
    };
    let live = !instance.status.is_terminal();
    if live {
        for timer in &waits.timers {
            let waiting = matches!(timer.state, TimerState::Scheduled | TimerState::Firing);
            if waiting && matches!(timer.kind, TimerKind::Sleep) {
                let due = crate::ops::timestamp(Some(timer.fire_at));
                open(
                    timer.step.clone(),
                    timer.created_at,
                    "sleep",
                    format!(", due {due}"),
                );
            }
        }
        for wait in &waits.signal_waits {
            open(
                wait.step.clone(),
                wait.since,
                "signal",
                format!(", token {}", wait.token),
            );
        }
        for awakeable in &waits.awakeables {
            if awakeable.status == AwakeableStatus::Pending {
                open(
                    format!("awakeable {}", awakeable.id),
                    awakeable.created_at,
                    "awakeable",
                    String::new(),
                );
            }
        }
        for child in children.iter().filter(|child| !child.status.is_terminal()) {
            open(
                format!("child {}", child.key),
                child.created_at,
                "child",
                format!(", {}", child.status.as_str()),
            );
        }
    }
    if let Some(done) = instance.completed_at {
        end = end.max(at(done));
    }
    let Lanes {
        lanes, truncated, ..
    } = lanes;
    Chart {
        lanes,
        span_ms: end.max(1),
        truncated,
    }
}

/// The drawing's width, its label column and one lane's height, in SVG units.
const WIDTH: i64 = 960;
const LABEL: i64 = 220;
const LANE: i64 = 20;
const AXIS: i64 = 22;

/// `chart` as inline SVG: a label and its bars per lane, ticks on failed attempts, a time axis
/// with five marks.
pub(crate) fn svg(chart: &Chart) -> Markup {
    let plot = WIDTH - LABEL - 10;
    let x = |ms: i64| LABEL + ms.saturating_mul(plot) / chart.span_ms;
    let lanes = i64::try_from(chart.lanes.len()).unwrap_or(0);
    let height = lanes * LANE + AXIS + 4;
    let bottom = lanes * LANE;
    html! {
        svg #timeline-chart xmlns="http://www.w3.org/2000/svg" role="img"
            viewBox={ "0 0 " (WIDTH) " " (height) } width=(WIDTH) height=(height)
            data-span-ms=(chart.span_ms) {
            title { "The run's steps across time" }
            @for (i, lane) in chart.lanes.iter().enumerate() {
                @let y = i64::try_from(i).unwrap_or(0) * LANE;
                g.lane data-step=(lane.label) {
                    text.label x="4" y=(y + 14) { (truncate(&lane.label)) }
                    line.grid x1=(LABEL) x2=(WIDTH - 10) y1=(y + LANE) y2=(y + LANE) {}
                    @for bar in &lane.bars {
                        @let (left, right) = (x(bar.start_ms), x(bar.end_ms));
                        @match bar.kind {
                            BarKind::Mark(_) => {
                                circle class=(bar.kind.class()) cx=(left) cy=(y + 10) r="5" {
                                    title { (bar.title) }
                                }
                            }
                            BarKind::Failed if bar.start_ms == bar.end_ms => {
                                circle class="mark failed" cx=(left) cy=(y + 10) r="5" {
                                    title { (bar.title) }
                                }
                            }
                            _ => {
                                rect class=(bar.kind.class()) x=(left) y=(y + 4)
                                    width=((right - left).max(2)) height=(LANE - 8) {
                                    title { (bar.title) }
                                }
                                @if let BarKind::Attempt(_) = bar.kind {
                                    line.tick x1=(right) x2=(right) y1=(y + 1) y2=(y + LANE - 1) {}
                                }
                            }
                        }
                    }
                }
            }
            g.axis {
                line x1=(LABEL) x2=(WIDTH - 10) y1=(bottom + 2) y2=(bottom + 2) {}
                @for q in 0..=4_i64 {
                    @let ms = chart.span_ms * q / 4;
                    text x=(x(ms)) y=(bottom + 16)
                        text-anchor=(match q { 0 => "start", 4 => "end", _ => "middle" }) {
                        "+" (duration(ms))
                    }
                }
            }
        }
    }
}

/// A lane's label cut to what its column holds.
fn truncate(label: &str) -> String {
    const CHARS: usize = 30;
    if label.chars().count() <= CHARS {
        label.to_owned()
    } else {
        let cut: String = label.chars().take(CHARS - 1).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use keiro::Status;
    use serde_json::json;
    use time::macros::datetime;
    use time::Duration;

    use super::*;

    fn entry(seq: i64, at_ms: i64, event: Event) -> JournalEntry {
        JournalEntry {
            seq,
            generation: 1,
            event,
            recorded_at: datetime!(2026-01-01 12:00:00 UTC) + Duration::milliseconds(at_ms),
        }
    }

    fn instance(key: (&str, &str), status: Status) -> Instance {
        let start = datetime!(2026-01-01 12:00:00 UTC);
        Instance {
            key: keiro::InstanceKey::parse(key.0, key.1).expect("a key"),
            generation: 1,
            status,
            input: json!(null),
            output: None,
            attempts: 0,
            open_refusals: 0,
            last_error: None,
            next_attempt_at: None,
            lease_owner: None,
            lease_epoch: 0,
            lease_expires_at: None,
            wake_after: None,
            parent: None,
            priority: 0,
            queue: None,
            queue_key: None,
            app_version: None,
            created_at: start,
            updated_at: start,
            completed_at: None,
        }
    }

    fn step(name: &str, kind: StepKind) -> Event {
        Event::StepRecorded {
            step: name.into(),
            kind,
            result: json!(null),
        }
    }

    #[test]
    fn steps_waits_attempts_and_failures_become_lanes_of_bars() {
        let instance = instance(("charge", "c-1"), Status::Failed);
        let journal = [
            entry(1, 100, step("authorize", StepKind::Step)),
            entry(2, 1_100, step("sleep:nap", StepKind::Sleep)),
            entry(3, 1_300, step("attempt:capture:1", StepKind::Attempt)),
            entry(4, 1_600, step("attempt:capture:failed", StepKind::Attempt)),
            entry(
                5,
                1_600,
                Event::WorkflowFailed {
                    reason: "declined".into(),
                },
            ),
        ];
        let chart = chart(
            &instance,
            &journal,
            &Waits::default(),
            &[],
            instance.created_at,
        );
        let labels: Vec<&str> = chart.lanes.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["authorize", "sleep:nap", "capture", "run"]);
        assert_eq!(chart.span_ms, 1_600);
        let bars = |i: usize| -> Vec<(i64, i64, BarKind)> {
            chart.lanes[i]
                .bars
                .iter()
                .map(|b| (b.start_ms, b.end_ms, b.kind))
                .collect()
        };
        assert_eq!(bars(0), [(0, 100, BarKind::Ran)]);
        assert_eq!(bars(1), [(100, 1_100, BarKind::Parked("sleep"))]);
        assert_eq!(
            bars(2),
            [
                (1_100, 1_300, BarKind::Attempt(1)),
                (1_300, 1_600, BarKind::Failed)
            ]
        );
        assert_eq!(bars(3), [(1_600, 1_600, BarKind::Failed)]);
        assert!(chart.lanes[2].bars[0].title.contains("attempt 1 failed"));
        assert!(
            chart.lanes[1].bars[0].title.contains("1.0s"),
            "{:?}",
            chart.lanes[1]
        );

        // The drawing: one `bar` per step row, the run's failure a red mark.
        let svg = svg(&chart).into_string();
        assert_eq!(svg.matches("class=\"bar ").count(), 4, "{svg}");
        assert_eq!(svg.matches("class=\"tick\"").count(), 1);
        assert_eq!(svg.matches("class=\"mark failed\"").count(), 1);
    }

    #[test]
    fn a_sleep_starts_when_its_timer_was_armed() {
        let instance = instance(("napper", "n-1"), Status::Completed);
        let start = instance.created_at;
        let journal = [
            entry(1, 100, step("other", StepKind::Step)),
            entry(2, 900, step("sleep:nap", StepKind::Sleep)),
        ];
        let waits = Waits {
            timers: vec![keiro::operate::TimerInfo {
                generation: 1,
                step: "sleep:nap".into(),
                kind: TimerKind::Sleep,
                state: TimerState::Fired,
                fire_at: start + Duration::milliseconds(850),
                fired_at: Some(start + Duration::milliseconds(890)),
                attempts: 1,
                created_at: start + Duration::milliseconds(50),
            }],
            ..Waits::default()
        };
        let chart = chart(&instance, &journal, &waits, &[], start);
        assert_eq!(
            (
                chart.lanes[1].bars[0].start_ms,
                chart.lanes[1].bars[0].end_ms
            ),
            (50, 900),
            "armed at 50 ms, beside the step that ended at 100 ms"
        );
    }

    #[test]
    fn what_a_live_run_waits_on_is_drawn_open_until_now() {
        let instance = instance(("waiter", "w-1"), Status::Suspended);
        let start = instance.created_at;
        let waits = Waits {
            signal_waits: vec![keiro::operate::SignalWaitInfo {
                generation: 1,
                step: "signal:<b>poke</b>".into(),
                token: "t".into(),
                since: start + Duration::milliseconds(200),
                timeout_at: None,
            }],
            ..Waits::default()
        };
        let child = InstanceSummary {
            key: keiro::InstanceKey::parse("greet", "kid-1").expect("a key"),
            generation: 0,
            status: Status::Running,
            attempts: 0,
            last_error: None,
            parent: Some(instance.key.clone()),
            priority: 0,
            created_at: start + Duration::seconds(1),
            updated_at: start + Duration::seconds(1),
            completed_at: None,
            queue: None,
            queue_key: None,
            not_before: None,
            attributes: keiro::operate::Attributes::default(),
        };
        let done = InstanceSummary {
            status: Status::Completed,
            key: keiro::InstanceKey::parse("greet", "kid-0").expect("a key"),
            ..child.clone()
        };
        let children = [child, done];
        let chart = chart(
            &instance,
            &[],
            &waits,
            &children,
            start + Duration::seconds(5),
        );
        assert_eq!(chart.span_ms, 5_000);
        assert_eq!(chart.lanes.len(), 2, "the signal wait and the live child");
        assert_eq!(chart.lanes[1].label, "child greet/kid-1");
        assert_eq!(
            (chart.lanes[1].bars[0].start_ms, chart.lanes[1].bars[0].kind),
            (1_000, BarKind::Open("child"))
        );
        assert_eq!(chart.lanes[0].bars[0].kind, BarKind::Open("signal"));
        assert_eq!(
            (
                chart.lanes[0].bars[0].start_ms,
                chart.lanes[0].bars[0].end_ms
            ),
            (200, 5_000)
        );
        let svg = svg(&chart).into_string();
        assert!(svg.contains("signal:&lt;b&gt;poke&lt;/b&gt;"), "{svg}");
        assert!(!svg.contains("class=\"bar "));
    }

    #[test]
    fn lanes_stop_at_their_bound_and_say_so() {
        let instance = instance(("long", "l-1"), Status::Running);
        let journal: Vec<JournalEntry> = (0..5_000)
            .map(|n| entry(n, n, step(&format!("step-{n}"), StepKind::Step)))
            .collect();
        let chart = chart(
            &instance,
            &journal,
            &Waits::default(),
            &[],
            instance.created_at,
        );
        assert_eq!(chart.lanes.len(), LANES_MAX);
        assert!(chart.truncated);
        assert_eq!(
            chart.lanes[LANES_MAX - 1].label,
            format!("step-{}", LANES_MAX - 1)
        );
        let short = chart_of(&journal[..3]);
        assert!(!short.truncated && short.lanes.len() == 3);
    }

    fn chart_of(journal: &[JournalEntry]) -> Chart {
        let instance = instance(("long", "l-1"), Status::Running);
        chart(
            &instance,
            journal,
            &Waits::default(),
            &[],
            instance.created_at,
        )
    }

    #[test]
    fn durations_read_in_their_unit() {
        assert_eq!(duration(850), "850ms");
        assert_eq!(duration(2_400), "2.4s");
        assert_eq!(duration(192_000), "3m 12s");
    }
}
