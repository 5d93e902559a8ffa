//! The workflow context: what a body calls to journal steps, await wake sources, take
//! patch decisions and continue as new.
//!
//! A fresh step costs one store round trip in steady state: its append also renews the lease
//! (a store may skip the rewrite while more than 3/4 of the lease is left, so a confirmation
//! always leaves at least half a TTL when the next action starts)
//! and re-checks the terminal markers. Before a fresh action the context confirms the lease
//! explicitly only when the last confirmation is older than [`RunOptions::confirm_after`], so a
//! long gap between steps (or a slow body) never runs an action on a stale lease.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;

use crate::replay::{Lookup, Replay};
use crate::store::{Append, JournalStore};
use crate::unwind::{CatchPanic, YieldNow};
use crate::{
    id, store, Event, Fence, Generation, InstanceKey, Marker, Status, StepKind, WorkflowError,
};

/// The default lease time-to-live of a run.
pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(60);
/// The default largest JSON payload (input, step result, output), in bytes.
pub const PAYLOAD_LEN_MAX_DEFAULT: usize = 4 * 1024 * 1024;
/// The default reconcile fallback for runs parked on an event with no deadline.
pub const RECONCILE_DEFAULT: Duration = Duration::from_secs(300);

/// Told about every step that ran its action, for metrics. Implemented by the resume worker
/// over OpenTelemetry; keep it cheap, it runs on the hot path.
pub trait StepObserver: Send + Sync + std::fmt::Debug {
    /// A fresh step of `kind` in workflow `workflow` took `duration` from action start to the
    /// end of its append.
    fn step_finished(&self, workflow: &crate::WorkflowName, kind: StepKind, duration: Duration);

    /// A remote step's task was written for worker group `group`.
    fn remote_dispatched(&self, _group: &str) {}

    /// A remote step's task passed its redispatch deadline and was dispatched again.
    fn remote_redispatched(&self, _group: &str) {}

    /// A remote step failed with `remote_step_lost` after its last redispatch.
    fn remote_lost(&self, _group: &str) {}
}

/// Gives the W3C trace context of the current span, carried on remote tasks so a remote
/// handler's span joins the workflow's trace (`keiro-telemetry` implements it over
/// OpenTelemetry).
pub trait TraceContext: Send + Sync + std::fmt::Debug {
    /// The `traceparent` header value of the current span; `None` when no trace is exported.
    fn traceparent(&self) -> Option<String>;
}

/// How one run is driven.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The lease the run holds. `None` runs unfenced (inline use, tests).
    /// Defaults to `None`.
    pub fence: Option<Fence>,
    /// How long each renewal extends the lease. Defaults to [`LEASE_TTL_DEFAULT`].
    pub lease_ttl: Duration,
    /// A fresh action starts only on a confirmation (a renewal, or an append's implicit one)
    /// younger than this. Defaults to a quarter of `lease_ttl`, fixed by [`RunOptions::new`].
    pub confirm_after: Duration,
    /// The largest encoded payload accepted. Defaults to [`PAYLOAD_LEN_MAX_DEFAULT`].
    pub payload_len_max: usize,
    /// A run parked on an event with no natural deadline becomes due again after this, so a
    /// lost wake heals by an idempotent re-drive. `None` disables it.
    /// Defaults to [`RECONCILE_DEFAULT`].
    pub reconcile: Option<Duration>,
    /// Told about each executed step. Defaults to `None`.
    pub observer: Option<Arc<dyn StepObserver>>,
    /// Stamps remote tasks with the dispatching span's trace context. Defaults to `None`.
    pub trace_context: Option<Arc<dyn TraceContext>>,
    /// When the lease in `fence` was last confirmed before the drive: the time its claim was
    /// asked for. A run that waited in a worker's queue after a batch claim so confirms again
    /// before its first fresh action when this is older than `confirm_after`. `None` counts
    /// from the start of the drive. Defaults to `None`.
    pub confirmed_at: Option<Instant>,
    /// The store's clock when the run's claim was granted (the claimed row's `updated_at`).
    /// The one deadline a run computes itself, the reconcile fallback, counts from it plus
    /// the time since `confirmed_at`, so it is on the store's clock like every other deadline
    /// and a worker whose own clock is off neither re-drives parked runs at once nor leaves
    /// them late. `None` counts from the worker's clock. Defaults to `None`.
    pub claimed_at: Option<OffsetDateTime>,
    /// How long one generation's journal may grow before fresh steps fail with
    /// [`WorkflowError::JournalFull`]. Defaults to [`JournalBudget::default`](crate::JournalBudget::default).
    pub journal_budget: crate::JournalBudget,
    /// Where runs crash on purpose, for tests. Defaults to `None`.
    pub faults: Option<Arc<dyn crate::Faults>>,
    /// Replay only: any fresh work (a step's action, an await's arm) is a divergence instead of
    /// being done, so a recorded history can be checked against the current code without
    /// running anything. Defaults to `false`.
    pub replay_only: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self::new(LEASE_TTL_DEFAULT)
    }
}

impl RunOptions {
    /// The store's clock now, as well as the run knows it: [`claimed_at`](Self::claimed_at)
    /// plus the time since [`confirmed_at`](Self::confirmed_at), or the worker's clock for an
    /// unclaimed run.
    pub(crate) fn store_now(&self) -> OffsetDateTime {
        match (self.claimed_at, self.confirmed_at) {
            (Some(at), Some(asked)) => at + asked.elapsed(),
            (Some(at), None) => at,
            (None, _) => OffsetDateTime::now_utc(),
        }
    }

    /// Options for a lease of `lease_ttl`, with `confirm_after` a quarter of it.
    pub fn new(lease_ttl: Duration) -> Self {
        Self {
            fence: None,
            lease_ttl,
            confirm_after: lease_ttl / 4,
            payload_len_max: PAYLOAD_LEN_MAX_DEFAULT,
            reconcile: Some(RECONCILE_DEFAULT),
            observer: None,
            trace_context: None,
            confirmed_at: None,
            claimed_at: None,
            journal_budget: crate::JournalBudget::default(),
            faults: None,
            replay_only: false,
        }
    }
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
}

/// Counts of what a run did, for summaries and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Steps whose action ran (journal misses).
    pub executed: u64,
    /// Steps answered from the journal (journal hits).
    pub replayed: u64,
    /// Events this run appended (steps, patch decisions, markers).
    pub appended: u64,
}

/// Why a run stopped early; the first reason wins.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Halt {
    Terminal(Marker),
    LeaseLost,
    Store,
    Conflict {
        step: String,
    },
    NonDeterminism {
        step: String,
        detail: String,
    },
    ContinueAsNew {
        input: Value,
    },
    /// The run must fail at once with this reason: a value the store refused, or a step result
    /// found unstorable after its action ran (running the action again would not help).
    Fail {
        reason: String,
    },
    /// The run crashes (injected by [`Faults`](crate::Faults)): retried like a failing step.
    Crash {
        message: String,
    },
}

impl Halt {
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Terminal(m) => format!("the instance is {}", m.kind_str()),
            Self::LeaseLost => "the lease was lost".into(),
            Self::Store => "a store call failed".into(),
            Self::Conflict { step } => format!("append of {step} conflicted"),
            Self::NonDeterminism { step, detail } => format!("non-determinism at {step}: {detail}"),
            Self::ContinueAsNew { .. } => "continuing as new".into(),
            Self::Fail { reason } => format!("the run fails: {reason}"),
            Self::Crash { message } => format!("the run crashed: {message}"),
        }
    }
}

pub(crate) struct State {
    pub(crate) replay: Replay,
    pub(crate) halt: Option<Halt>,
    pub(crate) store_error: Option<store::Error>,
    /// Awaited steps of a suspension, with the earliest natural deadline among them.
    pub(crate) awaiting: Vec<String>,
    pub(crate) wake_at: Option<OffsetDateTime>,
    /// Whether any await had no natural deadline (so the reconcile fallback applies).
    pub(crate) open_ended: bool,
    last_confirmed: Instant,
    pub(crate) stats: RunStats,
    /// How many signal waits on each token this run has made, for their step names.
    pub(crate) signal_ordinals: std::collections::HashMap<String, u32>,
    /// The park at the end of the run, if it parked.
    pub(crate) parked: Option<crate::run::Parked>,
    /// Remote steps armed but not yet written: they go with the park, or before the body's
    /// next other fresh action.
    pub(crate) deferred: Vec<crate::RemoteArm>,
    /// Step actions running now (concurrent branches of a `join`): while one runs, a remote
    /// step is dispatched at once instead of waiting for the park.
    pub(crate) actions_running: u32,
    /// Actions holding the instance row locked in their own transaction, fenced
    /// ([`StepJournal::hold_lease`](crate::StepJournal::hold_lease)): while any does, nobody
    /// else can take the lease over and the heartbeat renews nothing.
    pub(crate) leases_held: u32,
    /// Set while the body polls a branch that lost a decided [`Ctx::select`]: it may replay,
    /// but any fresh work (an arm, an action) suspends instead of happening.
    pub(crate) disarmed: bool,
    /// The steps of signal waits this drive registered, so a race can withdraw its losers'.
    pub(crate) signal_waits_armed: Vec<String>,
    /// While a [`Ctx::select`] polls one of its branches: what the branch has read so far, to
    /// decide the race by journal order and give back the signals a losing branch took.
    pub(crate) race_marks: Option<crate::race::RaceMarks>,
    /// What the generation's journal holds, for the journal budget.
    pub(crate) journal_size: crate::budget::JournalSize,
    /// Set by the driver, which sends a held-back append whenever the body waits: only then
    /// may a step's append be held back (`held_back`).
    pub(crate) drives_held_back: bool,
    /// The last step's append, held back for the completion to carry (`held_back`).
    pub(crate) held_back: Option<crate::held_back::HeldBack>,
    /// Set while someone sends the held-back append; the others wait for `held_back_sent`.
    pub(crate) held_back_sending: bool,
}

pub(crate) struct Inner {
    store: Arc<dyn JournalStore>,
    key: InstanceKey,
    generation: Generation,
    options: RunOptions,
    pub(crate) state: Mutex<State>,
    /// Told when a held-back append has been answered.
    pub(crate) held_back_sent: tokio::sync::Notify,
}

/// The handle a workflow body uses. Cheap to clone; clones share one run.
#[derive(Clone)]
pub struct Ctx {
    pub(crate) inner: Arc<Inner>,
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
        journal_size: crate::budget::JournalSize,
        options: RunOptions,
    ) -> Self {
        let last_confirmed = options.confirmed_at.unwrap_or_else(Instant::now);
        Self {
            inner: Arc::new(Inner {
                store,
                key,
                generation,
                options,
                state: Mutex::new(State {
                    replay,
                    halt: None,
                    store_error: None,
                    awaiting: Vec::new(),
                    wake_at: None,
                    open_ended: false,
                    last_confirmed,
                    stats: RunStats::default(),
                    signal_ordinals: std::collections::HashMap::new(),
                    parked: None,
                    deferred: Vec::new(),
                    actions_running: 0,
                    leases_held: 0,
                    disarmed: false,
                    signal_waits_armed: Vec::new(),
                    race_marks: None,
                    journal_size,
                    drives_held_back: false,
                    held_back: None,
                    held_back_sending: false,
                }),
                held_back_sent: tokio::sync::Notify::new(),
            }),
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means a panic while holding it; the state is plain data updated in
        // single assignments, so it is still consistent.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
    #[doc(hidden)]
    pub fn store(&self) -> &Arc<dyn JournalStore> {
        &self.inner.store
    }

    /// Runs `action` once and journals its result under `name`; on replay returns the recorded
    /// result without running it.
    ///
    /// The first run returns the JSON round-trip of the result, so a lossy `Serialize`/
    /// `Deserialize` pair shows at once rather than only after a crash.
    ///
    /// An `Err` from the action, or a panic inside it, crashes the run: nothing is journaled,
    /// and the resume worker retries the run with backoff.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// let total: u64 = ctx
    ///     .step("sum", || async { Ok::<_, std::io::Error>(40 + 2) })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Step`] or [`WorkflowError::Panicked`] for a failing action;
    /// [`WorkflowError::Halted`] when the run must stop; [`WorkflowError::NonDeterminism`]
    /// when the code no longer matches the journal; [`WorkflowError::Decode`] when the recorded
    /// value does not fit `T`.
    pub async fn step<T, E, F, Fut>(&self, name: &str, action: F) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned,
        E: std::fmt::Display,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        id::validate_user_step(name)?;
        self.journaled(name, StepKind::Step, action).await
    }

    /// The general form of [`step`](Self::step) for keiro's own wake sources, which record under
    /// reserved names and kinds.
    #[doc(hidden)]
    pub async fn journaled<T, E, F, Fut>(
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
        let value = match self.keep_alive(action).await {
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
        if let Some(value) = self.hold_back(step, kind, started, &value) {
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
        let json = match self.encode(step, value) {
            Ok(json) => json,
            Err(error) => return Err(self.fail_at_once(error)),
        };
        let recorded = self.record(step, kind, json).await?;
        if let Some(observer) = &self.inner.options.observer {
            observer.step_finished(&self.inner.key.name, kind, started.elapsed());
        }
        Ok(recorded)
    }

    /// Waits for a value that something outside the run journals under `name` (see
    /// `deliver`). The first time, the run suspends; once the value is journaled the
    /// instance becomes runnable and the re-driven run returns it.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// let approved: bool = ctx.await_step("approval").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] while the value is absent (propagate it with `?`), and the
    /// errors of [`step`](Self::step).
    pub async fn await_step<T: DeserializeOwned>(&self, name: &str) -> Result<T, WorkflowError> {
        id::validate_user_step(name)?;
        if let Some(value) = self.delivered_under_bare_name(name) {
            return decode(name, value);
        }
        let stored = crate::event::await_step_name(name);
        let value = self
            .awaited_with(&stored, StepKind::Await, || async {
                Ok(Armed::Deadline(None))
            })
            .await?;
        decode(name, value)
    }

    /// A value an older keiro delivered under the await's bare name, before deliveries got
    /// their own `await:` namespace: a run parked across the upgrade still reads it. Anything
    /// else recorded under the bare name is the body's own step and not this await's business.
    fn delivered_under_bare_name(&self, name: &str) -> Option<Value> {
        let mut state = self.state();
        if state.halt.is_some() {
            return None; // the await itself reports the halt
        }
        match state.replay.lookup(name, StepKind::Await) {
            Lookup::Hit(value) => {
                state.stats.replayed += 1;
                if state.race_marks.is_some() {
                    let position = state.replay.position(name);
                    if let Some(marks) = &mut state.race_marks {
                        marks.read(position);
                    }
                }
                Some(value)
            }
            Lookup::KindMismatch { .. } | Lookup::Miss => None,
        }
    }

    /// The general await: replay a journaled value, or register the suspension. `deadline`
    /// is the await's natural wake time (a sleep's), `None` for open-ended waits.
    #[doc(hidden)]
    pub async fn awaited<T: DeserializeOwned>(
        &self,
        step: &str,
        kind: StepKind,
        deadline: Option<OffsetDateTime>,
    ) -> Result<T, WorkflowError> {
        let value = self
            .awaited_with(step, kind, || async move { Ok(Armed::Deadline(deadline)) })
            .await?;
        decode(step, value)
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
                self.count_appended(crate::budget::encoded_len(&value));
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

    /// Whether this run takes the new branch of patch `id`.
    ///
    /// The first time a run meets the patch, it takes the old branch (`false`) when the old
    /// code already ran past this point: the journal holds a step the body recorded (see the
    /// `replay` module docs) that this drive has not replayed yet when the call is reached,
    /// so the new branch could contradict it. Otherwise it takes the new branch (`true`),
    /// wherever the patch sits: a run started on the new code, or an older run that had not
    /// recorded anything past this point (it may have parked on an await past it), gets the
    /// new branch even after any number of parks. Before deciding, the call lets the branches
    /// of a `join` polled with it replay their recorded steps, so a step recorded beside the
    /// patch does not count as past it. The decision is journaled under `patch:<id>`, so every
    /// later replay takes the same branch.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// if ctx.patched("send-receipt").await? {
    ///     ctx.step("receipt", || async { Ok::<_, std::io::Error>(()) }).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Halted`] when the run must stop.
    pub async fn patched(&self, id: &str) -> Result<bool, WorkflowError> {
        id::validate_user_step(id)?;
        let step = format!("patch:{id}");
        if let Some(value) = self.replayed(&step, StepKind::Patch)? {
            return decode(&step, value);
        }
        if self.state().disarmed {
            // A losing branch of a decided race records nothing new.
            return Err(WorkflowError::Suspended { step });
        }
        // As before a fresh step, siblings replay first, so only steps recorded past this
        // point (not beside it) are still unconsumed. No divergence check: a patch met before
        // recorded steps is exactly the in-flight case it exists for.
        YieldNow::new().await;
        let decision = {
            let state = self.state();
            if let Some(halt) = &state.halt {
                return Err(WorkflowError::Halted {
                    reason: halt.describe(),
                });
            }
            state.replay.first_unconsumed().is_none()
        };
        self.confirm_if_stale().await?;
        let recorded = self
            .record(&step, StepKind::Patch, Value::Bool(decision))
            .await?;
        decode(&step, recorded)
    }

    /// Ends this generation and continues the same logical instance on a new generation with
    /// `input` and an empty journal, so long-lived workflows keep a bounded journal.
    ///
    /// Always returns an error to propagate with `?`/`return`.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx, n: u32) -> Result<u32, keiro_journal::WorkflowError> {
    /// if n < 10 {
    ///     return Err(ctx.continue_as_new(&(n + 1)));
    /// }
    /// # Ok(n) }
    /// ```
    pub fn continue_as_new<I: Serialize>(&self, input: &I) -> WorkflowError {
        match self.encode("__workflow_continued_as_new__", input) {
            Ok(input) => {
                self.halt(Halt::ContinueAsNew { input });
                WorkflowError::ContinueAsNew
            }
            Err(e) => e,
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
                Err(self.diverged(step, detail))
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
            .map_err(|e| self.store_failed(&arm.journal_step, e))?;
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
                .map_err(|e| self.store_failed(&arm.journal_step, e))?;
            // A result found here is journaled: the park sees it and the run is re-driven.
            outcome.observe(self.inner.options.observer.as_ref(), &arm.group);
        }
        Ok(())
    }

    async fn prepare_fresh(&self, step: &str, flush: bool) -> Result<(), WorkflowError> {
        {
            let mut state = self.state();
            if state.disarmed {
                // A losing branch of a decided race: it replays what is journaled, and waits
                // forever on anything else, without arming it.
                return Err(WorkflowError::Suspended {
                    step: step.to_owned(),
                });
            }
            // Whatever this branch of a race resolves from here on, it resolves in this drive.
            if let Some(marks) = &mut state.race_marks {
                marks.fresh = true;
            }
        }
        self.send_held_back().await?;
        YieldNow::new().await;
        let unreached = {
            let state = self.state();
            if let Some(halt) = &state.halt {
                return Err(WorkflowError::Halted {
                    reason: halt.describe(),
                });
            }
            state.replay.first_unconsumed().map(str::to_owned)
        };
        if let Some(recorded) = unreached {
            let detail =
                format!("recorded step {recorded:?} was not reached before fresh step {step:?}");
            return Err(self.diverged(step, detail));
        }
        if self.inner.options.replay_only {
            let detail = "replay only: the journal has no record of this step".to_owned();
            return Err(self.diverged(step, detail));
        }
        self.check_budget(step)?;
        self.confirm_if_stale().await?;
        if flush && !self.state().deferred.is_empty() {
            self.flush_deferred().await?;
        }
        Ok(())
    }

    async fn confirm_if_stale(&self) -> Result<(), WorkflowError> {
        if self.state().last_confirmed.elapsed() < self.inner.options.confirm_after {
            return Ok(());
        }
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
        let status = status.map_err(|e| self.store_failed("__workflow_confirm__", e))?;
        let marker = match status {
            Status::Cancelled => Some(Marker::Cancelled),
            Status::Failed => Some(Marker::Failed),
            Status::Completed => Some(Marker::Completed),
            Status::Running | Status::Suspended => None,
        };
        if let Some(marker) = marker {
            return Err(self.halt(Halt::Terminal(marker)));
        }
        self.confirmed(Instant::now());
        Ok(())
    }

    /// Notes a confirmation of the lease that was asked for at `at` (concurrent confirmations
    /// may finish out of order; the newest wins).
    pub(crate) fn confirmed(&self, at: Instant) {
        let mut state = self.state();
        if at > state.last_confirmed {
            state.last_confirmed = at;
        }
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

    /// The append a fresh step makes, carrying the run's fence and lease renewal.
    pub(crate) fn fresh_append(&self, step: &str, kind: StepKind, json: Value) -> Append {
        Append {
            key: self.inner.key.clone(),
            generation: Some(self.inner.generation),
            event: Event::StepRecorded {
                step: step.to_owned(),
                kind,
                result: json,
            },
            fence: self.inner.options.fence.clone(),
            renew: self
                .inner
                .options
                .fence
                .as_ref()
                .map(|_| self.inner.options.lease_ttl),
        }
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
        self.send_held_back().await?;
        if let Some(marks) = &mut self.state().race_marks {
            marks.fresh = true;
        }
        let len = crate::budget::encoded_len(&json);
        self.check_budget_for(step, len)?;
        let append = self.fresh_append(step, kind, json.clone());
        let started = Instant::now();
        let store = &self.inner.store;
        let outcome = match &via {
            RecordVia::Append => store.journal_append(&append).await,
            RecordVia::Awakeable(id) => store.awakeable_create(&append, *id).await,
            RecordVia::Child(spawn) => store.child_spawn(&append, spawn).await,
            RecordVia::Race(signals) => store.signal_return(&append, signals).await,
        }
        .map_err(|e| self.store_failed(step, e))?;
        self.adopt(step, kind, json, len, outcome, started)
    }

    pub(crate) fn encode<T: Serialize + ?Sized>(
        &self,
        step: &str,
        value: &T,
    ) -> Result<Value, WorkflowError> {
        encode_payload(step, value, self.inner.options.payload_len_max)
    }

    pub(crate) fn diverged(&self, step: &str, detail: String) -> WorkflowError {
        self.halt(Halt::NonDeterminism {
            step: step.to_owned(),
            detail: detail.clone(),
        });
        WorkflowError::NonDeterminism {
            step: step.to_owned(),
            detail,
        }
    }

    /// The error a failed store call at `step` gives the body, with the halt it implies: a
    /// refused value fails the run at once; a lost lease or any other store error stops it.
    pub(crate) fn store_failed(&self, step: &str, error: store::Error) -> WorkflowError {
        if let store::Error::ValueRefused { reason, .. } = &error {
            return self.fail_at_once(WorkflowError::PayloadRefused {
                step: step.to_owned(),
                reason: reason.clone(),
            });
        }
        let halt = if error.is_lease_lost() {
            Halt::LeaseLost
        } else {
            Halt::Store
        };
        let reason = halt.describe();
        let mut state = self.state();
        if state.halt.is_none() {
            state.halt = Some(halt);
            state.store_error = Some(error);
        }
        WorkflowError::Halted { reason }
    }

    /// Makes the run fail at once with `error` as its reason (first halt wins), and returns
    /// `error` for the body, which may see it but can no longer do fresh work.
    pub(crate) fn fail_at_once(&self, error: WorkflowError) -> WorkflowError {
        self.halt(Halt::Fail {
            reason: crate::error_chain(&error),
        });
        error
    }

    /// Sets the halt reason (first wins) and returns the error the caller propagates.
    pub(crate) fn halt(&self, halt: Halt) -> WorkflowError {
        let mut state = self.state();
        let reason = halt.describe();
        state.halt.get_or_insert(halt);
        WorkflowError::Halted { reason }
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

/// Encodes a payload a run or a caller writes under `step`: it must encode as JSON, fit
/// `limit` bytes, and hold nothing a store refuses (see [`check_value`](crate::check_value)).
///
/// ```
/// use keiro_journal::{encode_payload, WorkflowError};
/// assert!(encode_payload("input", &"ok", 1024).is_ok());
/// let refused = encode_payload("input", &"a\u{0}b", 1024);
/// assert!(matches!(refused, Err(WorkflowError::PayloadRefused { .. })));
/// ```
///
/// # Errors
///
/// [`WorkflowError::Encode`], [`WorkflowError::PayloadTooLarge`] or
/// [`WorkflowError::PayloadRefused`], naming `step`.
pub fn encode_payload<T: Serialize + ?Sized>(
    step: &str,
    value: &T,
    limit: usize,
) -> Result<Value, WorkflowError> {
    let json = serde_json::to_value(value).map_err(|source| WorkflowError::Encode {
        step: step.to_owned(),
        source,
    })?;
    check_payload(step, &json, limit)?;
    crate::check_value(&json).map_err(|reason| WorkflowError::PayloadRefused {
        step: step.to_owned(),
        reason,
    })?;
    Ok(json)
}

/// Checks an encoded payload against the limit.
pub(crate) fn check_payload(step: &str, json: &Value, limit: usize) -> Result<(), WorkflowError> {
    let len = crate::budget::encoded_len(json);
    if len > limit {
        return Err(WorkflowError::PayloadTooLarge {
            step: step.to_owned(),
            len,
            limit,
        });
    }
    Ok(())
}

pub(crate) fn decode<T: DeserializeOwned>(step: &str, value: Value) -> Result<T, WorkflowError> {
    serde_json::from_value(value).map_err(|source| WorkflowError::Decode {
        step: step.to_owned(),
        source,
    })
}
