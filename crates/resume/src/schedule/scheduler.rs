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
//! - A schedule whose workflow this worker has not registered starts nothing: the reason is
//!   written to its row (`last_error`) and its ticks stay due, so the catch-up policy decides
//!   what happens to them once a worker that has it leads.
//! - A failing pass is logged and retried after the poll interval; the loop releases its
//!   leadership on shutdown so another worker takes over at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keiro_journal::{InstanceKey, StartRequest, StoreError};
use time::OffsetDateTime;

use super::plan::plan;
use super::spec::{tick_instance_id, ScheduleError};
use super::store::{FireOutcome, ScheduleFire, ScheduleStore};
use crate::{InvalidOptions, Registry, POLL_INTERVAL_MIN};
use keiro_journal::error_chain;
use keiro_journal::stretched as jittered;

/// The default longest wait between two scheduler passes: a tick starts at most this late.
pub const SCHEDULER_POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);
/// The default time-to-live of the scheduler's leadership; a dead leader's successor takes
/// over within it.
pub const SCHEDULER_LEASE_TTL_DEFAULT: Duration = Duration::from_secs(15);
/// The default catch-up window: a tick first seen later than this was missed.
pub const CATCH_UP_WINDOW_DEFAULT: Duration = Duration::from_secs(60);
/// The default number of due schedules one pass reads.
pub const SCHEDULER_BATCH_DEFAULT: i64 = 100;

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
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            poll_interval: SCHEDULER_POLL_INTERVAL_DEFAULT,
            lease_ttl: SCHEDULER_LEASE_TTL_DEFAULT,
            catch_up_window: CATCH_UP_WINDOW_DEFAULT,
            batch: SCHEDULER_BATCH_DEFAULT,
            owner: format!("scheduler-{}", uuid::Uuid::new_v4().simple()),
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
    /// Due schedules whose workflow this worker has not registered.
    pub unregistered: u64,
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
        self.unregistered += o.unregistered;
    }
}

/// One scheduler pass at `now` (`None`: the store's clock): take or renew the leadership,
/// then start the runs of every due schedule whose workflow is in `registry`.
///
/// # Errors
///
/// The first store error; schedules handled before it stay handled.
pub async fn schedule_once(
    store: &dyn ScheduleStore,
    registry: &Registry,
    options: &SchedulerOptions,
    now: Option<OffsetDateTime>,
) -> Result<SchedulerSummary, StoreError> {
    Ok(pass(store, registry, options, now).await?.0)
}

/// A pass, and how long until the next tick as the store saw it: `None` when this worker does
/// not lead or no schedule is active.
async fn pass(
    store: &dyn ScheduleStore,
    registry: &Registry,
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
    for due in &found.due {
        let schedule = &due.schedule;
        let spec = &schedule.spec;
        if registry.get(&spec.workflow).is_none() {
            summary.unregistered += 1;
            let error = ScheduleError::Unregistered {
                schedule: spec.name.clone(),
                workflow: spec.workflow.clone(),
            }
            .to_string();
            if schedule.last_error.as_deref() != Some(error.as_str()) {
                tracing::warn!(schedule = %spec.name, %error, "schedule not started");
                store
                    .schedule_record_error(&spec.name, schedule.revision, &error)
                    .await?;
            }
            continue;
        }
        let cadence = match spec.cadence.compile() {
            Ok(cadence) => cadence,
            Err(error) => {
                // Validated when written; a row that no longer compiles (written by another
                // build) is reported on the row rather than failing every pass.
                store
                    .schedule_record_error(&spec.name, schedule.revision, &error.to_string())
                    .await?;
                continue;
            }
        };
        let Some(plan) = plan(
            schedule,
            &cadence,
            found.clock,
            due.previous_live,
            options.catch_up_window,
        ) else {
            continue;
        };
        let mut starts = Vec::with_capacity(plan.starts.len());
        for tick in &plan.starts {
            let id = tick_instance_id(&spec.name, *tick).map_err(|e| StoreError::Malformed {
                operation: "planning a schedule",
                detail: e.to_string(),
            })?;
            starts.push(StartRequest {
                key: InstanceKey {
                    name: spec.workflow.clone(),
                    id,
                },
                input: spec.input.clone(),
                parent: None,
                priority: 0,
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
        match store.schedule_fire(&fire).await? {
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
            }
            FireOutcome::Stale => summary.stale += 1,
            FireOutcome::NotLeader => {
                summary.stale += 1;
                break;
            }
        }
    }
    let full = i64::try_from(found.due.len()).unwrap_or(i64::MAX) >= options.batch;
    let progressed = summary.started + summary.already_started > 0;
    let wait = if full && progressed {
        Some(Duration::ZERO) // there may be more due right now
    } else {
        // Until the next tick, at most the poll interval; a tick already due that this pass
        // left (an unregistered workflow, a live previous run) waits the poll interval, not
        // nothing, or the loop would spin on it.
        found.next_due.map(|at| {
            Duration::try_from(at - found.clock)
                .ok()
                .filter(|d| !d.is_zero())
                .unwrap_or(options.poll_interval)
        })
    };
    Ok((summary, wait))
}

/// Runs scheduler passes until `shutdown` resolves, then gives up the leadership.
pub async fn run_scheduler_loop(
    store: Arc<dyn ScheduleStore>,
    registry: Registry,
    options: SchedulerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> SchedulerSummary {
    let mut total = SchedulerSummary::default();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let wait = match pass(store.as_ref(), &registry, &options, None).await {
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
