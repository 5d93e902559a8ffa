//! The workflow context, [`Ctx`]: what a body calls to journal steps, await wake sources,
//! take patch decisions and continue as new.
//!
//! This module owns the type, with what reaches into it from outside ([`run_store`], for a
//! store crate's wake sources, and [`BoxFuture`], the form of a race's branches and of a
//! workflow's erased body), and what every family of calls shares: the replay half of a
//! call ([`Ctx::replayed`]), the checks before fresh work (decided by
//! [`fresh_call`], carried out here), the append of a fresh result, the general await and the
//! attempt loop of steps with a retry policy. Each family of calls is a file of its own that
//! uses these and the run's state (`state`), never another family: plain steps (`step`),
//! steps with a retry policy (`retry`), steps journaled in their own transaction
//! (`transaction`), awaits of deliveries (`awaits`), patches and continue-as-new (`patch`),
//! durable sleeps (`timers`), signals, awakeables, child workflows, remote steps and races
//! (`race`), events and streams (`messages`), updates (`updates`).
//!
//! A fresh step costs one store round trip in steady state: its append also renews the lease
//! (a store may skip the rewrite while more than 3/4 of the lease is left, so a confirmation
//! always leaves at least half a TTL when the next action starts)
//! and re-checks the terminal markers. Before a fresh action the context confirms the lease
//! explicitly only when the last confirmation is older than [`RunOptions::confirm_after`], so a
//! long gap between steps (or a slow body) never runs an action on a stale lease.

pub(crate) mod attributes;
pub(crate) mod awaits;
pub(crate) mod awakeables;
pub(crate) mod children;
pub(crate) mod messages;
pub(crate) mod patch;
pub(crate) mod race;
pub(crate) mod remote;
pub(crate) mod retry;
pub(crate) mod signals;
pub(crate) mod step;
pub(crate) mod timers;
pub(crate) mod transaction;
pub(crate) mod updates;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::model::budget::JournalSize;
use crate::model::event::{attempt_failed_step, attempt_step};
use crate::model::id;
pub(crate) use crate::model::payload::decode;
use crate::model::retry::{step_failed, Attempt};
use crate::state::fresh::{fresh_call, FreshCall, Stage};
use crate::state::replay::{Lookup, Replay};
use crate::state::{Halt, Run, State};
use crate::store::contract::{self as store, JournalStore};
use crate::unwind::{CatchPanic, YieldNow};
use crate::{
    Generation, InstanceKey, Marker, RunOptions, Status, StepKind, StepOptions, WorkflowError,
};

/// A boxed, sendable future: a race's branch ([`Ctx::select`]) and a workflow body erased to
/// JSON ([`Workflow::call`](crate::Workflow::call)).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The store a run journals to, for a store crate's own wake sources (the Postgres store's
/// transaction steps find their store through it). The run's last step may still be held back:
/// a journal write through it comes after a call that sends that step first.
///
/// ```
/// # async fn demo(ctx: keiro_journal::Ctx) {
/// println!("{:?}", keiro_journal::store::run_store(&ctx));
/// # }
/// ```
pub fn run_store(ctx: &Ctx) -> &Arc<dyn JournalStore> {
    ctx.store()
}

/// What an await's arm found.
pub(crate) enum Armed {
    /// The value is already journaled (by the arm itself, in its own transaction).
    Ready(Value),
    /// Not yet: suspend, waking by this deadline if any.
    Deadline(Option<OffsetDateTime>),
}

/// The store operation that journals a fresh step.
pub(crate) enum RecordVia {
    /// A plain append.
    Append,
    /// An append that also registers this awakeable.
    Awakeable(uuid::Uuid),
    /// An append that also spawns this child.
    Child(crate::ChildSpawn),
    /// A race's decision that also gives back the signals its losing waits took.
    Race(Vec<crate::ReturnedSignal>),
    /// An event's write, under this key.
    Event(String),
    /// A stream's append.
    Stream(store::StreamWrite),
    /// A stream's close, under this key.
    StreamClose(String),
    /// An update's answer.
    Update(crate::update::UpdateAnswer),
    /// A set of search attributes.
    Attributes(crate::attribute::Attributes),
}

/// The handle a workflow body uses. Cheap to clone; clones share one run.
#[derive(Clone)]
pub struct Ctx {
    pub(crate) inner: Arc<Run>,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("key", &self.inner.key)
            .field("generation", &self.inner.generation)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    pub(crate) fn new(
        store: Arc<dyn JournalStore>,
        key: InstanceKey,
        generation: Generation,
        replay: Replay,
        journal_size: JournalSize,
        options: RunOptions,
    ) -> Self {
        Self {
            inner: Arc::new(Run::new(
                store,
                key,
                generation,
                replay,
                journal_size,
                options,
            )),
        }
    }

    /// The run's state, locked.
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state()
    }

    /// The instance this run drives.
    pub fn key(&self) -> &InstanceKey {
        &self.inner.key
    }

    /// The journal generation this run is on.
    pub fn generation(&self) -> Generation {
        self.inner.generation
    }

    /// The run's options.
    pub fn options(&self) -> &RunOptions {
        &self.inner.options
    }

    /// The store the run journals to, for keiro's own wake sources. The run's last step may
    /// still be held back (`held_back`): a journal write through it comes after a call that
    /// sends that step first (`before_fresh_work`, or `send_held_back`).
    pub(crate) fn store(&self) -> &Arc<dyn JournalStore> {
        &self.inner.store
    }
    /// The general form of [`step`](Self::step) for keiro's own wake sources, which record under
    /// reserved names and kinds.
    pub(crate) async fn journaled<T, E, F, Fut>(
        &self,
        step: &str,
        kind: StepKind,
        action: F,
    ) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        if let Some(value) = self.replayed(step, kind)? {
            return decode(step, value);
        }
        self.before_fresh_work(step).await?;
        // No await between the flush in `before_fresh_work` and this count: a remote step
        // armed from now on, while the action runs, is dispatched at once.
        let _running = ActionRunning::new(self);
        let started = Instant::now();
        let span = tracing::debug_span!("step", keiro.workflow.step = step);
        let action = tracing::Instrument::instrument(CatchPanic::new(action()), span);
        let value = match self.inner.keep_alive(action).await {
            Ok(Ok(value)) => value,
            Ok(Err(e)) => {
                return Err(WorkflowError::Step {
                    step: step.to_owned(),
                    message: e.to_string(),
                })
            }
            Err(message) => {
                return Err(WorkflowError::Panicked {
                    step: step.to_owned(),
                    message,
                })
            }
        };
        self.state().stats.executed += 1;
        if let Some(value) = self.inner.hold_back(step, kind, started, &value) {
            return value;
        }
        self.record_result(step, kind, started, &value).await
    }

    /// Journals the result of an action that has run: an unstorable result fails the run at
    /// once, because running the action again would only produce it again.
    pub(crate) async fn record_result<T>(
        &self,
        step: &str,
        kind: StepKind,
        started: Instant,
        value: &T,
    ) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned,
    {
        let recorded = self.record_encoded(step, kind, started, value).await?;
        decode(step, recorded)
    }

    /// [`record_result`](Self::record_result) up to the journaled value, undecoded.
    pub(crate) async fn record_encoded<T: Serialize + ?Sized>(
        &self,
        step: &str,
        kind: StepKind,
        started: Instant,
        value: &T,
    ) -> Result<Value, WorkflowError> {
        let json = match self.inner.encode(step, value) {
            Ok(json) => json,
            Err(error) => return Err(self.inner.fail_at_once(error)),
        };
        let recorded = self.record(step, kind, json).await?;
        if let Some(observer) = &self.inner.options.observer {
            observer.step_finished(&self.inner.key.name, kind, started.elapsed());
        }
        Ok(recorded)
    }

    /// The await with an arm: on a journal miss, `arm` runs once per drive (it must be
    /// idempotent: it creates a timer, registers a waiter) and either says the value is already
    /// journaled, or gives the await's natural deadline before the run suspends.
    pub(crate) async fn awaited_with<A, Fut>(
        &self,
        step: &str,
        kind: StepKind,
        arm: A,
    ) -> Result<Value, WorkflowError>
    where
        A: FnOnce() -> Fut,
        Fut: Future<Output = Result<Armed, WorkflowError>>,
    {
        self.awaited_inner(step, kind, true, arm).await
    }

    /// [`awaited_with`](Self::awaited_with) for an arm that defers its write (a remote
    /// step's): it does not write the dispatches deferred before it either, so remote steps
    /// awaited together are all written with the park.
    pub(crate) async fn awaited_deferring<A, Fut>(
        &self,
        step: &str,
        kind: StepKind,
        arm: A,
    ) -> Result<Value, WorkflowError>
    where
        A: FnOnce() -> Fut,
        Fut: Future<Output = Result<Armed, WorkflowError>>,
    {
        self.awaited_inner(step, kind, false, arm).await
    }

    async fn awaited_inner<A, Fut>(
        &self,
        step: &str,
        kind: StepKind,
        flush: bool,
        arm: A,
    ) -> Result<Value, WorkflowError>
    where
        A: FnOnce() -> Fut,
        Fut: Future<Output = Result<Armed, WorkflowError>>,
    {
        if let Some(value) = self.replayed(step, kind)? {
            return Ok(value);
        }
        self.prepare_fresh(step, flush).await?;
        match arm().await? {
            Armed::Ready(value) => {
                self.inner.count_appended(crate::encoded_len(&value));
                let mut state = self.state();
                state.stats.appended += 1;
                state.replay.record_fresh(step, kind, value.clone());
                Ok(value)
            }
            Armed::Deadline(deadline) => {
                let mut state = self.state();
                // After an operator's reset the value arrives under the step's next revision.
                let stored = state.replay.stored_name(step).into_owned();
                if !state.awaiting.contains(&stored) {
                    state.awaiting.push(stored);
                }
                match deadline {
                    Some(at) => state.wake_at = Some(state.wake_at.map_or(at, |w| w.min(at))),
                    None => state.open_ended = true,
                }
                Err(WorkflowError::Suspended {
                    step: step.to_owned(),
                })
            }
        }
    }

    /// Replay half of every call: `Some(value)` on a journal hit.
    pub(crate) fn replayed(
        &self,
        step: &str,
        kind: StepKind,
    ) -> Result<Option<Value>, WorkflowError> {
        let mut state = self.state();
        if let Some(halt) = &state.halt {
            return Err(WorkflowError::Halted {
                reason: halt.describe(),
            });
        }
        match state.replay.lookup(step, kind) {
            Lookup::Hit(value) => {
                state.stats.replayed += 1;
                if state.race_marks.is_some() {
                    let position = state.replay.position(step);
                    if let Some(marks) = &mut state.race_marks {
                        marks.read(position);
                    }
                }
                Ok(Some(value))
            }
            Lookup::Miss => Ok(None),
            Lookup::KindMismatch { recorded } => {
                let detail = format!(
                    "recorded by a {} call, now read by a {} call",
                    recorded.as_str(),
                    kind.as_str()
                );
                drop(state);
                Err(self.inner.diverged(step, detail))
            }
        }
    }

    /// The checks before any fresh side effect: let siblings replay, detect divergence, and
    /// make sure the lease and the terminal markers were confirmed recently.
    pub(crate) async fn before_fresh_work(&self, step: &str) -> Result<(), WorkflowError> {
        self.prepare_fresh(step, true).await
    }

    /// Queues a remote step's dispatch for the park (deduplicated by step id), or writes it
    /// now when a step action is running beside it (the park may be far off). Returns what a
    /// write now found, `None` when queued.
    pub(crate) async fn dispatch(
        &self,
        arm: crate::RemoteArm,
    ) -> Result<Option<crate::RemoteArmOutcome>, WorkflowError> {
        {
            let mut state = self.state();
            if state.actions_running == 0 {
                if !state.deferred.iter().any(|a| a.step_id == arm.step_id) {
                    state.deferred.push(arm);
                }
                return Ok(None);
            }
        }
        let outcome = self
            .inner
            .store
            .remote_arm(&arm)
            .await
            .map_err(|e| self.inner.store_failed(&arm.journal_step, e))?;
        outcome.observe(self.inner.options.observer.as_ref(), &arm.group);
        Ok(Some(outcome))
    }

    /// Writes the deferred dispatches now, because the body is about to do something else
    /// that could take long (a step's action) or not park at all.
    async fn flush_deferred(&self) -> Result<(), WorkflowError> {
        let arms = std::mem::take(&mut self.state().deferred);
        for arm in arms {
            let outcome = self
                .inner
                .store
                .remote_arm(&arm)
                .await
                .map_err(|e| self.inner.store_failed(&arm.journal_step, e))?;
            // A result found here is journaled: the park sees it and the run is re-driven.
            outcome.observe(self.inner.options.observer.as_ref(), &arm.group);
        }
        Ok(())
    }

    /// Carries out the checks before a fresh call at `step` ([`fresh_call`] decides them),
    /// then writes the deferred dispatches when `flush`.
    async fn prepare_fresh(&self, step: &str, flush: bool) -> Result<(), WorkflowError> {
        let mut stage = Stage::Entered;
        loop {
            let call = {
                let mut state = self.state();
                let call = fresh_call(&state, self.options(), step, stage, Instant::now());
                if let FreshCall::Settle = call {
                    // Whatever this branch of a race resolves from here on, it resolves in
                    // this drive.
                    if let Some(marks) = &mut state.race_marks {
                        marks.fresh = true;
                    }
                }
                call
            };
            match call {
                FreshCall::Suspend => {
                    return Err(WorkflowError::Suspended {
                        step: step.to_owned(),
                    })
                }
                FreshCall::Settle => {
                    self.inner.send_held_back().await?;
                    YieldNow::new().await;
                    stage = Stage::Settled;
                }
                FreshCall::Halted { reason } => return Err(WorkflowError::Halted { reason }),
                FreshCall::Diverged { detail } => return Err(self.inner.diverged(step, detail)),
                FreshCall::Refused(error) => return Err(error),
                FreshCall::Proceed { confirm } => {
                    if confirm {
                        self.confirm().await?;
                    }
                    break;
                }
            }
        }
        if flush && !self.state().deferred.is_empty() {
            self.flush_deferred().await?;
        }
        Ok(())
    }

    /// Confirms the lease when the last confirmation is older than
    /// [`RunOptions::confirm_after`].
    pub(crate) async fn confirm_if_stale(&self) -> Result<(), WorkflowError> {
        if self.state().last_confirmed.elapsed() < self.inner.options.confirm_after {
            return Ok(());
        }
        self.confirm().await
    }

    /// Confirms the lease (unfenced: reads the instance's status), halting the run when the
    /// instance is terminal.
    async fn confirm(&self) -> Result<(), WorkflowError> {
        let status = match &self.inner.options.fence {
            Some(fence) => {
                self.inner
                    .store
                    .instance_confirm(&self.inner.key, fence, self.inner.options.lease_ttl)
                    .await
            }
            None => self
                .inner
                .store
                .instance_get(&self.inner.key)
                .await
                .and_then(|row| {
                    row.map(|r| r.status).ok_or_else(|| store::Error::NotFound {
                        key: self.inner.key.clone(),
                    })
                }),
        };
        let status = status.map_err(|e| self.inner.store_failed("__workflow_confirm__", e))?;
        let marker = match status {
            Status::Cancelled => Some(Marker::Cancelled),
            Status::Failed => Some(Marker::Failed),
            Status::Completed => Some(Marker::Completed),
            Status::Running | Status::Suspended => None,
        };
        if let Some(marker) = marker {
            return Err(self.inner.halt(Halt::Terminal(marker)));
        }
        self.inner.confirmed(Instant::now());
        Ok(())
    }

    /// Appends a fresh step result and returns the value every reader must adopt.
    pub(crate) async fn record(
        &self,
        step: &str,
        kind: StepKind,
        json: Value,
    ) -> Result<Value, WorkflowError> {
        self.record_via(step, kind, json, RecordVia::Append).await
    }

    /// Appends a fresh step through the store operation `via` (a plain append, or one that also
    /// registers an awakeable or spawns a child in the same transaction).
    pub(crate) async fn record_via(
        &self,
        step: &str,
        kind: StepKind,
        json: Value,
        via: RecordVia,
    ) -> Result<Value, WorkflowError> {
        self.inner.send_held_back().await?;
        if let Some(marks) = &mut self.state().race_marks {
            marks.fresh = true;
        }
        let len = crate::encoded_len(&json);
        self.inner.check_budget_for(step, len)?;
        let append = self.inner.fresh_append(step, kind, json.clone());
        let started = Instant::now();
        let store = &self.inner.store;
        let outcome = match &via {
            RecordVia::Append => store.journal_append(&append).await,
            RecordVia::Awakeable(id) => store.awakeable_create(&append, *id).await,
            RecordVia::Child(spawn) => store.child_spawn(&append, spawn).await,
            RecordVia::Race(signals) => store.signal_return(&append, signals).await,
            RecordVia::Event(key) => store.event_set(&append, key).await,
            RecordVia::StreamClose(key) => store.stream_close(&append, key).await,
            RecordVia::Stream(write) => match store.stream_write(&append, write).await {
                Ok(store::StreamOutcome::Append(outcome)) => Ok(outcome),
                Ok(store::StreamOutcome::Closed) => {
                    return Err(WorkflowError::StreamClosed {
                        key: write.key.clone(),
                    })
                }
                Ok(store::StreamOutcome::Full { items, bytes }) => {
                    return Err(WorkflowError::StreamFull {
                        key: write.key.clone(),
                        scope: "stream",
                        items: items + 1,
                        bytes: bytes.saturating_add(u64::try_from(len).unwrap_or(u64::MAX)),
                        budget_items: write.items_max,
                        budget_bytes: write.bytes_max,
                    })
                }
                Err(e) => Err(e),
            },
            RecordVia::Attributes(attributes) => {
                match store.attributes_set(&append, attributes).await {
                    Ok(store::AttributesOutcome::Append(outcome)) => Ok(outcome),
                    Ok(store::AttributesOutcome::TooMany { count }) => {
                        return Err(attributes::too_many(count))
                    }
                    Err(e) => Err(e),
                }
            }
            RecordVia::Update(answer) => match store.update_answer(&append, answer).await {
                Ok(crate::update::UpdateAnswerOutcome::Append(outcome)) => Ok(outcome),
                Ok(crate::update::UpdateAnswerOutcome::Unknown) => {
                    return Err(WorkflowError::UpdateUnknown {
                        name: answer.name.clone(),
                        id: answer.id.clone(),
                    })
                }
                Ok(crate::update::UpdateAnswerOutcome::Answered) => {
                    return Err(WorkflowError::UpdateAnswered {
                        name: answer.name.clone(),
                        id: answer.id.clone(),
                    })
                }
                Err(e) => Err(e),
            },
        }
        .map_err(|e| self.inner.store_failed(step, e))?;
        self.inner.adopt(step, kind, json, len, outcome, started)
    }

    /// The attempt loop of every step kind with a retry policy: replays a recorded result or
    /// final failure, counts the failed attempts already journaled, then runs `attempt(n)`
    /// until one succeeds (it journals its own result) or the policy gives up, journaling each
    /// failure and keeping the lease alive between attempts.
    pub(crate) async fn retrying<T, A, Fut>(
        &self,
        name: &str,
        options: &StepOptions,
        mut attempt: A,
    ) -> Result<T, WorkflowError>
    where
        T: DeserializeOwned,
        A: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<Attempt, WorkflowError>>,
    {
        id::validate_user_step(name)?;
        if let Some(value) = self.replayed(name, StepKind::Step)? {
            return decode(name, value);
        }
        let failed_step = attempt_failed_step(name);
        if let Some(failure) = self.replayed(&failed_step, StepKind::Attempt)? {
            return Err(step_failed(name, &failure));
        }
        let mut failures = 0;
        while self
            .replayed(&attempt_step(name, failures + 1), StepKind::Attempt)?
            .is_some()
        {
            failures += 1;
        }
        self.before_fresh_work(name).await?;
        let max_attempts = options.max_attempts.max(1);
        loop {
            let n = failures + 1;
            let outcome = attempt(n).await;
            self.state().stats.executed += 1;
            let (message, retry) = match outcome? {
                Attempt::Succeeded(value) => return decode(name, value),
                Attempt::Failed { message, retry } => (message, retry),
            };
            failures = n;
            let record = json!({ "attempt": n, "message": crate::storable_text(&message) });
            if !retry || n >= max_attempts {
                let recorded = self.record(&failed_step, StepKind::Attempt, record).await?;
                return Err(step_failed(name, &recorded));
            }
            self.record(&attempt_step(name, n), StepKind::Attempt, record)
                .await?;
            self.inner
                .keep_alive(tokio::time::sleep(options.jittered_interval(failures)))
                .await;
            // The wait may have outlived the lease or met a cancel: stop before the next try.
            self.before_fresh_work(name).await?;
        }
    }
}

/// Counts a running step action for as long as it lives (dropped on completion, panic or
/// cancellation alike).
pub(crate) struct ActionRunning<'a>(&'a Ctx);

impl<'a> ActionRunning<'a> {
    pub(crate) fn new(ctx: &'a Ctx) -> Self {
        ctx.state().actions_running += 1;
        Self(ctx)
    }
}

impl Drop for ActionRunning<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.actions_running = state.actions_running.saturating_sub(1);
    }
}
