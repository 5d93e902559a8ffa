//! The [`Metrics`] handle: every keiro instrument, created once from a meter and shared by
//! cloning, with one recorder method per event; [`ext`] lets an `Option<Metrics>` record too.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter, MeterProvider, UpDownCounter};
use opentelemetry::{InstrumentationScope, KeyValue};

use crate::names;

mod ext;

pub use ext::MetricsExt;

/// Handle to every keiro instrument, created once and cloned into each component that records.
///
/// Cloning copies one pointer: the instruments live behind a shared [`Arc`], so a worker can hand
/// a clone to every task it spawns. Components hold an `Option<Metrics>` and record through
/// [`MetricsExt`], which does nothing when the option is `None`.
///
/// ```
/// use keiro_telemetry::{names, Metrics};
///
/// let meter = opentelemetry::global::meter(names::METER);
/// let metrics = Metrics::new(&meter);
/// let for_a_task = metrics.clone();
/// for_a_task.step_executed("checkout", 1);
/// ```
#[derive(Clone)]
pub struct Metrics {
    instruments: Arc<Instruments>,
    /// How often a [`SampledGauge`] is due; see [`Metrics::gauge_interval`].
    gauge_interval: Duration,
}

/// How often the gauges keiro reads from the database are sampled by default: at most once
/// per 10 s per [`Metrics`] handle and its clones, whatever the number of passes and batches.
pub const GAUGE_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);

/// A gauge whose value costs a database query, sampled on a period rather than on every pass
/// or batch (see [`Metrics::sample_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SampledGauge {
    /// [`names::WORKFLOW_AWAKEABLES_PENDING`], counted by the resume worker.
    AwakeablesPending,
    /// [`names::TIMER_BACKLOG`], counted by the timer worker.
    TimerBacklog,
    /// [`names::QUEUE_WAITING`] and [`names::QUEUE_RUNNING`], counted by a worker serving
    /// queues.
    QueueDepth,
}

impl SampledGauge {
    const COUNT: usize = 3;

    fn slot(self) -> usize {
        match self {
            Self::AwakeablesPending => 0,
            Self::TimerBacklog => 1,
            Self::QueueDepth => 2,
        }
    }
}

// One field per instrument in `names::INSTRUMENTS`. Kept separate from `Metrics` so that a clone
// is a single reference-count increment rather than fifteen.
struct Instruments {
    steps_executed: Counter<u64>,
    steps_replayed: Counter<u64>,
    resumed: Counter<u64>,
    failed: Counter<u64>,
    resume_errors: Counter<u64>,
    lease_skipped: Counter<u64>,
    active: UpDownCounter<i64>,
    journal_length: Histogram<u64>,
    awakeables_pending: Gauge<u64>,
    timer_backlog: Gauge<u64>,
    timer_fire_lag: Histogram<f64>,
    remote_dispatched: Counter<u64>,
    remote_redispatched: Counter<u64>,
    remote_lost: Counter<u64>,
    step_duration: Histogram<f64>,
    queue_waiting: Gauge<u64>,
    queue_running: Gauge<u64>,
    queue_admitted: Counter<u64>,
    queue_throttled: Counter<u64>,
    queue_admission_wait: Histogram<f64>,
    /// When each [`SampledGauge`] was last claimed, shared by every clone so that the workers
    /// of one process sample a gauge once between them, not once each.
    sampled: Mutex<[Option<Instant>; SampledGauge::COUNT]>,
}

impl Metrics {
    /// Creates every keiro instrument on `meter`.
    ///
    /// Call it once per process and clone the result: the SDK deduplicates instruments by name,
    /// but each creation still costs a lookup and a lock. The meter should be named
    /// [`names::METER`] so that keiro's instruments share one instrumentation scope; use
    /// [`Metrics::from_provider`] to get that for free.
    ///
    /// ```
    /// use keiro_telemetry::{names, Metrics};
    /// use opentelemetry::metrics::{MeterProvider, NoopMeterProvider};
    ///
    /// let meter = NoopMeterProvider::new().meter(names::METER);
    /// let metrics = Metrics::new(&meter);
    /// # let _ = metrics;
    /// ```
    pub fn new(meter: &Meter) -> Self {
        let counter = |name, unit, description| {
            meter
                .u64_counter(name)
                .with_unit(unit)
                .with_description(description)
                .build()
        };
        let instruments = Instruments {
            steps_executed: counter(
                names::WORKFLOW_STEPS_EXECUTED,
                names::WORKFLOW_STEPS_EXECUTED_UNIT,
                names::WORKFLOW_STEPS_EXECUTED_DESCRIPTION,
            ),
            steps_replayed: counter(
                names::WORKFLOW_STEPS_REPLAYED,
                names::WORKFLOW_STEPS_REPLAYED_UNIT,
                names::WORKFLOW_STEPS_REPLAYED_DESCRIPTION,
            ),
            resumed: counter(
                names::WORKFLOW_RESUMED,
                names::WORKFLOW_RESUMED_UNIT,
                names::WORKFLOW_RESUMED_DESCRIPTION,
            ),
            failed: counter(
                names::WORKFLOW_FAILED,
                names::WORKFLOW_FAILED_UNIT,
                names::WORKFLOW_FAILED_DESCRIPTION,
            ),
            resume_errors: counter(
                names::WORKFLOW_RESUME_ERRORS,
                names::WORKFLOW_RESUME_ERRORS_UNIT,
                names::WORKFLOW_RESUME_ERRORS_DESCRIPTION,
            ),
            lease_skipped: counter(
                names::WORKFLOW_LEASE_SKIPPED,
                names::WORKFLOW_LEASE_SKIPPED_UNIT,
                names::WORKFLOW_LEASE_SKIPPED_DESCRIPTION,
            ),
            active: meter
                .i64_up_down_counter(names::WORKFLOW_ACTIVE)
                .with_unit(names::WORKFLOW_ACTIVE_UNIT)
                .with_description(names::WORKFLOW_ACTIVE_DESCRIPTION)
                .build(),
            journal_length: meter
                .u64_histogram(names::WORKFLOW_JOURNAL_LENGTH)
                .with_unit(names::WORKFLOW_JOURNAL_LENGTH_UNIT)
                .with_description(names::WORKFLOW_JOURNAL_LENGTH_DESCRIPTION)
                .with_boundaries(names::WORKFLOW_JOURNAL_LENGTH_BOUNDARIES.to_vec())
                .build(),
            awakeables_pending: meter
                .u64_gauge(names::WORKFLOW_AWAKEABLES_PENDING)
                .with_unit(names::WORKFLOW_AWAKEABLES_PENDING_UNIT)
                .with_description(names::WORKFLOW_AWAKEABLES_PENDING_DESCRIPTION)
                .build(),
            timer_backlog: meter
                .u64_gauge(names::TIMER_BACKLOG)
                .with_unit(names::TIMER_BACKLOG_UNIT)
                .with_description(names::TIMER_BACKLOG_DESCRIPTION)
                .build(),
            timer_fire_lag: meter
                .f64_histogram(names::TIMER_FIRE_LAG)
                .with_unit(names::TIMER_FIRE_LAG_UNIT)
                .with_description(names::TIMER_FIRE_LAG_DESCRIPTION)
                .with_boundaries(names::TIMER_FIRE_LAG_BOUNDARIES.to_vec())
                .build(),
            remote_dispatched: counter(
                names::REMOTE_DISPATCHED,
                names::REMOTE_DISPATCHED_UNIT,
                names::REMOTE_DISPATCHED_DESCRIPTION,
            ),
            remote_redispatched: counter(
                names::REMOTE_REDISPATCHED,
                names::REMOTE_REDISPATCHED_UNIT,
                names::REMOTE_REDISPATCHED_DESCRIPTION,
            ),
            remote_lost: counter(
                names::REMOTE_LOST,
                names::REMOTE_LOST_UNIT,
                names::REMOTE_LOST_DESCRIPTION,
            ),
            step_duration: meter
                .f64_histogram(names::STEP_DURATION)
                .with_unit(names::STEP_DURATION_UNIT)
                .with_description(names::STEP_DURATION_DESCRIPTION)
                .with_boundaries(names::STEP_DURATION_BOUNDARIES.to_vec())
                .build(),
            queue_waiting: meter
                .u64_gauge(names::QUEUE_WAITING)
                .with_unit(names::QUEUE_WAITING_UNIT)
                .with_description(names::QUEUE_WAITING_DESCRIPTION)
                .build(),
            queue_running: meter
                .u64_gauge(names::QUEUE_RUNNING)
                .with_unit(names::QUEUE_RUNNING_UNIT)
                .with_description(names::QUEUE_RUNNING_DESCRIPTION)
                .build(),
            queue_admitted: counter(
                names::QUEUE_ADMITTED,
                names::QUEUE_ADMITTED_UNIT,
                names::QUEUE_ADMITTED_DESCRIPTION,
            ),
            queue_throttled: counter(
                names::QUEUE_THROTTLED,
                names::QUEUE_THROTTLED_UNIT,
                names::QUEUE_THROTTLED_DESCRIPTION,
            ),
            queue_admission_wait: meter
                .f64_histogram(names::QUEUE_ADMISSION_WAIT)
                .with_unit(names::QUEUE_ADMISSION_WAIT_UNIT)
                .with_description(names::QUEUE_ADMISSION_WAIT_DESCRIPTION)
                .with_boundaries(names::QUEUE_ADMISSION_WAIT_BOUNDARIES.to_vec())
                .build(),
            sampled: Mutex::new([None; SampledGauge::COUNT]),
        };
        Self {
            instruments: Arc::new(instruments),
            gauge_interval: GAUGE_INTERVAL_DEFAULT,
        }
    }

    /// Samples the gauges of [`SampledGauge`] at most once per `interval` (default
    /// [`GAUGE_INTERVAL_DEFAULT`]); `Duration::ZERO` samples at every chance.
    ///
    /// Each sample is a count over a table that grows with the backlog, so sampling on every
    /// resume pass or timer batch would make the busiest moments the most expensive to observe.
    /// The handle returned and its clones share the last sampling times with `self`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use keiro_telemetry::Metrics;
    ///
    /// let metrics = Metrics::global().gauge_interval(Duration::from_secs(30));
    /// assert_eq!(metrics.sampling_interval(), Duration::from_secs(30));
    /// ```
    #[must_use]
    pub fn gauge_interval(mut self, interval: Duration) -> Self {
        self.gauge_interval = interval;
        self
    }

    /// The period set by [`Metrics::gauge_interval`].
    ///
    /// ```
    /// use keiro_telemetry::{Metrics, GAUGE_INTERVAL_DEFAULT};
    ///
    /// assert_eq!(Metrics::global().sampling_interval(), GAUGE_INTERVAL_DEFAULT);
    /// ```
    pub fn sampling_interval(&self) -> Duration {
        self.gauge_interval
    }

    /// Whether `gauge` is due for a sample; `true` claims it, so the caller then queries and
    /// records it, and every other caller sharing this handle's instruments gets `false` until
    /// the interval has passed again. The first call is always due.
    ///
    /// A failed query is not retried before the next period: a gauge that is a little stale is
    /// better than a database that is asked more when it struggles.
    ///
    /// ```
    /// use keiro_telemetry::{Metrics, SampledGauge};
    ///
    /// let metrics = Metrics::global();
    /// if metrics.sample_due(SampledGauge::TimerBacklog) {
    ///     let backlog = 0; // counted by the caller
    ///     metrics.timer_backlog(backlog);
    /// }
    /// assert!(!metrics.sample_due(SampledGauge::TimerBacklog));
    /// ```
    pub fn sample_due(&self, gauge: SampledGauge) -> bool {
        let now = Instant::now();
        // The guarded value is plain timestamps, valid whatever a panicking holder did.
        let mut sampled = self
            .instruments
            .sampled
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let last = &mut sampled[gauge.slot()];
        if last.is_some_and(|at| now.saturating_duration_since(at) < self.gauge_interval) {
            return false;
        }
        *last = Some(now);
        true
    }

    /// Creates every keiro instrument on a meter from `provider`, scoped [`names::METER`] and
    /// versioned with this crate's version.
    ///
    /// ```
    /// use keiro_telemetry::Metrics;
    /// use opentelemetry::metrics::NoopMeterProvider;
    ///
    /// let metrics = Metrics::from_provider(&NoopMeterProvider::new());
    /// # let _ = metrics;
    /// ```
    pub fn from_provider<P: MeterProvider + ?Sized>(provider: &P) -> Self {
        Self::new(&provider.meter_with_scope(scope()))
    }

    /// Creates every keiro instrument on the global meter provider, like
    /// [`Metrics::from_provider`].
    ///
    /// The instruments bind to whichever provider is installed *now*: call this after
    /// [`opentelemetry::global::set_meter_provider`], or everything recorded goes to the no-op
    /// provider.
    ///
    /// ```
    /// let metrics = keiro_telemetry::Metrics::global();
    /// metrics.resumed("checkout");
    /// ```
    pub fn global() -> Self {
        Self::new(&opentelemetry::global::meter_with_scope(scope()))
    }

    /// Counts `n` steps of `workflow` whose action ran because the journal had no result.
    ///
    /// Records `n` on [`names::WORKFLOW_STEPS_EXECUTED`].
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.step_executed("checkout", 1);
    /// ```
    pub fn step_executed(&self, workflow: &str, n: u64) {
        self.instruments
            .steps_executed
            .add(n, &[workflow_attribute(workflow)]);
    }

    /// Counts `n` steps of `workflow` answered from the journal without running their action.
    ///
    /// Records `n` on [`names::WORKFLOW_STEPS_REPLAYED`]. A resumed run replays its whole
    /// prefix, so callers may count a batch at once.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.step_replayed("checkout", 3);
    /// ```
    pub fn step_replayed(&self, workflow: &str, n: u64) {
        self.instruments
            .steps_replayed
            .add(n, &[workflow_attribute(workflow)]);
    }

    /// Counts one re-invocation of `workflow` by the resume worker.
    ///
    /// Records 1 on [`names::WORKFLOW_RESUMED`], once the worker holds the run's lease and
    /// before it drives the run, so every claimed run counts whatever it then does.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.resumed("checkout");
    /// ```
    pub fn resumed(&self, workflow: &str) {
        self.instruments
            .resumed
            .add(1, &[workflow_attribute(workflow)]);
    }

    /// Counts one instance of `workflow` marked terminally failed by the resume worker.
    ///
    /// Records 1 on [`names::WORKFLOW_FAILED`].
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.failed("checkout");
    /// ```
    pub fn failed(&self, workflow: &str) {
        self.instruments
            .failed
            .add(1, &[workflow_attribute(workflow)]);
    }

    /// Counts one transient store error absorbed by the resume worker.
    ///
    /// Records 1 on [`names::WORKFLOW_RESUME_ERRORS`]. `kind` classifies the error (for
    /// example `"connection"` or `"serialization"`); the message, which may contain ids or SQL,
    /// stays in logs.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.resume_error("connection");
    /// ```
    pub fn resume_error(&self, kind: &'static str) {
        self.instruments
            .resume_errors
            .add(1, &[KeyValue::new(names::ERROR_KIND, kind)]);
    }

    /// Counts one instance of `workflow` skipped because another worker holds its lease.
    ///
    /// Records 1 on [`names::WORKFLOW_LEASE_SKIPPED`]. A run that loses its lease mid-way is
    /// counted here too, never as a crash.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.lease_skipped("checkout");
    /// ```
    pub fn lease_skipped(&self, workflow: &str) {
        self.instruments
            .lease_skipped
            .add(1, &[workflow_attribute(workflow)]);
    }

    /// Counts a run of `workflow` as in progress in this process.
    ///
    /// Adds 1 to [`names::WORKFLOW_ACTIVE`]; pair it with [`Metrics::run_finished`], or use
    /// [`Metrics::run_scope`], which cannot forget the second half.
    ///
    /// The instrument is an up-down counter rather than a gauge. Each run changes the count by
    /// one from its own task, and an up-down counter sums those deltas in the SDK; a gauge
    /// records whole values, so every task would have to share and update a counter of its own
    /// and the last writer would win. Summed deltas also add up across processes, so the
    /// cluster-wide figure is a plain sum over instances. Backends show it like a gauge.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.run_started("checkout");
    /// // ... drive the run ...
    /// metrics.run_finished("checkout");
    /// ```
    pub fn run_started(&self, workflow: &str) {
        self.instruments
            .active
            .add(1, &[workflow_attribute(workflow)]);
    }

    /// Counts a run of `workflow` as no longer in progress in this process.
    ///
    /// Subtracts 1 from [`names::WORKFLOW_ACTIVE`]. Call it exactly once per
    /// [`Metrics::run_started`], on every path out of the run.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.run_started("checkout");
    /// metrics.run_finished("checkout");
    /// ```
    pub fn run_finished(&self, workflow: &str) {
        self.instruments
            .active
            .add(-1, &[workflow_attribute(workflow)]);
    }

    /// Counts a run of `workflow` as in progress until the returned guard is dropped.
    ///
    /// Prefer this to [`Metrics::run_started`]/[`Metrics::run_finished`]: an early `?`, a panic
    /// or a cancelled future all drop the guard, so the count cannot drift upwards.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// let _active = metrics.run_scope("checkout");
    /// // ... drive the run; the count drops when `_active` goes out of scope ...
    /// ```
    pub fn run_scope(&self, workflow: &str) -> ActiveRun {
        let attributes = [workflow_attribute(workflow)];
        self.instruments.active.add(1, &attributes);
        ActiveRun {
            active: self.instruments.active.clone(),
            attributes,
        }
    }

    /// Records the journal length of a run of `workflow` that reached a terminal state.
    ///
    /// Records `len` on [`names::WORKFLOW_JOURNAL_LENGTH`].
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.journal_length("checkout", 12);
    /// ```
    pub fn journal_length(&self, workflow: &str, len: u64) {
        self.instruments
            .journal_length
            .record(len, &[workflow_attribute(workflow)]);
    }

    /// Records how many awakeables are waiting for an external completion.
    ///
    /// Sets [`names::WORKFLOW_AWAKEABLES_PENDING`] to `n`. The count comes from the database,
    /// so every process reporting it reports the same figure.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.awakeables_pending(4);
    /// ```
    pub fn awakeables_pending(&self, n: u64) {
        self.instruments.awakeables_pending.record(n, &[]);
    }

    /// Records how many durable timers are due but not yet fired.
    ///
    /// Sets [`names::TIMER_BACKLOG`] to `n`.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.timer_backlog(0);
    /// ```
    pub fn timer_backlog(&self, n: u64) {
        self.instruments.timer_backlog.record(n, &[]);
    }

    /// Records how long after its due time a timer fired.
    ///
    /// Records `lag` in milliseconds on [`names::TIMER_FIRE_LAG`]. A timer fired early (clock
    /// skew between processes) should be passed as [`Duration::ZERO`].
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// use std::time::Duration;
    ///
    /// metrics.timer_fire_lag(Duration::from_millis(120));
    /// ```
    pub fn timer_fire_lag(&self, lag: Duration) {
        self.instruments
            .timer_fire_lag
            .record(lag.as_secs_f64() * 1_000.0, &[]);
    }

    /// Records what queue `queue` holds: runs waiting for admission and runs holding a slot.
    ///
    /// Sets [`names::QUEUE_WAITING`] and [`names::QUEUE_RUNNING`].
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.queue_depth("llm", 120, 10);
    /// ```
    pub fn queue_depth(&self, queue: &str, waiting: u64, running: u64) {
        let attributes = [KeyValue::new(names::QUEUE_NAME, queue.to_owned())];
        self.instruments.queue_waiting.record(waiting, &attributes);
        self.instruments.queue_running.record(running, &attributes);
    }

    /// Counts one run admitted to `queue`, and, for a first admission, how long it waited.
    ///
    /// Records 1 on [`names::QUEUE_ADMITTED`] and `waited` in seconds on
    /// [`names::QUEUE_ADMISSION_WAIT`].
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// use std::time::Duration;
    ///
    /// metrics.queue_admitted("llm", Some(Duration::from_millis(40)));
    /// ```
    pub fn queue_admitted(&self, queue: &str, waited: Option<Duration>) {
        let attributes = [KeyValue::new(names::QUEUE_NAME, queue.to_owned())];
        self.instruments.queue_admitted.add(1, &attributes);
        if let Some(waited) = waited {
            self.instruments
                .queue_admission_wait
                .record(waited.as_secs_f64(), &attributes);
        }
    }

    /// Counts one sample of `queue` held at a limit (or paused) while runs ready to be
    /// admitted waited.
    ///
    /// Records 1 on [`names::QUEUE_THROTTLED`].
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.queue_throttled("llm");
    /// ```
    pub fn queue_throttled(&self, queue: &str) {
        self.instruments
            .queue_throttled
            .add(1, &[KeyValue::new(names::QUEUE_NAME, queue.to_owned())]);
    }

    /// Counts one remote step task dispatched to worker `group` for the first time.
    ///
    /// Records 1 on [`names::REMOTE_DISPATCHED`]. The attribute is the group without its
    /// `@partition` suffix (`print-label@tenant-7` counts as `print-label`): partitions are
    /// chosen by the application, often per tenant or per key, and each distinct value would be
    /// a time series of its own.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.remote_dispatched("print-label");
    /// ```
    pub fn remote_dispatched(&self, group: &str) {
        self.instruments
            .remote_dispatched
            .add(1, &[group_attribute(group)]);
    }

    /// Counts one remote step task dispatched again to worker `group`.
    ///
    /// Records 1 on [`names::REMOTE_REDISPATCHED`], whether the redispatch deadline passed or
    /// an operator asked for it.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.remote_redispatched("print-label");
    /// ```
    pub fn remote_redispatched(&self, group: &str) {
        self.instruments
            .remote_redispatched
            .add(1, &[group_attribute(group)]);
    }

    /// Counts one remote step task for worker `group` given up as lost.
    ///
    /// Records 1 on [`names::REMOTE_LOST`].
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// metrics.remote_lost("print-label");
    /// ```
    pub fn remote_lost(&self, group: &str) {
        self.instruments
            .remote_lost
            .add(1, &[group_attribute(group)]);
    }

    /// Records how long one step action of `workflow` took.
    ///
    /// Records `duration` in seconds on [`names::STEP_DURATION`]. `step_kind` says what kind of
    /// step it was (`"local"`, `"remote"`, ...); the step's own name is not recorded because it
    /// can embed ids.
    ///
    /// ```
    /// # let metrics = keiro_telemetry::Metrics::global();
    /// use std::time::Duration;
    ///
    /// metrics.step_duration("checkout", "local", Duration::from_millis(35));
    /// ```
    pub fn step_duration(&self, workflow: &str, step_kind: &'static str, duration: Duration) {
        self.instruments.step_duration.record(
            duration.as_secs_f64(),
            &[
                workflow_attribute(workflow),
                KeyValue::new(names::STEP_KIND, step_kind),
            ],
        );
    }
}

impl fmt::Debug for Metrics {
    // The instruments are opaque SDK handles; listing them would say nothing useful.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// A run counted in [`names::WORKFLOW_ACTIVE`] until this guard is dropped.
///
/// Returned by [`Metrics::run_scope`] and [`MetricsExt::run_scope`].
///
/// ```
/// # let metrics = keiro_telemetry::Metrics::global();
/// {
///     let _active = metrics.run_scope("checkout");
///     // counted as active here
/// }
/// // and no longer here
/// ```
#[must_use = "the run counts as active only while the guard is alive"]
pub struct ActiveRun {
    active: UpDownCounter<i64>,
    // Kept from the increment so the decrement hits the same series without a second
    // allocation of the workflow name.
    attributes: [KeyValue; 1],
}

impl Drop for ActiveRun {
    fn drop(&mut self) {
        self.active.add(-1, &self.attributes);
    }
}

impl fmt::Debug for ActiveRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActiveRun")
            .field("attributes", &self.attributes)
            .finish_non_exhaustive()
    }
}

/// The instrumentation scope every keiro meter should carry.
fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(names::METER)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

// Workflow names are registry keys, a bounded set, but arrive borrowed; the copy is the one
// allocation a recording makes, and only ever on the enabled path.
fn workflow_attribute(workflow: &str) -> KeyValue {
    KeyValue::new(names::WORKFLOW_NAME, workflow.to_owned())
}

// A group is `<step>` or `<step>@<partition>`, and a step name cannot contain `@`, so the
// first `@` starts the partition.
fn group_attribute(group: &str) -> KeyValue {
    let step = group.split_once('@').map_or(group, |(step, _)| step);
    KeyValue::new(names::REMOTE_GROUP, step.to_owned())
}
