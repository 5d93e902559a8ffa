//! The scheduler: starts the runs of due schedules, from one elected worker at a time.
//!
//! Design:
//! - Leadership is a lease row (owner, epoch, expiry), taken or renewed at the start of every
//!   pass (`scheduler_lease`); a worker that does not hold it plans nothing. Only the store's
//!   clock decides expiry.
//! - A pass reads the due schedules with the store's clock and plans each one with a pure
//!   function ([`plan`](super::plan)); the store applies a plan in one transaction that starts
//!   the runs and moves the row on, refused unless the writer still leads (its epoch) and the
//!   row is still at the revision the plan was made from.
//! - Exactly once per tick: a tick's run has the id `<schedule>@<tick>`, starts are idempotent
//!   by id, and the row's next tick moves past a tick in the same transaction as its start. Two
//!   leaders (a lease that expired mid-pass) can both plan a tick; the revision lets one write.
//! - A tick starts its workflow by name, whether or not the leading worker registers it: the
//!   run waits for a worker that does, as any start does. Services that share a schema with
//!   different registries therefore share one scheduler, and a schedule whose workflow no
//!   worker runs yet holds up no other (under [`Overlap::Skip`](crate::Overlap), its default,
//!   it keeps one run waiting and drops its later ticks meanwhile). Leadership per workflow
//!   name would need a lease per name and would leave a name nobody leads unscheduled; one
//!   leader that never looks at the registry has neither problem.
//! - A due schedule that cannot start (its tick's id is refused, its cadence no longer
//!   compiles, the store refuses the fire, or its row cannot be read as a schedule) gets the
//!   reason on its row (`last_error`) and is
//!   backed off (`retry_at`, growing with each failure in a row along
//!   [`SchedulerOptions::error_backoff`]); the pass goes on with the others, and the due query
//!   leaves it out until then, so a batch is never filled with schedules that cannot start.
//!   Its ticks stay due meanwhile: the catch-up policy decides what happens to them once it
//!   starts again. Only the store being unreachable (the error cannot even be recorded) fails
//!   a pass.
//! - A failing pass is logged and retried after the poll interval; the loop releases its
//!   leadership on shutdown so another worker takes over at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keiro_journal::{store::StartRequest, Backoff, InstanceKey, StoreError};
use time::OffsetDateTime;

use super::plan::plan;
use super::spec::tick_instance_id;
use super::store::{DueSchedule, FireOutcome, ScheduleFire, ScheduleStore};
use super::ScheduleError;
use crate::{InvalidOptions, POLL_INTERVAL_MIN};
use keiro_journal::error_chain;
use keiro_journal::store::stretched as jittered;

/// The default longest wait between two scheduler passes: a tick starts at most this late.
pub const SCHEDULER_POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// The default time-to-live of the scheduler's leadership; a dead leader's successor takes
/// over within it.
pub const SCHEDULER_LEASE_TTL_DEFAULT: Duration = Duration::from_secs(15);
/// The default catch-up window: a tick first seen later than this was missed.
pub const CATCH_UP_WINDOW_DEFAULT: Duration = Duration::from_secs(60);
/// The default number of due schedules one pass reads.
pub const SCHEDULER_BATCH_DEFAULT: i64 = 100;
/// The default back-off of a schedule that cannot start: 1 s after the first failure,
/// doubling up to 5 minutes, jittered.
pub const SCHEDULE_ERROR_BACKOFF_DEFAULT: Backoff =
    Backoff::exponential(Duration::from_secs(1), Duration::from_secs(300));

/// How the scheduler runs.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// The longest wait between passes of a leader with an active schedule. A follower, or a
    /// leader with no unpaused schedule, passes every `lease_ttl / 3` instead, so an idle
    /// worker costs one or two queries per five seconds by default (a new schedule is picked up
    /// within that; its first ticks are still on time, see `catch_up_window`). Defaults to
    /// [`SCHEDULER_POLL_INTERVAL_DEFAULT`].
    pub poll_interval: Duration,
    /// The leadership's time-to-live, renewed every pass; keep it well above
    /// `poll_interval`. Defaults to [`SCHEDULER_LEASE_TTL_DEFAULT`].
    pub lease_ttl: Duration,
    /// How late a tick may be seen and still count as on time rather than missed
    /// ([`CatchUp`](crate::CatchUp)); keep it above `lease_ttl`, so a leader's death does not
    /// turn its successor's first ticks into missed ones. Defaults to
    /// [`CATCH_UP_WINDOW_DEFAULT`].
    pub catch_up_window: Duration,
    /// Due schedules read per pass. Defaults to [`SCHEDULER_BATCH_DEFAULT`].
    pub batch: i64,
    /// The leadership's owner id. Defaults to a fresh `scheduler-<uuid>` per worker.
    pub owner: String,
    /// How long a schedule that could not start is left alone, by how many passes in a row
    /// failed it. Defaults to [`SCHEDULE_ERROR_BACKOFF_DEFAULT`].
    pub error_backoff: Backoff,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            poll_interval: SCHEDULER_POLL_INTERVAL_DEFAULT,
            lease_ttl: SCHEDULER_LEASE_TTL_DEFAULT,
            catch_up_window: CATCH_UP_WINDOW_DEFAULT,
            batch: SCHEDULER_BATCH_DEFAULT,
            owner: format!("scheduler-{}", uuid::Uuid::new_v4().simple()),
            error_backoff: SCHEDULE_ERROR_BACKOFF_DEFAULT,
        }
    }
}

impl SchedulerOptions {
    /// Checks every field's bound.
    ///
    /// ```
    /// let mut options = keiro_resume::SchedulerOptions::default();
    /// assert!(options.validate().is_ok());
    /// options.lease_ttl = options.poll_interval;
    /// assert!(options.validate().is_err());
    /// ```
    ///
    /// # Errors
    ///
    /// [`InvalidOptions::Field`] naming the field and its bound.
    pub fn validate(&self) -> Result<(), InvalidOptions> {
        let field = |field, problem| Err(InvalidOptions::Field { field, problem });
        if self.poll_interval < POLL_INTERVAL_MIN {
            return field("scheduler.poll_interval", "must be at least 10ms");
        }
        if self.lease_ttl <= self.poll_interval {
            return field("scheduler.lease_ttl", "must exceed the poll interval");
        }
        if self.batch < 1 {
            return field("scheduler.batch", "must be positive");
        }
        if self.owner.is_empty() {
            return field("scheduler.owner", "must not be empty");
        }
        if let Err(e) = self.error_backoff.validate() {
            return field(
                if e.field == "initial" {
                    "scheduler.error_backoff.initial"
                } else {
                    "scheduler.error_backoff.max"
                },
                e.problem,
            );
        }
        Ok(())
    }
}

/// What scheduler passes did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedulerSummary {
    /// Passes that held the leadership.
    pub led: u64,
    /// Passes that did not.
    pub followed: u64,
    /// Runs started (new instances).
    pub started: u64,
    /// Starts whose id already existed (a tick started before, by this or another scheduler).
    pub already_started: u64,
    /// Ticks the overlap policy dropped.
    pub dropped: u64,
    /// Ticks newly buffered.
    pub buffered: u64,
    /// Plans refused because the row moved on or the leadership was lost.
    pub stale: u64,
    /// Due schedules that could not start: their error was recorded and they were backed off.
    pub failed: u64,
}

impl std::ops::AddAssign for SchedulerSummary {
    fn add_assign(&mut self, o: Self) {
        self.led += o.led;
        self.followed += o.followed;
        self.started += o.started;
        self.already_started += o.already_started;
        self.dropped += o.dropped;
        self.buffered += o.buffered;
        self.stale += o.stale;
        self.failed += o.failed;
    }
}

/// One scheduler pass at `now` (`None`: the store's clock): take or renew the leadership,
/// then start the runs of every due schedule, whatever workflow it names.
///
/// # Errors
///
/// The first store error that is not one schedule's own (taking the lease, reading the due
/// schedules, recording a schedule's error); schedules handled before it stay handled.
pub async fn schedule_once(
    store: &dyn ScheduleStore,
    options: &SchedulerOptions,
    now: Option<OffsetDateTime>,
) -> Result<SchedulerSummary, StoreError> {
    Ok(pass(store, options, now).await?.0)
}

/// What became of one due schedule.
enum Handled {
    /// Nothing to write.
    Nothing,
    /// The plan was applied.
    Fired,
    /// The plan was refused (the row moved on).
    Stale,
    /// The leadership is gone: the pass stops.
    Deposed,
}

/// A pass, and how long until the next tick as the store saw it: `None` when this worker does
/// not lead or no schedule is active.
async fn pass(
    store: &dyn ScheduleStore,
    options: &SchedulerOptions,
    now: Option<OffsetDateTime>,
) -> Result<(SchedulerSummary, Option<Duration>), StoreError> {
    let mut summary = SchedulerSummary::default();
    let Some(leader) = store
        .scheduler_lease(&options.owner, options.lease_ttl, now)
        .await?
    else {
        summary.followed = 1;
        return Ok((summary, None));
    };
    summary.led = 1;
    let found = store.schedules_due(now, options.batch).await?;
    let mut written = 0_u64;
    for due in &found.due {
        match fire(store, options, &leader, found.clock, due, &mut summary).await {
            Ok(Handled::Nothing) => {}
            Ok(Handled::Fired) => written += 1,
            Ok(Handled::Stale) => summary.stale += 1,
            Ok(Handled::Deposed) => {
                summary.stale += 1;
                break;
            }
            Err(error) => {
                // This schedule's own failure: recorded on its row, which leaves the due
                // schedules until its back-off is over; the others go on.
                let s = &due.schedule;
                let failed = Failed {
                    name: &s.spec.name,
                    revision: s.revision,
                    failures: s.failures,
                };
                record_failure(store, options, found.clock, &failed, &error.message()).await?;
                summary.failed += 1;
                written += 1;
            }
        }
    }
    for row in &found.unreadable {
        let failed = Failed {
            name: &row.name,
            revision: row.revision,
            failures: row.failures,
        };
        let error = keiro_journal::store::storable_text(&row.error).into_owned();
        record_failure(store, options, found.clock, &failed, &error).await?;
        summary.failed += 1;
        written += 1;
    }
    let read = found.due.len() + found.unreadable.len();
    let full = i64::try_from(read).unwrap_or(i64::MAX) >= options.batch;
    let wait = if full && written > 0 {
        Some(Duration::ZERO) // there may be more due right now
    } else {
        // Until the next tick, at most the poll interval; a tick already due that this pass
        // left (a live previous run) waits the poll interval, not nothing, or the loop would
        // spin on it.
        found.next_due.map(|at| {
            Duration::try_from(at - found.clock)
                .ok()
                .filter(|d| !d.is_zero())
                .unwrap_or(options.poll_interval)
        })
    };
    Ok((summary, wait))
}

/// Plans one due schedule and applies the plan. `Err` is the schedule's own failure: its
/// tick's id is refused, its cadence does not compile, or the store refused the fire.
async fn fire(
    store: &dyn ScheduleStore,
    options: &SchedulerOptions,
    leader: &keiro_journal::Fence,
    clock: OffsetDateTime,
    due: &DueSchedule,
    summary: &mut SchedulerSummary,
) -> Result<Handled, FireError> {
    let schedule = &due.schedule;
    let spec = &schedule.spec;
    // Validated when written; a row that no longer compiles (written by another build or by
    // hand) is this schedule's failure.
    let cadence = spec.cadence.compile().map_err(FireError::Schedule)?;
    let Some(plan) = plan(
        schedule,
        &cadence,
        clock,
        due.previous_live,
        options.catch_up_window,
    ) else {
        return Ok(Handled::Nothing);
    };
    let mut starts = Vec::with_capacity(plan.starts.len());
    for tick in &plan.starts {
        let id = tick_instance_id(&spec.name, *tick).map_err(|source| {
            FireError::Schedule(ScheduleError::TickId {
                schedule: spec.name.clone(),
                source,
            })
        })?;
        starts.push(StartRequest {
            attributes: Default::default(),
            key: InstanceKey {
                name: spec.workflow.clone(),
                id,
            },
            input: spec.input.clone(),
            parent: None,
            priority: 0,
            queue: None,
        });
    }
    let fire = ScheduleFire {
        name: spec.name.clone(),
        leader: leader.clone(),
        revision: schedule.revision,
        starts,
        next_tick: plan.next_tick,
        last_tick: plan.last_tick,
        buffered_tick: plan.buffered,
    };
    Ok(
        match store.schedule_fire(&fire).await.map_err(FireError::Store)? {
            FireOutcome::Fired(started) => {
                for s in &started {
                    if s.created {
                        summary.started += 1;
                    } else {
                        summary.already_started += 1;
                    }
                }
                summary.dropped += plan.dropped;
                if plan.buffered.is_some() && plan.buffered != schedule.buffered_tick {
                    summary.buffered += 1;
                }
                Handled::Fired
            }
            FireOutcome::Stale => Handled::Stale,
            FireOutcome::NotLeader => Handled::Deposed,
        },
    )
}

/// Why one schedule could not start.
#[derive(Debug)]
enum FireError {
    /// Its row cannot be planned.
    Schedule(ScheduleError),
    /// The store refused its fire.
    Store(StoreError),
}

impl FireError {
    /// What the row's `last_error` says: the whole chain, as text a row can hold.
    fn message(&self) -> String {
        let chain = match self {
            Self::Schedule(e) => error_chain(e),
            Self::Store(e) => error_chain(e),
        };
        keiro_journal::store::storable_text(&chain).into_owned()
    }
}

/// The row of a schedule that could not start.
struct Failed<'a> {
    name: &'a str,
    revision: i64,
    /// Its failures before this one.
    failures: u32,
}

/// Writes `message` on the schedule's row and backs it off; `Err` only when even that fails
/// (the store is likely unreachable then, and the pass fails as a whole).
async fn record_failure(
    store: &dyn ScheduleStore,
    options: &SchedulerOptions,
    clock: OffsetDateTime,
    failed: &Failed<'_>,
    message: &str,
) -> Result<(), StoreError> {
    let failures = failed.failures.saturating_add(1);
    let delay = options.error_backoff.delay_random(failures);
    tracing::warn!(
        schedule = %failed.name,
        error = %message,
        failures,
        retry_in = ?delay,
        "schedule not started; backing off"
    );
    store
        .schedule_record_error(failed.name, failed.revision, message, clock + delay)
        .await?;
    Ok(())
}

/// Runs scheduler passes until `shutdown` resolves, then gives up the leadership.
pub async fn run_scheduler_loop(
    store: Arc<dyn ScheduleStore>,
    options: SchedulerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> SchedulerSummary {
    let mut total = SchedulerSummary::default();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let wait = match pass(store.as_ref(), &options, None).await {
            Ok((summary, until_next)) => {
                total += summary;
                // A follower, or a leader with nothing scheduled, only needs to keep its lease
                // (or notice a new schedule, or a dead leader) in time: a third of the lease.
                until_next.map_or(options.lease_ttl / 3, |d| d.min(options.poll_interval))
            }
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "scheduler pass failed; retrying");
                options.poll_interval
            }
        };
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            () = tokio::time::sleep(jittered(wait)) => {}
        }
    }
    // A failure leaves the lease to expire.
    if let Err(error) = store.scheduler_release(&options.owner).await {
        tracing::debug!(error = %error_chain(&error), "releasing the scheduler lease failed");
    }
    total
}
