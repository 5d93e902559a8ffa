//! keiro-resume: the resume worker that finds unfinished workflow instances and drives them.
//!
//! A pass runs one exact discovery query (instances `running`, or `suspended` with a due
//! `wake_after`), then for each candidate: registry lookup, lease claim, drive, classify,
//! release. Crashed runs are retried with backoff and failed at the ceiling; a poison workflow
//! never stops a healthy one. Loops repeat passes on a fixed poll or on push notifications; a
//! loop's pass claims in batches beside the runs it drives, and the runs it holds outlive the
//! pass, so no run waits for another to end before it is claimed.
//!
//! ```no_run
//! use std::sync::Arc;
//! use keiro_journal::{Ctx, WorkflowError};
//! use keiro_lease::LeaseStore;
//! use keiro_resume::{resume_once, Registry, ResumeOptions};
//!
//! async fn double(ctx: Ctx, n: u64) -> Result<u64, WorkflowError> {
//!     ctx.step("double", || async move { Ok::<_, std::io::Error>(n * 2) }).await
//! }
//!
//! # async fn demo(store: Arc<dyn LeaseStore>) -> Result<(), Box<dyn std::error::Error>> {
//! let mut registry = Registry::new();
//! registry.register("double", double)?;
//! let summary = resume_once(&store, &registry, &ResumeOptions::default()).await?;
//! println!("completed {} of {}", summary.completed, summary.discovered);
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//!
//! - One steady-state advancer per instance (leases with fencing); a dead worker's instances
//!   are resumed within `lease_ttl` plus one poll interval.
//! - Discovery is exact: an instance parked on an unresolved wake source is not returned.
//! - The summary of a pass is the same whether candidates ran one at a time or concurrently.
//! - Loops survive failing passes and shut down gracefully.
//!
//! # Errors
//!
//! Only a failing discovery query fails a pass; everything per candidate is counted in
//! [`ResumeSummary`] and reported through the log hook ([`ResumeLogEvent`]).

mod claim_pass;
mod closed;
mod hand_off;
mod heartbeat;
mod log;
mod options;
mod pass;
mod queue_gauges;
mod registry;
mod retention;
mod schedule;
mod summary;
mod timer;
mod wake;
mod worker;

pub use closed::{ClosedWait, ClosedWaiters, CLOSED_FALLBACK_READS_PER_S};
pub use hand_off::{Delivered, HandOff, HandOffs, NotDelivered, Reservation};
pub use heartbeat::run_heartbeat;
pub use log::{tracing_log_hook, LogHook, ResumeLogEvent};
pub use options::{
    InvalidOptions, ResumeOptions, LEASE_TTL_MIN, MAX_CONCURRENT_ADVANCES_DEFAULT,
    PASS_LIMIT_DEFAULT, POLL_INTERVAL_DEFAULT, POLL_INTERVAL_MIN,
};
pub use pass::{drain, drive_claim, resume_once, resume_once_up_to, ClaimDriven};
pub use queue_gauges::{run_queue_gauges, throttled};
pub use registry::{Registry, RegistryError};
pub use retention::{
    collect, run_retention_loop, RetentionOptions, RETENTION_BATCHES_PER_SWEEP_DEFAULT,
    RETENTION_BATCH_DEFAULT, RETENTION_INTERVAL_DEFAULT, RETENTION_PAUSE_DEFAULT,
};
pub use schedule::cadence::{Cadence, INTERVAL_MIN, TIME_ZONE_DEFAULT};
pub use schedule::scheduler::{
    run_scheduler_loop, schedule_once, SchedulerOptions, SchedulerSummary, CATCH_UP_WINDOW_DEFAULT,
    SCHEDULER_BATCH_DEFAULT, SCHEDULER_LEASE_TTL_DEFAULT, SCHEDULER_POLL_INTERVAL_DEFAULT,
    SCHEDULE_ERROR_BACKOFF_DEFAULT,
};
pub use schedule::spec::{
    tick_instance_id, trigger_instance_id, validate_name as validate_schedule_name, CatchUp,
    Overlap, Schedule, ScheduleSpec, CATCH_UP_MAX, SCHEDULE_NAME_LEN_MAX,
};
pub use schedule::store::{
    DueSchedule, FireOutcome, ScheduleFire, ScheduleStore, SchedulesDue, UnreadableSchedule,
};
pub use schedule::ScheduleError;
pub use summary::ResumeSummary;
pub use timer::{
    fire_due_once, run_timer_loop, TimerOptions, TimerSummary, TIMER_BATCH_SIZE_DEFAULT,
    TIMER_IDLE_FALLBACK_DEFAULT, TIMER_MIN_WAIT_DEFAULT, TIMER_REQUEUE_STUCK_AFTER_DEFAULT,
};
pub use wake::{
    BroadcastWake, ClosedOutcome, FixedPoll, Notifier, WakeFilter, WakeMessage, WakeReason,
    WakeSource,
};
pub use worker::run_loop;
