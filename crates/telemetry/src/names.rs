//! Every name keiro's telemetry exports: the meter, each instrument with its unit and
//! description, histogram bucket boundaries, and the attribute keys.
//!
//! Dashboards, alerts and tests refer to these constants rather than to string literals, so a
//! rename happens in one place. The naming rule for instrument constants is mechanical: drop the
//! `keiro.` prefix, turn dots into underscores and upper-case the rest
//! (`keiro.workflow.steps.executed` → [`WORKFLOW_STEPS_EXECUTED`]). Each has a `_UNIT` and a
//! `_DESCRIPTION` companion.
//!
//! Units follow the [UCUM] conventions OpenTelemetry uses: `s` and `ms` for time, and a
//! `{annotation}` in braces for plain counts of things.
//!
//! ```
//! use keiro_telemetry::names;
//!
//! assert_eq!(names::METER, "keiro");
//! assert_eq!(names::WORKFLOW_STEPS_EXECUTED, "keiro.workflow.steps.executed");
//! assert_eq!(names::WORKFLOW_STEPS_EXECUTED_UNIT, "{step}");
//! assert!(names::INSTRUMENTS.contains(&names::STEP_DURATION));
//! ```
//!
//! [UCUM]: https://ucum.org/ucum

// ---------------------------------------------------------------------------------------------
// Meter
// ---------------------------------------------------------------------------------------------

/// Name of the meter (the OpenTelemetry instrumentation scope) every keiro instrument belongs
/// to.
///
/// ```
/// let meter = opentelemetry::global::meter(keiro_telemetry::names::METER);
/// # let _ = meter;
/// ```
pub const METER: &str = "keiro";

/// The instrumentation scope of keiro's OpenTelemetry spans (see [`Tracing`](crate::Tracing)).
pub const TRACER: &str = "keiro";

// ---------------------------------------------------------------------------------------------
// Workflow instruments
// ---------------------------------------------------------------------------------------------

/// Counter: workflow steps whose action ran because the journal had no result for them.
///
/// Attributes: [`WORKFLOW_NAME`].
pub const WORKFLOW_STEPS_EXECUTED: &str = "keiro.workflow.steps.executed";
/// Unit of [`WORKFLOW_STEPS_EXECUTED`].
pub const WORKFLOW_STEPS_EXECUTED_UNIT: &str = "{step}";
/// Description of [`WORKFLOW_STEPS_EXECUTED`].
pub const WORKFLOW_STEPS_EXECUTED_DESCRIPTION: &str =
    "Workflow steps that ran their action (a journal miss).";

/// Counter: workflow steps answered from the journal instead of running their action.
///
/// Attributes: [`WORKFLOW_NAME`].
pub const WORKFLOW_STEPS_REPLAYED: &str = "keiro.workflow.steps.replayed";
/// Unit of [`WORKFLOW_STEPS_REPLAYED`].
pub const WORKFLOW_STEPS_REPLAYED_UNIT: &str = "{step}";
/// Description of [`WORKFLOW_STEPS_REPLAYED`].
pub const WORKFLOW_STEPS_REPLAYED_DESCRIPTION: &str =
    "Workflow steps short-circuited to a recorded result (a journal hit).";

/// Counter: runs the resume worker re-invoked.
///
/// Attributes: [`WORKFLOW_NAME`].
pub const WORKFLOW_RESUMED: &str = "keiro.workflow.resumed";
/// Unit of [`WORKFLOW_RESUMED`].
pub const WORKFLOW_RESUMED_UNIT: &str = "{workflow}";
/// Description of [`WORKFLOW_RESUMED`].
pub const WORKFLOW_RESUMED_DESCRIPTION: &str =
    "Workflow re-invocations performed by the resume worker.";

/// Counter: instances the resume worker marked terminally failed (attempts exhausted).
///
/// Attributes: [`WORKFLOW_NAME`].
pub const WORKFLOW_FAILED: &str = "keiro.workflow.failed";
/// Unit of [`WORKFLOW_FAILED`].
pub const WORKFLOW_FAILED_UNIT: &str = "{workflow}";
/// Description of [`WORKFLOW_FAILED`].
pub const WORKFLOW_FAILED_DESCRIPTION: &str =
    "Workflow instances marked terminally failed by the resume worker.";

/// Counter: transient store errors the resume worker absorbed (no attempt consumed).
///
/// Attributes: [`ERROR_KIND`].
pub const WORKFLOW_RESUME_ERRORS: &str = "keiro.workflow.resume.errors";
/// Unit of [`WORKFLOW_RESUME_ERRORS`].
pub const WORKFLOW_RESUME_ERRORS_UNIT: &str = "{error}";
/// Description of [`WORKFLOW_RESUME_ERRORS`].
pub const WORKFLOW_RESUME_ERRORS_DESCRIPTION: &str =
    "Transient store errors observed by the workflow resume worker.";

/// Counter: candidates skipped because another worker holds their lease, including runs that
/// stopped at a boundary after losing their lease.
///
/// Attributes: [`WORKFLOW_NAME`].
pub const WORKFLOW_LEASE_SKIPPED: &str = "keiro.workflow.lease.skipped";
/// Unit of [`WORKFLOW_LEASE_SKIPPED`].
pub const WORKFLOW_LEASE_SKIPPED_UNIT: &str = "{workflow}";
/// Description of [`WORKFLOW_LEASE_SKIPPED`].
pub const WORKFLOW_LEASE_SKIPPED_DESCRIPTION: &str =
    "Workflow instances skipped because another worker owns their lease.";

/// Up-down counter: runs currently executing in this process.
///
/// An up-down counter rather than a gauge: see [`Metrics::run_started`](crate::Metrics::run_started).
///
/// Attributes: [`WORKFLOW_NAME`].
pub const WORKFLOW_ACTIVE: &str = "keiro.workflow.active";
/// Unit of [`WORKFLOW_ACTIVE`].
pub const WORKFLOW_ACTIVE_UNIT: &str = "{workflow}";
/// Description of [`WORKFLOW_ACTIVE`].
pub const WORKFLOW_ACTIVE_DESCRIPTION: &str =
    "Workflow runs currently in progress in this process.";

/// Histogram: journal length of a run when it reaches a terminal state.
///
/// Attributes: [`WORKFLOW_NAME`].
pub const WORKFLOW_JOURNAL_LENGTH: &str = "keiro.workflow.journal.length";
/// Unit of [`WORKFLOW_JOURNAL_LENGTH`].
pub const WORKFLOW_JOURNAL_LENGTH_UNIT: &str = "{event}";
/// Description of [`WORKFLOW_JOURNAL_LENGTH`].
pub const WORKFLOW_JOURNAL_LENGTH_DESCRIPTION: &str =
    "Journal event count of a workflow at completion.";
/// Bucket boundaries of [`WORKFLOW_JOURNAL_LENGTH`].
///
/// Roughly logarithmic, because a journal grows with every step and long-lived workflows reach
/// thousands of events before `continue_as_new` should have rotated them; the top buckets are
/// there to make those visible.
pub const WORKFLOW_JOURNAL_LENGTH_BOUNDARIES: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1_000.0, 2_000.0, 5_000.0, 10_000.0,
];

/// Gauge: awakeables waiting for an external completion, as last counted (every
/// `Metrics::gauge_interval`, 10 s by default).
///
/// No attributes.
pub const WORKFLOW_AWAKEABLES_PENDING: &str = "keiro.workflow.awakeables.pending";
/// Unit of [`WORKFLOW_AWAKEABLES_PENDING`].
pub const WORKFLOW_AWAKEABLES_PENDING_UNIT: &str = "{awakeable}";
/// Description of [`WORKFLOW_AWAKEABLES_PENDING`].
pub const WORKFLOW_AWAKEABLES_PENDING_DESCRIPTION: &str = "Awakeables awaiting an external signal.";

// ---------------------------------------------------------------------------------------------
// Timer instruments
// ---------------------------------------------------------------------------------------------

/// Gauge: durable timers that are due but not yet fired, as last counted by the timer worker
/// (every `Metrics::gauge_interval`, 10 s by default).
///
/// No attributes.
pub const TIMER_BACKLOG: &str = "keiro.timer.backlog";
/// Unit of [`TIMER_BACKLOG`].
pub const TIMER_BACKLOG_UNIT: &str = "{timer}";
/// Description of [`TIMER_BACKLOG`].
pub const TIMER_BACKLOG_DESCRIPTION: &str = "Due timers not yet fired.";

/// Histogram: how late a timer fired, measured from its `fire_at`, in milliseconds.
///
/// Milliseconds, as in the seed, because the interesting range (a few ms of polling slack up
/// to minutes of backlog) reads naturally in them.
///
/// No attributes.
pub const TIMER_FIRE_LAG: &str = "keiro.timer.fire.lag";
/// Unit of [`TIMER_FIRE_LAG`].
pub const TIMER_FIRE_LAG_UNIT: &str = "ms";
/// Description of [`TIMER_FIRE_LAG`].
pub const TIMER_FIRE_LAG_DESCRIPTION: &str = "Delay between a timer's due time and its firing.";
/// Bucket boundaries of [`TIMER_FIRE_LAG`], in milliseconds.
///
/// From sub-poll-interval lag (tens of ms) to five minutes, the default stuck-timer requeue
/// threshold beyond which lag means the worker is down rather than busy.
pub const TIMER_FIRE_LAG_BOUNDARIES: &[f64] = &[
    5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1_000.0, 2_500.0, 5_000.0, 10_000.0, 30_000.0,
    60_000.0, 300_000.0,
];

// ---------------------------------------------------------------------------------------------
// Remote step instruments
// ---------------------------------------------------------------------------------------------

/// Counter: remote step tasks handed to a worker group for the first time.
///
/// Attributes: [`REMOTE_GROUP`].
pub const REMOTE_DISPATCHED: &str = "keiro.remote.dispatched";
/// Unit of [`REMOTE_DISPATCHED`].
pub const REMOTE_DISPATCHED_UNIT: &str = "{task}";
/// Description of [`REMOTE_DISPATCHED`].
pub const REMOTE_DISPATCHED_DESCRIPTION: &str = "Remote step tasks dispatched to a worker group.";

/// Counter: remote step tasks dispatched again, after their redispatch deadline passed or by an
/// operator.
///
/// Attributes: [`REMOTE_GROUP`].
pub const REMOTE_REDISPATCHED: &str = "keiro.remote.redispatched";
/// Unit of [`REMOTE_REDISPATCHED`].
pub const REMOTE_REDISPATCHED_UNIT: &str = "{task}";
/// Description of [`REMOTE_REDISPATCHED`].
pub const REMOTE_REDISPATCHED_DESCRIPTION: &str =
    "Remote step tasks dispatched again because no worker reported in time.";

/// Counter: remote step tasks given up as lost once their redispatches ran out.
///
/// Attributes: [`REMOTE_GROUP`].
pub const REMOTE_LOST: &str = "keiro.remote.lost";
/// Unit of [`REMOTE_LOST`].
pub const REMOTE_LOST_UNIT: &str = "{task}";
/// Description of [`REMOTE_LOST`].
pub const REMOTE_LOST_DESCRIPTION: &str =
    "Remote step tasks failed as lost after exhausting their redispatches.";

// ---------------------------------------------------------------------------------------------
// Step instruments
// ---------------------------------------------------------------------------------------------

/// Histogram: wall-clock time a step's action took, in seconds.
///
/// Seconds, because that is the unit OpenTelemetry's semantic conventions prescribe for
/// durations and what backends expect when they convert units; only [`TIMER_FIRE_LAG`] keeps
/// the seed's milliseconds.
///
/// Attributes: [`WORKFLOW_NAME`], [`STEP_KIND`].
pub const STEP_DURATION: &str = "keiro.step.duration";
/// Unit of [`STEP_DURATION`].
pub const STEP_DURATION_UNIT: &str = "s";
/// Description of [`STEP_DURATION`].
pub const STEP_DURATION_DESCRIPTION: &str = "Time a workflow step's action took to run.";
/// Bucket boundaries of [`STEP_DURATION`], in seconds.
///
/// The SDK's default buckets (0 to 10 000) are meant for milliseconds and would put nearly every
/// step in the first bucket; these span a fast database write (5 ms) to a slow external call
/// (5 minutes).
pub const STEP_DURATION_BOUNDARIES: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

// ---------------------------------------------------------------------------------------------
// Queue instruments
// ---------------------------------------------------------------------------------------------

/// Gauge: runs waiting for admission on a queue (delayed ones included), sampled by a worker
/// serving the queue (every `Metrics::gauge_interval`).
///
/// Attributes: [`QUEUE_NAME`].
pub const QUEUE_WAITING: &str = "keiro.queue.waiting";
/// Unit of [`QUEUE_WAITING`].
pub const QUEUE_WAITING_UNIT: &str = "{run}";
/// Description of [`QUEUE_WAITING`].
pub const QUEUE_WAITING_DESCRIPTION: &str = "Runs waiting for admission on a queue.";

/// Gauge: runs holding a slot of a queue, sampled with [`QUEUE_WAITING`].
///
/// Attributes: [`QUEUE_NAME`].
pub const QUEUE_RUNNING: &str = "keiro.queue.running";
/// Unit of [`QUEUE_RUNNING`].
pub const QUEUE_RUNNING_UNIT: &str = "{run}";
/// Description of [`QUEUE_RUNNING`].
pub const QUEUE_RUNNING_DESCRIPTION: &str = "Runs holding a slot of a queue.";

/// Counter: admissions of a run to a queue by this process's workers.
///
/// Attributes: [`QUEUE_NAME`].
pub const QUEUE_ADMITTED: &str = "keiro.queue.admitted";
/// Unit of [`QUEUE_ADMITTED`].
pub const QUEUE_ADMITTED_UNIT: &str = "{run}";
/// Description of [`QUEUE_ADMITTED`].
pub const QUEUE_ADMITTED_DESCRIPTION: &str = "Runs admitted to a queue.";

/// Counter: gauge samples at which a queue was held at its concurrency or rate limit (or
/// paused) while runs ready to be admitted waited. A steady rate says the limit, not the
/// fleet, bounds the queue's throughput.
///
/// Attributes: [`QUEUE_NAME`].
pub const QUEUE_THROTTLED: &str = "keiro.queue.throttled";
/// Unit of [`QUEUE_THROTTLED`].
pub const QUEUE_THROTTLED_UNIT: &str = "{sample}";
/// Description of [`QUEUE_THROTTLED`].
pub const QUEUE_THROTTLED_DESCRIPTION: &str =
    "Samples of a queue held at a limit while runs ready to be admitted waited.";

/// Histogram: how long a run waited from its start to its first admission, in seconds.
///
/// Attributes: [`QUEUE_NAME`].
pub const QUEUE_ADMISSION_WAIT: &str = "keiro.queue.admission.wait";
/// Unit of [`QUEUE_ADMISSION_WAIT`].
pub const QUEUE_ADMISSION_WAIT_UNIT: &str = "s";
/// Description of [`QUEUE_ADMISSION_WAIT`].
pub const QUEUE_ADMISSION_WAIT_DESCRIPTION: &str =
    "Time a run waited on its queue before its first admission.";
/// Bucket boundaries of [`QUEUE_ADMISSION_WAIT`], in seconds: a free slot found at once (a few
/// ms) to a backlog an hour deep.
pub const QUEUE_ADMISSION_WAIT_BOUNDARIES: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3_600.0,
];

/// Every instrument name above, in declaration order.
///
/// Useful for checking an exporter's output or a dashboard against the full set.
pub const INSTRUMENTS: &[&str] = &[
    WORKFLOW_STEPS_EXECUTED,
    WORKFLOW_STEPS_REPLAYED,
    WORKFLOW_RESUMED,
    WORKFLOW_FAILED,
    WORKFLOW_RESUME_ERRORS,
    WORKFLOW_LEASE_SKIPPED,
    WORKFLOW_ACTIVE,
    WORKFLOW_JOURNAL_LENGTH,
    WORKFLOW_AWAKEABLES_PENDING,
    TIMER_BACKLOG,
    TIMER_FIRE_LAG,
    REMOTE_DISPATCHED,
    REMOTE_REDISPATCHED,
    REMOTE_LOST,
    STEP_DURATION,
    QUEUE_WAITING,
    QUEUE_RUNNING,
    QUEUE_ADMITTED,
    QUEUE_THROTTLED,
    QUEUE_ADMISSION_WAIT,
];

// ---------------------------------------------------------------------------------------------
// Attribute keys
// ---------------------------------------------------------------------------------------------

/// Attribute key: the workflow's registered name (never its instance id).
///
/// Used on metrics and on `workflow <name>` spans.
pub const WORKFLOW_NAME: &str = "keiro.workflow.name";

/// Attribute key: a workflow instance's id.
///
/// For spans only. It is unbounded, so no instrument in this crate accepts it.
pub const WORKFLOW_ID: &str = "keiro.workflow.id";

/// Attribute key: the name of the step a span covers.
///
/// For spans only: step names can embed ids (`child:<id>:result`), so metrics use
/// [`STEP_KIND`] instead.
pub const WORKFLOW_STEP: &str = "keiro.workflow.step";

/// Attribute key: the class of a transient error (`"connection"`, `"timeout"`, ...), never its
/// message.
pub const ERROR_KIND: &str = "keiro.error.kind";

/// Attribute key: the kind of a step (`"local"`, `"remote"`, ...), never its name.
pub const STEP_KIND: &str = "keiro.step.kind";

/// Attribute key: the worker group a remote step was dispatched to, without its `@partition`
/// (partitions are the application's, unbounded in number).
pub const REMOTE_GROUP: &str = "keiro.remote.group";

/// Attribute key: a queue's name (never a run's key on it: keys are the application's,
/// unbounded in number).
pub const QUEUE_NAME: &str = "keiro.queue.name";

/// Attribute key: a remote step's name, on `remote <step>` spans.
pub const REMOTE_STEP: &str = "keiro.remote.step";

/// Attribute key: a remote step's stable id (`<name>/<id>/<generation>/<step>`). For spans
/// only: it embeds the instance id.
pub const REMOTE_STEP_ID: &str = "keiro.remote.step_id";
