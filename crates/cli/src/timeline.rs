//! The journal as a timeline, for `keiro show`: each event's offset from the start, how long
//! the step ran (for steps the run executed) or how long the run waited for it (for results
//! that came from outside: sleeps, awaits, signals, awakeables, children, remote steps), and
//! the totals. A journal row is written when its step ends, so the gap since the previous row
//! is that step's duration, or the time the run spent parked waiting for it.

use keiro::{store::Event, store::Instance, store::JournalEntry, store::StepKind};
use time::OffsetDateTime;

/// What the gap before a journal row was spent on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gap {
    /// The run executed the step.
    Ran,
    /// The run was parked until the result arrived from outside.
    Parked,
    /// A lifecycle event or an operator's.
    Other,
}

impl Gap {
    fn label(self) -> &'static str {
        match self {
            Self::Ran => "ran",
            Self::Parked => "parked",
            Self::Other => "",
        }
    }
}

/// Classifies a journal row.
pub(crate) fn gap(event: &Event) -> Gap {
    let Event::StepRecorded { step, kind, .. } = event else {
        return Gap::Other;
    };
    match kind {
        StepKind::Await | StepKind::Sleep | StepKind::Signal | StepKind::Remote => Gap::Parked,
        // An awakeable's allocation (`awkid:`) runs in the body; its completion is waited for.
        StepKind::Awakeable if !step.starts_with("awkid:") => Gap::Parked,
        // A child's spawn runs in the body; its result is waited for.
        StepKind::Child if step.contains(":result") => Gap::Parked,
        _ => Gap::Ran,
    }
}

fn seconds(span: time::Duration) -> String {
    let ms = span.whole_milliseconds();
    if ms.abs() < 10_000 {
        format!("{ms}ms")
    } else {
        format!("{:.1}s", span.as_seconds_f64())
    }
}

/// Prints the timeline of `journal`, starting at the instance's creation.
pub(crate) fn print(instance: &Instance, journal: &[JournalEntry]) {
    if journal.is_empty() {
        return;
    }
    println!("timeline     offset      gap  spent   event");
    let mut previous: OffsetDateTime = instance.created_at;
    let (mut ran, mut parked) = (time::Duration::ZERO, time::Duration::ZERO);
    for entry in journal {
        let row = entry.event.encode();
        let span = (entry.recorded_at - previous).max(time::Duration::ZERO);
        let spent = gap(&entry.event);
        match spent {
            Gap::Ran => ran += span,
            Gap::Parked => parked += span,
            Gap::Other => {}
        }
        println!(
            "  {:>12} {:>8}  {:<6}  {} {}",
            seconds(entry.recorded_at - instance.created_at),
            seconds(span),
            spent.label(),
            row.kind,
            row.step_name
        );
        previous = entry.recorded_at;
    }
    let end = instance.completed_at.unwrap_or(previous).max(previous);
    println!(
        "  total {} (ran {}, parked {})",
        seconds(end - instance.created_at),
        seconds(ran),
        seconds(parked)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(name: &str, kind: StepKind) -> Event {
        Event::StepRecorded {
            step: name.to_owned(),
            kind,
            result: serde_json::Value::Null,
        }
    }

    #[test]
    fn waits_are_parked_time_and_actions_are_run_time() {
        assert_eq!(gap(&step("charge", StepKind::Step)), Gap::Ran);
        assert_eq!(gap(&step("sleep:nap", StepKind::Sleep)), Gap::Parked);
        assert_eq!(gap(&step("approval", StepKind::Await)), Gap::Parked);
        assert_eq!(gap(&step("remote:print", StepKind::Remote)), Gap::Parked);
        assert_eq!(gap(&step("awkid:spare", StepKind::Awakeable)), Gap::Ran);
        assert_eq!(gap(&step("awk:spare", StepKind::Awakeable)), Gap::Parked);
        assert_eq!(gap(&step("child:ship/o-1", StepKind::Child)), Gap::Ran);
        assert_eq!(
            gap(&step("child:ship/o-1:result", StepKind::Child)),
            Gap::Parked
        );
        assert_eq!(gap(&Event::WorkflowCancelled), Gap::Other);
    }
}
