//! An operator's requeue of a failed instance and its failed children, and the start of a fix
//! with new input (`keiro_instance_requeue` and `keiro_instance_retry_with_input` in
//! `crates/migrations/functions/instance.sql`). They sit beside the remote tasks because a requeue
//! redispatches the tasks whose failures it supersedes.

use std::collections::BTreeSet;

use keiro_journal::store::{Append, Result};
use keiro_journal::{
    store::logical_step, store::marker_name, store::revised_step, store::step_revision, Envelope,
    Event, Generation, InstanceKey, Status, StepKind, StoreError,
};
use keiro_remote::{RequeueOutcome, RetryOutcome};
use serde_json::Value;
use time::OffsetDateTime;

use crate::sources::RETRY_MARK;
use crate::state::{clear_lease, reset_attempts, Entry, JournalRow};
use crate::State;

/// The stored name the next result of `stored`'s step goes under after a reset.
fn next_revision(stored: &str) -> String {
    revised_step(
        logical_step(stored),
        step_revision(stored).saturating_add(1),
    )
}

/// The child a `child:<name>/<id>:result[#n]` step awaits.
fn awaited_child(stored: &str) -> Option<InstanceKey> {
    let (name, id) = logical_step(stored)
        .strip_prefix("child:")?
        .strip_suffix(":result")?
        .split_once('/')?;
    InstanceKey::parse(name, id).ok()
}

/// A failure a requeue supersedes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// A remote step's journaled `{"error": ..}`.
    Remote,
    /// An awaited child's journaled `{"failed": ..}`.
    Child,
}

/// The current failures of one generation, in append order: the stored names of `remote`
/// rows holding an `error` and of child result rows holding a `failed`, leaving out every row
/// a `reset` row supersedes (the one stored under `__workflow_step_reset__:<its name>`).
fn current_failures(entry: &Entry, generation: Generation) -> Vec<(String, Failure)> {
    let has = |payload: &Value, field: &str| {
        payload
            .as_object()
            .is_some_and(|fields| fields.contains_key(field))
    };
    let child_result = |stored: &str| {
        let logical = logical_step(stored);
        logical.starts_with("child:") && logical.ends_with(":result")
    };
    let rows: Vec<&JournalRow> = entry.rows(generation).collect();
    // The reason the run failed with last: it names the failure the body did not handle.
    let reason = rows
        .iter()
        .rev()
        .find(|row| row.kind == "failed")
        .and_then(|row| row.payload.as_str())
        .unwrap_or_default();
    rows.iter()
        .enumerate()
        .filter_map(|(at, row)| {
            let failure = match row.kind {
                "remote" if has(&row.payload, "error") => Failure::Remote,
                "child" if has(&row.payload, "failed") && child_result(&row.step_name) => {
                    Failure::Child
                }
                _ => return None,
            };
            let reset = format!("{}{}", marker_name::STEP_RESET_PREFIX, row.step_name);
            if entry.step(generation, &reset).is_some() {
                return None;
            }
            // A failure the body went on past, recording steps of its own after it, was handled
            // (a fallback ran): resetting it would send a re-drive down the success path and
            // past the recorded fallback. Unless the run failed on it after all.
            let handled = rows[at + 1..].iter().any(|later| written_by_body(later))
                && !reason.contains(&failure_mention(&row.step_name));
            (!handled).then(|| (row.step_name.clone(), failure))
        })
        .collect()
}

/// Whether the body itself wrote this row (as opposed to a wake source delivering it), as
/// `keiro_journal_written_by_body` (migration 0013) decides.
fn written_by_body(row: &JournalRow) -> bool {
    match row.kind {
        "step" | "patch" | "race" | "attempt" => true,
        "child" => !logical_step(&row.step_name).ends_with(":result"),
        "awakeable" => row.step_name.starts_with("awkid:"),
        _ => false,
    }
}

/// How a run's failure reason names the failed remote step or child of `stored`
/// (`RemoteStepError` and `WorkflowError::ChildFailed` render them so).
fn failure_mention(stored: &str) -> String {
    let logical = logical_step(stored);
    if let Some(step) = logical.strip_prefix("remote:") {
        return format!("remote step {step:?} failed");
    }
    let child = logical
        .strip_prefix("child:")
        .and_then(|c| c.strip_suffix(":result"))
        .unwrap_or(logical);
    format!("child workflow {child} failed")
}

/// What a requeue has done so far, across the instances it reached.
#[derive(Debug)]
struct Requeue {
    /// Every instance requeued (or being requeued): the cycle guard.
    visited: BTreeSet<InstanceKey>,
    reset_steps: u64,
    children: Vec<InstanceKey>,
}

impl State {
    pub(super) fn instance_requeue(&mut self, key: &InstanceKey) -> Result<RequeueOutcome> {
        let Some(entry) = self.instances.get(key) else {
            return Ok(RequeueOutcome::NotFound);
        };
        if entry.row.status != Status::Failed {
            return Ok(RequeueOutcome::NotFailed(entry.row.status));
        }
        let mut requeue = Requeue {
            visited: BTreeSet::from([key.clone()]),
            reset_steps: 0,
            children: Vec::new(),
        };
        self.requeue_failed(key, &mut requeue)?;
        Ok(RequeueOutcome::Requeued {
            reset_steps: requeue.reset_steps,
            children: requeue.children,
        })
    }

    /// Requeues the failed instance `key`, and through it its failed children. The caller has
    /// checked that `key` is failed and put it in `visited`.
    ///
    /// A worklist, not recursion: a chain of failed children can be as deep as users nest
    /// them, and each level would cost a stack frame. Children are taken depth first in the
    /// order their parents' records name them, so `children` lists each before its own.
    fn requeue_failed(&mut self, key: &InstanceKey, requeue: &mut Requeue) -> Result<()> {
        let mut pending = self.requeue_one(key, requeue)?;
        pending.reverse();
        while let Some(child) = pending.pop() {
            requeue.children.push(child.clone());
            let found = self.requeue_one(&child, requeue)?;
            pending.extend(found.into_iter().rev());
        }
        Ok(())
    }

    /// Requeues the failed instance `key` alone and returns its failed children still to
    /// requeue, already in `visited`.
    fn requeue_one(
        &mut self,
        key: &InstanceKey,
        requeue: &mut Requeue,
    ) -> Result<Vec<InstanceKey>> {
        let now = self.clock.now();
        let entry = self
            .instances
            .get(key)
            .ok_or_else(|| StoreError::NotFound { key: key.clone() })?;
        let generation = entry.row.generation;
        let failures = current_failures(entry, generation);

        let mut redispatched = false;
        // Journaled once the row is running again: an append into a failed row is refused.
        let mut buffered = Vec::new();
        let mut found = Vec::new();
        for (stored, failure) in failures {
            self.reset_step(key, generation, &stored)?;
            requeue.reset_steps = requeue.reset_steps.saturating_add(1);
            let revised = next_revision(&stored);
            if failure == Failure::Remote {
                let task = self.tasks.by_id.values_mut().find(|task| {
                    task.key == *key && task.generation == generation && task.journal_step == stored
                });
                if let Some(task) = task {
                    task.journal_step = revised;
                    task.attempts = 0;
                    task.dispatches = 1;
                    task.last_error = None;
                    task.output = None;
                    task.settled_at = None;
                    task.make_available(now);
                    redispatched = true;
                }
                continue;
            }
            let Some(child) = awaited_child(&stored) else {
                continue;
            };
            if let Some(output) = self.buffered_success(key, generation, &child) {
                buffered.push((revised, output));
                continue;
            }
            self.relink(key, generation, &stored, &revised, now);
            let failed = self
                .instances
                .get(&child)
                .is_some_and(|entry| entry.row.status == Status::Failed);
            if failed && requeue.visited.insert(child.clone()) {
                found.push(child);
            }
        }

        let entry = self.entry_mut(key)?;
        let name = entry.repeatable_name(generation, marker_name::RESURRECTED);
        self.record(key, generation, name, &Event::Resurrected)?;
        let row = &mut self.entry_mut(key)?.row;
        row.status = Status::Running;
        reset_attempts(row);
        clear_lease(row);
        row.completed_at = None;
        row.wake_after = None;
        row.updated_at = now;
        self.wake(key);

        for (step, output) in buffered {
            let append = Append {
                key: key.clone(),
                generation: Some(generation),
                event: Event::StepRecorded {
                    step,
                    kind: StepKind::Child,
                    result: Envelope::ok(output),
                },
                fence: None,
                renew: None,
            };
            self.append(&append)?;
        }
        if redispatched {
            self.remote_tasks_ready();
        }
        Ok(found)
    }

    /// Supersedes the row stored as `stored` with a `StepReset`.
    pub(super) fn reset_step(
        &mut self,
        key: &InstanceKey,
        generation: Generation,
        stored: &str,
    ) -> Result<()> {
        let reset = Event::StepReset {
            step: logical_step(stored).to_owned(),
            superseded: stored.to_owned(),
        };
        let name = reset.step_name().into_owned();
        self.record(key, generation, name, &reset)
    }

    /// The output of a success the failed parent could not take: `child` itself completed,
    /// or a fix of it (`<id>~retry~<hex>`) linked to the parent's generation did; of several
    /// fixes, the first to complete.
    fn buffered_success(
        &self,
        parent: &InstanceKey,
        generation: Generation,
        child: &InstanceKey,
    ) -> Option<Value> {
        let output = |entry: &Entry| entry.row.output.clone().unwrap_or(Value::Null);
        if let Some(entry) = self.instances.get(child) {
            if entry.row.status == Status::Completed {
                return Some(output(entry));
            }
        }
        let prefix = format!("{}{RETRY_MARK}", child.id.as_str());
        self.children
            .get(parent)?
            .iter()
            .filter(|key| key.name == child.name && key.id.as_str().starts_with(&prefix))
            .filter_map(|key| self.instances.get(key))
            .filter(|entry| {
                entry.row.status == Status::Completed
                    && entry
                        .link
                        .as_ref()
                        .is_some_and(|link| link.generation == generation)
            })
            .min_by_key(|entry| (entry.row.completed_at, &entry.row.key))
            .map(output)
    }

    /// Points every instance linked to `parent`'s step `stored` (the child and its fixes) at
    /// `revised`, where its next result is awaited.
    pub(super) fn relink(
        &mut self,
        parent: &InstanceKey,
        generation: Generation,
        stored: &str,
        revised: &str,
        now: OffsetDateTime,
    ) {
        let Some(children) = self.children.get(parent) else {
            return;
        };
        for child in children {
            let Some(entry) = self.instances.get_mut(child) else {
                continue;
            };
            let Some(link) = entry.link.as_mut() else {
                continue;
            };
            if link.generation == generation && link.step == stored {
                revised.clone_into(&mut link.step);
                entry.row.updated_at = now;
            }
        }
    }

    pub(super) fn instance_retry_with_input(
        &mut self,
        origin: &InstanceKey,
        retry: &InstanceKey,
        input: &Value,
    ) -> Result<RetryOutcome> {
        let Some(entry) = self.instances.get(origin) else {
            return Ok(RetryOutcome::OriginNotFound);
        };
        if self.instances.contains_key(retry) {
            return Ok(RetryOutcome::Exists(retry.clone()));
        }
        let (parent, link, priority) = (
            entry.row.parent.clone(),
            entry.link.clone(),
            entry.row.priority,
        );
        self.instance_create(retry, input.clone(), parent, priority);
        self.entry_mut(retry)?.link = link;
        Ok(RetryOutcome::Started(retry.clone()))
    }
}
