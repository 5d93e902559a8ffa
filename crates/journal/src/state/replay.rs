//! Replay and divergence detection: a pure model of one generation's journal as a run
//! consumes it.
//!
//! # The divergence rule
//!
//! Replay is keyed by step name, so moving a step is safe. A run has *diverged* from its
//! journal, and stops with `NonDeterminism` before it does anything, when:
//!
//! 1. a call reads a recorded step of another kind (a `step` where an await was recorded);
//! 2. the body is about to do fresh work (run a step's action, arm an await) while a step
//!    that the body itself recorded earlier is still unconsumed — the recorded step was
//!    renamed, removed, or the body took another path past a recorded decision;
//! 3. the body returns while such a step is still unconsumed.
//!
//! Only steps the body records itself count for 2 and 3 (`ctx.step`, patch decisions, child
//! spawns, awakeable allocations, final failures of `step_with`), and remote results: a worker
//! journals a remote result from outside, but the task exists only because the body dispatched
//! it, so a recorded `remote:<step>` is evidence of the body's own call, as a spawn is. A
//! remote step still pending has no record and is not checked; after an operator's requeue
//! the superseded result no longer counts and its next revision (`remote:<step>#<n>`) counts
//! as the step. Values that may be journaled before the body reaches them — await results,
//! sleep fires, signals, child results, awakeable values — never count.
//!
//! Concurrent steps in one body (`join`) are not false positives: before its divergence check
//! a fresh call yields once, so every sibling future polled in the same round consumes its
//! recorded steps first, and replayed steps resolve without a store round trip.
//!
//! # Patch decisions
//!
//! The same model decides a patch met for the first time (no `patch:<id>` record): the old
//! branch exactly when a body-recorded step is still unconsumed at that point (after the same
//! yield), because then the old code ran past the patch and recorded what the new branch may
//! not match; the new branch otherwise. So the decision is taken per patch position, not per
//! run: a patch placed after a park still reaches runs that parked before it. Nothing but the
//! journal is evidence: an older run that parked on an await past the patch without recording
//! a step past it takes the new branch (the new code runs before the await is read, which the
//! journal does not contradict), and a remote step it dispatched past the patch counts only
//! once its result is journaled.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::model::event::{logical_step, revised_step, step_revision};
use crate::{encoded_len, Deliveries, Event, JournalEntry, StepKind};

/// What a lookup found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Lookup {
    /// Recorded by the same kind of call: replay this value.
    Hit(Value),
    /// Recorded by another kind of call.
    KindMismatch { recorded: StepKind },
    /// Not recorded: the call must do fresh work.
    Miss,
}

/// The generation's recorded steps and which of them this run has consumed.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    /// Each recorded step's kind, value, and journal position (`seq`; `None` for a value this
    /// run recorded itself, which comes after everything loaded).
    recorded: HashMap<String, (StepKind, Value, Option<i64>)>,
    /// Body-recorded steps in journal order, for a stable divergence report.
    body_order: Vec<String>,
    consumed: HashSet<String>,
    /// How many leading `body_order` steps are known consumed: consumption never reverts, so
    /// the search for the first unconsumed step resumes here instead of at the start, which
    /// keeps a fresh step's check O(1) however long the journal (a run of K steps checks K
    /// times).
    consumed_prefix: std::cell::Cell<usize>,
    /// Steps an operator reset, with the revision their next value is stored under.
    revisions: HashMap<String, u32>,
    /// The deliveries (`await` records) this run's awaits have read, each once.
    deliveries_read: Deliveries,
}

/// Whether the body itself records this step, as opposed to a wake source delivering it.
pub(crate) fn recorded_by_body(step: &str, kind: StepKind) -> bool {
    match kind {
        // A remote result exists only for a task the body dispatched.
        StepKind::Step | StepKind::Patch | StepKind::Remote => true,
        StepKind::Awakeable => step.starts_with("awkid:"),
        StepKind::Child => !step.ends_with(":result"),
        StepKind::Attempt => crate::model::event::is_final_attempt(step),
        StepKind::Race
        | StepKind::Event
        | StepKind::Stream
        | StepKind::Update
        | StepKind::Attributes => true,
        _ => false,
    }
}

impl Replay {
    /// Builds the model from one generation's entries.
    pub(crate) fn new(entries: &[JournalEntry]) -> Self {
        let mut replay = Self::default();
        for entry in entries {
            match &entry.event {
                // A revised step (`remote:x#2`) answers for its logical step.
                Event::StepRecorded { step, kind, result } => {
                    replay.insert(logical_step(step), *kind, result.clone(), Some(entry.seq));
                }
                // Entries come in append order, so a reset forgets exactly the records before
                // it, and the next revision (appended after it) is the one replayed.
                Event::StepReset { step, superseded } => {
                    replay.forget(step);
                    replay
                        .revisions
                        .insert(step.clone(), step_revision(superseded) + 1);
                }
                _ => {}
            }
        }
        replay
    }

    fn forget(&mut self, step: &str) {
        self.recorded.remove(step);
        self.body_order.retain(|s| s != step);
        self.consumed_prefix.set(0);
    }

    fn insert(&mut self, step: &str, kind: StepKind, value: Value, seq: Option<i64>) {
        if self.recorded.contains_key(step) {
            return; // first record wins, as in the store
        }
        if recorded_by_body(step, kind) {
            self.body_order.push(step.to_owned());
        }
        self.recorded.insert(step.to_owned(), (kind, value, seq));
    }

    /// Where `step`'s record sits in the journal (its `seq`), if it was loaded with the run;
    /// `None` for a step this run recorded itself, or none at all.
    pub(crate) fn position(&self, step: &str) -> Option<i64> {
        self.recorded.get(step).and_then(|(_, _, seq)| *seq)
    }

    /// The name the next value of `step` is stored under: `step` itself, or its next revision
    /// after an operator's reset. A park waits on this name, so a superseded record of the
    /// step does not count as its value having arrived.
    pub(crate) fn stored_name<'a>(&self, step: &'a str) -> std::borrow::Cow<'a, str> {
        match self.revisions.get(step) {
            Some(&revision) => revised_step(step, revision).into(),
            None => step.into(),
        }
    }

    /// Looks a step up and marks it consumed on a hit.
    pub(crate) fn lookup(&mut self, step: &str, kind: StepKind) -> Lookup {
        match self.recorded.get(step) {
            Some((recorded, value, _)) if *recorded == kind => {
                let value = value.clone();
                if self.consumed.insert(step.to_owned()) && kind == StepKind::Await {
                    self.deliveries_read.count += 1;
                    self.deliveries_read.bytes += encoded_len(&value);
                }
                Lookup::Hit(value)
            }
            Some((recorded, _, _)) => Lookup::KindMismatch {
                recorded: *recorded,
            },
            None => Lookup::Miss,
        }
    }

    /// The deliveries this run's awaits have read so far (each counted once): the whole
    /// generation's, since a drive replays it from the start.
    pub(crate) fn deliveries_read(&self) -> Deliveries {
        self.deliveries_read
    }

    /// Records a fresh result so a repeated name in the same run replays it.
    pub(crate) fn record_fresh(&mut self, step: &str, kind: StepKind, value: Value) {
        self.insert(step, kind, value, None);
        self.consumed.insert(step.to_owned());
    }

    /// Whether the generation holds a step whose name starts with `prefix` (recorded before or
    /// during this run).
    pub(crate) fn holds_prefix(&self, prefix: &str) -> bool {
        self.recorded.keys().any(|step| step.starts_with(prefix))
    }

    /// The first body-recorded step the run has not reached, if any.
    pub(crate) fn first_unconsumed(&self) -> Option<&str> {
        let mut at = self.consumed_prefix.get();
        while self
            .body_order
            .get(at)
            .is_some_and(|s| self.consumed.contains(s))
        {
            at += 1;
        }
        self.consumed_prefix.set(at);
        self.body_order.get(at).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use time::OffsetDateTime;

    fn entry(seq: i64, step: &str, kind: StepKind) -> JournalEntry {
        JournalEntry {
            seq,
            generation: 0,
            event: Event::StepRecorded {
                step: step.into(),
                kind,
                result: json!(seq),
            },
            recorded_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn hits_consume_and_misses_do_not() {
        let mut r = Replay::new(&[entry(1, "a", StepKind::Step), entry(2, "b", StepKind::Step)]);
        assert_eq!(r.first_unconsumed(), Some("a"));
        assert_eq!(r.lookup("a", StepKind::Step), Lookup::Hit(json!(1)));
        assert_eq!(r.first_unconsumed(), Some("b"));
        assert_eq!(r.lookup("c", StepKind::Step), Lookup::Miss);
        assert_eq!(r.lookup("b", StepKind::Step), Lookup::Hit(json!(2)));
        assert_eq!(r.first_unconsumed(), None);
    }

    fn reset(seq: i64, superseded: &str) -> JournalEntry {
        JournalEntry {
            seq,
            generation: 0,
            event: Event::StepReset {
                step: "remote:label".into(),
                superseded: superseded.into(),
            },
            recorded_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_reset_step_is_awaited_again_and_its_revision_replays() {
        let mut r = Replay::new(&[
            entry(1, "remote:label", StepKind::Remote),
            reset(2, "remote:label"),
        ]);
        assert_eq!(r.lookup("remote:label", StepKind::Remote), Lookup::Miss);
        assert_eq!(r.stored_name("remote:label"), "remote:label#1");
        assert_eq!(r.stored_name("remote:other"), "remote:other");
        let mut r = Replay::new(&[
            entry(1, "remote:label", StepKind::Remote),
            reset(2, "remote:label"),
            entry(3, "remote:label#1", StepKind::Remote),
        ]);
        assert_eq!(
            r.lookup("remote:label", StepKind::Remote),
            Lookup::Hit(json!(3))
        );
    }

    #[test]
    fn a_remote_result_counts_as_reached_only_while_it_is_current() {
        let mut r = Replay::new(&[
            entry(1, "remote:label", StepKind::Remote),
            entry(2, "after", StepKind::Step),
        ]);
        assert_eq!(r.first_unconsumed(), Some("remote:label"));
        assert_eq!(
            r.lookup("remote:label", StepKind::Remote),
            Lookup::Hit(json!(1))
        );
        assert_eq!(r.first_unconsumed(), Some("after"));
        // A superseded result waits for its next revision, which then counts as the step.
        let r = Replay::new(&[
            entry(1, "remote:label", StepKind::Remote),
            reset(2, "remote:label"),
        ]);
        assert_eq!(r.first_unconsumed(), None);
        let mut r = Replay::new(&[
            entry(1, "remote:label", StepKind::Remote),
            reset(2, "remote:label"),
            entry(3, "remote:label#1", StepKind::Remote),
        ]);
        assert_eq!(r.first_unconsumed(), Some("remote:label"));
        assert_eq!(
            r.lookup("remote:label", StepKind::Remote),
            Lookup::Hit(json!(3))
        );
        assert_eq!(r.first_unconsumed(), None);
    }

    #[test]
    fn steps_consumed_out_of_order_are_found_past_the_first_unconsumed() {
        let mut r = Replay::new(&[
            entry(1, "a", StepKind::Step),
            entry(2, "b", StepKind::Step),
            entry(3, "c", StepKind::Step),
        ]);
        assert_eq!(r.lookup("b", StepKind::Step), Lookup::Hit(json!(2)));
        assert_eq!(r.first_unconsumed(), Some("a"));
        assert_eq!(r.lookup("a", StepKind::Step), Lookup::Hit(json!(1)));
        assert_eq!(r.first_unconsumed(), Some("c"));
        r.record_fresh("d", StepKind::Step, json!(4));
        assert_eq!(r.first_unconsumed(), Some("c"));
        assert_eq!(r.lookup("c", StepKind::Step), Lookup::Hit(json!(3)));
        assert_eq!(r.first_unconsumed(), None);
        r.record_fresh("e", StepKind::Step, json!(5));
        assert_eq!(r.first_unconsumed(), None);
    }

    #[test]
    fn a_loaded_step_knows_its_journal_position_and_a_fresh_one_does_not() {
        let mut r = Replay::new(&[
            entry(7, "a", StepKind::Sleep),
            entry(9, "a", StepKind::Sleep),
        ]);
        assert_eq!(r.position("a"), Some(7), "the first record wins");
        r.record_fresh("b", StepKind::Step, json!(1));
        assert_eq!(r.position("b"), None);
        assert_eq!(r.position("c"), None);
    }

    #[test]
    fn kind_mismatch_is_reported() {
        let mut r = Replay::new(&[entry(1, "a", StepKind::Await)]);
        assert_eq!(
            r.lookup("a", StepKind::Step),
            Lookup::KindMismatch {
                recorded: StepKind::Await
            }
        );
    }

    #[test]
    fn externally_delivered_values_never_count_as_unreached() {
        let r = Replay::new(&[
            entry(1, "approval", StepKind::Await),
            entry(2, "sleep:x", StepKind::Sleep),
            entry(3, "child:c1:result", StepKind::Child),
            entry(4, "awk:123", StepKind::Awakeable),
        ]);
        assert_eq!(r.first_unconsumed(), None);
        let r = Replay::new(&[
            entry(1, "child:c1", StepKind::Child),
            entry(2, "awkid:a", StepKind::Awakeable),
        ]);
        assert_eq!(r.first_unconsumed(), Some("child:c1"));
    }
}
