//! Schedules in memory: the `schedules` table and the scheduler's leadership row, with the
//! same rules as the Postgres store (`docs/store-contract.md`, "Schedules"). Each method is one
//! critical section, so a fire's starts and its row update are atomic, as one transaction is.

use std::collections::BTreeMap;
use std::time::Duration;

use keiro_journal::store::{Error, Result};
use keiro_journal::{span::traced, store_span};
use keiro_journal::{store::StartRequest, Fence, InstanceKey, Started};
use keiro_resume::DueSchedule;
use keiro_resume::{
    trigger_instance_id, FireOutcome, Schedule, ScheduleFire, ScheduleSpec, ScheduleStore,
    SchedulesDue,
};
use time::OffsetDateTime;

use crate::clock::later;
use crate::State;
use crate::{storable, MemoryStore};

/// The schedules and the leadership, inside the store's state.
#[derive(Debug, Default)]
pub(crate) struct Schedules {
    rows: BTreeMap<String, Schedule>,
    leader: Option<Leader>,
    /// The epoch of the last holder, kept across releases so a new holder's epoch is new.
    epoch: i64,
}

#[derive(Debug, Clone)]
struct Leader {
    owner: String,
    expires_at: OffsetDateTime,
}

const UPSERT: &str = "writing a schedule";
const TRIGGER: &str = "triggering a schedule";

/// The first tick strictly after `now`, or a refusal for a cadence that does not compile (the
/// facade checks it first; a caller of the trait may not).
fn first_tick(
    spec: &ScheduleSpec,
    now: OffsetDateTime,
    operation: &'static str,
) -> Result<Option<OffsetDateTime>> {
    spec.cadence
        .next_after(now)
        .map_err(|e| Error::ValueRefused {
            operation,
            reason: e.to_string(),
        })
}

impl State {
    fn schedule_start(&mut self, schedule: &Schedule, id: keiro_journal::WorkflowId) -> Started {
        self.instance_start(&StartRequest {
            key: InstanceKey {
                name: schedule.spec.workflow.clone(),
                id,
            },
            input: schedule.spec.input.clone(),
            parent: None,
            priority: 0,
        })
    }

    fn previous_live(&self, schedule: &Schedule) -> bool {
        schedule.last_instance.as_ref().is_some_and(|id| {
            let key = InstanceKey {
                name: schedule.spec.workflow.clone(),
                id: id.clone(),
            };
            self.instances
                .get(&key)
                .is_some_and(|entry| !entry.row.status.is_terminal())
        })
    }
}

#[async_trait::async_trait]
impl ScheduleStore for MemoryStore {
    async fn schedule_upsert(
        &self,
        spec: &ScheduleSpec,
        now: Option<OffsetDateTime>,
    ) -> Result<Schedule> {
        let span = store_span!("schedule_upsert", keiro.schedule.name = %spec.name);
        traced(span, async {
            storable::value(UPSERT, &spec.input)?;
            self.transact(UPSERT, |state| {
                let now = now.unwrap_or_else(|| state.clock.now());
                let next_tick = first_tick(spec, now, UPSERT)?;
                let row = match state.schedules.rows.get(&spec.name) {
                    Some(old) => Schedule {
                        spec: spec.clone(),
                        next_tick,
                        buffered_tick: None,
                        last_error: None,
                        failures: 0,
                        retry_at: None,
                        revision: old.revision + 1,
                        updated_at: now,
                        ..old.clone()
                    },
                    None => Schedule {
                        spec: spec.clone(),
                        paused: false,
                        next_tick,
                        last_tick: None,
                        buffered_tick: None,
                        last_instance: None,
                        last_error: None,
                        failures: 0,
                        retry_at: None,
                        revision: 1,
                        created_at: now,
                        updated_at: now,
                    },
                };
                state.schedules.rows.insert(spec.name.clone(), row.clone());
                Ok(row)
            })
        })
        .await
    }

    async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>> {
        let span = store_span!("schedule_get", keiro.schedule.name = %name);
        traced(span, async {
            self.transact("reading a schedule", |state| {
                Ok(state.schedules.rows.get(name).cloned())
            })
        })
        .await
    }

    async fn schedules_list(&self) -> Result<Vec<Schedule>> {
        let span = store_span!("schedules_list");
        traced(span, async {
            self.transact("listing schedules", |state| {
                Ok(state.schedules.rows.values().cloned().collect())
            })
        })
        .await
    }

    async fn schedule_delete(&self, name: &str) -> Result<bool> {
        let span = store_span!("schedule_delete", keiro.schedule.name = %name);
        traced(span, async {
            self.transact("deleting a schedule", |state| {
                Ok(state.schedules.rows.remove(name).is_some())
            })
        })
        .await
    }

    async fn schedule_set_paused(
        &self,
        name: &str,
        paused: bool,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Schedule>> {
        let span = store_span!("schedule_set_paused", keiro.schedule.name = %name);
        traced(span, async {
            const PAUSE: &str = "pausing or resuming a schedule";
            self.transact(PAUSE, |state| {
                let now = now.unwrap_or_else(|| state.clock.now());
                let Some(row) = state.schedules.rows.get(name).cloned() else {
                    return Ok(None);
                };
                if row.paused == paused {
                    return Ok(Some(row));
                }
                let next_tick = if paused {
                    row.next_tick
                } else {
                    first_tick(&row.spec, now, PAUSE)?
                };
                // A resume clears the back-off: the operator's act is the retry.
                let (failures, retry_at) = if paused {
                    (row.failures, row.retry_at)
                } else {
                    (0, None)
                };
                let row = Schedule {
                    paused,
                    next_tick,
                    buffered_tick: if paused { row.buffered_tick } else { None },
                    failures,
                    retry_at,
                    revision: row.revision + 1,
                    updated_at: now,
                    ..row
                };
                state.schedules.rows.insert(name.to_owned(), row.clone());
                Ok(Some(row))
            })
        })
        .await
    }

    async fn schedule_trigger(
        &self,
        name: &str,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Started>> {
        let span = store_span!("schedule_trigger", keiro.schedule.name = %name);
        traced(span, async {
            self.transact(TRIGGER, |state| {
                let now = now.unwrap_or_else(|| state.clock.now());
                let Some(row) = state.schedules.rows.get(name).cloned() else {
                    return Ok(None);
                };
                let id = trigger_instance_id(name, now).map_err(|e| Error::ValueRefused {
                    operation: TRIGGER,
                    reason: e.to_string(),
                })?;
                let started = state.schedule_start(&row, id.clone());
                let row = Schedule {
                    last_instance: Some(id),
                    revision: row.revision + 1,
                    updated_at: now,
                    ..row
                };
                state.schedules.rows.insert(name.to_owned(), row);
                Ok(Some(started))
            })
        })
        .await
    }

    async fn scheduler_lease(
        &self,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Fence>> {
        let span = store_span!("scheduler_lease");
        traced(span, async {
            self.transact("taking the scheduler lease", |state| {
                let now = now.unwrap_or_else(|| state.clock.now());
                let s = &mut state.schedules;
                let held_by_other = s
                    .leader
                    .as_ref()
                    .is_some_and(|l| l.owner != owner && l.expires_at > now);
                if held_by_other {
                    return Ok(None);
                }
                if s.leader.as_ref().is_none_or(|l| l.owner != owner) {
                    s.epoch += 1;
                }
                s.leader = Some(Leader {
                    owner: owner.to_owned(),
                    expires_at: later(now, ttl),
                });
                Ok(Some(Fence {
                    owner: owner.to_owned(),
                    epoch: s.epoch,
                }))
            })
        })
        .await
    }

    async fn scheduler_release(&self, owner: &str) -> Result<bool> {
        let span = store_span!("scheduler_release");
        traced(span, async {
            self.transact("releasing the scheduler lease", |state| {
                let s = &mut state.schedules;
                if s.leader.as_ref().is_some_and(|l| l.owner == owner) {
                    s.leader = None;
                    return Ok(true);
                }
                Ok(false)
            })
        })
        .await
    }

    async fn schedules_due(&self, now: Option<OffsetDateTime>, limit: i64) -> Result<SchedulesDue> {
        let span = store_span!("schedules_due");
        traced(span, async {
            self.transact("reading due schedules", |state| {
                let clock = now.unwrap_or_else(|| state.clock.now());
                let live = state.schedules.rows.values().filter(|s| !s.paused);
                // A backed-off schedule is due at its next tick or its retry, whichever is
                // later (PostgreSQL's `greatest`, which ignores a missing retry).
                let next_due = live
                    .clone()
                    .filter_map(|s| s.next_tick.map(|t| s.retry_at.map_or(t, |r| r.max(t))))
                    .min();
                let mut due: Vec<DueSchedule> = live
                    .filter(|s| {
                        (s.next_tick.is_some_and(|t| t <= clock) || s.buffered_tick.is_some())
                            && s.retry_at.is_none_or(|r| r <= clock)
                    })
                    .map(|s| DueSchedule {
                        schedule: s.clone(),
                        previous_live: state.previous_live(s),
                    })
                    .collect();
                // As the Postgres query: earliest next tick first, a row with none last.
                due.sort_by_key(|d| (d.schedule.next_tick.is_none(), d.schedule.next_tick));
                due.truncate(usize::try_from(limit).unwrap_or(0));
                Ok(SchedulesDue {
                    clock,
                    due,
                    // Every row here was written through the trait, typed.
                    unreadable: Vec::new(),
                    next_due,
                })
            })
        })
        .await
    }

    async fn schedule_fire(&self, fire: &ScheduleFire) -> Result<FireOutcome> {
        let span = store_span!("schedule_fire", keiro.schedule.name = %fire.name);
        traced(span, async {
            const FIRE: &str = "firing a schedule";
            for start in &fire.starts {
                storable::value(FIRE, &start.input)?;
            }
            self.transact(FIRE, |state| {
                let leads = state.schedules.epoch == fire.leader.epoch
                    && state
                        .schedules
                        .leader
                        .as_ref()
                        .is_some_and(|l| l.owner == fire.leader.owner);
                if !leads {
                    return Ok(FireOutcome::NotLeader);
                }
                let Some(row) = state
                    .schedules
                    .rows
                    .get(&fire.name)
                    .filter(|r| r.revision == fire.revision && !r.paused)
                    .cloned()
                else {
                    return Ok(FireOutcome::Stale);
                };
                let now = state.clock.now();
                let started: Vec<Started> = fire
                    .starts
                    .iter()
                    .map(|request| state.instance_start(request))
                    .collect();
                let row = Schedule {
                    next_tick: fire.next_tick,
                    last_tick: fire.last_tick,
                    buffered_tick: fire.buffered_tick,
                    last_instance: fire
                        .starts
                        .last()
                        .map(|r| r.key.id.clone())
                        .or(row.last_instance),
                    last_error: None,
                    failures: 0,
                    retry_at: None,
                    revision: row.revision + 1,
                    updated_at: now,
                    ..row
                };
                state.schedules.rows.insert(fire.name.clone(), row);
                Ok(FireOutcome::Fired(started))
            })
        })
        .await
    }

    async fn schedule_record_error(
        &self,
        name: &str,
        revision: i64,
        error: &str,
        retry_at: OffsetDateTime,
    ) -> Result<bool> {
        const RECORD: &str = "recording a schedule's error";
        let span = store_span!("schedule_record_error", keiro.schedule.name = %name);
        traced(span, async {
            storable::text(RECORD, "schedule error", error)?;
            self.transact(RECORD, |state| {
                let now = state.clock.now();
                match state.schedules.rows.get_mut(name) {
                    Some(row) if row.revision == revision => {
                        row.last_error = Some(error.to_owned());
                        row.failures = row.failures.saturating_add(1);
                        row.retry_at = Some(retry_at);
                        row.updated_at = now;
                        Ok(true)
                    }
                    _ => Ok(false),
                }
            })
        })
        .await
    }
}
