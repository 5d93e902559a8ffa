//! The invariants the chaos run must keep, checked from the database after it: the instance
//! rows, the journal table read directly, and the witnesses. Each store's rows are read into
//! the plain structs below (the `db` module), and these pure functions decide on both alike.
//!
//! 1. **Completed right**: every instance started is `completed`, with the output its input
//!    implies.
//! 2. **Journaled once**: no `(instance, generation, step)` has two journal rows (of any kind).
//! 3. **Witnessed**: every journaled step (kinds `step` and `remote`) has at least one witness:
//!    nothing was journaled that did not run.
//! 4. **No stale holder**: no witness of a step was written after that step was journaled by
//!    another holder, and no holder ran a step after a newer holder had. Precisely, for every
//!    witness `w` of a journaled step `j`:
//!    - *late*: `w.written_at > j.recorded_at` is a violation. `recorded_at` is the start of the
//!      transaction that journaled the step (the fenced append of a local step, the report of a
//!      remote one), on the database clock that also stamps `written_at`. (On SQLite both are
//!      the host's wall clock read while the file's write lock is held: the journaling
//!      transaction's operation, the witness's own transaction.) The holder that
//!      journaled the step wrote its own witness before its action returned, so strictly before
//!      that transaction began; a witness written after it is therefore another holder's (or
//!      the same holder's, running a step again after recording it: the same guarantee broken
//!      the other way). A stale worker running a step again after a newer holder recorded it
//!      trips this.
//!    - *stale epoch* (local steps, whose witnesses carry the lease epoch they ran under): a
//!      witness written after a witness of the same step by a newer epoch is a violation. The
//!      newer epoch was granted before its witness, so the older lease had already been lost
//!      when the older holder started the step: a double run after a lost lease that the
//!      journal happens not to show (the newer holder had not recorded the step yet) trips
//!      this.
//! 5. **Every step journaled**: every completed instance journaled each step of its workflow
//!    (kinds `step` and `remote`) and no other: the demo's check ([`proof::check_steps`]). A
//!    run that completed with the right output but without one of its steps in the journal
//!    passes 1 and 3; this catches it.
//!
//! The checks are pure functions over rows, so the unit tests feed them rows that break each
//! invariant.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use time::OffsetDateTime;

use super::workload::Output;
use crate::proof;

/// How many example lines each check keeps for the report.
const EXAMPLES: usize = 5;

/// `(workflow name, instance id, generation, step)`: a step's identity in the journal and in
/// the witnesses.
pub(crate) type StepKey = (String, String, i32, String);

/// An instance row.
#[derive(Debug, Clone)]
pub(crate) struct InstanceRow {
    /// The workflow name.
    pub(crate) name: String,
    /// The instance id.
    pub(crate) id: String,
    /// Its status.
    pub(crate) status: String,
    /// Its output, once completed.
    pub(crate) output: Option<Value>,
    /// Why it failed, if it did.
    pub(crate) last_error: Option<String>,
}

/// A journal row.
#[derive(Debug, Clone)]
pub(crate) struct JournalRow {
    /// Which step it records.
    pub(crate) key: StepKey,
    /// `step`, `remote`, `completed`, ...
    pub(crate) kind: String,
    /// The start of the transaction that wrote it.
    pub(crate) recorded_at: OffsetDateTime,
}

impl JournalRow {
    /// Whether the row records a step's result (local or remote), which needs a witness.
    fn is_step(&self) -> bool {
        self.kind == "step" || self.kind == "remote"
    }
}

/// A witness row.
#[derive(Debug, Clone)]
pub(crate) struct WitnessRow {
    /// Which step ran.
    pub(crate) key: StepKey,
    /// The process that ran it.
    pub(crate) pid: i64,
    /// The lease or claim it ran under.
    pub(crate) holder: String,
    /// The lease epoch, for local steps.
    pub(crate) epoch: Option<i64>,
    /// When it was written (database clock).
    pub(crate) written_at: OffsetDateTime,
}

/// An instance the run started, with the output it must end with.
#[derive(Debug, Clone)]
pub(crate) struct Expected {
    /// The workflow name.
    pub(crate) name: String,
    /// The instance id.
    pub(crate) id: String,
    /// The right output.
    pub(crate) output: Output,
    /// The journal names of the steps it must journal.
    pub(crate) steps: Vec<String>,
}

/// The rows the checks read.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    /// The chaos workflows' instance rows.
    pub(crate) instances: Vec<InstanceRow>,
    /// Their journal, every kind.
    pub(crate) journal: Vec<JournalRow>,
    /// Every witness.
    pub(crate) witnesses: Vec<WitnessRow>,
}

/// What one invariant check found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Check {
    /// How many violations.
    pub(crate) violations: u64,
    /// The first few, one line each.
    pub(crate) examples: Vec<String>,
}

impl Check {
    fn violation(&mut self, line: impl FnOnce() -> String) {
        self.violations += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(line());
        }
    }

    /// Whether the invariant held.
    pub(crate) fn held(&self) -> bool {
        self.violations == 0
    }
}

/// What the checks found, with the figures around them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Findings {
    /// Invariant 1.
    pub(crate) completed: Check,
    /// Invariant 2.
    pub(crate) journaled_once: Check,
    /// Invariant 3.
    pub(crate) witnessed: Check,
    /// Invariant 4, late witnesses.
    pub(crate) late: Check,
    /// Invariant 4, stale epochs.
    pub(crate) stale_epoch: Check,
    /// Invariant 5.
    pub(crate) all_journaled: Check,
    /// Instances completed with the right output.
    pub(crate) completed_ok: u64,
    /// Journal rows of steps (local and remote).
    pub(crate) journaled_steps: u64,
    /// Witness rows: every execution of a step.
    pub(crate) witnesses: u64,
}

impl Findings {
    /// Whether every invariant held.
    pub(crate) fn held(&self) -> bool {
        [
            &self.completed,
            &self.journaled_once,
            &self.witnessed,
            &self.late,
            &self.stale_epoch,
            &self.all_journaled,
        ]
        .iter()
        .all(|check| check.held())
    }

    /// At-least-once re-executions: executions beyond one per journaled step.
    pub(crate) fn re_executions(&self) -> i64 {
        i64::try_from(self.witnesses).unwrap_or(i64::MAX)
            - i64::try_from(self.journaled_steps).unwrap_or(i64::MAX)
    }
}

/// Runs every check over `rows`.
pub(crate) fn check(expected: &[Expected], rows: &Rows) -> Findings {
    let (completed, completed_ok) = check_completed(expected, &rows.instances);
    let (late, stale_epoch) = check_stale_holders(&rows.journal, &rows.witnesses);
    Findings {
        completed,
        journaled_once: check_journaled_once(&rows.journal),
        witnessed: check_witnessed(&rows.journal, &rows.witnesses),
        late,
        stale_epoch,
        all_journaled: check_all_journaled(expected, &rows.instances, &rows.journal),
        completed_ok,
        journaled_steps: rows.journal.iter().filter(|row| row.is_step()).count() as u64,
        witnesses: rows.witnesses.len() as u64,
    }
}

/// Invariant 1; also returns how many completed right.
pub(crate) fn check_completed(expected: &[Expected], instances: &[InstanceRow]) -> (Check, u64) {
    let rows: BTreeMap<(&str, &str), &InstanceRow> = instances
        .iter()
        .map(|row| ((row.name.as_str(), row.id.as_str()), row))
        .collect();
    let mut check = Check::default();
    let mut ok = 0;
    for instance in expected {
        let Some(row) = rows.get(&(instance.name.as_str(), instance.id.as_str())) else {
            check.violation(|| format!("{} {} has no instance row", instance.name, instance.id));
            continue;
        };
        if row.status != "completed" {
            check.violation(|| {
                let reason = row
                    .last_error
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                format!("{} is {}, not completed{reason}", row.id, row.status)
            });
            continue;
        }
        let output = row
            .output
            .clone()
            .and_then(|output| serde_json::from_value::<Output>(output).ok());
        if output == Some(instance.output) {
            ok += 1;
        } else {
            check.violation(|| {
                format!(
                    "{} completed with {output:?}, expected {:?}",
                    row.id, instance.output
                )
            });
        }
    }
    (check, ok)
}

/// Invariant 5: every step of every completed instance journaled, and no other.
pub(crate) fn check_all_journaled(
    expected: &[Expected],
    instances: &[InstanceRow],
    journal: &[JournalRow],
) -> Check {
    let completed: BTreeSet<(&str, &str)> = instances
        .iter()
        .filter(|row| row.status == "completed")
        .map(|row| (row.name.as_str(), row.id.as_str()))
        .collect();
    let expected: Vec<(String, Vec<String>)> = expected
        .iter()
        .filter(|e| completed.contains(&(e.name.as_str(), e.id.as_str())))
        .map(|e| (e.id.clone(), e.steps.clone()))
        .collect();
    let ids: BTreeSet<&str> = expected.iter().map(|(id, _)| id.as_str()).collect();
    let journaled = journal
        .iter()
        .filter(|row| row.is_step() && ids.contains(row.key.1.as_str()))
        .map(|row| (row.key.1.clone(), row.key.3.clone()))
        .collect();
    let found = proof::check_steps(&expected, &journaled);
    let mut check = Check::default();
    for line in found.missing.into_iter().chain(found.unknown) {
        check.violation(|| line);
    }
    check
}

/// Invariant 2, from the journal rows themselves (not trusting the unique key).
pub(crate) fn check_journaled_once(journal: &[JournalRow]) -> Check {
    let mut counts: BTreeMap<&StepKey, u64> = BTreeMap::new();
    for row in journal {
        *counts.entry(&row.key).or_default() += 1;
    }
    let mut check = Check::default();
    for ((_, id, generation, step), count) in counts {
        if count > 1 {
            check.violation(|| {
                format!("{id} generation {generation} step {step} is journaled {count} times")
            });
        }
    }
    check
}

/// Invariant 3.
pub(crate) fn check_witnessed(journal: &[JournalRow], witnesses: &[WitnessRow]) -> Check {
    let witnessed: BTreeSet<&StepKey> = witnesses.iter().map(|w| &w.key).collect();
    let mut check = Check::default();
    for row in journal.iter().filter(|row| row.is_step()) {
        if !witnessed.contains(&row.key) {
            let (_, id, generation, step) = &row.key;
            check.violation(|| {
                format!("{id} generation {generation} step {step} is journaled but never ran")
            });
        }
    }
    check
}

/// Invariant 4: the late witnesses, then the stale-epoch ones.
pub(crate) fn check_stale_holders(
    journal: &[JournalRow],
    witnesses: &[WitnessRow],
) -> (Check, Check) {
    let recorded: BTreeMap<&StepKey, OffsetDateTime> = journal
        .iter()
        .filter(|row| row.is_step())
        .map(|row| (&row.key, row.recorded_at))
        .collect();
    let mut late = Check::default();
    let mut by_step: BTreeMap<&StepKey, Vec<&WitnessRow>> = BTreeMap::new();
    for witness in witnesses {
        by_step.entry(&witness.key).or_default().push(witness);
        let Some(recorded_at) = recorded.get(&witness.key) else {
            continue;
        };
        if witness.written_at > *recorded_at {
            let (_, id, generation, step) = &witness.key;
            late.violation(|| {
                format!(
                    "{id} generation {generation} step {step} ran (pid {}, {}) {:.1} ms after it \
                     was journaled",
                    witness.pid,
                    witness.holder,
                    (witness.written_at - *recorded_at).as_seconds_f64() * 1000.0
                )
            });
        }
    }
    let mut stale = Check::default();
    for (key, mut runs) in by_step {
        runs.sort_by_key(|witness| witness.written_at);
        let mut newest: Option<&WitnessRow> = None;
        for witness in runs {
            let Some(epoch) = witness.epoch else {
                continue;
            };
            match newest {
                Some(newer) if newer.epoch.is_some_and(|newer| newer > epoch) => {
                    let (_, id, generation, step) = key;
                    stale.violation(|| {
                        format!(
                            "{id} generation {generation} step {step} ran under {} (pid {}) {:.1} \
                             ms after {} (pid {}) had run it under a newer lease",
                            witness.holder,
                            witness.pid,
                            (witness.written_at - newer.written_at).as_seconds_f64() * 1000.0,
                            newer.holder,
                            newer.pid
                        )
                    });
                }
                _ => newest = Some(witness),
            }
        }
    }
    (late, stale)
}

#[cfg(test)]
mod tests {
    use time::Duration;

    use super::*;

    fn at(ms: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + Duration::milliseconds(ms)
    }

    fn key(id: &str, step: &str) -> StepKey {
        ("chaos-local".into(), id.into(), 0, step.into())
    }

    fn journaled(id: &str, step: &str, ms: i64) -> JournalRow {
        JournalRow {
            key: key(id, step),
            kind: "step".into(),
            recorded_at: at(ms),
        }
    }

    fn witness(id: &str, step: &str, epoch: i64, ms: i64) -> WitnessRow {
        WitnessRow {
            key: key(id, step),
            pid: 100 + epoch,
            holder: format!("worker-{}#{epoch}", 100 + epoch),
            epoch: Some(epoch),
            written_at: at(ms),
        }
    }

    /// Instance `id` of `chaos-local`, whose steps here are `a` and `b`.
    fn expected(id: &str, chain: u64) -> Expected {
        Expected {
            name: "chaos-local".into(),
            id: id.into(),
            output: Output { n: 1, chain },
            steps: vec!["a".into(), "b".into()],
        }
    }

    fn instance(id: &str, status: &str, chain: Option<u64>) -> InstanceRow {
        InstanceRow {
            name: "chaos-local".into(),
            id: id.into(),
            status: status.into(),
            output: chain.map(|chain| serde_json::json!({ "n": 1, "chain": chain })),
            last_error: None,
        }
    }

    /// A clean history: two executions of `a` (the first cut by a kill), one of `b`.
    fn clean() -> Rows {
        Rows {
            instances: vec![instance("i1", "completed", Some(60))],
            journal: vec![
                journaled("i1", "a", 100),
                journaled("i1", "b", 200),
                JournalRow {
                    key: key("i1", "completed"),
                    kind: "completed".into(),
                    recorded_at: at(210),
                },
            ],
            witnesses: vec![
                witness("i1", "a", 1, 10),
                witness("i1", "a", 2, 90),
                witness("i1", "b", 2, 150),
            ],
        }
    }

    #[test]
    fn a_clean_history_keeps_every_invariant_and_counts_the_re_execution() {
        let findings = check(&[expected("i1", 60)], &clean());
        assert!(findings.held(), "{findings:?}");
        assert_eq!(findings.completed_ok, 1);
        assert_eq!(findings.journaled_steps, 2);
        assert_eq!(findings.witnesses, 3);
        assert_eq!(findings.re_executions(), 1);
    }

    #[test]
    fn an_instance_not_completed_or_with_a_wrong_output_or_missing_is_caught() {
        let instances = [
            instance("i1", "failed", None),
            instance("i2", "completed", Some(61)),
        ];
        let (check, ok) = check_completed(
            &[expected("i1", 60), expected("i2", 60), expected("i3", 60)],
            &instances,
        );
        assert_eq!((check.violations, ok), (3, 0), "{check:?}");
        assert!(check.examples[0].contains("failed"));
        assert!(check.examples[1].contains("expected"));
        assert!(check.examples[2].contains("no instance row"));
    }

    #[test]
    fn a_step_journaled_twice_is_caught() {
        let mut rows = clean();
        rows.journal.push(journaled("i1", "b", 300));
        let findings = check(&[expected("i1", 60)], &rows);
        assert_eq!(findings.journaled_once.violations, 1);
        assert!(findings.journaled_once.examples[0].contains("step b is journaled 2 times"));
        assert!(!findings.held());
    }

    #[test]
    fn a_completed_instance_without_one_of_its_steps_in_the_journal_is_caught() {
        // Completed with the right output, every journaled step witnessed: but `b` was never
        // journaled.
        let mut rows = clean();
        rows.journal.retain(|row| row.key.3 != "b");
        rows.witnesses.retain(|w| w.key.3 != "b");
        let findings = check(&[expected("i1", 60)], &rows);
        assert!(!findings.held(), "{findings:?}");
        assert_eq!(findings.all_journaled.violations, 1);
        assert!(
            findings.all_journaled.examples[0].contains("i1 step b was never journaled"),
            "{findings:?}"
        );
    }

    #[test]
    fn a_step_no_workflow_has_or_a_failed_instance_is_left_to_the_other_checks() {
        let mut rows = clean();
        rows.journal.push(journaled("i1", "z", 205));
        rows.witnesses.push(witness("i1", "z", 2, 204));
        let findings = check(&[expected("i1", 60)], &rows);
        assert_eq!(findings.all_journaled.violations, 1, "{findings:?}");
        assert!(findings.all_journaled.examples[0].contains("unknown step z"));
        // A failed instance is the first check's violation, not this one's.
        let failed = Rows {
            instances: vec![instance("i1", "failed", None)],
            journal: Vec::new(),
            witnesses: Vec::new(),
        };
        let findings = check(&[expected("i1", 60)], &failed);
        assert!(findings.all_journaled.held(), "{findings:?}");
        assert_eq!(findings.completed.violations, 1);
    }

    #[test]
    fn a_journaled_step_without_a_witness_is_caught() {
        let mut rows = clean();
        rows.witnesses.retain(|w| w.key.3 != "b");
        let findings = check(&[expected("i1", 60)], &rows);
        assert_eq!(findings.witnessed.violations, 1);
        assert!(findings.witnessed.examples[0].contains("step b"));
        assert!(!findings.held());
    }

    #[test]
    fn a_remote_step_needs_a_witness_too_but_a_marker_does_not() {
        let journal = vec![JournalRow {
            key: ("chaos-mixed".into(), "i5".into(), 0, "remote:enrich".into()),
            kind: "remote".into(),
            recorded_at: at(100),
        }];
        assert_eq!(check_witnessed(&journal, &[]).violations, 1);
        let markers = vec![JournalRow {
            kind: "completed".into(),
            ..journal[0].clone()
        }];
        assert!(check_witnessed(&markers, &[]).held());
    }

    #[test]
    fn a_witness_written_after_the_step_was_journaled_by_another_holder_is_caught() {
        // A stale holder (epoch 1) runs `b` again 50 ms after epoch 2 journaled it.
        let mut rows = clean();
        rows.witnesses.push(witness("i1", "b", 1, 250));
        let findings = check(&[expected("i1", 60)], &rows);
        assert_eq!(findings.late.violations, 1, "{findings:?}");
        assert!(findings.late.examples[0].contains("50.0 ms after it was journaled"));
        assert!(!findings.held());
    }

    #[test]
    fn a_remote_step_run_after_its_result_was_journaled_is_caught() {
        let key: StepKey = ("chaos-mixed".into(), "i5".into(), 0, "remote:enrich".into());
        let journal = [JournalRow {
            key: key.clone(),
            kind: "remote".into(),
            recorded_at: at(100),
        }];
        let run = |ms| WitnessRow {
            key: key.clone(),
            pid: 7,
            holder: "remote-7/attempt 1/dispatch 1".into(),
            epoch: None,
            written_at: at(ms),
        };
        let (late, stale) = check_stale_holders(&journal, &[run(50), run(120)]);
        assert_eq!(late.violations, 1);
        assert!(stale.held());
    }

    #[test]
    fn a_holder_running_a_step_after_a_newer_lease_did_is_caught_even_before_the_journal() {
        // Epoch 2 took over and ran `b` at 150; the stale epoch 1 still ran it at 170, before
        // epoch 2 journaled it at 200: not late, but a double run after a lost lease.
        let mut rows = clean();
        rows.witnesses.push(witness("i1", "b", 1, 170));
        let findings = check(&[expected("i1", 60)], &rows);
        assert!(findings.late.held());
        assert_eq!(findings.stale_epoch.violations, 1, "{findings:?}");
        assert!(findings.stale_epoch.examples[0].contains("20.0 ms after worker-102#2"));
        assert!(!findings.held());
    }

    #[test]
    fn the_same_holder_writing_twice_or_epochs_in_order_are_not_stale() {
        let witnesses = [
            witness("i1", "a", 1, 10),
            witness("i1", "a", 1, 20),
            witness("i1", "a", 3, 30),
            witness("i1", "a", 3, 40),
        ];
        let (late, stale) = check_stale_holders(&[journaled("i1", "a", 100)], &witnesses);
        assert!(late.held() && stale.held());
    }
}
