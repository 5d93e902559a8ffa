//! Remote steps in memory: the task table, the rules of
//! [`JournalStore::remote_arm`](keiro_journal::JournalStore::remote_arm), and [`Transport`] and
//! [`RemoteAdmin`] for [`MemoryStore`], each one critical section. An operator's requeue and
//! retry-with-input are in [`requeue`].
//!
//! A task is keyed by its step id, like the table's primary key; first arm wins. Every result
//! reaches the owner's journal through [`State::append`] unfenced, the function behind
//! `journal_append`, so the generation check, the recorded-step convergence, the terminal
//! refusal and the `suspended` -> `running` flip with its wake are those of every other wake
//! source. The store lock stands in for the row locks and `SKIP LOCKED` of the Postgres
//! functions: an arm, a claim and a report never interleave.
//!
//! Every time comparison (availability, claim expiry, redispatch deadline) reads the store
//! clock, so tests move it with `set_now` instead of sleeping.
//!
//! Claims scan the table rather than an index of pending tasks: the memory store serves tests
//! and embedding, where the table stays small.

use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::time::Duration;

use keiro_journal::store::{Append, AppendOutcome, Result};
use keiro_journal::{span::traced, store_span};
use keiro_journal::{
    store::RemoteArm, store::RemoteArmOutcome, Backoff, Envelope, Event, Generation, InstanceKey,
    RemoteStepError, StepKind, StoreError,
};
use keiro_remote::{
    ClaimRequest, ClaimedTask, HeartbeatOutcome, RemoteAdmin, RemoteTask, ReportOutcome,
    RequeueOutcome, RetryOutcome, TaskFailure, TaskStatus, Transport,
};
use serde_json::{json, Value};
use time::OffsetDateTime;
use uuid::Uuid;

mod requeue;

use crate::clock::later;
use crate::state::{holds, lease_lost};
use crate::State;
use crate::{storable, MemoryStore};

/// The remote task table.
#[derive(Debug, Default)]
pub(crate) struct Tasks {
    by_id: BTreeMap<String, Task>,
    /// Tasks written so far: each task's `order`.
    written: u64,
}

/// One remote task row.
#[derive(Debug, Clone)]
struct Task {
    step_id: String,
    key: InstanceKey,
    generation: Generation,
    step: String,
    journal_step: String,
    group: String,
    input: Value,
    priority: i32,
    traceparent: Option<String>,
    status: TaskStatus,
    /// Failed attempts so far.
    attempts: u32,
    max_attempts: u32,
    backoff: Backoff,
    dispatches: u32,
    redispatch_after: Option<Duration>,
    redispatch_max: u32,
    deadline_at: Option<OffsetDateTime>,
    available_at: OffsetDateTime,
    claim: Option<Uuid>,
    claimed_by: Option<String>,
    claim_expires_at: Option<OffsetDateTime>,
    output: Option<Value>,
    /// `{message, code, retryable}` of the last failure.
    last_error: Option<Value>,
    created_at: OffsetDateTime,
    updated_at: OffsetDateTime,
    settled_at: Option<OffsetDateTime>,
    /// Write order: breaks ties of `created_at` (a pinned clock gives every task the same
    /// one) by age, as distinct transaction timestamps do in Postgres.
    order: u64,
}

impl Task {
    /// Whether the task is final: settled by a result, or cancelled with its run.
    fn is_settled(&self) -> bool {
        matches!(
            self.status,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }

    fn drop_claim(&mut self) {
        self.claim = None;
        self.claimed_by = None;
        self.claim_expires_at = None;
    }

    /// The redispatch deadline of a dispatch that becomes available at `at`.
    fn deadline_after(&self, at: OffsetDateTime) -> Option<OffsetDateTime> {
        self.redispatch_after.map(|after| later(at, after))
    }

    /// Makes the task claimable now with a fresh deadline, dropping any claim: a redispatch,
    /// or a requeue. The caller counts the dispatch.
    fn make_available(&mut self, now: OffsetDateTime) {
        self.status = TaskStatus::Pending;
        self.drop_claim();
        self.available_at = now;
        self.deadline_at = self.deadline_after(now);
        self.updated_at = now;
    }

    /// Settles the task as `status`.
    fn settle(&mut self, status: TaskStatus, now: OffsetDateTime) {
        self.status = status;
        self.drop_claim();
        self.settled_at = Some(now);
        self.updated_at = now;
    }

    /// Whether the task is claimed by a claim that expired at `now`.
    fn claim_expired(&self, now: OffsetDateTime) -> bool {
        self.status == TaskStatus::Running && self.claim_expires_at.is_some_and(|at| at <= now)
    }

    /// Counts an expired claim as a failed attempt (its holder stopped heartbeating without a
    /// report: its process most likely died): the task is pending again with attempts left,
    /// else failed with [`RemoteStepError::CRASHED`]. Returns whether it failed.
    fn expire_claim(&mut self, now: OffsetDateTime) -> bool {
        let attempts = self.attempts.saturating_add(1);
        let message = format!(
            "the claim of {} expired without a report (attempt {attempts} of {})",
            self.claimed_by.as_deref().unwrap_or_default(),
            self.max_attempts
        );
        self.attempts = attempts;
        self.last_error = Some(last_error(&message, Some(RemoteStepError::CRASHED), true));
        if attempts >= self.max_attempts {
            self.settle(TaskStatus::Failed, now);
            return true;
        }
        self.status = TaskStatus::Pending;
        self.drop_claim();
        self.updated_at = now;
        false
    }

    fn claimed(&self, claim: Uuid) -> ClaimedTask {
        ClaimedTask {
            step_id: self.step_id.clone(),
            claim,
            key: self.key.clone(),
            generation: self.generation,
            step: self.step.clone(),
            group: self.group.clone(),
            input: self.input.clone(),
            priority: self.priority,
            traceparent: self.traceparent.clone(),
            attempt: self.attempts.saturating_add(1),
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            dispatches: self.dispatches,
            available_at: self.available_at,
        }
    }

    fn snapshot(&self) -> RemoteTask {
        RemoteTask {
            step_id: self.step_id.clone(),
            key: self.key.clone(),
            generation: self.generation,
            step: self.step.clone(),
            journal_step: self.journal_step.clone(),
            group: self.group.clone(),
            status: self.status,
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            dispatches: self.dispatches,
            claimed_by: self.claimed_by.clone(),
            last_error: self.last_error.clone(),
            output: self.output.clone(),
            traceparent: self.traceparent.clone(),
        }
    }
}

/// The `last_error` of a failure: `{message, code, retryable}` (`code` JSON null when absent).
fn last_error(message: &str, code: Option<&str>, retryable: bool) -> Value {
    json!({ "message": message, "code": code, "retryable": retryable })
}

/// The journaled final failure: `last_error` with the failed attempts added.
fn error_envelope(last_error: &Value, attempts: u32) -> Value {
    let mut error = last_error.clone();
    if let Value::Object(fields) = &mut error {
        fields.insert("attempts".to_owned(), json!(attempts));
    }
    Envelope::error(error)
}

/// What a report answers once its result went to the journal (`None`: the owner is gone).
fn delivery(outcome: Option<AppendOutcome>) -> ReportOutcome {
    match outcome {
        Some(AppendOutcome::Appended | AppendOutcome::AlreadyPresent(_)) => {
            ReportOutcome::Delivered
        }
        Some(AppendOutcome::RefusedTerminal(_) | AppendOutcome::Conflict) | None => {
            ReportOutcome::OwnerGone
        }
    }
}

impl State {
    /// Journals `envelope` under `step` into `(key, generation)` as an external append.
    /// `None` when the owner is missing, which a report treats like any other refusal.
    fn journal_result(
        &mut self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
        envelope: Value,
    ) -> Result<Option<AppendOutcome>> {
        let append = Append {
            key: key.clone(),
            generation: Some(generation),
            event: Event::StepRecorded {
                step: step.to_owned(),
                kind: StepKind::Remote,
                result: envelope,
            },
            fence: None,
            renew: None,
        };
        match self.append(&append) {
            Ok(outcome) => Ok(Some(outcome)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Journals the error envelope of the failed task `step_id` into its owner, as the
    /// report that failed it would. Returns the envelope and what became of it.
    fn journal_failure(&mut self, step_id: &str) -> Result<(Value, Option<AppendOutcome>)> {
        let Some(task) = self.tasks.by_id.get(step_id) else {
            return Ok((Value::Null, None));
        };
        let envelope = error_envelope(
            task.last_error.as_ref().unwrap_or(&Value::Null),
            task.attempts,
        );
        let (key, generation, step) =
            (task.key.clone(), task.generation, task.journal_step.clone());
        let outcome = self.journal_result(&key, generation, &step, envelope.clone())?;
        Ok((envelope, outcome))
    }

    pub(crate) fn remote_arm(&mut self, arm: &RemoteArm) -> Result<RemoteArmOutcome> {
        let now = self.clock.now();
        let entry = self
            .instances
            .get(&arm.key)
            .ok_or_else(|| StoreError::NotFound {
                key: arm.key.clone(),
            })?;
        if let Some(fence) = &arm.fence {
            if !holds(&entry.row, fence) {
                return Err(lease_lost(&arm.key, fence));
            }
        }
        if entry.row.status.is_terminal() || entry.row.generation != arm.generation {
            // The park that follows sees the terminal row, or the new generation.
            return Ok(RemoteArmOutcome::Waiting { deadline: None });
        }

        let Some(task) = self.tasks.by_id.get_mut(&arm.step_id) else {
            let order = self.tasks.written;
            self.tasks.written = order.saturating_add(1);
            let task = Task {
                step_id: arm.step_id.clone(),
                key: arm.key.clone(),
                generation: arm.generation,
                step: arm.step.clone(),
                journal_step: arm.journal_step.clone(),
                group: arm.group.clone(),
                input: arm.input.clone(),
                priority: arm.priority,
                traceparent: arm.traceparent.clone(),
                status: TaskStatus::Pending,
                attempts: 0,
                // As the table's CHECK constraints would have it: at least one of each.
                max_attempts: arm.max_attempts.max(1),
                backoff: arm.backoff,
                dispatches: 1,
                redispatch_after: arm.redispatch_after,
                redispatch_max: arm.redispatch_max.max(1),
                deadline_at: arm.redispatch_after.map(|after| later(now, after)),
                available_at: now,
                claim: None,
                claimed_by: None,
                claim_expires_at: None,
                output: None,
                last_error: None,
                created_at: now,
                updated_at: now,
                settled_at: None,
                order,
            };
            let deadline = task.deadline_at;
            self.tasks.by_id.insert(arm.step_id.clone(), task);
            self.remote_tasks_ready();
            return Ok(RemoteArmOutcome::Dispatched { deadline });
        };

        if task.status == TaskStatus::Cancelled {
            // Only a cancelled owner or a generation left behind cancels a task, and both were
            // answered above; no result will ever come.
            return Ok(RemoteArmOutcome::Waiting { deadline: None });
        }
        if task.is_settled() {
            // The result went to the journal with the settlement, unless the owner was failed
            // then (a sibling step failed the run, and an operator requeued it since): the
            // result waited in the task, and is journaled now.
            let recorded = self
                .instances
                .get(&task.key)
                .and_then(|entry| entry.step(task.generation, &task.journal_step))
                .map(|row| row.payload.clone());
            if let Some(value) = recorded {
                return Ok(RemoteArmOutcome::Settled { value, lost: false });
            }
            let envelope = match (&task.status, &task.output, &task.last_error) {
                (TaskStatus::Completed, output, _) => {
                    Envelope::ok(output.clone().unwrap_or(Value::Null))
                }
                (_, _, Some(error)) => error_envelope(error, task.attempts),
                (_, _, None) => return Ok(RemoteArmOutcome::Waiting { deadline: None }),
            };
            let (key, generation, step) =
                (task.key.clone(), task.generation, task.journal_step.clone());
            return Ok(
                match self.journal_result(&key, generation, &step, envelope.clone())? {
                    Some(AppendOutcome::Appended) => RemoteArmOutcome::Settled {
                        value: envelope,
                        lost: false,
                    },
                    Some(AppendOutcome::AlreadyPresent(value)) => {
                        RemoteArmOutcome::Settled { value, lost: false }
                    }
                    Some(AppendOutcome::RefusedTerminal(_) | AppendOutcome::Conflict) | None => {
                        RemoteArmOutcome::Waiting { deadline: None }
                    }
                },
            );
        }
        if task.deadline_at.is_none_or(|deadline| deadline > now) {
            return Ok(RemoteArmOutcome::Waiting {
                deadline: task.deadline_at,
            });
        }
        // The redispatch below would drop this claim unseen by any claim's sweep.
        if task.claim_expired(now) && task.expire_claim(now) {
            return Ok(match self.journal_failure(&arm.step_id)? {
                (value, Some(AppendOutcome::Appended)) => {
                    RemoteArmOutcome::Settled { value, lost: false }
                }
                (_, Some(AppendOutcome::AlreadyPresent(value))) => {
                    RemoteArmOutcome::Settled { value, lost: false }
                }
                // The owner closed or moved on: the park that follows sees that.
                (_, Some(AppendOutcome::RefusedTerminal(_) | AppendOutcome::Conflict) | None) => {
                    RemoteArmOutcome::Waiting { deadline: None }
                }
            });
        }
        if task.dispatches < task.redispatch_max {
            task.dispatches = task.dispatches.saturating_add(1);
            task.make_available(now);
            let deadline = task.deadline_at;
            self.remote_tasks_ready();
            return Ok(RemoteArmOutcome::Redispatched { deadline });
        }

        // Lost too often: fail the step for good.
        let error = last_error(
            &format!("no result after {} dispatch(es)", task.dispatches),
            Some(RemoteStepError::LOST),
            true,
        );
        let envelope = error_envelope(&error, task.attempts);
        task.last_error = Some(error);
        task.settle(TaskStatus::Failed, now);
        let (key, generation, step) =
            (task.key.clone(), task.generation, task.journal_step.clone());
        Ok(
            match self.journal_result(&key, generation, &step, envelope.clone())? {
                Some(AppendOutcome::Appended) => RemoteArmOutcome::Settled {
                    value: envelope,
                    lost: true,
                },
                Some(AppendOutcome::AlreadyPresent(value)) => {
                    RemoteArmOutcome::Settled { value, lost: true }
                }
                // The step was recorded by another kind of call: the park that follows
                // finds it, and the replay reports the mismatch.
                Some(AppendOutcome::RefusedTerminal(_) | AppendOutcome::Conflict) | None => {
                    RemoteArmOutcome::Waiting { deadline: None }
                }
            },
        )
    }

    fn tasks_claim(&mut self, request: &ClaimRequest) -> Result<Vec<ClaimedTask>> {
        let now = self.clock.now();
        let served = |task: &Task| request.groups.contains(&task.group);
        // Each expired claim is a failed attempt; the failures it ends are journaled in owner
        // key order, as the Postgres sweep does.
        let mut crashed = Vec::new();
        for task in self.tasks.by_id.values_mut() {
            if task.claim_expired(now) && served(task) && task.expire_claim(now) {
                crashed.push((task.key.clone(), task.step_id.clone()));
            }
        }
        crashed.sort();
        for (_, step_id) in crashed {
            self.journal_failure(&step_id)?;
        }
        let mut due: Vec<&mut Task> = self
            .tasks
            .by_id
            .values_mut()
            .filter(|task| {
                task.status == TaskStatus::Pending && task.available_at <= now && served(task)
            })
            .collect();
        due.sort_by_key(|task| {
            (
                Reverse(task.priority),
                task.available_at,
                task.created_at,
                task.order,
            )
        });
        let limit = usize::try_from(request.limit).unwrap_or(usize::MAX);
        Ok(due
            .into_iter()
            .take(limit)
            .map(|task| {
                let claim = Uuid::new_v4();
                task.status = TaskStatus::Running;
                task.claim = Some(claim);
                task.claimed_by = Some(request.worker.clone());
                task.claim_expires_at = Some(later(now, request.claim_ttl));
                task.updated_at = now;
                task.claimed(claim)
            })
            .collect())
    }

    fn task_heartbeat(&mut self, step_id: &str, claim: Uuid, ttl: Duration) -> HeartbeatOutcome {
        let now = self.clock.now();
        match self.tasks.by_id.get_mut(step_id) {
            Some(task) if task.status == TaskStatus::Running && task.claim == Some(claim) => {
                task.claim_expires_at = Some(later(now, ttl));
                task.updated_at = now;
                HeartbeatOutcome::Extended
            }
            // The cancellation dropped the claim, so any claimant of the task is told.
            Some(task) if task.status == TaskStatus::Cancelled => HeartbeatOutcome::Cancelled,
            _ => HeartbeatOutcome::Lost,
        }
    }

    /// Cancels the pending and claimed tasks of `key`'s `generation`, which its run will never
    /// await again (it was cancelled, or continued as new): they are never claimed again, their
    /// claimants learn it at their next heartbeat, and their reports are refused. Settled tasks
    /// keep their result. Returns how many were cancelled.
    pub(crate) fn remote_tasks_cancel(&mut self, key: &InstanceKey, generation: Generation) -> u64 {
        let now = self.clock.now();
        let mut count = 0u64;
        for task in self.tasks.by_id.values_mut() {
            if task.key == *key && task.generation == generation && !task.is_settled() {
                task.settle(TaskStatus::Cancelled, now);
                count = count.saturating_add(1);
            }
        }
        count
    }

    fn task_complete(&mut self, step_id: &str, output: &Value) -> Result<ReportOutcome> {
        let now = self.clock.now();
        let Some(task) = self.tasks.by_id.get_mut(step_id) else {
            return Ok(ReportOutcome::NotFound);
        };
        if task.status == TaskStatus::Cancelled {
            return Ok(ReportOutcome::Cancelled);
        }
        if task.is_settled() {
            return Ok(ReportOutcome::AlreadySettled);
        }
        // Whoever reports first wins, claimant or not: the output is the step's result.
        task.output = Some(output.clone());
        task.settle(TaskStatus::Completed, now);
        let (key, generation, step) =
            (task.key.clone(), task.generation, task.journal_step.clone());
        let outcome = self.journal_result(&key, generation, &step, Envelope::ok(output.clone()))?;
        Ok(delivery(outcome))
    }

    fn task_fail(
        &mut self,
        step_id: &str,
        claim: Uuid,
        failure: &TaskFailure,
        retry_delay: Duration,
    ) -> Result<ReportOutcome> {
        let now = self.clock.now();
        let Some(task) = self.tasks.by_id.get_mut(step_id) else {
            return Ok(ReportOutcome::NotFound);
        };
        // Before the claim check: the cancellation dropped every claim.
        if task.status == TaskStatus::Cancelled {
            return Ok(ReportOutcome::Cancelled);
        }
        if task.is_settled() {
            return Ok(ReportOutcome::AlreadySettled);
        }
        if task.status != TaskStatus::Running || task.claim != Some(claim) {
            return Ok(ReportOutcome::Stale);
        }
        let attempts = task.attempts.saturating_add(1);
        let error = last_error(&failure.message, failure.code.as_deref(), failure.retryable);
        task.attempts = attempts;
        task.last_error = Some(error.clone());
        if failure.retryable && attempts < task.max_attempts {
            let at = later(now, retry_delay);
            task.status = TaskStatus::Pending;
            task.drop_claim();
            task.available_at = at;
            task.deadline_at = task.deadline_after(at);
            task.updated_at = now;
            return Ok(ReportOutcome::Retrying { at });
        }
        task.settle(TaskStatus::Failed, now);
        let (key, generation, step) =
            (task.key.clone(), task.generation, task.journal_step.clone());
        let envelope = error_envelope(&error, attempts);
        let outcome = self.journal_result(&key, generation, &step, envelope)?;
        Ok(delivery(outcome))
    }

    fn remote_redispatch_pending(&mut self, key: &InstanceKey) -> Option<u64> {
        let now = self.clock.now();
        let generation = self.instances.get(key)?.row.generation;
        let mut count = 0u64;
        for task in self.tasks.by_id.values_mut() {
            if task.key == *key && task.generation == generation && !task.is_settled() {
                task.dispatches = task.dispatches.saturating_add(1);
                task.make_available(now);
                count = count.saturating_add(1);
            }
        }
        if count > 0 {
            self.remote_tasks_ready();
        }
        Some(count)
    }

    fn remote_tasks(&self, key: &InstanceKey) -> Vec<RemoteTask> {
        let mut tasks: Vec<&Task> = self
            .tasks
            .by_id
            .values()
            .filter(|task| task.key == *key)
            .collect();
        tasks.sort_by(|a, b| (a.created_at, &a.step_id).cmp(&(b.created_at, &b.step_id)));
        tasks.into_iter().map(Task::snapshot).collect()
    }
}

#[async_trait::async_trait]
impl Transport for MemoryStore {
    async fn tasks_claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedTask>> {
        let span = store_span!("tasks_claim", keiro.remote.groups = ?request.groups);
        traced(span, async {
            self.transact("claiming remote tasks", |state| state.tasks_claim(request))
        })
        .await
    }

    async fn task_heartbeat(
        &self,
        step_id: &str,
        claim: Uuid,
        ttl: Duration,
    ) -> Result<HeartbeatOutcome> {
        let span = store_span!("task_heartbeat", keiro.remote.step_id = %step_id);
        traced(span, async {
            self.transact("heartbeating a remote task", |state| {
                Ok(state.task_heartbeat(step_id, claim, ttl))
            })
        })
        .await
    }

    async fn task_complete(&self, step_id: &str, output: &Value) -> Result<ReportOutcome> {
        let span = store_span!("task_complete", keiro.remote.step_id = %step_id);
        traced(span, async {
            storable::value("completing a remote task", output)?;
            self.transact("completing a remote task", |state| {
                state.task_complete(step_id, output)
            })
        })
        .await
    }

    /// One critical section for the whole batch, as Postgres takes one transaction: a value
    /// it refuses refuses the batch, and nothing of it is written.
    async fn tasks_complete(&self, reports: &[(String, Value)]) -> Result<Vec<ReportOutcome>> {
        let span = store_span!("tasks_complete", keiro.store.len = reports.len());
        traced(span, async {
            for (_, output) in reports {
                storable::value("completing remote tasks", output)?;
            }
            self.transact("completing remote tasks", |state| {
                reports
                    .iter()
                    .map(|(step_id, output)| state.task_complete(step_id, output))
                    .collect()
            })
        })
        .await
    }

    async fn task_fail(
        &self,
        step_id: &str,
        claim: Uuid,
        failure: &TaskFailure,
        retry_delay: Duration,
    ) -> Result<ReportOutcome> {
        let span = store_span!("task_fail", keiro.remote.step_id = %step_id);
        traced(span, async {
            storable::failure("failing a remote task", failure)?;
            self.transact("failing a remote task", |state| {
                state.task_fail(step_id, claim, failure, retry_delay)
            })
        })
        .await
    }
}

#[async_trait::async_trait]
impl RemoteAdmin for MemoryStore {
    async fn remote_redispatch_pending(&self, key: &InstanceKey) -> Result<Option<u64>> {
        let span = store_span!("remote_redispatch_pending", key = key);
        traced(span, async {
            self.transact("redispatching remote tasks", |state| {
                Ok(state.remote_redispatch_pending(key))
            })
        })
        .await
    }

    async fn instance_requeue(&self, key: &InstanceKey) -> Result<RequeueOutcome> {
        let span = store_span!("instance_requeue", key = key);
        traced(span, async {
            self.transact("requeuing an instance", |state| state.instance_requeue(key))
        })
        .await
    }

    async fn instance_retry_with_input(
        &self,
        origin: &InstanceKey,
        retry: &InstanceKey,
        input: &Value,
    ) -> Result<RetryOutcome> {
        let span =
            store_span!("instance_retry_with_input", key = origin, keiro.retry.id = %retry.id);
        traced(span, async {
            storable::value("retrying an instance with a new input", input)?;
            self.transact("retrying an instance with a new input", |state| {
                state.instance_retry_with_input(origin, retry, input)
            })
        })
        .await
    }

    async fn remote_tasks(&self, key: &InstanceKey) -> Result<Vec<RemoteTask>> {
        let span = store_span!("remote_tasks", key = key);
        traced(span, async {
            self.transact("listing remote tasks", |state| Ok(state.remote_tasks(key)))
        })
        .await
    }
}

// The operators' reads (crate::inspect) and retention (crate::retention) see the tasks through
// these, so the table's private layout stays in this module.
impl Tasks {
    /// Whether `key` has a task that failed for good.
    pub(crate) fn has_failed(&self, key: &InstanceKey) -> bool {
        self.by_id
            .values()
            .any(|task| task.key == *key && task.status == TaskStatus::Failed)
    }

    /// Pending and running tasks per group, groups with neither left out.
    pub(crate) fn backlog(&self) -> BTreeMap<String, (u64, u64)> {
        let mut groups: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for task in self.by_id.values() {
            match task.status {
                TaskStatus::Pending => groups.entry(task.group.clone()).or_default().0 += 1,
                TaskStatus::Running => groups.entry(task.group.clone()).or_default().1 += 1,
                _ => {}
            }
        }
        groups
    }

    /// Deletes every task `key` owns; how many.
    pub(crate) fn forget(&mut self, key: &InstanceKey) -> u64 {
        let before = self.by_id.len();
        self.by_id.retain(|_, task| task.key != *key);
        u64::try_from(before - self.by_id.len()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use keiro_journal::{
        store::child_result_step, store::marker_name, store::remote_step_id, store::ChildSpawn,
        store::Park, Fence, JournalStore, Status, REDISPATCH_MAX_DEFAULT,
    };
    use keiro_lease::LeaseStore;
    use keiro_resume::{Notifier, WakeFilter, WakeReason};
    use time::Duration as Span;
    use tokio::sync::broadcast::Receiver;

    use super::*;
    use crate::fixtures::{append, claim, start, store, T0, TTL};
    use crate::Notification;

    const TEN_MINUTES: Duration = Duration::from_secs(600);

    fn arm(key: &InstanceKey, step: &str) -> RemoteArm {
        RemoteArm {
            step_id: remote_step_id(key, 0, step),
            key: key.clone(),
            generation: 0,
            step: step.to_owned(),
            journal_step: format!("remote:{step}"),
            group: step.to_owned(),
            input: json!({ "step": step }),
            priority: 0,
            traceparent: None,
            max_attempts: 1,
            backoff: Backoff::default(),
            redispatch_after: None,
            redispatch_max: REDISPATCH_MAX_DEFAULT,
            fence: None,
        }
    }

    fn request(groups: &[&str], worker: &str, limit: u32) -> ClaimRequest {
        ClaimRequest {
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            worker: worker.to_owned(),
            limit,
            claim_ttl: TTL,
        }
    }

    fn failure(message: &str, code: Option<&str>, retryable: bool) -> TaskFailure {
        TaskFailure {
            message: message.to_owned(),
            code: code.map(str::to_owned),
            retryable,
        }
    }

    fn id(key: &InstanceKey, step: &str) -> String {
        remote_step_id(key, 0, step)
    }

    /// `(stored name, kind, payload)` of every row of generation 0 of `key`, in order.
    fn rows(store: &MemoryStore, key: &InstanceKey) -> Vec<(String, &'static str, Value)> {
        store.inspect(|state| {
            state.instances[key]
                .rows(0)
                .map(|row| (row.step_name.clone(), row.kind, row.payload.clone()))
                .collect()
        })
    }

    fn row(step_name: &str, kind: &'static str, payload: Value) -> (String, &'static str, Value) {
        (step_name.to_owned(), kind, payload)
    }

    fn link_step(store: &MemoryStore, key: &InstanceKey) -> Option<String> {
        store.inspect(|state| state.instances[key].link.as_ref().map(|l| l.step.clone()))
    }

    async fn task(store: &MemoryStore, key: &InstanceKey, step: &str) -> RemoteTask {
        let step_id = id(key, step);
        store
            .remote_tasks(key)
            .await
            .unwrap()
            .into_iter()
            .find(|task| task.step_id == step_id)
            .expect("the task exists")
    }

    async fn claim_one(store: &MemoryStore, group: &str) -> ClaimedTask {
        let mut claimed = store
            .tasks_claim(&request(&[group], "w1", 1))
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "one task of {group} is claimable");
        claimed.remove(0)
    }

    async fn status(store: &MemoryStore, key: &InstanceKey) -> Status {
        store.instance_get(key).await.unwrap().unwrap().status
    }

    /// Parks `key` on `awaited` with no lease, as a run that found nothing would.
    async fn park(store: &MemoryStore, key: &InstanceKey, awaited: &str) {
        let park = Park {
            key: key.clone(),
            generation: 0,
            fence: None,
            awaited: vec![awaited.to_owned()],
            wake_after: None,
        };
        store.instance_park(&park).await.unwrap();
    }

    async fn fail(store: &MemoryStore, key: &InstanceKey, reason: &str) {
        let failed = Event::WorkflowFailed {
            reason: reason.to_owned(),
        };
        let outcome = append(store, key, None, failed, None).await.unwrap();
        assert_eq!(outcome, AppendOutcome::Appended);
    }

    async fn complete(store: &MemoryStore, key: &InstanceKey, output: Value) {
        let completed = Event::WorkflowCompleted { output };
        let outcome = append(store, key, None, completed, None).await.unwrap();
        assert_eq!(outcome, AppendOutcome::Appended);
    }

    /// Spawns `child:<id>` from `parent`; returns the child and the step its result goes to.
    async fn spawn(store: &MemoryStore, parent: &InstanceKey, id: &str) -> (InstanceKey, String) {
        let child = InstanceKey::parse("child", id).unwrap();
        let await_step = child_result_step(&child);
        let append = Append::external(
            parent.clone(),
            Event::StepRecorded {
                step: format!("child:{}/{}", child.name, child.id),
                kind: StepKind::Child,
                result: json!({"name": child.name, "id": child.id}),
            },
        );
        let spawn = ChildSpawn {
            child: child.clone(),
            input: json!(null),
            await_step: await_step.clone(),
        };
        store.child_spawn(&append, &spawn).await.unwrap();
        (child, await_step)
    }

    fn drain(notifications: &mut Receiver<Notification>) -> Vec<Notification> {
        std::iter::from_fn(|| notifications.try_recv().ok()).collect()
    }

    #[tokio::test]
    async fn an_arm_writes_the_task_once_and_only_for_a_live_current_owner() {
        let store = store();
        let key = start(&store, "a").await;
        let mut notifications = store.notifications();
        assert_eq!(
            store.remote_arm(&arm(&key, "label")).await.unwrap(),
            RemoteArmOutcome::Dispatched { deadline: None }
        );
        assert_eq!(drain(&mut notifications), [Notification::RemoteTasks]);

        // First arm wins: a re-arm changes nothing and notifies nobody.
        let rearm = RemoteArm {
            input: json!("other"),
            priority: 9,
            max_attempts: 5,
            ..arm(&key, "label")
        };
        assert_eq!(
            store.remote_arm(&rearm).await.unwrap(),
            RemoteArmOutcome::Waiting { deadline: None }
        );
        assert!(drain(&mut notifications).is_empty());
        assert_eq!(
            store.remote_tasks(&key).await.unwrap(),
            [RemoteTask {
                step_id: "wf/a/0/label".into(),
                key: key.clone(),
                generation: 0,
                step: "label".into(),
                journal_step: "remote:label".into(),
                group: "label".into(),
                status: TaskStatus::Pending,
                attempts: 0,
                max_attempts: 1,
                dispatches: 1,
                claimed_by: None,
                last_error: None,
                output: None,
                traceparent: None,
            }]
        );
        let claimed = claim_one(&store, "label").await;
        assert_eq!(
            (claimed.input, claimed.priority),
            (json!({"step": "label"}), 0)
        );

        let fence = claim(&store, &key, "w").await;
        let fenced = RemoteArm {
            fence: Some(fence.clone()),
            traceparent: Some("00-trace".into()),
            ..arm(&key, "print")
        };
        assert!(matches!(
            store.remote_arm(&fenced).await.unwrap(),
            RemoteArmOutcome::Dispatched { .. }
        ));
        assert_eq!(
            task(&store, &key, "print").await.traceparent.as_deref(),
            Some("00-trace")
        );
        let stale = RemoteArm {
            fence: Some(Fence {
                epoch: fence.epoch - 1,
                ..fence
            }),
            ..arm(&key, "stale")
        };
        assert!(store.remote_arm(&stale).await.unwrap_err().is_lease_lost());

        let next_generation = RemoteArm {
            step_id: remote_step_id(&key, 1, "next"),
            generation: 1,
            ..arm(&key, "next")
        };
        assert_eq!(
            store.remote_arm(&next_generation).await.unwrap(),
            RemoteArmOutcome::Waiting { deadline: None }
        );
        append(&store, &key, None, Event::WorkflowCancelled, None)
            .await
            .unwrap();
        assert_eq!(
            store.remote_arm(&arm(&key, "late")).await.unwrap(),
            RemoteArmOutcome::Waiting { deadline: None }
        );
        let steps: Vec<_> = store
            .remote_tasks(&key)
            .await
            .unwrap()
            .into_iter()
            .map(|task| task.step)
            .collect();
        assert_eq!(steps, ["label", "print"]);
        assert!(drain(&mut notifications)
            .iter()
            .all(|n| *n == Notification::RemoteTasks));

        let missing = InstanceKey::parse("wf", "missing").unwrap();
        assert!(store
            .remote_arm(&arm(&missing, "label"))
            .await
            .unwrap_err()
            .is_not_found());
    }

    #[tokio::test]
    async fn claims_take_the_highest_priority_then_the_oldest() {
        let store = store();
        let key = start(&store, "a").await;
        let in_labels = |step: &str, priority: i32| RemoteArm {
            group: "labels".into(),
            priority,
            ..arm(&key, step)
        };
        // Written at the same instant: the earlier write is the older task.
        store.remote_arm(&in_labels("b-first", 0)).await.unwrap();
        store.remote_arm(&in_labels("a-second", 0)).await.unwrap();
        store.set_now(Some(T0 + Span::seconds(1)));
        store.remote_arm(&in_labels("young", 0)).await.unwrap();
        store.remote_arm(&in_labels("urgent", 5)).await.unwrap();
        let elsewhere = RemoteArm {
            group: "other".into(),
            priority: 9,
            ..arm(&key, "elsewhere")
        };
        store.remote_arm(&elsewhere).await.unwrap();
        store.set_now(Some(T0 + Span::seconds(2)));

        let steps = |claimed: Vec<ClaimedTask>| -> Vec<String> {
            claimed.into_iter().map(|task| task.step).collect()
        };
        let first = store
            .tasks_claim(&request(&["labels"], "w1", 3))
            .await
            .unwrap();
        let urgent = first[0].clone();
        assert_eq!(steps(first), ["urgent", "b-first", "a-second"]);
        assert_eq!(
            steps(
                store
                    .tasks_claim(&request(&["labels"], "w1", 10))
                    .await
                    .unwrap()
            ),
            ["young"]
        );
        assert!(store
            .tasks_claim(&request(&["labels"], "w1", 10))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            steps(
                store
                    .tasks_claim(&request(&["labels", "other"], "w2", 10))
                    .await
                    .unwrap()
            ),
            ["elsewhere"]
        );

        assert_eq!(
            (
                urgent.step_id.as_str(),
                &urgent.key,
                urgent.group.as_str(),
                urgent.priority,
                urgent.attempt,
                urgent.max_attempts,
                urgent.dispatches,
                urgent.available_at,
            ),
            (
                "wf/a/0/urgent",
                &key,
                "labels",
                5,
                1,
                1,
                1,
                T0 + Span::seconds(1)
            )
        );
        let urgent = task(&store, &key, "urgent").await;
        assert_eq!(
            (urgent.status, urgent.claimed_by.as_deref()),
            (TaskStatus::Running, Some("w1"))
        );
    }

    #[tokio::test]
    async fn an_expired_claim_is_claimable_again_and_heartbeats_extend_a_claim() {
        let store = store();
        let key = start(&store, "a").await;
        let retried = RemoteArm {
            max_attempts: 3,
            ..arm(&key, "label")
        };
        store.remote_arm(&retried).await.unwrap();
        let step_id = id(&key, "label");
        let first = claim_one(&store, "label").await;

        store.set_now(Some(T0 + Span::seconds(30)));
        assert_eq!(
            store
                .task_heartbeat(&step_id, first.claim, TTL)
                .await
                .unwrap(),
            HeartbeatOutcome::Extended
        );
        assert_eq!(
            store
                .task_heartbeat(&step_id, Uuid::nil(), TTL)
                .await
                .unwrap(),
            HeartbeatOutcome::Lost
        );
        assert_eq!(
            store
                .task_heartbeat("wf/a/0/missing", first.claim, TTL)
                .await
                .unwrap(),
            HeartbeatOutcome::Lost
        );

        // The heartbeat moved the expiry from T0 + 60 s to T0 + 90 s.
        store.set_now(Some(T0 + Span::seconds(89)));
        assert!(store
            .tasks_claim(&request(&["label"], "w2", 1))
            .await
            .unwrap()
            .is_empty());
        store.set_now(Some(T0 + Span::seconds(90)));
        let second = store
            .tasks_claim(&request(&["label"], "w2", 1))
            .await
            .unwrap()
            .remove(0);
        assert_eq!(second.step_id, step_id);
        assert_ne!(second.claim, first.claim);
        // An expired claim is a failed attempt.
        assert_eq!(second.attempt, 2);
        let current = task(&store, &key, "label").await;
        assert_eq!(
            (
                current.status,
                current.claimed_by.as_deref(),
                current.attempts
            ),
            (TaskStatus::Running, Some("w2"), 1)
        );
        assert_eq!(
            current.last_error,
            Some(json!({
                "message": "the claim of w1 expired without a report (attempt 1 of 3)",
                "code": RemoteStepError::CRASHED,
                "retryable": true,
            }))
        );

        assert_eq!(
            store
                .task_heartbeat(&step_id, first.claim, TTL)
                .await
                .unwrap(),
            HeartbeatOutcome::Lost
        );
        let jammed = failure("jammed", None, true);
        assert_eq!(
            store
                .task_fail(&step_id, first.claim, &jammed, TTL)
                .await
                .unwrap(),
            ReportOutcome::Stale
        );
        assert_eq!(task(&store, &key, "label").await.attempts, 1);
    }

    #[tokio::test]
    async fn expired_claims_count_attempts_and_the_last_one_fails_the_step_as_crashed() {
        let store = store();
        let key = start(&store, "a").await;
        let twice = RemoteArm {
            max_attempts: 2,
            ..arm(&key, "label")
        };
        store.remote_arm(&twice).await.unwrap();
        park(&store, &key, "remote:label").await;
        let first = claim_one(&store, "label").await;
        assert_eq!(first.attempt, 1);
        store.set_now(Some(T0 + Span::seconds(60)));
        let second = claim_one(&store, "label").await;
        assert_eq!(second.attempt, 2);
        assert_eq!(status(&store, &key).await, Status::Suspended);

        // The last attempt's claim expires too: the next claim fails the step, journals the
        // error into the parked owner and wakes it, and hands out nothing.
        let mut notifications = store.notifications();
        store.set_now(Some(T0 + Span::seconds(120)));
        assert!(store
            .tasks_claim(&request(&["label"], "w2", 1))
            .await
            .unwrap()
            .is_empty());
        let crashed = json!({"error": {
            "message": "the claim of w1 expired without a report (attempt 2 of 2)",
            "code": RemoteStepError::CRASHED,
            "retryable": true,
            "attempts": 2,
        }});
        assert_eq!(
            rows(&store, &key),
            [row("remote:label", "remote", crashed.clone())]
        );
        assert_eq!(status(&store, &key).await, Status::Running);
        assert_eq!(
            drain(&mut notifications),
            [Notification::Instance(key.clone())]
        );
        let failed = task(&store, &key, "label").await;
        assert_eq!(
            (failed.status, failed.attempts, failed.claimed_by),
            (TaskStatus::Failed, 2, None)
        );
        // The dead claimant's late words change nothing; a re-arm reads the failure.
        let late = failure("late", None, true);
        assert_eq!(
            store
                .task_fail(&second.step_id, second.claim, &late, TTL)
                .await
                .unwrap(),
            ReportOutcome::AlreadySettled
        );
        assert_eq!(
            store.remote_arm(&twice).await.unwrap(),
            RemoteArmOutcome::Settled {
                value: crashed,
                lost: false
            }
        );
        // Another group's expired claims are left to its own claimers.
        let other = start(&store, "b").await;
        store.remote_arm(&arm(&other, "scan")).await.unwrap();
        claim_one(&store, "scan").await;
        store.set_now(Some(T0 + Span::seconds(240)));
        assert!(store
            .tasks_claim(&request(&["label"], "w2", 1))
            .await
            .unwrap()
            .is_empty());
        let scan = task(&store, &other, "scan").await;
        assert_eq!((scan.status, scan.attempts), (TaskStatus::Running, 0));
    }

    #[tokio::test]
    async fn a_passed_deadline_counts_the_expired_claim_it_drops() {
        let store = store();
        let key = start(&store, "a").await;
        let twice = RemoteArm {
            max_attempts: 2,
            redispatch_after: Some(TEN_MINUTES),
            ..arm(&key, "label")
        };
        store.remote_arm(&twice).await.unwrap();
        claim_one(&store, "label").await;
        store.set_now(Some(T0 + Span::minutes(10)));
        assert_eq!(
            store.remote_arm(&twice).await.unwrap(),
            RemoteArmOutcome::Redispatched {
                deadline: Some(T0 + Span::minutes(20))
            }
        );
        let redispatched = task(&store, &key, "label").await;
        assert_eq!(
            (
                redispatched.status,
                redispatched.attempts,
                redispatched.dispatches
            ),
            (TaskStatus::Pending, 1, 2)
        );
        assert_eq!(claim_one(&store, "label").await.attempt, 2);
        store.set_now(Some(T0 + Span::minutes(20)));
        let crashed = json!({"error": {
            "message": "the claim of w1 expired without a report (attempt 2 of 2)",
            "code": RemoteStepError::CRASHED,
            "retryable": true,
            "attempts": 2,
        }});
        assert_eq!(
            store.remote_arm(&twice).await.unwrap(),
            RemoteArmOutcome::Settled {
                value: crashed.clone(),
                lost: false
            }
        );
        assert_eq!(rows(&store, &key), [row("remote:label", "remote", crashed)]);
        let failed = task(&store, &key, "label").await;
        assert_eq!(
            (failed.status, failed.attempts, failed.dispatches),
            (TaskStatus::Failed, 2, 2)
        );
    }

    #[tokio::test]
    async fn a_completion_settles_once_and_journals_into_the_owner_waking_it() {
        let store = store();
        let key = start(&store, "a").await;
        store.remote_arm(&arm(&key, "label")).await.unwrap();
        park(&store, &key, "remote:label").await;
        assert_eq!(status(&store, &key).await, Status::Suspended);
        let mut notifications = store.notifications();
        let step_id = id(&key, "label");

        // Unclaimed, even: the first result wins.
        assert_eq!(
            store.task_complete(&step_id, &json!("L-1")).await.unwrap(),
            ReportOutcome::Delivered
        );
        let delivered = vec![row("remote:label", "remote", json!({"ok": "L-1"}))];
        assert_eq!(rows(&store, &key), delivered);
        assert_eq!(status(&store, &key).await, Status::Running);
        assert_eq!(
            drain(&mut notifications),
            [Notification::Instance(key.clone())]
        );
        let settled = task(&store, &key, "label").await;
        assert_eq!(
            (settled.status, settled.output, settled.claimed_by),
            (TaskStatus::Completed, Some(json!("L-1")), None)
        );

        assert_eq!(
            store.task_complete(&step_id, &json!("L-2")).await.unwrap(),
            ReportOutcome::AlreadySettled
        );
        let late = failure("late", None, true);
        assert_eq!(
            store
                .task_fail(&step_id, Uuid::nil(), &late, TTL)
                .await
                .unwrap(),
            ReportOutcome::AlreadySettled
        );
        assert_eq!(rows(&store, &key), delivered);
        assert_eq!(
            store.remote_arm(&arm(&key, "label")).await.unwrap(),
            RemoteArmOutcome::Settled {
                value: json!({"ok": "L-1"}),
                lost: false
            }
        );
        assert_eq!(
            store
                .task_complete("wf/a/0/missing", &json!(1))
                .await
                .unwrap(),
            ReportOutcome::NotFound
        );
        assert_eq!(
            store
                .task_fail("wf/a/0/missing", Uuid::nil(), &late, TTL)
                .await
                .unwrap(),
            ReportOutcome::NotFound
        );

        // An owner that failed meanwhile takes nothing; the task still settles, its result
        // kept for a requeue. (A cancelled owner cancels its tasks instead.)
        let gone = start(&store, "gone").await;
        store.remote_arm(&arm(&gone, "label")).await.unwrap();
        fail(&store, &gone, "broken").await;
        assert_eq!(
            store
                .task_complete(&id(&gone, "label"), &json!("L"))
                .await
                .unwrap(),
            ReportOutcome::OwnerGone
        );
        assert_eq!(
            task(&store, &gone, "label").await.status,
            TaskStatus::Completed
        );
        assert_eq!(
            rows(&store, &gone),
            [row(marker_name::FAILED, "failed", json!("broken"))]
        );
    }

    #[tokio::test]
    async fn failures_retry_with_backoff_then_fail_for_good_and_stale_ones_are_ignored() {
        let store = store();
        let key = start(&store, "a").await;
        let retried = RemoteArm {
            max_attempts: 3,
            redispatch_after: Some(TEN_MINUTES),
            ..arm(&key, "label")
        };
        assert_eq!(
            store.remote_arm(&retried).await.unwrap(),
            RemoteArmOutcome::Dispatched {
                deadline: Some(T0 + Span::minutes(10))
            }
        );
        let step_id = id(&key, "label");
        let jammed = failure("jammed", Some("printer"), true);
        let first = claim_one(&store, "label").await;
        assert_eq!(
            store
                .task_fail(&step_id, Uuid::nil(), &jammed, TTL)
                .await
                .unwrap(),
            ReportOutcome::Stale
        );
        let delay = Duration::from_secs(30);
        assert_eq!(
            store
                .task_fail(&step_id, first.claim, &jammed, delay)
                .await
                .unwrap(),
            ReportOutcome::Retrying {
                at: T0 + Span::seconds(30)
            }
        );
        let pending = task(&store, &key, "label").await;
        let last_error = json!({"message": "jammed", "code": "printer", "retryable": true});
        assert_eq!(
            (
                pending.status,
                pending.attempts,
                pending.claimed_by,
                pending.last_error
            ),
            (TaskStatus::Pending, 1, None, Some(last_error.clone()))
        );
        // A pending task has no claim a report could carry.
        assert_eq!(
            store
                .task_fail(&step_id, first.claim, &jammed, delay)
                .await
                .unwrap(),
            ReportOutcome::Stale
        );
        // The redispatch deadline counts from the end of the backoff.
        assert_eq!(
            store.remote_arm(&retried).await.unwrap(),
            RemoteArmOutcome::Waiting {
                deadline: Some(T0 + Span::seconds(30) + Span::minutes(10))
            }
        );
        assert!(store
            .tasks_claim(&request(&["label"], "w1", 1))
            .await
            .unwrap()
            .is_empty());

        store.set_now(Some(T0 + Span::seconds(30)));
        let second = claim_one(&store, "label").await;
        assert_eq!(second.attempt, 2);
        assert_eq!(
            store
                .task_fail(&step_id, second.claim, &jammed, delay)
                .await
                .unwrap(),
            ReportOutcome::Retrying {
                at: T0 + Span::seconds(60)
            }
        );
        store.set_now(Some(T0 + Span::seconds(60)));
        let third = claim_one(&store, "label").await;
        assert_eq!(third.attempt, 3);
        assert_eq!(
            store
                .task_fail(&step_id, third.claim, &jammed, delay)
                .await
                .unwrap(),
            ReportOutcome::Delivered
        );
        let final_error = json!({"error": {"message": "jammed", "code": "printer", "retryable": true, "attempts": 3}});
        assert_eq!(
            rows(&store, &key),
            [row("remote:label", "remote", final_error.clone())]
        );
        let failed = task(&store, &key, "label").await;
        assert_eq!(
            (failed.status, failed.attempts, failed.last_error),
            (TaskStatus::Failed, 3, Some(last_error))
        );
        assert_eq!(
            store
                .task_fail(&step_id, third.claim, &jammed, delay)
                .await
                .unwrap(),
            ReportOutcome::AlreadySettled
        );
        assert_eq!(
            store.remote_arm(&retried).await.unwrap(),
            RemoteArmOutcome::Settled {
                value: final_error,
                lost: false
            }
        );

        // Not retryable: failed at once, whatever attempts remain.
        let scan = RemoteArm {
            max_attempts: 5,
            ..arm(&key, "scan")
        };
        store.remote_arm(&scan).await.unwrap();
        let claimed = claim_one(&store, "scan").await;
        assert_eq!(
            store
                .task_fail(
                    &id(&key, "scan"),
                    claimed.claim,
                    &failure("bad input", None, false),
                    delay
                )
                .await
                .unwrap(),
            ReportOutcome::Delivered
        );
        assert_eq!(
            rows(&store, &key).pop(),
            Some(row(
                "remote:scan",
                "remote",
                json!({"error": {"message": "bad input", "code": null, "retryable": false, "attempts": 1}})
            ))
        );
    }

    #[tokio::test]
    async fn a_lost_dispatch_is_redispatched_at_its_deadline_until_redispatch_max() {
        let store = store();
        let key = start(&store, "a").await;
        let lossy = RemoteArm {
            redispatch_after: Some(TEN_MINUTES),
            redispatch_max: 2,
            ..arm(&key, "label")
        };
        let step_id = id(&key, "label");
        store.remote_arm(&lossy).await.unwrap();
        // Claimants that stay alive (their claims outlast the test) and never report: the
        // deadline redispatches without counting an attempt.
        let alive = ClaimRequest {
            claim_ttl: Duration::from_secs(3600),
            ..request(&["label"], "w1", 1)
        };
        let first = store.tasks_claim(&alive).await.unwrap().remove(0);

        store.set_now(Some(T0 + Span::minutes(5)));
        assert_eq!(
            store.remote_arm(&lossy).await.unwrap(),
            RemoteArmOutcome::Waiting {
                deadline: Some(T0 + Span::minutes(10))
            }
        );
        let mut notifications = store.notifications();
        store.set_now(Some(T0 + Span::minutes(10)));
        assert_eq!(
            store.remote_arm(&lossy).await.unwrap(),
            RemoteArmOutcome::Redispatched {
                deadline: Some(T0 + Span::minutes(20))
            }
        );
        assert_eq!(drain(&mut notifications), [Notification::RemoteTasks]);
        let redispatched = task(&store, &key, "label").await;
        assert_eq!(
            (
                redispatched.status,
                redispatched.dispatches,
                redispatched.claimed_by
            ),
            (TaskStatus::Pending, 2, None)
        );
        // The first claimant's reports no longer count, but its output would.
        assert_eq!(
            store
                .task_heartbeat(&step_id, first.claim, TTL)
                .await
                .unwrap(),
            HeartbeatOutcome::Lost
        );
        let jammed = failure("jammed", None, true);
        assert_eq!(
            store
                .task_fail(&step_id, first.claim, &jammed, TTL)
                .await
                .unwrap(),
            ReportOutcome::Stale
        );
        let second = store.tasks_claim(&alive).await.unwrap().remove(0);
        assert_eq!((second.dispatches, second.attempt), (2, 1));

        store.set_now(Some(T0 + Span::minutes(20)));
        let lost = json!({"error": {
            "message": "no result after 2 dispatch(es)",
            "code": "remote_step_lost",
            "retryable": true,
            "attempts": 0,
        }});
        assert_eq!(
            store.remote_arm(&lossy).await.unwrap(),
            RemoteArmOutcome::Settled {
                value: lost.clone(),
                lost: true
            }
        );
        assert_eq!(
            rows(&store, &key),
            [row("remote:label", "remote", lost.clone())]
        );
        let failed = task(&store, &key, "label").await;
        assert_eq!(
            (failed.status, failed.claimed_by, failed.last_error),
            (
                TaskStatus::Failed,
                None,
                Some(
                    json!({"message": "no result after 2 dispatch(es)", "code": "remote_step_lost", "retryable": true})
                )
            )
        );
        assert_eq!(
            store.remote_arm(&lossy).await.unwrap(),
            RemoteArmOutcome::Settled {
                value: lost,
                lost: false
            }
        );
        assert_eq!(
            store.task_complete(&step_id, &json!("late")).await.unwrap(),
            ReportOutcome::AlreadySettled
        );

        // The failure is journaled like any result: a suspended owner is woken by it.
        let parked = start(&store, "parked").await;
        let once = RemoteArm {
            redispatch_after: Some(TEN_MINUTES),
            redispatch_max: 1,
            ..arm(&parked, "label")
        };
        store.remote_arm(&once).await.unwrap();
        park(&store, &parked, "remote:label").await;
        drain(&mut notifications);
        store.set_now(Some(T0 + Span::minutes(30)));
        assert!(matches!(
            store.remote_arm(&once).await.unwrap(),
            RemoteArmOutcome::Settled { lost: true, .. }
        ));
        assert_eq!(status(&store, &parked).await, Status::Running);
        assert_eq!(drain(&mut notifications), [Notification::Instance(parked)]);
    }

    #[tokio::test]
    async fn redispatch_pending_counts_the_live_tasks_of_the_current_generation() {
        let store = store();
        let key = start(&store, "a").await;
        for step in ["x", "y", "done"] {
            store.remote_arm(&arm(&key, step)).await.unwrap();
        }
        let claimed = claim_one(&store, "x").await;
        store
            .task_complete(&id(&key, "done"), &json!(1))
            .await
            .unwrap();
        let mut notifications = store.notifications();
        store.set_now(Some(T0 + Span::minutes(1)));

        assert_eq!(
            store.remote_redispatch_pending(&key).await.unwrap(),
            Some(2)
        );
        assert_eq!(drain(&mut notifications), [Notification::RemoteTasks]);
        let x = task(&store, &key, "x").await;
        assert_eq!(
            (x.status, x.dispatches, x.claimed_by),
            (TaskStatus::Pending, 2, None)
        );
        assert_eq!(task(&store, &key, "y").await.dispatches, 2);
        let done = task(&store, &key, "done").await;
        assert_eq!((done.status, done.dispatches), (TaskStatus::Completed, 1));
        assert_eq!(
            store
                .task_heartbeat(&id(&key, "x"), claimed.claim, TTL)
                .await
                .unwrap(),
            HeartbeatOutcome::Lost
        );
        let again = claim_one(&store, "x").await;
        assert_eq!(
            (again.dispatches, again.available_at),
            (2, T0 + Span::minutes(1))
        );

        let missing = InstanceKey::parse("wf", "missing").unwrap();
        assert_eq!(
            store.remote_redispatch_pending(&missing).await.unwrap(),
            None
        );
        // The tasks belong to generation 0; generation 1 has none.
        let rotate = Event::WorkflowContinuedAsNew {
            next_generation: 1,
            input: json!(null),
        };
        append(&store, &key, None, rotate, None).await.unwrap();
        drain(&mut notifications);
        assert_eq!(
            store.remote_redispatch_pending(&key).await.unwrap(),
            Some(0)
        );
        assert!(drain(&mut notifications).is_empty());
    }

    #[tokio::test]
    async fn a_requeue_supersedes_a_failed_remote_step_and_redispatches_its_task() {
        let store = store();
        let key = start(&store, "a").await;
        let label = RemoteArm {
            redispatch_after: Some(TEN_MINUTES),
            ..arm(&key, "label")
        };
        let step_id = id(&key, "label");
        store.remote_arm(&label).await.unwrap();
        let claimed = claim_one(&store, "label").await;
        let bad = failure("jammed", None, false);
        store
            .task_fail(&step_id, claimed.claim, &bad, TTL)
            .await
            .unwrap();
        fail(&store, &key, "remote step failed").await;
        assert_eq!(
            store
                .instance_requeue(&start(&store, "live").await)
                .await
                .unwrap(),
            RequeueOutcome::NotFailed(Status::Running)
        );
        let missing = InstanceKey::parse("wf", "missing").unwrap();
        assert_eq!(
            store.instance_requeue(&missing).await.unwrap(),
            RequeueOutcome::NotFound
        );

        let mut notifications = store.notifications();
        let later = T0 + Span::hours(1);
        store.set_now(Some(later));
        assert_eq!(
            store.instance_requeue(&key).await.unwrap(),
            RequeueOutcome::Requeued {
                reset_steps: 1,
                children: vec![]
            }
        );
        let error = json!({"error": {"message": "jammed", "code": null, "retryable": false, "attempts": 1}});
        assert_eq!(
            rows(&store, &key),
            [
                row("remote:label", "remote", error.clone()),
                row(marker_name::FAILED, "failed", json!("remote step failed")),
                row(
                    "__workflow_step_reset__:remote:label",
                    "reset",
                    json!({"step": "remote:label", "superseded": "remote:label"})
                ),
                row(marker_name::RESURRECTED, "resurrected", Value::Null),
            ]
        );
        assert_eq!(
            drain(&mut notifications),
            [
                Notification::Instance(key.clone()),
                Notification::RemoteTasks
            ]
        );
        let row_after = store.instance_get(&key).await.unwrap().unwrap();
        assert_eq!(
            (
                row_after.status,
                row_after.last_error,
                row_after.completed_at,
                row_after.attempts
            ),
            (Status::Running, None, None, 0)
        );
        let requeued = task(&store, &key, "label").await;
        assert_eq!(
            (
                requeued.status,
                requeued.journal_step.as_str(),
                requeued.attempts,
                requeued.dispatches,
                requeued.last_error,
                requeued.claimed_by,
            ),
            (TaskStatus::Pending, "remote:label#1", 0, 1, None, None)
        );
        assert_eq!(
            store.remote_arm(&label).await.unwrap(),
            RemoteArmOutcome::Waiting {
                deadline: Some(later + Span::minutes(10))
            }
        );

        // The next result lands under the next revision; failed again, it is reset again.
        let claimed = claim_one(&store, "label").await;
        assert_eq!((claimed.attempt, claimed.available_at), (1, later));
        store
            .task_fail(&step_id, claimed.claim, &bad, TTL)
            .await
            .unwrap();
        fail(&store, &key, "again").await;
        assert_eq!(
            store.instance_requeue(&key).await.unwrap(),
            RequeueOutcome::Requeued {
                reset_steps: 1,
                children: vec![]
            }
        );
        let tail: Vec<_> = rows(&store, &key).into_iter().skip(4).collect();
        assert_eq!(
            tail,
            [
                row("remote:label#1", "remote", error),
                row(
                    &format!("{}/2", marker_name::FAILED),
                    "failed",
                    json!("again")
                ),
                row(
                    "__workflow_step_reset__:remote:label#1",
                    "reset",
                    json!({"step": "remote:label", "superseded": "remote:label#1"})
                ),
                row(
                    &format!("{}/2", marker_name::RESURRECTED),
                    "resurrected",
                    Value::Null
                ),
            ]
        );
        assert_eq!(
            task(&store, &key, "label").await.journal_step,
            "remote:label#2"
        );
        assert_eq!(
            store.task_complete(&step_id, &json!("L")).await.unwrap(),
            ReportOutcome::Delivered
        );
        assert_eq!(
            rows(&store, &key).pop(),
            Some(row("remote:label#2", "remote", json!({"ok": "L"})))
        );
        assert_eq!(
            store.remote_arm(&label).await.unwrap(),
            RemoteArmOutcome::Settled {
                value: json!({"ok": "L"}),
                lost: false
            }
        );
    }

    #[tokio::test]
    async fn a_requeue_resets_failures_in_journal_order() {
        let store = store();
        let key = start(&store, "a").await;
        // The child is gone (never existed here): its failure is reset all the same.
        let gone = InstanceKey::parse("child", "gone").unwrap();
        let child_step = child_result_step(&gone);
        let failed_child = Event::StepRecorded {
            step: child_step.clone(),
            kind: StepKind::Child,
            result: json!({"failed": "boom"}),
        };
        append(&store, &key, None, failed_child, None)
            .await
            .unwrap();
        store.remote_arm(&arm(&key, "label")).await.unwrap();
        let claimed = claim_one(&store, "label").await;
        let bad = failure("jammed", None, false);
        store
            .task_fail(&id(&key, "label"), claimed.claim, &bad, TTL)
            .await
            .unwrap();
        fail(&store, &key, "failed").await;

        assert_eq!(
            store.instance_requeue(&key).await.unwrap(),
            RequeueOutcome::Requeued {
                reset_steps: 2,
                children: vec![]
            }
        );
        let resets: Vec<_> = rows(&store, &key)
            .into_iter()
            .filter(|(_, kind, _)| *kind == "reset")
            .map(|(step, _, _)| step)
            .collect();
        assert_eq!(
            resets,
            [
                format!("__workflow_step_reset__:{child_step}"),
                "__workflow_step_reset__:remote:label".to_owned(),
            ]
        );
    }

    #[tokio::test]
    async fn a_requeue_cascades_to_failed_children_and_relinks_them() {
        let store = store();
        let root = start(&store, "root").await;
        let (child, child_step) = spawn(&store, &root, "c").await;
        let (grandchild, grandchild_step) = spawn(&store, &child, "g").await;
        park(&store, &root, &child_step).await;
        fail(&store, &grandchild, "boom").await;
        fail(&store, &child, "grandchild failed").await;
        fail(&store, &root, "child failed").await;
        assert_eq!(
            rows(&store, &root)[1],
            row(&child_step, "child", json!({"failed": "grandchild failed"}))
        );

        assert_eq!(
            store.instance_requeue(&root).await.unwrap(),
            RequeueOutcome::Requeued {
                reset_steps: 2,
                children: vec![child.clone(), grandchild.clone()]
            }
        );
        for key in [&root, &child, &grandchild] {
            assert_eq!(status(&store, key).await, Status::Running);
            assert_eq!(
                rows(&store, key).pop(),
                Some(row(marker_name::RESURRECTED, "resurrected", Value::Null))
            );
        }
        assert!(rows(&store, &root).contains(&row(
            &format!("__workflow_step_reset__:{child_step}"),
            "reset",
            json!({"step": child_step, "superseded": child_step})
        )));
        assert_eq!(link_step(&store, &child), Some(format!("{child_step}#1")));
        assert_eq!(
            link_step(&store, &grandchild),
            Some(format!("{grandchild_step}#1"))
        );

        complete(&store, &grandchild, json!("g")).await;
        complete(&store, &child, json!("c")).await;
        let child_rows = rows(&store, &child);
        assert_eq!(
            child_rows[child_rows.len() - 2..],
            [
                row(&format!("{grandchild_step}#1"), "child", json!({"ok": "g"})),
                row(marker_name::COMPLETED, "completed", json!("c")),
            ]
        );
        assert_eq!(
            rows(&store, &root).pop(),
            Some(row(&format!("{child_step}#1"), "child", json!({"ok": "c"})))
        );
    }

    #[tokio::test]
    async fn a_requeue_delivers_a_success_the_failed_parent_could_not_take() {
        let store = store();
        let parent = start(&store, "parent").await;
        let (child, child_step) = spawn(&store, &parent, "c").await;
        fail(&store, &child, "boom").await;
        fail(&store, &parent, "child failed").await;
        store.instance_resurrect(&child).await.unwrap();
        complete(&store, &child, json!("fixed")).await;
        let before = rows(&store, &parent);

        assert_eq!(
            store.instance_requeue(&parent).await.unwrap(),
            RequeueOutcome::Requeued {
                reset_steps: 1,
                children: vec![]
            }
        );
        let after = rows(&store, &parent);
        assert_eq!(after[..before.len()], before[..]);
        assert_eq!(
            after[before.len()..],
            [
                row(
                    &format!("__workflow_step_reset__:{child_step}"),
                    "reset",
                    json!({"step": child_step, "superseded": child_step})
                ),
                row(marker_name::RESURRECTED, "resurrected", Value::Null),
                row(&format!("{child_step}#1"), "child", json!({"ok": "fixed"})),
            ]
        );
        assert_eq!(status(&store, &parent).await, Status::Running);
        assert_eq!(status(&store, &child).await, Status::Completed);
    }

    #[tokio::test]
    async fn a_requeue_reaches_each_instance_of_a_cycle_once() {
        let store = store();
        let a = start(&store, "a").await;
        let b = start(&store, "b").await;
        for (key, other) in [(&a, &b), (&b, &a)] {
            let result = Event::StepRecorded {
                step: child_result_step(other),
                kind: StepKind::Child,
                result: json!({"failed": "x"}),
            };
            append(&store, key, None, result, None).await.unwrap();
        }
        fail(&store, &a, "b failed").await;
        fail(&store, &b, "a failed").await;

        assert_eq!(
            store.instance_requeue(&a).await.unwrap(),
            RequeueOutcome::Requeued {
                reset_steps: 2,
                children: vec![b.clone()]
            }
        );
        for key in [&a, &b] {
            assert_eq!(status(&store, key).await, Status::Running);
            let resets = rows(&store, key)
                .iter()
                .filter(|(_, kind, _)| *kind == "reset")
                .count();
            assert_eq!(resets, 1);
        }
    }

    #[tokio::test]
    async fn a_retry_with_input_takes_the_origins_link_and_delivers_only_its_success() {
        let store = store();
        let parent = start(&store, "parent").await;
        let (child, child_step) = spawn(&store, &parent, "c").await;
        fail(&store, &child, "bad input").await;
        fail(&store, &parent, "child failed").await;
        store.instance_requeue(&parent).await.unwrap();
        let revised = format!("{child_step}#1");
        let fix = |hex: &str| InstanceKey::parse("child", &format!("c~retry~{hex}")).unwrap();

        let missing = InstanceKey::parse("child", "missing").unwrap();
        assert_eq!(
            store
                .instance_retry_with_input(&missing, &fix("00000000"), &json!(1))
                .await
                .unwrap(),
            RetryOutcome::OriginNotFound
        );
        let mut notifications = store.notifications();
        let first = fix("0000000a");
        assert_eq!(
            store
                .instance_retry_with_input(&child, &first, &json!("good"))
                .await
                .unwrap(),
            RetryOutcome::Started(first.clone())
        );
        assert_eq!(
            drain(&mut notifications),
            [Notification::Instance(first.clone())]
        );
        assert_eq!(
            store
                .instance_retry_with_input(&child, &first, &json!("other"))
                .await
                .unwrap(),
            RetryOutcome::Exists(first.clone())
        );
        let started = store.instance_get(&first).await.unwrap().unwrap();
        assert_eq!(
            (
                started.status,
                started.input,
                started.parent,
                started.priority
            ),
            (Status::Running, json!("good"), Some(parent.clone()), 0)
        );
        assert_eq!(link_step(&store, &first), Some(revised.clone()));

        // A fix's failure or cancellation is not its origin's result.
        fail(&store, &first, "still bad").await;
        let second = fix("0000000b");
        store
            .instance_retry_with_input(&child, &second, &json!("better"))
            .await
            .unwrap();
        store.instance_cancel(&second, false).await.unwrap();
        assert!(rows(&store, &parent)
            .iter()
            .all(|(step, _, _)| *step != revised));

        let third = fix("0000000c");
        store
            .instance_retry_with_input(&child, &third, &json!("best"))
            .await
            .unwrap();
        complete(&store, &third, json!("done")).await;
        assert_eq!(
            rows(&store, &parent).pop(),
            Some(row(&revised, "child", json!({"ok": "done"})))
        );
        // The origin's own late result finds the step taken.
        fail(&store, &child, "late").await;
        assert_eq!(
            rows(&store, &parent).pop(),
            Some(row(&revised, "child", json!({"ok": "done"})))
        );

        // Priority and parent (none here) come from the origin.
        let lone = keiro_journal::store::StartRequest {
            key: InstanceKey::parse("wf", "lone").unwrap(),
            input: json!(null),
            parent: None,
            priority: 4,
        };
        store.instance_start(&lone).await.unwrap();
        let lone_fix = InstanceKey::parse("wf", "lone~retry~00000001").unwrap();
        store
            .instance_retry_with_input(&lone.key, &lone_fix, &json!(2))
            .await
            .unwrap();
        let row_fix = store.instance_get(&lone_fix).await.unwrap().unwrap();
        assert_eq!((row_fix.priority, row_fix.parent), (4, None));
    }

    #[tokio::test]
    async fn a_requeue_delivers_the_success_of_a_fix_made_while_the_parent_was_failed() {
        let store = store();
        let parent = start(&store, "parent").await;
        let (child, child_step) = spawn(&store, &parent, "c").await;
        fail(&store, &child, "bad input").await;
        fail(&store, &parent, "child failed").await;
        let fix = InstanceKey::parse("child", "c~retry~0000000a").unwrap();
        store
            .instance_retry_with_input(&child, &fix, &json!("good"))
            .await
            .unwrap();
        assert_eq!(link_step(&store, &fix), Some(child_step.clone()));
        complete(&store, &fix, json!("done")).await;

        assert_eq!(
            store.instance_requeue(&parent).await.unwrap(),
            RequeueOutcome::Requeued {
                reset_steps: 1,
                children: vec![]
            }
        );
        assert_eq!(
            rows(&store, &parent).pop(),
            Some(row(
                &format!("{child_step}#1"),
                "child",
                json!({"ok": "done"})
            ))
        );
        // The failed origin was not requeued: the fix answered for it.
        assert_eq!(status(&store, &child).await, Status::Failed);
    }

    #[tokio::test(start_paused = true)]
    async fn remote_task_notifications_wake_only_remote_workers() {
        let fallback = Duration::from_secs(30);
        let store = store();
        let mut remote = store.subscribe(WakeFilter::RemoteTasks);
        let mut instances = store.subscribe(WakeFilter::Instances);
        let key = start(&store, "a").await;
        assert_eq!(remote.wait(fallback).await, WakeReason::Timeout);
        assert_eq!(instances.wait(fallback).await, WakeReason::Notified);
        store.remote_arm(&arm(&key, "label")).await.unwrap();
        assert_eq!(instances.wait(fallback).await, WakeReason::Timeout);
        assert_eq!(remote.wait(fallback).await, WakeReason::Notified);
    }

    #[tokio::test]
    async fn a_cancel_cancels_the_live_tasks_of_the_run_and_refuses_their_reports() {
        let store = store();
        let key = start(&store, "a").await;
        for step in ["claimed", "pending", "done"] {
            store.remote_arm(&arm(&key, step)).await.unwrap();
        }
        let claimed = claim_one(&store, "claimed").await;
        store
            .task_complete(&id(&key, "done"), &json!("kept"))
            .await
            .unwrap();

        store.instance_cancel(&key, false).await.unwrap();
        for (step, status) in [
            ("claimed", TaskStatus::Cancelled),
            ("pending", TaskStatus::Cancelled),
            ("done", TaskStatus::Completed),
        ] {
            let task = task(&store, &key, step).await;
            assert_eq!((task.status, task.claimed_by), (status, None), "{step}");
        }
        for held in [claimed.claim, Uuid::nil()] {
            assert_eq!(
                store
                    .task_heartbeat(&claimed.step_id, held, TTL)
                    .await
                    .unwrap(),
                HeartbeatOutcome::Cancelled
            );
        }
        assert!(store
            .tasks_claim(&request(&["claimed", "pending"], "w2", 10))
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            store
                .task_complete(&id(&key, "pending"), &json!("late"))
                .await
                .unwrap(),
            ReportOutcome::Cancelled
        );
        let batch = [
            (id(&key, "claimed"), json!("late")),
            (id(&key, "done"), json!("again")),
        ];
        assert_eq!(
            store.tasks_complete(&batch).await.unwrap(),
            [ReportOutcome::Cancelled, ReportOutcome::AlreadySettled]
        );
        let declined = failure("declined", None, true);
        assert_eq!(
            store
                .task_fail(&claimed.step_id, claimed.claim, &declined, TTL)
                .await
                .unwrap(),
            ReportOutcome::Cancelled
        );
        let after = task(&store, &key, "claimed").await;
        assert_eq!(
            (after.attempts, after.output, after.last_error),
            (0, None, None)
        );
        assert_eq!(
            rows(&store, &key),
            [
                row("remote:done", "remote", json!({"ok": "kept"})),
                row(marker_name::CANCELLED, "cancelled", Value::Null),
            ]
        );
        assert_eq!(
            store.remote_arm(&arm(&key, "pending")).await.unwrap(),
            RemoteArmOutcome::Waiting { deadline: None }
        );
        assert_eq!(
            store.remote_redispatch_pending(&key).await.unwrap(),
            Some(0)
        );
        assert_eq!(
            task(&store, &key, "pending").await.status,
            TaskStatus::Cancelled
        );
    }

    #[tokio::test]
    async fn a_continue_as_new_cancels_the_tasks_of_the_generation_it_leaves() {
        let store = store();
        let key = start(&store, "a").await;
        store.remote_arm(&arm(&key, "label")).await.unwrap();
        let claimed = claim_one(&store, "label").await;
        let rotate = Event::WorkflowContinuedAsNew {
            next_generation: 1,
            input: json!("next"),
        };
        assert_eq!(
            append(&store, &key, None, rotate, None).await.unwrap(),
            AppendOutcome::Appended
        );
        assert_eq!(status(&store, &key).await, Status::Running);
        assert_eq!(
            task(&store, &key, "label").await.status,
            TaskStatus::Cancelled
        );
        assert_eq!(
            store
                .task_heartbeat(&claimed.step_id, claimed.claim, TTL)
                .await
                .unwrap(),
            HeartbeatOutcome::Cancelled
        );
        let next = RemoteArm {
            step_id: remote_step_id(&key, 1, "label"),
            generation: 1,
            ..arm(&key, "label")
        };
        assert_eq!(
            store.remote_arm(&next).await.unwrap(),
            RemoteArmOutcome::Dispatched { deadline: None }
        );
        assert_eq!(claim_one(&store, "label").await.step_id, next.step_id);
    }
}
