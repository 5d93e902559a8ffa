//! The scheduler's decision for one due schedule, as a pure function of its row, the store's
//! clock and whether its previous run is live: which ticks start, which one is buffered, and
//! where the next tick is. The scheduler loads the inputs and the store carries the plan out.

use std::time::Duration;

use time::OffsetDateTime;

use super::cadence::Compiled;
use super::spec::{CatchUp, Overlap, Schedule};

/// The most on-time ticks one pass starts for one schedule; the rest stay due for the next
/// pass (only a cadence of seconds with a long catch-up window reaches it).
pub(crate) const ON_TIME_MAX: usize = 1_000;

/// What to write for one schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Ticks to start, oldest first.
    pub(crate) starts: Vec<OffsetDateTime>,
    /// The tick kept for later ([`Overlap::BufferOne`]).
    pub(crate) buffered: Option<OffsetDateTime>,
    /// The first tick not handled.
    pub(crate) next_tick: Option<OffsetDateTime>,
    /// The latest tick handled.
    pub(crate) last_tick: Option<OffsetDateTime>,
    /// Ticks the overlap policy dropped.
    pub(crate) dropped: u64,
}

/// Plans `schedule` at `now`: `None` when nothing would change.
///
/// Due ticks are those from the row's next tick up to `now`. Ticks older than `now - window`
/// were missed (no scheduler saw them in time) and start only as the catch-up policy says;
/// the others are on time. The buffered tick, if any, queues ahead of them, then the overlap
/// policy decides what starts.
pub(crate) fn plan(
    schedule: &Schedule,
    cadence: &Compiled,
    now: OffsetDateTime,
    previous_live: bool,
    window: Duration,
) -> Option<Plan> {
    let mut due = Vec::new();
    let mut next_tick = schedule.next_tick;
    let mut last_tick = schedule.last_tick;
    if let Some(first) = schedule.next_tick.filter(|t| *t <= now) {
        let window_start = now - window;
        if first < window_start {
            if let Some(latest) = cadence.before(window_start).filter(|t| *t >= first) {
                last_tick = Some(latest);
                let keep = match schedule.spec.catch_up {
                    CatchUp::None => 0,
                    CatchUp::Last => 1,
                    CatchUp::All { max } => usize::try_from(max).unwrap_or(usize::MAX),
                };
                let mut missed = Vec::new();
                let mut tick = Some(latest);
                while let Some(t) = tick.filter(|t| *t >= first && missed.len() < keep) {
                    missed.push(t);
                    tick = cadence.before(t);
                }
                missed.reverse();
                due.extend(missed);
            }
        }
        // The row's next tick is a tick by construction (and may be one a daylight-saving
        // gap moved, which no search from it would find again).
        let mut tick = if first >= window_start {
            Some(first)
        } else {
            cadence.at_or_after(window_start)
        };
        let mut on_time = 0;
        while let Some(t) = tick.filter(|t| *t <= now && on_time < ON_TIME_MAX) {
            due.push(t);
            last_tick = Some(t);
            on_time += 1;
            tick = cadence.next_after(t);
        }
        next_tick = tick;
    }
    let queue: Vec<OffsetDateTime> = schedule.buffered_tick.into_iter().chain(due).collect();
    let count = u64::try_from(queue.len()).unwrap_or(u64::MAX);
    let (starts, buffered) = match (schedule.spec.overlap, previous_live) {
        (_, _) if queue.is_empty() => (Vec::new(), None),
        (Overlap::AllowAll, _) => (queue, None),
        (Overlap::Skip, true) => (Vec::new(), None),
        (Overlap::Skip, false) => (queue.last().copied().into_iter().collect(), None),
        (Overlap::BufferOne, true) => (Vec::new(), queue.first().copied()),
        (Overlap::BufferOne, false) => (vec![queue[0]], queue.get(1).copied()),
    };
    let kept = u64::try_from(starts.len()).unwrap_or(u64::MAX) + u64::from(buffered.is_some());
    let plan = Plan {
        dropped: count - kept,
        starts,
        buffered,
        next_tick,
        last_tick,
    };
    let unchanged = plan.starts.is_empty()
        && plan.buffered == schedule.buffered_tick
        && plan.next_tick == schedule.next_tick;
    (!unchanged).then_some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::cadence::Cadence;
    use crate::schedule::spec::ScheduleSpec;
    use keiro_journal::WorkflowName;
    use time::macros::datetime;

    const WINDOW: Duration = Duration::from_secs(60);

    fn every_minute(overlap: Overlap, catch_up: CatchUp, next: OffsetDateTime) -> Schedule {
        Schedule {
            spec: ScheduleSpec {
                name: "s".into(),
                workflow: WorkflowName::new("w").expect("valid"),
                cadence: Cadence::Every(Duration::from_secs(60)),
                input: serde_json::Value::Null,
                overlap,
                catch_up,
            },
            paused: false,
            next_tick: Some(next),
            last_tick: None,
            buffered_tick: None,
            last_instance: None,
            last_error: None,
            failures: 0,
            retry_at: None,
            revision: 1,
            created_at: next,
            updated_at: next,
        }
    }

    fn run(s: &Schedule, now: OffsetDateTime, live: bool) -> Option<Plan> {
        let c = s.spec.cadence.compile().expect("valid");
        plan(s, &c, now, live, WINDOW)
    }

    #[test]
    fn a_tick_not_yet_due_changes_nothing() {
        let s = every_minute(
            Overlap::Skip,
            CatchUp::None,
            datetime!(2026-01-01 10:01 UTC),
        );
        assert_eq!(run(&s, datetime!(2026-01-01 10:00:59 UTC), false), None);
    }

    #[test]
    fn an_on_time_tick_starts() {
        let s = every_minute(
            Overlap::Skip,
            CatchUp::None,
            datetime!(2026-01-01 10:01 UTC),
        );
        let p = run(&s, datetime!(2026-01-01 10:01:02 UTC), false).expect("a plan");
        assert_eq!(p.starts, vec![datetime!(2026-01-01 10:01 UTC)]);
        assert_eq!(p.next_tick, Some(datetime!(2026-01-01 10:02 UTC)));
    }

    #[test]
    fn catch_up_policies_after_downtime() {
        // Down from 10:00:30 to 10:05:30: 10:01..10:04 are missed, 10:05 is on time.
        let next = datetime!(2026-01-01 10:01 UTC);
        let now = datetime!(2026-01-01 10:05:30 UTC);
        let starts = |c| {
            run(&every_minute(Overlap::AllowAll, c, next), now, false)
                .expect("a plan")
                .starts
        };
        assert_eq!(starts(CatchUp::None), vec![datetime!(2026-01-01 10:05 UTC)]);
        assert_eq!(
            starts(CatchUp::Last),
            vec![
                datetime!(2026-01-01 10:04 UTC),
                datetime!(2026-01-01 10:05 UTC)
            ]
        );
        assert_eq!(
            starts(CatchUp::All { max: 2 }),
            vec![
                datetime!(2026-01-01 10:03 UTC),
                datetime!(2026-01-01 10:04 UTC),
                datetime!(2026-01-01 10:05 UTC)
            ]
        );
        assert_eq!(starts(CatchUp::All { max: 100 }).len(), 5);
    }

    #[test]
    fn overlap_policies_while_the_previous_run_is_live() {
        let next = datetime!(2026-01-01 10:01 UTC);
        let now = datetime!(2026-01-01 10:01:01 UTC);
        let skip = run(&every_minute(Overlap::Skip, CatchUp::None, next), now, true).expect("plan");
        assert!(skip.starts.is_empty());
        assert_eq!(skip.dropped, 1);
        let buffer = run(
            &every_minute(Overlap::BufferOne, CatchUp::None, next),
            now,
            true,
        )
        .expect("plan");
        assert!(buffer.starts.is_empty());
        assert_eq!(buffer.buffered, Some(next));
        let all = run(
            &every_minute(Overlap::AllowAll, CatchUp::None, next),
            now,
            true,
        )
        .expect("plan");
        assert_eq!(all.starts, vec![next]);
    }

    #[test]
    fn a_buffered_tick_starts_when_the_previous_run_ends_and_one_more_is_kept() {
        let mut s = every_minute(
            Overlap::BufferOne,
            CatchUp::None,
            datetime!(2026-01-01 10:02 UTC),
        );
        s.buffered_tick = Some(datetime!(2026-01-01 10:01 UTC));
        let live = datetime!(2026-01-01 10:01:30 UTC);
        assert_eq!(run(&s, live, true), None, "still live, nothing new is due");
        let p = run(&s, live, false).expect("a plan");
        assert_eq!(p.starts, vec![datetime!(2026-01-01 10:01 UTC)]);
        assert_eq!(p.buffered, None);
        let later = datetime!(2026-01-01 10:02:01 UTC);
        let p = run(&s, later, false).expect("a plan");
        assert_eq!(p.starts, vec![datetime!(2026-01-01 10:01 UTC)]);
        assert_eq!(p.buffered, Some(datetime!(2026-01-01 10:02 UTC)));
        let p = run(&s, later, true).expect("a plan");
        assert_eq!(p.buffered, Some(datetime!(2026-01-01 10:01 UTC)));
        assert_eq!(p.dropped, 1, "the 10:02 tick finds the buffer full");
    }
}
