//! Options of the resume worker, with the seed's defaults.

use std::time::Duration;

use std::sync::Arc;

use keiro_journal::{Backoff, InvalidBackoff};
use keiro_journal::{RunOptions, LEASE_TTL_DEFAULT, PAYLOAD_LEN_MAX_DEFAULT, RECONCILE_DEFAULT};
use keiro_journal::{StepKind, StepObserver, WorkflowName};
use keiro_lease::{CRASH_BACKOFF_DEFAULT, MAX_ATTEMPTS_DEFAULT};

use crate::log::{tracing_log_hook, LogHook};

/// The default gap between passes of the fixed-poll loop (and the fallback of the push loop).
pub const POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// The smallest poll interval accepted.
pub const POLL_INTERVAL_MIN: Duration = Duration::from_millis(10);
/// The default number of runs one pass drives at once.
pub const MAX_CONCURRENT_ADVANCES_DEFAULT: usize = 1;
/// The default number of candidates one pass of a worker loop takes.
pub const PASS_LIMIT_DEFAULT: usize = 256;
/// The smallest lease TTL accepted.
pub const LEASE_TTL_MIN: Duration = Duration::from_millis(100);

/// How the resume worker runs.
#[derive(Clone)]
pub struct ResumeOptions {
    /// Gap between passes when nothing advanced. Defaults to [`POLL_INTERVAL_DEFAULT`].
    pub poll_interval: Duration,
    /// Crash ceiling: at this many attempts a run is failed. Defaults to
    /// [`MAX_ATTEMPTS_DEFAULT`].
    pub max_attempts: i32,
    /// Lease time-to-live; a dead worker's runs resume within it plus one poll interval.
    /// Defaults to [`LEASE_TTL_DEFAULT`].
    pub lease_ttl: Duration,
    /// Runs one pass drives at once; values below 1 count as 1. Defaults to
    /// [`MAX_CONCURRENT_ADVANCES_DEFAULT`].
    ///
    /// A worker loop's pass counts a run while its body runs: once the body has returned, its
    /// closing write (the completion, park or failure, then the crash record or release) waits
    /// for its commit without a slot, and the next run starts meanwhile. Runs running and
    /// closing together stay within twice this many, so a slow store holds back new runs
    /// instead of piling up writes.
    pub max_concurrent_advances: usize,
    /// Reconcile fallback for runs parked on an event with no deadline; `None` disables it.
    /// Defaults to [`RECONCILE_DEFAULT`].
    pub reconcile: Option<Duration>,
    /// Crash backoff: after a crash with `n` earlier ones the run waits the ladder's rung
    /// `n + 1`. Defaults to [`CRASH_BACKOFF_DEFAULT`] (`min(2^(n+1), 64)` s, no jitter).
    pub backoff: Backoff,
    /// The most runs one pass of a worker loop claims (`None`: no cap). A pass claims in small
    /// batches beside the runs it drives (once fewer than one and a half times
    /// `max_concurrent_advances` are queued or running, it asks for enough to hold twice that);
    /// after a claim that came back short it claims again on the next wake or poll while it
    /// has room. It ends once its runs are done and nothing more was claimable, or as soon as
    /// this many were claimed, leaving the runs still going to the next pass (the limit bounds
    /// a pass's summary, never how long a new run waits). One-off passes (`resume_once`) are
    /// unbounded.
    /// Defaults to `Some(`[`PASS_LIMIT_DEFAULT`]`)`.
    pub pass_limit: Option<usize>,
    /// Largest payload accepted. Defaults to
    /// [`PAYLOAD_LEN_MAX_DEFAULT`].
    pub payload_len_max: usize,
    /// How long one generation's journal may grow before fresh steps fail with
    /// `WorkflowError::JournalFull` (continue as new to go on). Defaults to
    /// [`JournalBudget::default`](keiro_journal::JournalBudget::default): 50,000 entries, 50 MiB.
    pub journal_budget: keiro_journal::JournalBudget,
    /// How much a run may write to its streams before a write fails with
    /// `WorkflowError::StreamFull`. Defaults to
    /// [`StreamBudget::default`](keiro_journal::message::StreamBudget::default).
    pub stream_budget: keiro_journal::message::StreamBudget,
    /// The lease owner id. `None` mints a fresh id per pass, as the seed does.
    /// Defaults to `None`.
    pub owner: Option<String>,
    /// Where notable events go. Defaults to [`tracing_log_hook`].
    pub log: LogHook,
    /// Metrics; `None` records nothing. Defaults to `None`.
    pub metrics: Option<keiro_telemetry::Metrics>,
    /// OpenTelemetry spans: a `workflow <name>` span per drive, current while the body runs,
    /// whose trace context is stamped on the remote tasks it dispatches. Defaults to `None`.
    pub tracing: Option<keiro_telemetry::Tracing>,
    /// Where runs crash on purpose, for tests (`keiro::testing`). Defaults to `None`.
    pub faults: Option<Arc<dyn keiro_journal::store::Faults>>,
    /// Retention: when set, the worker also deletes terminal instances that went terminal
    /// longer ago than this, with everything they own, in bounded batches at a bounded rate
    /// (see [`RetentionOptions`](crate::RetentionOptions); at most one worker collects at a
    /// time). Needs a store with retention (`Keiro::worker` passes it). Defaults to `None`.
    pub retention: Option<Duration>,
    /// The queues this worker admits runs from (`keiro_journal::queue`): a run started on a
    /// queue is claimed only by a worker serving it, through the queue's admission. Serving
    /// a queue needs a stable [`owner`](Self::owner) for per-worker limits; the worker
    /// builder mints one when none is given. Defaults to none.
    pub queues: Vec<String>,
    /// The application versions whose runs this worker claims (`keiro_lease::versions`): every
    /// claim path (the batch claim, queue admission, a pass's claim of each candidate) passes
    /// over runs of other versions. The facade's worker builder sets its store's version
    /// unless told otherwise. Defaults to [`Versions::Any`](keiro_lease::Versions::Any).
    pub versions: keiro_lease::Versions,
    /// Where runs started in this process are handed to this worker's loop, leased to it
    /// from their start (`keiro_resume::HandOffs`); `None` takes runs through claims only.
    /// The facade's worker opens one on its `Keiro`'s hand-offs while it runs. Defaults to
    /// `None`.
    pub hand_off: Option<crate::HandOff>,
}

impl std::fmt::Debug for ResumeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumeOptions")
            .field("poll_interval", &self.poll_interval)
            .field("max_attempts", &self.max_attempts)
            .field("versions", &self.versions)
            .field("lease_ttl", &self.lease_ttl)
            .field("max_concurrent_advances", &self.max_concurrent_advances)
            .field("reconcile", &self.reconcile)
            .field("backoff", &self.backoff)
            .field("pass_limit", &self.pass_limit)
            .field("payload_len_max", &self.payload_len_max)
            .field("journal_budget", &self.journal_budget)
            .field("stream_budget", &self.stream_budget)
            .field("owner", &self.owner)
            .field("metrics", &self.metrics.is_some())
            .field("tracing", &self.tracing.is_some())
            .field("faults", &self.faults)
            .field("retention", &self.retention)
            .field("queues", &self.queues)
            .field("hand_off", &self.hand_off.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for ResumeOptions {
    fn default() -> Self {
        Self {
            poll_interval: POLL_INTERVAL_DEFAULT,
            max_attempts: MAX_ATTEMPTS_DEFAULT,
            lease_ttl: LEASE_TTL_DEFAULT,
            max_concurrent_advances: MAX_CONCURRENT_ADVANCES_DEFAULT,
            reconcile: Some(RECONCILE_DEFAULT),
            backoff: CRASH_BACKOFF_DEFAULT,
            pass_limit: Some(PASS_LIMIT_DEFAULT),
            payload_len_max: PAYLOAD_LEN_MAX_DEFAULT,
            journal_budget: keiro_journal::JournalBudget::default(),
            stream_budget: keiro_journal::message::StreamBudget::default(),
            owner: None,
            log: tracing_log_hook(),
            metrics: None,
            tracing: None,
            faults: None,
            retention: None,
            queues: Vec::new(),
            versions: keiro_lease::Versions::Any,
            hand_off: None,
        }
    }
}

/// A resume option out of bounds.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidOptions {
    /// A field breaks its bound.
    #[error("resume options: {field} {problem}")]
    Field {
        /// The field.
        field: &'static str,
        /// The bound.
        problem: &'static str,
    },
    /// The backoff policy is invalid.
    #[error("resume options: invalid backoff")]
    Backoff(#[from] InvalidBackoff),
}

impl ResumeOptions {
    /// Checks every field's bound.
    ///
    /// # Errors
    ///
    /// [`InvalidOptions`] naming the field and the bound.
    pub fn validate(&self) -> Result<(), InvalidOptions> {
        let field = |field, problem| Err(InvalidOptions::Field { field, problem });
        if self.poll_interval < POLL_INTERVAL_MIN {
            return field("poll_interval", "must be at least 10ms");
        }
        if self.lease_ttl < LEASE_TTL_MIN {
            return field("lease_ttl", "must be at least 100ms");
        }
        if self.max_attempts < 1 {
            return field("max_attempts", "must be at least 1");
        }
        if self.pass_limit == Some(0) {
            return field("pass_limit", "must be positive");
        }
        if self.payload_len_max == 0 {
            return field("payload_len_max", "must be positive");
        }
        if self.retention == Some(Duration::ZERO) {
            return field("retention", "must be positive");
        }
        self.backoff.validate()?;
        Ok(())
    }

    /// The effective concurrency (at least 1).
    pub fn concurrency(&self) -> usize {
        self.max_concurrent_advances.max(1)
    }

    /// The options each run is driven with.
    pub fn run_options(&self) -> RunOptions {
        let mut run = RunOptions::new(self.lease_ttl);
        run.payload_len_max = self.payload_len_max;
        run.journal_budget = self.journal_budget;
        run.stream_budget = self.stream_budget;
        run.reconcile = self.reconcile;
        run.faults = self.faults.clone();
        run.observer = self
            .metrics
            .clone()
            .map(|metrics| Arc::new(StepDurations(metrics)) as Arc<dyn StepObserver>);
        if self.tracing.is_some() {
            run.trace_context = Some(Arc::new(CurrentSpan));
        }
        run
    }
}

/// Stamps remote tasks with the trace context of the drive's `workflow <name>` span, which
/// the pass makes current around the drive.
#[derive(Debug)]
struct CurrentSpan;

impl keiro_journal::TraceContext for CurrentSpan {
    fn traceparent(&self) -> Option<String> {
        keiro_telemetry::current_traceparent()
    }
}

/// Records each executed step's duration in `keiro.step.duration`, and the remote steps a run
/// dispatches, redispatches and loses.
#[derive(Debug)]
struct StepDurations(keiro_telemetry::Metrics);

impl StepObserver for StepDurations {
    fn step_finished(&self, workflow: &WorkflowName, kind: StepKind, duration: Duration) {
        self.0
            .step_duration(workflow.as_str(), kind.as_str(), duration);
    }

    fn remote_dispatched(&self, group: &str) {
        self.0.remote_dispatched(group);
    }

    fn remote_redispatched(&self, group: &str) {
        self.0.remote_redispatched(group);
    }

    fn remote_lost(&self, group: &str) {
        self.0.remote_lost(group);
    }
}
