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
//!
//! Under `--profile queue` ([`check_queue`]), three more, over the same rows:
//!
//! 6. **Admitted**: every run is on the queue under its key, its row records an admission
//!    (`queue_admitted_at`, the first one's instant), no run that ended still holds its slot,
//!    and no step of a run began before its first admission.
//! 7. **Concurrency**: at no instant were more than `C` runs in a local step at once.
//! 8. **Key concurrency**: at no instant were more than `key_concurrency` (1) runs of one key in
//!    a local step at once.
//!
//!    A step counts from its witness (`written_at`) to its end (`ended_at`), both on the
//!    database clock, as the span of one run: the number at an instant is of distinct runs with
//!    a step in it, begins counted before ends at the same instant. A step with no end (its
//!    worker was killed inside it) counts until the expiry its run's lease had when the step
//!    began (`lease_expires_at`, read with the witness, and only while the lease was the
//!    step's own epoch): its slot was held at least that long, since nothing gives a slot back
//!    early but the run's own release (after the step) and the lease's expiry, so the span is
//!    never counted past its slot, nor cut short to nothing. Not `written_at` plus the TTL:
//!    the last renewal (the claim, or the previous step's append) came before the step began,
//!    so that would run past the expiry by the gap between the two, and a run admitted into the
//!    freed slot within it would count as an overlap that never was. A step that ended after
//!    that expiry is cut there too (`cut_at_lease` in the report): past it the lease, and with
//!    it the slot, may be gone, and what a worker does past its lease is what fencing (and
//!    invariant 4) answers, not admission. Only when the lease was no longer the step's own
//!    (or unknown) does an unended step count for the workers' lease TTL from its witness.
//!    Remote steps are not counted: a run parks for them, and a parked run gives its slot back
//!    (the queue's `release_on_park`, on by default), so they run outside the limit by design.
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
    /// The queue it was started on.
    pub(crate) queue: Option<String>,
    /// Its key on the queue.
    pub(crate) queue_key: Option<String>,
    /// Whether it holds a slot of its queue (or did when it last held a lease).
    pub(crate) queue_admitted: bool,
    /// Its first admission, if any.
    pub(crate) queue_admitted_at: Option<OffsetDateTime>,
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
    /// When it was written (database clock): the step began.
    pub(crate) written_at: OffsetDateTime,
    /// The expiry the run's lease had as the witness was written, if the lease was still the
    /// epoch's the step ran under.
    pub(crate) lease_expires_at: Option<OffsetDateTime>,
    /// When the step's work was done (database clock; `--profile queue` only), if its worker
    /// lived to write it.
    pub(crate) ended_at: Option<OffsetDateTime>,
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
    /// Its key on the queue (`--profile queue`).
    pub(crate) queue_key: Option<String>,
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

/// The queue of `--profile queue` and the limits it was declared with.
#[derive(Debug, Clone)]
pub(crate) struct QueueLimits {
    /// The queue's name.
    pub(crate) name: String,
    /// Runs at once, fleet-wide.
    pub(crate) concurrency: u64,
    /// Runs at once per key.
    pub(crate) key_concurrency: u64,
    /// The workers' lease TTL: how long an unended step counts when its lease is unknown.
    pub(crate) lease_ttl: time::Duration,
}

/// What the queue checks found (invariants 6 to 8), with the figures around them.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueueFindings {
    /// Invariant 6.
    pub(crate) admitted: Check,
    /// Invariant 7.
    pub(crate) concurrency: Check,
    /// Invariant 8.
    pub(crate) key_concurrency: Check,
    /// Runs whose row records an admission.
    pub(crate) admitted_runs: u64,
    /// The most runs in a local step at once.
    pub(crate) max_running: u64,
    /// The most runs of one key in a local step at once.
    pub(crate) max_running_per_key: u64,
    /// Local step executions counted (witnesses).
    pub(crate) steps: u64,
    /// Of them, those with no end: counted until their lease's expiry.
    pub(crate) unended: u64,
    /// Of them, those that ended after their lease's expiry: cut there.
    pub(crate) cut_at_lease: u64,
}

impl QueueFindings {
    /// Whether every queue invariant held.
    pub(crate) fn held(&self) -> bool {
        self.admitted.held() && self.concurrency.held() && self.key_concurrency.held()
    }
}

/// The span a local step counts for in invariants 7 and 8 (the module says why): from its
/// witness to its end, cut at the expiry its lease had as it began; with no end, until that
/// expiry; with no lease of its own, `lease_ttl` stands in for it. Never shorter than an
/// instant. Also says whether the span was cut at the lease.
pub(crate) fn step_span(
    witness: &WitnessRow,
    lease_ttl: time::Duration,
) -> (OffsetDateTime, OffsetDateTime, bool) {
    let begin = witness.written_at;
    let bound = witness
        .lease_expires_at
        .unwrap_or_else(|| begin.saturating_add(lease_ttl));
    let (end, cut) = match witness.ended_at {
        Some(ended) if ended > bound => (bound, true),
        Some(ended) => (ended, false),
        None => (bound, false),
    };
    (begin, end.max(begin), cut)
}

/// Invariants 6 to 8 over the runs of `expected` started on `limits`' queue.
pub(crate) fn check_queue(
    expected: &[Expected],
    rows: &Rows,
    limits: &QueueLimits,
) -> QueueFindings {
    let keys: BTreeMap<(&str, &str), &str> = expected
        .iter()
        .filter_map(|e| Some(((e.name.as_str(), e.id.as_str()), e.queue_key.as_deref()?)))
        .collect();
    let local: Vec<&WitnessRow> = rows
        .witnesses
        .iter()
        .filter(|w| w.epoch.is_some() && keys.contains_key(&(w.key.0.as_str(), w.key.1.as_str())))
        .collect();
    let mut findings = check_admitted(&keys, &rows.instances, &local, &limits.name);
    let mut spans = Vec::with_capacity(local.len());
    for witness in &local {
        let (begin, end, cut) = step_span(witness, limits.lease_ttl);
        findings.unended += u64::from(witness.ended_at.is_none());
        findings.cut_at_lease += u64::from(cut);
        let run = (witness.key.0.as_str(), witness.key.1.as_str());
        spans.push(Span {
            run,
            key: keys.get(&run).copied().unwrap_or_default(),
            begin,
            end,
        });
    }
    findings.steps = spans.len() as u64;
    let overlap = overlaps(&spans, limits);
    findings.max_running = overlap.max_running;
    findings.max_running_per_key = overlap.max_per_key;
    findings.concurrency = overlap.concurrency;
    findings.key_concurrency = overlap.key_concurrency;
    findings
}

/// Invariant 6, over the instance rows of the runs `keys` names and their local witnesses;
/// also counts the admissions recorded.
fn check_admitted(
    keys: &BTreeMap<(&str, &str), &str>,
    instances: &[InstanceRow],
    local: &[&WitnessRow],
    queue: &str,
) -> QueueFindings {
    let mut findings = QueueFindings::default();
    let mut admitted_at: BTreeMap<(&str, &str), OffsetDateTime> = BTreeMap::new();
    let check = &mut findings.admitted;
    for row in instances {
        let run = (row.name.as_str(), row.id.as_str());
        let Some(key) = keys.get(&run) else {
            continue;
        };
        if row.queue.as_deref() != Some(queue) || row.queue_key.as_deref() != Some(*key) {
            check.violation(|| {
                format!(
                    "{} is on queue {:?} under key {:?}, not {queue} under {key}",
                    row.id, row.queue, row.queue_key
                )
            });
        }
        match row.queue_admitted_at {
            Some(at) => {
                findings.admitted_runs += 1;
                admitted_at.insert(run, at);
            }
            None => check.violation(|| format!("{} ({}) records no admission", row.id, row.status)),
        }
        if row.queue_admitted && !matches!(row.status.as_str(), "running" | "suspended") {
            check.violation(|| format!("{} is {} and still holds its slot", row.id, row.status));
        }
    }
    for witness in local {
        let run = (witness.key.0.as_str(), witness.key.1.as_str());
        if let Some(at) = admitted_at.get(&run) {
            if witness.written_at < *at {
                check.violation(|| {
                    format!(
                        "{} ran step {} {:.1} ms before its first admission",
                        run.1,
                        witness.key.3,
                        (*at - witness.written_at).as_seconds_f64() * 1000.0
                    )
                });
            }
        }
    }
    findings
}

/// One run's local step, as counted.
struct Span<'a> {
    run: (&'a str, &'a str),
    key: &'a str,
    begin: OffsetDateTime,
    end: OffsetDateTime,
}

/// What the sweep over the spans found.
#[derive(Default)]
struct Overlap {
    max_running: u64,
    max_per_key: u64,
    concurrency: Check,
    key_concurrency: Check,
}

/// Sweeps the spans in time order (begins before ends at one instant) counting the distinct
/// runs in a step, fleet-wide and per key; each begin that takes a count past its limit is a
/// violation, named with the runs in a step then.
fn overlaps(spans: &[Span<'_>], limits: &QueueLimits) -> Overlap {
    let mut events: Vec<(OffsetDateTime, bool, usize)> = spans
        .iter()
        .enumerate()
        .flat_map(|(index, span)| [(span.begin, false, index), (span.end, true, index)])
        .collect();
    // `false` (a begin) sorts before `true` (an end): spans that touch overlap.
    events.sort();
    let mut steps_in: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    let mut per_key: BTreeMap<&str, BTreeSet<(&str, &str)>> = BTreeMap::new();
    let mut overlap = Overlap::default();
    for (at, is_end, index) in events {
        let span = &spans[index];
        let count = steps_in.entry(span.run).or_default();
        if is_end {
            *count -= 1;
            if *count == 0 {
                steps_in.remove(&span.run);
                if let Some(runs) = per_key.get_mut(span.key) {
                    runs.remove(&span.run);
                }
            }
            continue;
        }
        *count += 1;
        if *count > 1 {
            // The run was in a step already (a step run again under a newer lease, while the
            // killed one's counts on): one run.
            continue;
        }
        let running = steps_in.len() as u64;
        let key_runs = per_key.entry(span.key).or_default();
        key_runs.insert(span.run);
        let of_key = key_runs.len() as u64;
        overlap.max_running = overlap.max_running.max(running);
        overlap.max_per_key = overlap.max_per_key.max(of_key);
        if running > limits.concurrency {
            overlap.concurrency.violation(|| {
                let ids: Vec<&str> = steps_in.keys().map(|run| run.1).collect();
                format!(
                    "{running} runs in a step at once at {at} (limit {}): {}",
                    limits.concurrency,
                    ids.join(", ")
                )
            });
        }
        if of_key > limits.key_concurrency {
            overlap.key_concurrency.violation(|| {
                let ids: Vec<&str> = key_runs.iter().map(|run| run.1).collect();
                format!(
                    "{of_key} runs of key {} in a step at once at {at} (limit {}): {}",
                    span.key,
                    limits.key_concurrency,
                    ids.join(", ")
                )
            });
        }
    }
    overlap
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
            lease_expires_at: None,
            ended_at: None,
        }
    }

    /// Instance `id` of `chaos-local`, whose steps here are `a` and `b`.
    fn expected(id: &str, chain: u64) -> Expected {
        Expected {
            name: "chaos-local".into(),
            id: id.into(),
            output: Output { n: 1, chain },
            steps: vec!["a".into(), "b".into()],
            queue_key: None,
        }
    }

    fn instance(id: &str, status: &str, chain: Option<u64>) -> InstanceRow {
        InstanceRow {
            name: "chaos-local".into(),
            id: id.into(),
            status: status.into(),
            output: chain.map(|chain| serde_json::json!({ "n": 1, "chain": chain })),
            last_error: None,
            queue: None,
            queue_key: None,
            queue_admitted: false,
            queue_admitted_at: None,
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
            lease_expires_at: None,
            ended_at: None,
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

    /// The queue of the queue tests: two runs at once, one per key, a 2 s lease.
    fn limits() -> QueueLimits {
        QueueLimits {
            name: "chaos-q".into(),
            concurrency: 2,
            key_concurrency: 1,
            lease_ttl: Duration::milliseconds(2_000),
        }
    }

    fn queued(id: &str, key: &str) -> Expected {
        Expected {
            queue_key: Some(key.into()),
            ..expected(id, 60)
        }
    }

    /// Run `id` completed on the queue under `key`, first admitted at `admitted` ms.
    fn queued_row(id: &str, key: &str, admitted: i64) -> InstanceRow {
        InstanceRow {
            queue: Some("chaos-q".into()),
            queue_key: Some(key.into()),
            queue_admitted_at: Some(at(admitted)),
            ..instance(id, "completed", Some(60))
        }
    }

    /// A step of run `id` under `epoch` from `begin` to `end` (none: its worker was killed),
    /// its lease then expiring at `lease`.
    fn step(id: &str, epoch: i64, begin: i64, end: Option<i64>, lease: Option<i64>) -> WitnessRow {
        WitnessRow {
            lease_expires_at: lease.map(at),
            ended_at: end.map(at),
            ..witness(id, "a", epoch, begin)
        }
    }

    /// Runs r1 and r3 on key `k1`, r2 and r4 on `k2`, all admitted at 0, with `steps`.
    fn queue_rows(steps: Vec<WitnessRow>) -> (Vec<Expected>, Rows) {
        let runs = [("r1", "k1"), ("r2", "k2"), ("r3", "k1"), ("r4", "k2")];
        let expected = runs.iter().map(|(id, key)| queued(id, key)).collect();
        let rows = Rows {
            instances: runs
                .iter()
                .map(|(id, key)| queued_row(id, key, 0))
                .collect(),
            journal: Vec::new(),
            witnesses: steps,
        };
        (expected, rows)
    }

    #[test]
    fn runs_within_the_limits_pass_and_report_the_most_at_once() {
        let (expected, rows) = queue_rows(vec![
            step("r1", 1, 10, Some(50), Some(2_000)),
            step("r2", 1, 20, Some(60), Some(2_000)),
            // r3 waits for r1 (same key) and for a slot; r4 takes r2's slot after it.
            step("r3", 1, 55, Some(90), Some(2_050)),
            step("r4", 1, 61, Some(95), Some(2_060)),
        ]);
        let found = check_queue(&expected, &rows, &limits());
        assert!(found.held(), "{found:?}");
        assert_eq!((found.max_running, found.max_running_per_key), (2, 1));
        assert_eq!((found.steps, found.unended, found.cut_at_lease), (4, 0, 0));
        assert_eq!(found.admitted_runs, 4);
    }

    #[test]
    fn more_runs_at_once_than_the_queue_or_a_key_allows_is_caught() {
        let (expected, rows) = queue_rows(vec![
            step("r1", 1, 10, Some(50), Some(2_000)),
            step("r2", 1, 20, Some(60), Some(2_000)),
            // A third run while two are in a step, and the second of key k1 at once.
            step("r3", 1, 30, Some(40), Some(2_000)),
        ]);
        let found = check_queue(&expected, &rows, &limits());
        assert!(!found.held());
        assert_eq!(found.concurrency.violations, 1, "{found:?}");
        assert!(
            found.concurrency.examples[0].contains("3 runs in a step at once")
                && found.concurrency.examples[0].contains("r1, r2, r3"),
            "{found:?}"
        );
        assert_eq!(found.key_concurrency.violations, 1, "{found:?}");
        assert!(found.key_concurrency.examples[0].contains("2 runs of key k1"));
        assert_eq!((found.max_running, found.max_running_per_key), (3, 2));
        // Spans that touch overlap: r3 beginning at the instant r1 ends is two of k1 at once.
        let (expected, rows) = queue_rows(vec![
            step("r1", 1, 10, Some(50), Some(2_000)),
            step("r3", 1, 50, Some(60), Some(2_000)),
        ]);
        assert_eq!(
            check_queue(&expected, &rows, &limits())
                .key_concurrency
                .violations,
            1
        );
    }

    #[test]
    fn a_step_its_worker_never_ended_counts_until_its_lease_expired_not_forever_nor_not_at_all() {
        // r1's worker was killed inside the step that began at 10; its lease (last renewed
        // before the step) expired at 1_900, and admission may give its slot away after that.
        let killed = step("r1", 1, 10, None, Some(1_900));
        // r3 (same key) in a step at 300: inside r1's slot, so two of k1 at once.
        let (expected, rows) = queue_rows(vec![
            killed.clone(),
            step("r3", 1, 300, Some(350), Some(2_300)),
        ]);
        let found = check_queue(&expected, &rows, &limits());
        assert_eq!(found.key_concurrency.violations, 1, "{found:?}");
        assert_eq!(found.unended, 1);
        // At 1_950 the slot is gone: no overlap, although 10 + the 2 s TTL is later still.
        let (expected, rows) = queue_rows(vec![
            killed.clone(),
            step("r3", 1, 1_950, Some(2_000), Some(3_950)),
        ]);
        let found = check_queue(&expected, &rows, &limits());
        assert!(found.held(), "{found:?}");
        // r1 itself, admitted again and running the step again under epoch 2 (even while its
        // killed step still counts), is one run, not two.
        let (expected, rows) = queue_rows(vec![
            killed,
            step("r1", 2, 1_000, Some(1_050), Some(3_000)),
            step("r2", 1, 1_020, Some(1_060), Some(3_020)),
        ]);
        let found = check_queue(&expected, &rows, &limits());
        assert!(found.held(), "{found:?}");
        assert_eq!(found.max_running, 2);
    }

    #[test]
    fn an_unended_step_without_its_own_lease_counts_for_the_ttl_and_a_late_end_is_cut() {
        // No lease of its own as it began: 10 + 2_000.
        let stale = step("r1", 1, 10, None, None);
        assert_eq!(
            step_span(&stale, limits().lease_ttl),
            (at(10), at(2_010), false)
        );
        let (expected, rows) =
            queue_rows(vec![stale.clone(), step("r3", 1, 1_500, Some(1_600), None)]);
        assert_eq!(
            check_queue(&expected, &rows, &limits())
                .key_concurrency
                .violations,
            1
        );
        let (expected, rows) = queue_rows(vec![stale, step("r3", 1, 2_100, Some(2_200), None)]);
        assert!(check_queue(&expected, &rows, &limits()).held());
        // Ended at 900, past the lease that expired at 500: counted to 500.
        let late = step("r1", 1, 10, Some(900), Some(500));
        assert_eq!(
            step_span(&late, limits().lease_ttl),
            (at(10), at(500), true)
        );
        let (expected, rows) = queue_rows(vec![late, step("r3", 1, 700, Some(800), Some(2_700))]);
        let found = check_queue(&expected, &rows, &limits());
        assert!(found.held(), "{found:?}");
        assert_eq!(found.cut_at_lease, 1);
        // A lease already expired as the step began: an instant, never a negative span.
        let expired = step("r1", 1, 600, None, Some(500));
        assert_eq!(
            step_span(&expired, limits().lease_ttl),
            (at(600), at(600), false)
        );
    }

    #[test]
    fn remote_steps_run_outside_the_slot_and_are_not_counted() {
        let remote = |id: &str| WitnessRow {
            epoch: None,
            ended_at: Some(at(100)),
            ..witness(id, "remote:enrich", 0, 10)
        };
        let (expected, rows) = queue_rows(vec![remote("r1"), remote("r2"), remote("r3")]);
        let found = check_queue(&expected, &rows, &limits());
        assert!(found.held(), "{found:?}");
        assert_eq!((found.steps, found.max_running), (0, 0));
    }

    #[test]
    fn a_run_off_its_queue_unadmitted_holding_a_slot_or_stepping_before_admission_is_caught() {
        let (expected, mut rows) = queue_rows(vec![step("r4", 1, 5, Some(8), Some(2_000))]);
        rows.instances[0].queue_key = Some("k2".into());
        rows.instances[1].queue_admitted_at = None;
        rows.instances[2].queue_admitted = true;
        rows.instances[3].queue_admitted_at = Some(at(20));
        let found = check_queue(&expected, &rows, &limits());
        assert_eq!(found.admitted.violations, 4, "{found:?}");
        let lines = found.admitted.examples.join("\n");
        assert!(
            lines.contains("r1 is on queue Some(\"chaos-q\") under key Some(\"k2\")"),
            "{lines}"
        );
        assert!(
            lines.contains("r2 (completed) records no admission"),
            "{lines}"
        );
        assert!(
            lines.contains("r3 is completed and still holds its slot"),
            "{lines}"
        );
        assert!(
            lines.contains("r4 ran step a 15.0 ms before its first admission"),
            "{lines}"
        );
        assert_eq!(found.admitted_runs, 3);
        assert!(!found.held());
    }
}
