//! Wake sources in memory: durable timers, awakeables, signals, child workflows and
//! cancellation with cascade, each one critical section. The signal rules are in [`signal`].
//!
//! Every resolution journals through [`State::append`], the very function behind
//! `journal_append`, so the generation check, the recorded-step convergence, the terminal
//! refusal, the fence and the `suspended` -> `running` flip with its wake apply unchanged. Only
//! a signal wait that consumes a buffered signal is fenced; every other resolution is external.
//!
//! The store lock orders everything: it is the per-token lock of the signal operations, and
//! it is why a timer is never fired twice (the Postgres store needs `SKIP LOCKED` for that).
//! Firing is one critical section, so a timer is never seen half fired: the `firing` state of
//! the Postgres table has no counterpart here.
//!
//! A child's parent link is the row's `parent` plus a [`ParentLink`]. Whenever a linked row
//! goes terminal (a closing marker, the crash ceiling, divergence) the same critical section
//! journals its result envelope into the parent through [`State::deliver_to_parent`]; a
//! parent that refuses (terminal, or on another generation) is ignored. A fix of a failed
//! child (`<id>~retry~<hex>`, linked where its origin is) delivers only when it completes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use keiro_journal::store::{Append, AppendOutcome, Result};
use keiro_journal::{
    store::awakeable_step, store::ChildSpawn, store::FiredTimer, store::TimerArm, store::TimerDue,
    AwakeableInfo, AwakeableOutcome, AwakeableStatus, Envelope, Event, Generation, Instance,
    InstanceKey, SignalWaitInfo, Status, StepKind, StoreError, TimerFiring, TimerInfo, TimerKind,
    TimerState, Waits,
};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

mod signal;

use crate::clock::later;
use crate::journal::Plan;
use crate::state::{refused, ParentLink};
use crate::State;

/// One step of one instance generation: the key of a timer and of a signal waiter, as in
/// their Postgres primary keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct StepId {
    key: InstanceKey,
    generation: Generation,
    step: String,
}

impl StepId {
    fn new(key: &InstanceKey, generation: Generation, step: &str) -> Self {
        Self {
            key: key.clone(),
            generation,
            step: step.to_owned(),
        }
    }
}

/// What a timer does when it fires. The signal wait's token is not kept: the store lock
/// already orders the timeout against every send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fire {
    Sleep,
    SignalTimeout,
}

/// A timer row. It is `scheduled` while [`Sources::scheduled`] indexes it and `fired` after;
/// fired timers stay, so a late re-arm of the same step still finds the first.
#[derive(Debug)]
struct Timer {
    fire_at: OffsetDateTime,
    fire: Fire,
    /// The token of a signal timeout, kept for the operators' read only.
    token: Option<String>,
    created_at: OffsetDateTime,
    fired_at: Option<OffsetDateTime>,
}

/// An awakeable row: its owner, the generation its value goes to, and whether it settled.
#[derive(Debug)]
struct Awakeable {
    owner: InstanceKey,
    generation: Generation,
    status: AwakeableStatus,
    created_at: OffsetDateTime,
    settled_at: Option<OffsetDateTime>,
}

/// A registered signal wait: its token, its arrival number (the `seq` of `signal_waiters`)
/// and when it was registered.
#[derive(Debug)]
struct Waiter {
    token: String,
    seq: u64,
    since: OffsetDateTime,
}

/// A signal no wait took yet.
#[derive(Debug)]
struct Buffered {
    payload: Value,
    /// From then on it is never delivered, and the next send or wait on its token, or a
    /// send's sweep, deletes it.
    expires_at: OffsetDateTime,
}

/// The wake-source tables.
#[derive(Debug, Default)]
pub(crate) struct Sources {
    timers: BTreeMap<StepId, Timer>,
    /// The scheduled timers by due time, then key: the memory form of the partial index on
    /// `fire_at WHERE status = 'scheduled'`, serving the fire, the next due time and the count.
    scheduled: BTreeSet<(OffsetDateTime, StepId)>,
    awakeables: HashMap<Uuid, Awakeable>,
    /// Undelivered signals per token, by arrival number (oldest first).
    buffered: HashMap<String, BTreeMap<u64, Buffered>>,
    /// The buffered signals by expiry: the memory form of the index on `expires_at` that
    /// serves the sweep of a send.
    expiring: BTreeSet<(OffsetDateTime, u64, String)>,
    /// The last buffered signal's arrival number, like the `seq` identity of `signal_buffer`.
    buffer_seq: u64,
    /// Registered waiters.
    waiters: BTreeMap<StepId, Waiter>,
    /// Per token, the waiters by arrival: the `(token, seq)` index.
    queues: HashMap<String, BTreeMap<u64, StepId>>,
    /// The last arrival number handed out, like the `seq` identity of `signal_waiters`.
    waiter_seq: u64,
}

/// What separates a fix's id from its origin's: `<origin id>~retry~<8 hex>`.
pub(crate) const RETRY_MARK: &str = "~retry~";

/// Whether `key` is a fix started by `instance_retry_with_input`: its id holds
/// [`RETRY_MARK`] (Postgres: `strpos(workflow_id, '~retry~') > 0`).
pub(crate) fn is_retry(key: &InstanceKey) -> bool {
    key.id.as_str().contains(RETRY_MARK)
}

/// The envelope a terminal row's result travels in; `None` while it is live.
fn result_envelope(row: &Instance) -> Option<Value> {
    match row.status {
        Status::Completed => Some(Envelope::ok(row.output.clone().unwrap_or(Value::Null))),
        Status::Failed => Some(Envelope::failed(row.last_error.as_deref().unwrap_or(""))),
        Status::Cancelled => Some(Envelope::cancelled()),
        Status::Running | Status::Suspended => None,
    }
}

impl State {
    /// Journals `value` under `target` as an external append. `None` when the instance is
    /// missing, which every wake source treats like any other refusal.
    fn append_external(
        &mut self,
        target: &StepId,
        kind: StepKind,
        value: Value,
    ) -> Result<Option<AppendOutcome>> {
        let append = Append {
            key: target.key.clone(),
            generation: Some(target.generation),
            event: Event::StepRecorded {
                step: target.step.clone(),
                kind,
                result: value,
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

    /// The child-delivery rule: if `child` has a parent link and is terminal, journal its
    /// result envelope into the parent's spawning generation. Refusals are ignored.
    pub(crate) fn deliver_to_parent(&mut self, child: &InstanceKey) -> Result<()> {
        let Some(entry) = self.instances.get(child) else {
            return Ok(());
        };
        let (Some(parent), Some(link)) = (&entry.row.parent, &entry.link) else {
            return Ok(());
        };
        let Some(envelope) = result_envelope(&entry.row) else {
            return Ok(());
        };
        // A fix started by `instance_retry_with_input` (`<origin id>~retry~<hex>`) shares its
        // origin's link and answers for it only by succeeding: its failure or cancellation
        // would otherwise take the step from a later, successful fix.
        if is_retry(child) && entry.row.status != Status::Completed {
            return Ok(());
        }
        let target = StepId::new(parent, link.generation, &link.step);
        self.append_external(&target, StepKind::Child, envelope)?;
        Ok(())
    }

    pub(crate) fn timer_arm(&mut self, arm: &TimerArm) -> Result<OffsetDateTime> {
        if !self.instances.contains_key(&arm.key) {
            return Err(StoreError::NotFound {
                key: arm.key.clone(),
            });
        }
        let id = StepId::new(&arm.key, arm.generation, &arm.step);
        if let Some(timer) = self.sources.timers.get(&id) {
            return Ok(timer.fire_at);
        }
        let (fire, token) = match &arm.kind {
            TimerKind::Sleep => (Fire::Sleep, None),
            TimerKind::SignalTimeout { token } => (Fire::SignalTimeout, Some(token.clone())),
            // As the table's CHECK constraint would: a kind this store cannot fire is refused
            // when armed, not discovered when due.
            _ => return Err(refused("arming a timer", "unknown timer kind")),
        };
        // On the store's clock, as Postgres computes `now() + span` in the arm's statement.
        let now = self.clock.now();
        let fire_at = match arm.due {
            TimerDue::At(at) => at,
            TimerDue::After(_) => later(now, arm.due.span().unwrap_or_default()),
        };
        self.sources.scheduled.insert((fire_at, id.clone()));
        self.sources.timers.insert(
            id,
            Timer {
                fire_at,
                fire,
                token,
                created_at: now,
                fired_at: None,
            },
        );
        self.timer_armed();
        Ok(fire_at)
    }

    pub(crate) fn timers_fire_due(
        &mut self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> Result<TimerFiring> {
        let now = now.unwrap_or_else(|| self.clock.now());
        // A negative limit fires nothing, as it selects nothing in discovery.
        let limit = usize::try_from(limit.max(0)).unwrap_or(usize::MAX);
        let batch: Vec<_> = self
            .sources
            .scheduled
            .iter()
            .take_while(|(fire_at, _)| *fire_at <= now)
            .take(limit)
            .cloned()
            .collect();
        let mut fired = Vec::with_capacity(batch.len());
        for (fire_at, id) in batch {
            // Out of the index is `fired`, whatever the append below decides.
            self.sources.scheduled.remove(&(fire_at, id.clone()));
            let timer = self
                .sources
                .timers
                .get_mut(&id)
                .expect("every scheduled entry indexes a stored timer");
            timer.fired_at = Some(now);
            let fire = timer.fire;
            let delivered = match fire {
                Fire::Sleep => {
                    let outcome = self.append_external(&id, StepKind::Sleep, Value::Null)?;
                    let delivered = outcome == Some(AppendOutcome::Appended);
                    if delivered {
                        // The deadline is met; the row must not come due again on it.
                        self.entry_mut(&id.key)?.row.wake_after = None;
                    }
                    delivered
                }
                // A waiter that is gone was satisfied by a signal first.
                Fire::SignalTimeout => {
                    self.sources.waiter_remove(&id)
                        && self.append_external(&id, StepKind::Signal, Envelope::timeout())?
                            == Some(AppendOutcome::Appended)
                }
            };
            fired.push(FiredTimer {
                key: id.key,
                step: id.step,
                fire_at,
                fired_at: now,
                delivered,
            });
        }
        let next_due = self.sources.scheduled.first().map(|(fire_at, _)| *fire_at);
        Ok(TimerFiring {
            fired,
            next_due,
            clock: now,
        })
    }

    pub(crate) fn timers_due_count(&self, now: Option<OffsetDateTime>) -> u64 {
        let now = now.unwrap_or_else(|| self.clock.now());
        let due = self
            .sources
            .scheduled
            .iter()
            .take_while(|(fire_at, _)| *fire_at <= now)
            .count();
        u64::try_from(due).unwrap_or(u64::MAX)
    }

    pub(crate) fn awakeable_create(&mut self, append: &Append, id: Uuid) -> Result<AppendOutcome> {
        let slot = match self.append_plan(append)? {
            Plan::Decided(outcome) => return Ok(outcome),
            Plan::Write(slot) => slot,
        };
        // Checked before the journal is touched: Postgres would roll the append back with the
        // primary key violation.
        if self.sources.awakeables.contains_key(&id) {
            return Err(refused(
                "creating an awakeable",
                "the awakeable id is already registered",
            ));
        }
        let generation = slot.generation;
        self.append_write(append, slot)?;
        let created_at = self.clock.now();
        self.sources.awakeables.insert(
            id,
            Awakeable {
                owner: append.key.clone(),
                generation,
                status: AwakeableStatus::Pending,
                created_at,
                settled_at: None,
            },
        );
        Ok(AppendOutcome::Appended)
    }

    /// Settles a pending awakeable as `status` and journals `envelope` into its owner.
    pub(crate) fn awakeable_settle(
        &mut self,
        id: Uuid,
        status: AwakeableStatus,
        envelope: Value,
    ) -> Result<AwakeableOutcome> {
        let now = self.clock.now();
        let Some(awakeable) = self.sources.awakeables.get_mut(&id) else {
            return Ok(AwakeableOutcome::NotFound);
        };
        if awakeable.status != AwakeableStatus::Pending {
            return Ok(AwakeableOutcome::AlreadySettled(awakeable.status));
        }
        awakeable.status = status;
        awakeable.settled_at = Some(now);
        let target = StepId::new(&awakeable.owner, awakeable.generation, &awakeable_step(id));
        Ok(
            match self.append_external(&target, StepKind::Awakeable, envelope)? {
                Some(AppendOutcome::Appended | AppendOutcome::AlreadyPresent(_)) => {
                    AwakeableOutcome::Delivered
                }
                Some(AppendOutcome::RefusedTerminal(_) | AppendOutcome::Conflict) | None => {
                    AwakeableOutcome::OwnerGone
                }
            },
        )
    }

    /// Cancels the pending awakeables of a generation that was just closed (cancelled, or left
    /// by continue-as-new): nothing will await them, and a late completion must not count them
    /// as pending forever. Nothing is journaled. Returns how many.
    pub(crate) fn awakeables_cancel(&mut self, key: &InstanceKey, generation: Generation) -> u64 {
        let now = self.clock.now();
        let mut cancelled = 0;
        for awakeable in self.sources.awakeables.values_mut() {
            if awakeable.status == AwakeableStatus::Pending
                && awakeable.generation == generation
                && awakeable.owner == *key
            {
                awakeable.status = AwakeableStatus::Cancelled;
                awakeable.settled_at = Some(now);
                cancelled += 1;
            }
        }
        cancelled
    }

    pub(crate) fn awakeables_pending(&self) -> u64 {
        let pending = self
            .sources
            .awakeables
            .values()
            .filter(|awakeable| awakeable.status == AwakeableStatus::Pending)
            .count();
        u64::try_from(pending).unwrap_or(u64::MAX)
    }

    pub(crate) fn child_spawn(
        &mut self,
        append: &Append,
        spawn: &ChildSpawn,
    ) -> Result<AppendOutcome> {
        let slot = match self.append_plan(append)? {
            Plan::Decided(outcome) => return Ok(outcome),
            Plan::Write(slot) => slot,
        };
        let link = ParentLink {
            generation: slot.generation,
            step: spawn.await_step.clone(),
        };
        let spawner = &append.key;
        let await_target = StepId::new(spawner, link.generation, &link.step);

        let Some(entry) = self.instances.get_mut(&spawn.child) else {
            self.append_write(append, slot)?;
            self.instance_create(&spawn.child, spawn.input.clone(), Some(spawner.clone()), 0);
            self.entry_mut(&spawn.child)?.link = Some(link);
            return Ok(AppendOutcome::Appended);
        };
        // An instance under this key exists already. A finished one answers the spawner at
        // once. A running one has one parent, which alone gets its result: the spawner
        // becomes it when there is none or when it is the spawner itself on an earlier
        // generation (a link to a generation that continued as new could never deliver);
        // another parent keeps it, and the spawn is refused.
        let envelope = result_envelope(&entry.row);
        let other_parent = entry
            .row
            .parent
            .clone()
            .filter(|parent| parent != spawner && envelope.is_none());
        if let Some(parent) = other_parent {
            // Recorded in the spawn step, so every replay of the spawner is refused the same
            // way, and under the awaited step, so a wait for the child ends too.
            let Event::StepRecorded { step, kind, result } = &append.event else {
                return Err(refused("spawning a child workflow", "a spawn is a step"));
            };
            let mut refused_spawn = result.clone();
            if let (Value::Object(fields), Value::Object(mut taken)) =
                (&mut refused_spawn, Envelope::taken(&parent))
            {
                fields.append(&mut taken);
            }
            let recorded = Append {
                event: Event::StepRecorded {
                    step: step.clone(),
                    kind: *kind,
                    result: refused_spawn.clone(),
                },
                ..append.clone()
            };
            self.append_write(&recorded, slot)?;
            self.append_external(&await_target, StepKind::Child, Envelope::taken(&parent))?;
            return Ok(AppendOutcome::AlreadyPresent(refused_spawn));
        }
        self.append_write(append, slot)?;
        let now = self.clock.now();
        let entry = self.entry_mut(&spawn.child)?;
        let adopted = entry.row.parent.is_none();
        if adopted || envelope.is_none() {
            entry.row.parent = Some(spawner.clone());
            entry.link = Some(link);
            entry.row.updated_at = now;
        }
        if adopted {
            self.adopt(spawner, &spawn.child);
        }
        if let Some(envelope) = envelope {
            self.append_external(&await_target, StepKind::Child, envelope)?;
        }
        Ok(AppendOutcome::Appended)
    }

    pub(crate) fn instance_cancel(
        &mut self,
        key: &InstanceKey,
        cascade: bool,
    ) -> Result<AppendOutcome> {
        let outcome = self.append(&Append::external(key.clone(), Event::WorkflowCancelled))?;
        if outcome != AppendOutcome::Appended || !cascade {
            return Ok(outcome);
        }
        // Depth first, children in key order, without recursion so a deep tree cannot
        // exhaust the stack. Each cancelled descendant's own delivery to its (cancelled)
        // parent is refused and ignored.
        let mut pending = self.live_children(key);
        while let Some(child) = pending.pop() {
            let cancelled =
                self.append(&Append::external(child.clone(), Event::WorkflowCancelled))?;
            if cancelled == AppendOutcome::Appended {
                pending.extend(self.live_children(&child));
            }
        }
        Ok(outcome)
    }

    /// The non-terminal instances whose parent is `parent`, last key first (a stack pops them
    /// in key order).
    fn live_children(&self, parent: &InstanceKey) -> Vec<InstanceKey> {
        let Some(children) = self.children.get(parent) else {
            return Vec::new();
        };
        children
            .iter()
            .rev()
            .filter(|child| {
                self.instances
                    .get(*child)
                    .is_some_and(|entry| !entry.row.status.is_terminal())
            })
            .cloned()
            .collect()
    }
}

// The operators' counts (crate::inspect) and retention (crate::retention) read and delete the
// wake-source rows through these, so the tables' private layout stays in this module.
impl Sources {
    /// Scheduled timers due at `now`, and due later.
    pub(crate) fn timer_backlog(&self, now: OffsetDateTime) -> (u64, u64) {
        let due = self
            .scheduled
            .iter()
            .take_while(|(fire_at, _)| *fire_at <= now)
            .count();
        let future = self.scheduled.len() - due;
        (
            u64::try_from(due).unwrap_or(u64::MAX),
            u64::try_from(future).unwrap_or(u64::MAX),
        )
    }

    /// The timers, awakeables and signal waits of `key`, newest first, up to `limit` + 1 of
    /// each kind (the probe [`Waits::from_probe`] cuts): the order Postgres sorts them in.
    pub(crate) fn waits(&self, key: &InstanceKey, limit: u32) -> Waits {
        let probe = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        let mut timers: Vec<TimerInfo> = self
            .timers
            .iter()
            .filter(|(step, _)| step.key == *key)
            .map(|(step, timer)| TimerInfo {
                generation: step.generation,
                step: step.step.clone(),
                kind: match (timer.fire, &timer.token) {
                    (Fire::SignalTimeout, Some(token)) => TimerKind::SignalTimeout {
                        token: token.clone(),
                    },
                    _ => TimerKind::Sleep,
                },
                state: if timer.fired_at.is_some() {
                    TimerState::Fired
                } else {
                    TimerState::Scheduled
                },
                fire_at: timer.fire_at,
                fired_at: timer.fired_at,
                attempts: i32::from(timer.fired_at.is_some()),
                created_at: timer.created_at,
            })
            .collect();
        timers.sort_by(|a, b| {
            (b.generation, b.created_at, &b.step).cmp(&(a.generation, a.created_at, &a.step))
        });
        timers.truncate(probe);
        let mut awakeables: Vec<AwakeableInfo> = self
            .awakeables
            .iter()
            .filter(|(_, awakeable)| awakeable.owner == *key)
            .map(|(id, awakeable)| AwakeableInfo {
                id: *id,
                generation: awakeable.generation,
                status: awakeable.status,
                created_at: awakeable.created_at,
                settled_at: awakeable.settled_at,
            })
            .collect();
        awakeables.sort_by(|a, b| {
            (b.generation, b.created_at, b.id).cmp(&(a.generation, a.created_at, a.id))
        });
        awakeables.truncate(probe);
        let mut waits: Vec<(u64, SignalWaitInfo)> = self
            .waiters
            .iter()
            .filter(|(step, _)| step.key == *key)
            .map(|(step, waiter)| {
                let timeout_at = self
                    .timers
                    .get(step)
                    .filter(|timer| timer.fire == Fire::SignalTimeout)
                    .map(|timer| timer.fire_at);
                (
                    waiter.seq,
                    SignalWaitInfo {
                        generation: step.generation,
                        step: step.step.clone(),
                        token: waiter.token.clone(),
                        since: waiter.since,
                        timeout_at,
                    },
                )
            })
            .collect();
        waits.sort_by(|(a_seq, a), (b_seq, b)| (b.generation, b_seq).cmp(&(a.generation, a_seq)));
        let signal_waits = waits
            .into_iter()
            .take(probe)
            .map(|(_, wait)| wait)
            .collect();
        Waits::from_probe(timers, awakeables, signal_waits, limit)
    }

    /// Deletes every timer, awakeable and signal wait `key` owns; how many of each.
    pub(crate) fn forget(&mut self, key: &InstanceKey) -> (u64, u64, u64) {
        let timers: Vec<StepId> = self
            .timers
            .keys()
            .filter(|step| step.key == *key)
            .cloned()
            .collect();
        for step in &timers {
            if let Some(timer) = self.timers.remove(step) {
                self.scheduled.remove(&(timer.fire_at, step.clone()));
            }
        }
        let before = self.awakeables.len();
        self.awakeables
            .retain(|_, awakeable| awakeable.owner != *key);
        let awakeables = before - self.awakeables.len();
        let waiters: Vec<StepId> = self
            .waiters
            .keys()
            .filter(|step| step.key == *key)
            .cloned()
            .collect();
        for waiter in &waiters {
            self.waiter_remove(waiter);
        }
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        (count(timers.len()), count(awakeables), count(waiters.len()))
    }
}

#[cfg(test)]
mod tests {
    use keiro_journal::{
        store::child_result_step, store::Park, store::SignalWait, store::SignalWaitOutcome,
        JournalStore, Marker, SignalSendOutcome,
    };
    use keiro_lease::{Crash, CrashOutcome, LeaseStore};
    use serde_json::json;
    use time::Duration as Span;

    use super::*;
    use crate::fixtures::{append, claim, start, store, T0, TTL};
    use crate::{MemoryStore, Notification};

    /// `(step name, payload)` of every journal row of `key`, in order.
    async fn journal(store: &MemoryStore, key: &InstanceKey) -> Vec<(String, Value)> {
        store
            .journal_history(key)
            .await
            .unwrap()
            .into_iter()
            .map(|entry| {
                let encoded = entry.event.encode();
                (encoded.step_name, encoded.payload)
            })
            .collect()
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
            wake_after: Some(T0 + Span::hours(1)),
        };
        store.instance_park(&park).await.unwrap();
    }

    fn sleep(key: &InstanceKey, step: &str, minutes: i64) -> TimerArm {
        TimerArm {
            key: key.clone(),
            generation: 0,
            step: step.to_owned(),
            due: TimerDue::At(T0 + Span::minutes(minutes)),
            kind: TimerKind::Sleep,
        }
    }

    fn wait(key: &InstanceKey, step: &str, token: &str) -> SignalWait {
        SignalWait {
            key: key.clone(),
            generation: 0,
            step: step.to_owned(),
            token: token.to_owned(),
            fence: None,
        }
    }

    async fn spawn(
        store: &MemoryStore,
        parent: &InstanceKey,
        child: &str,
    ) -> (InstanceKey, String, AppendOutcome) {
        let child = InstanceKey::parse("child", child).unwrap();
        let await_step = child_result_step(&child);
        let append = Append::external(
            parent.clone(),
            Event::StepRecorded {
                step: format!("child:{}/{}", child.name, child.id),
                kind: StepKind::Child,
                result: json!({"name": child.name, "id": child.id}),
            },
        );
        let request = ChildSpawn {
            child: child.clone(),
            input: json!({"from": parent.id}),
            await_step: await_step.clone(),
        };
        let outcome = store.child_spawn(&append, &request).await.unwrap();
        (child, await_step, outcome)
    }

    #[tokio::test]
    async fn timers_arm_once_and_fire_by_the_pinned_clock_in_due_order() {
        let store = store();
        let a = start(&store, "a").await;
        let b = start(&store, "b").await;
        let missing = InstanceKey::parse("wf", "missing").unwrap();
        assert!(store
            .timer_arm(&sleep(&missing, "sleep:x", 1))
            .await
            .unwrap_err()
            .is_not_found());
        assert_eq!(
            store.timer_arm(&sleep(&b, "sleep:nap", 10)).await.unwrap(),
            T0 + Span::minutes(10)
        );
        assert_eq!(
            store.timer_arm(&sleep(&a, "sleep:nap", 5)).await.unwrap(),
            T0 + Span::minutes(5)
        );
        // A re-arm never moves fire_at, earlier or later.
        assert_eq!(
            store.timer_arm(&sleep(&a, "sleep:nap", 1)).await.unwrap(),
            T0 + Span::minutes(5)
        );
        park(&store, &a, "sleep:nap").await;

        let idle = store.timers_fire_due(None, 10).await.unwrap();
        assert_eq!(
            idle,
            TimerFiring {
                fired: vec![],
                next_due: Some(T0 + Span::minutes(5)),
                clock: T0,
            }
        );
        assert_eq!(store.timers_due_count(None).await.unwrap(), 0);
        let later = Some(T0 + Span::minutes(10));
        assert_eq!(store.timers_due_count(later).await.unwrap(), 2);
        assert!(store
            .timers_fire_due(later, 0)
            .await
            .unwrap()
            .fired
            .is_empty());

        let mut notifications = store.notifications();
        store.set_now(Some(T0 + Span::minutes(7)));
        let firing = store.timers_fire_due(None, 10).await.unwrap();
        assert_eq!(
            firing,
            TimerFiring {
                fired: vec![FiredTimer {
                    key: a.clone(),
                    step: "sleep:nap".into(),
                    fire_at: T0 + Span::minutes(5),
                    fired_at: T0 + Span::minutes(7),
                    delivered: true,
                }],
                next_due: Some(T0 + Span::minutes(10)),
                clock: T0 + Span::minutes(7),
            }
        );
        assert_eq!(
            journal(&store, &a).await,
            [("sleep:nap".into(), Value::Null)]
        );
        let row = store.instance_get(&a).await.unwrap().unwrap();
        assert_eq!((row.status, row.wake_after), (Status::Running, None));
        assert_eq!(notifications.try_recv().unwrap(), Notification::Instance(a));

        let firing = store.timers_fire_due(later, 10).await.unwrap();
        assert_eq!(firing.fired.len(), 1);
        assert_eq!(firing.next_due, None);
        assert_eq!(store.timers_due_count(later).await.unwrap(), 0);
        assert_eq!(store.timers_requeue_stuck(TTL).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_fire_journals_nothing_for_a_terminal_owner_or_a_journaled_step() {
        let store = store();
        let closed = start(&store, "closed").await;
        let journaled = start(&store, "journaled").await;
        let rotated = start(&store, "rotated").await;
        for key in [&closed, &journaled, &rotated] {
            store.timer_arm(&sleep(key, "sleep:nap", 1)).await.unwrap();
        }
        store.instance_cancel(&closed, false).await.unwrap();
        let early = Event::StepRecorded {
            step: "sleep:nap".into(),
            kind: StepKind::Sleep,
            result: Value::Null,
        };
        append(&store, &journaled, None, early, None).await.unwrap();
        let rotate = Event::WorkflowContinuedAsNew {
            next_generation: 1,
            input: json!(null),
        };
        append(&store, &rotated, None, rotate, None).await.unwrap();
        let parked = Park {
            key: journaled.clone(),
            generation: 0,
            fence: None,
            awaited: vec!["awk:x".into()],
            wake_after: Some(T0 + Span::hours(1)),
        };
        store.instance_park(&parked).await.unwrap();
        let before: Vec<_> = [&closed, &journaled, &rotated]
            .into_iter()
            .map(|key| store.inspect(|state| state.instances[key].row.clone()))
            .collect();

        store.set_now(Some(T0 + Span::minutes(1)));
        let firing = store.timers_fire_due(None, 10).await.unwrap();
        let delivered: Vec<_> = firing
            .fired
            .iter()
            .map(|fired| (fired.key.id.to_string(), fired.delivered))
            .collect();
        assert_eq!(
            delivered,
            [
                ("closed".to_owned(), false),
                ("journaled".to_owned(), false),
                ("rotated".to_owned(), false)
            ]
        );
        let after: Vec<_> = [&closed, &journaled, &rotated]
            .into_iter()
            .map(|key| store.inspect(|state| state.instances[key].row.clone()))
            .collect();
        assert_eq!(after, before, "an undelivered fire leaves the rows alone");
        assert_eq!(journal(&store, &closed).await.len(), 1);
        assert_eq!(journal(&store, &journaled).await.len(), 1);
        // Fired is fired: nothing is due again and a re-arm finds the first timer.
        assert!(store
            .timers_fire_due(None, 10)
            .await
            .unwrap()
            .fired
            .is_empty());
        assert_eq!(
            store
                .timer_arm(&sleep(&closed, "sleep:nap", 9))
                .await
                .unwrap(),
            T0 + Span::minutes(1)
        );
    }

    #[tokio::test]
    async fn buffered_signals_are_consumed_oldest_first_by_later_waits() {
        let store = store();
        let a = start(&store, "a").await;
        let b = start(&store, "b").await;
        let c = start(&store, "c").await;
        for payload in ["one", "two"] {
            assert_eq!(
                store.signal_send("t", &json!(payload)).await.unwrap(),
                SignalSendOutcome::Buffered
            );
        }
        assert_eq!(
            store.signal_wait(&wait(&a, "signal:x", "t")).await.unwrap(),
            SignalWaitOutcome::Delivered(json!({"ok": "one"}))
        );
        // A repeated wait reads the journal; it consumes nothing more.
        assert_eq!(
            store.signal_wait(&wait(&a, "signal:x", "t")).await.unwrap(),
            SignalWaitOutcome::Delivered(json!({"ok": "one"}))
        );
        let entries = store.journal_history(&a).await.unwrap();
        assert!(matches!(
            &entries[0].event,
            Event::StepRecorded {
                kind: StepKind::Signal,
                ..
            }
        ));

        // A stale fence cannot consume the buffered signal.
        let fence = claim(&store, &b, "w").await;
        store.instance_lease_force_release(&b).await.unwrap();
        let fenced = SignalWait {
            fence: Some(fence),
            ..wait(&b, "signal:x", "t")
        };
        assert!(store
            .signal_wait(&fenced)
            .await
            .unwrap_err()
            .is_lease_lost());
        // Nor can a terminal waiter: the signal stays for someone who can take it.
        store.instance_cancel(&c, false).await.unwrap();
        assert_eq!(
            store.signal_wait(&wait(&c, "signal:x", "t")).await.unwrap(),
            SignalWaitOutcome::Waiting
        );
        assert_eq!(
            store.signal_wait(&wait(&b, "signal:x", "t")).await.unwrap(),
            SignalWaitOutcome::Delivered(json!({"ok": "two"}))
        );
        let d = start(&store, "d").await;
        assert_eq!(
            store.signal_wait(&wait(&d, "signal:x", "t")).await.unwrap(),
            SignalWaitOutcome::Waiting
        );
        assert_eq!(
            store.signal_wait(&wait(&d, "signal:x", "t")).await.unwrap(),
            SignalWaitOutcome::Waiting
        );
        assert_eq!(
            store.signal_send("t", &json!("three")).await.unwrap(),
            SignalSendOutcome::Delivered { to: d }
        );
        let missing = InstanceKey::parse("wf", "missing").unwrap();
        assert!(store
            .signal_wait(&wait(&missing, "signal:x", "t"))
            .await
            .unwrap_err()
            .is_not_found());
    }

    #[tokio::test]
    async fn a_registered_wait_takes_a_signal_buffered_beside_it() {
        // The state a send whose snapshot predated the waiter leaves on PostgreSQL (a waiter
        // with a signal buffered beside it), made by hand: the re-driven wait takes it.
        let store = store();
        let a = start(&store, "a").await;
        assert_eq!(
            store.signal_wait(&wait(&a, "signal:x", "t")).await.unwrap(),
            SignalWaitOutcome::Waiting
        );
        store
            .transact("buffering beside a waiter", |state| {
                state
                    .sources
                    .buffer_push("t", json!(1), T0 + Span::hours(1))
            })
            .unwrap();
        assert_eq!(
            store.signal_wait(&wait(&a, "signal:x", "t")).await.unwrap(),
            SignalWaitOutcome::Delivered(json!({"ok": 1})),
            "the re-driven wait must consult the buffer"
        );
        store.inspect(|state| {
            assert!(state.sources.buffered.is_empty());
            assert!(state.sources.waiters.is_empty());
            assert!(state.sources.queues.is_empty());
        });
        assert_eq!(
            store.signal_send("t", &json!(2)).await.unwrap(),
            SignalSendOutcome::Buffered
        );
    }

    #[tokio::test]
    async fn a_send_goes_to_the_oldest_live_waiter_and_wakes_it() {
        let store = store();
        let gone = start(&store, "gone").await;
        let live = start(&store, "live").await;
        let last = start(&store, "last").await;
        for key in [&gone, &live, &last] {
            assert_eq!(
                store
                    .signal_wait(&wait(key, "signal:x", "t"))
                    .await
                    .unwrap(),
                SignalWaitOutcome::Waiting
            );
        }
        park(&store, &live, "signal:x").await;
        store.instance_cancel(&gone, false).await.unwrap();
        let mut notifications = store.notifications();

        assert_eq!(
            store.signal_send("t", &json!(7)).await.unwrap(),
            SignalSendOutcome::Delivered { to: live.clone() }
        );
        assert_eq!(
            journal(&store, &live).await,
            [("signal:x".into(), json!({"ok": 7}))]
        );
        assert_eq!(status(&store, &live).await, Status::Running);
        assert_eq!(
            notifications.try_recv().unwrap(),
            Notification::Instance(live)
        );
        assert_eq!(journal(&store, &gone).await.len(), 1);
        // The refused waiter was dropped, not kept for the next signal.
        assert_eq!(
            store.signal_send("t", &json!(8)).await.unwrap(),
            SignalSendOutcome::Delivered { to: last }
        );
        assert_eq!(
            store.signal_send("t", &json!(9)).await.unwrap(),
            SignalSendOutcome::Buffered
        );
        assert_eq!(
            store.signal_send("other", &json!(9)).await.unwrap(),
            SignalSendOutcome::Buffered
        );
    }

    #[tokio::test]
    async fn a_signal_timeout_fires_only_while_the_wait_is_pending() {
        let store = store();
        let timed_out = start(&store, "timed-out").await;
        let answered = start(&store, "answered").await;
        for key in [&timed_out, &answered] {
            store
                .signal_wait(&wait(key, "signal:x", "t"))
                .await
                .unwrap();
            let timeout = TimerArm {
                kind: TimerKind::SignalTimeout { token: "t".into() },
                ..sleep(key, "signal:x", 1)
            };
            store.timer_arm(&timeout).await.unwrap();
        }
        // Both are due together and fire in key order, so `answered` times out while the
        // older waiter, `timed_out`, is still there to take the next send.
        store.set_now(Some(T0 + Span::minutes(1)));
        let first = store.timers_fire_due(None, 1).await.unwrap();
        assert_eq!(first.fired[0].key, answered);
        assert!(first.fired[0].delivered);
        assert_eq!(
            journal(&store, &answered).await,
            [("signal:x".into(), json!({"timeout": true}))]
        );
        assert_eq!(
            store.signal_send("t", &json!("late")).await.unwrap(),
            SignalSendOutcome::Delivered {
                to: timed_out.clone()
            }
        );
        let second = store.timers_fire_due(None, 1).await.unwrap();
        assert_eq!(second.fired[0].key, timed_out);
        assert!(!second.fired[0].delivered);
        assert_eq!(
            journal(&store, &timed_out).await,
            [("signal:x".into(), json!({"ok": "late"}))]
        );
        // With the waiter gone, the next signal is buffered rather than lost.
        assert_eq!(
            store.signal_send("t", &json!("next")).await.unwrap(),
            SignalSendOutcome::Buffered
        );
    }

    #[tokio::test]
    async fn awakeables_settle_once_and_never_journal_into_a_terminal_owner() {
        let store = store();
        let owner = start(&store, "owner").await;
        let id = Uuid::from_u128(1);
        let allocate = |step: &str, id: Uuid| {
            Append::external(
                owner.clone(),
                Event::StepRecorded {
                    step: step.to_owned(),
                    kind: StepKind::Awakeable,
                    result: json!(id.to_string()),
                },
            )
        };
        assert_eq!(
            store
                .awakeable_create(&allocate("awkid:a", id), id)
                .await
                .unwrap(),
            AppendOutcome::Appended
        );
        let replayed = Uuid::from_u128(2);
        assert_eq!(
            store
                .awakeable_create(&allocate("awkid:a", replayed), replayed)
                .await
                .unwrap(),
            AppendOutcome::AlreadyPresent(json!(id.to_string()))
        );
        assert_eq!(
            store.awakeable_complete(replayed, &json!(1)).await.unwrap(),
            AwakeableOutcome::NotFound
        );
        // An id registered twice is refused before the second allocation step is journaled.
        assert!(store
            .awakeable_create(&allocate("awkid:b", id), id)
            .await
            .is_err());
        assert_eq!(store.awakeables_pending().await.unwrap(), 1);

        park(&store, &owner, &awakeable_step(id)).await;
        assert_eq!(
            store.awakeable_complete(id, &json!("paid")).await.unwrap(),
            AwakeableOutcome::Delivered
        );
        assert_eq!(status(&store, &owner).await, Status::Running);
        assert_eq!(
            store.awakeable_complete(id, &json!("again")).await.unwrap(),
            AwakeableOutcome::AlreadySettled(AwakeableStatus::Completed)
        );
        assert_eq!(
            store.awakeable_cancel(id).await.unwrap(),
            AwakeableOutcome::AlreadySettled(AwakeableStatus::Completed)
        );

        let orphaned = Uuid::from_u128(3);
        store
            .awakeable_create(&allocate("awkid:c", orphaned), orphaned)
            .await
            .unwrap();
        store.instance_cancel(&owner, false).await.unwrap();
        let before = journal(&store, &owner).await;
        // The cancel settled it: nothing will await it any more.
        assert_eq!(
            store.awakeable_cancel(orphaned).await.unwrap(),
            AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
        );
        assert_eq!(journal(&store, &owner).await, before);
        assert_eq!(
            store.awakeable_complete(orphaned, &json!(1)).await.unwrap(),
            AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
        );
        assert_eq!(store.awakeables_pending().await.unwrap(), 0);
        assert_eq!(
            before,
            [
                ("awkid:a".to_owned(), json!(id.to_string())),
                (awakeable_step(id), json!({"ok": "paid"})),
                ("awkid:c".to_owned(), json!(orphaned.to_string())),
                (Marker::Cancelled.step_name().to_owned(), Value::Null),
            ]
        );
    }

    #[tokio::test]
    async fn every_terminal_path_of_a_child_journals_its_envelope_into_the_parent() {
        let store = store();
        let parent = start(&store, "parent").await;
        let mut notifications = store.notifications();
        let (done, done_step, outcome) = spawn(&store, &parent, "done").await;
        assert_eq!(outcome, AppendOutcome::Appended);
        assert_eq!(
            notifications.try_recv().unwrap(),
            Notification::Instance(done.clone())
        );
        let row = store.instance_get(&done).await.unwrap().unwrap();
        assert_eq!(
            (
                row.status,
                row.generation,
                row.input,
                row.parent,
                row.priority
            ),
            (
                Status::Running,
                0,
                json!({"from": "parent"}),
                Some(parent.clone()),
                0
            )
        );
        // A replayed spawn creates nothing and moves nothing.
        assert!(matches!(
            spawn(&store, &parent, "done").await.2,
            AppendOutcome::AlreadyPresent(_)
        ));
        assert!(notifications.try_recv().is_err());

        let (crashed, crashed_step, _) = spawn(&store, &parent, "crashed").await;
        let (diverged, diverged_step, _) = spawn(&store, &parent, "diverged").await;
        let (cancelled, cancelled_step, _) = spawn(&store, &parent, "cancelled").await;
        let (rotated, _, _) = spawn(&store, &parent, "rotated").await;
        park(&store, &parent, &done_step).await;

        let completed = Event::WorkflowCompleted { output: json!(42) };
        append(&store, &done, None, completed, None).await.unwrap();
        assert_eq!(status(&store, &parent).await, Status::Running);
        let fence = claim(&store, &crashed, "w").await;
        let crash = Crash {
            error: "boom".into(),
            retry_delay: TTL,
            max_attempts: 1,
        };
        assert_eq!(
            store
                .instance_record_crash(&crashed, &fence, &crash)
                .await
                .unwrap(),
            CrashOutcome::Failed { attempts: 1 }
        );
        store
            .instance_fail_diverged(&diverged, None, "code changed")
            .await
            .unwrap();
        store.instance_cancel(&cancelled, false).await.unwrap();
        let rotate = Event::WorkflowContinuedAsNew {
            next_generation: 1,
            input: json!(null),
        };
        append(&store, &rotated, None, rotate, None).await.unwrap();

        let results: Vec<_> = journal(&store, &parent)
            .await
            .into_iter()
            .filter(|(step, _)| step.ends_with(":result"))
            .collect();
        assert_eq!(
            results,
            [
                (done_step, json!({"ok": 42})),
                (crashed_step, json!({"failed": "boom"})),
                (diverged_step, json!({"failed": "code changed"})),
                (cancelled_step, json!({"cancelled": true})),
            ]
        );
        let kinds = store.journal_history(&parent).await.unwrap();
        assert!(kinds.iter().all(|entry| matches!(
            entry.event,
            Event::StepRecorded {
                kind: StepKind::Child,
                ..
            }
        )));
    }

    #[tokio::test]
    async fn a_spawn_adopts_an_existing_instance_and_a_closed_parent_refuses_quietly() {
        let store = store();
        let parent = start(&store, "parent").await;
        let orphan = InstanceKey::parse("child", "orphan").unwrap();
        let request = keiro_journal::store::StartRequest {
            key: orphan.clone(),
            input: json!("own input"),
            parent: None,
            priority: 3,
        };
        store.instance_start(&request).await.unwrap();
        append(
            &store,
            &orphan,
            None,
            Event::WorkflowCompleted {
                output: json!("early"),
            },
            None,
        )
        .await
        .unwrap();
        let (_, await_step, _) = spawn(&store, &parent, "orphan").await;
        let row = store.instance_get(&orphan).await.unwrap().unwrap();
        assert_eq!(
            (row.input, row.priority, row.parent),
            (json!("own input"), 3, Some(parent.clone()))
        );
        assert!(journal(&store, &parent)
            .await
            .contains(&(await_step, json!({"ok": "early"}))));

        let (late, _, _) = spawn(&store, &parent, "late").await;
        store.instance_cancel(&parent, false).await.unwrap();
        let before = journal(&store, &parent).await;
        let completed = Event::WorkflowCompleted { output: json!(1) };
        assert_eq!(
            append(&store, &late, None, completed, None).await.unwrap(),
            AppendOutcome::Appended
        );
        assert_eq!(journal(&store, &parent).await, before);
        assert_eq!(
            store.instance_cancel(&parent, true).await.unwrap(),
            AppendOutcome::AlreadyPresent(Value::Null)
        );
    }

    #[tokio::test]
    async fn a_cascading_cancel_reaches_every_live_descendant_only() {
        let store = store();
        let root = start(&store, "root").await;
        let (child, child_step, _) = spawn(&store, &root, "child").await;
        let (grandchild, _, _) = spawn(&store, &child, "grandchild").await;
        let (finished, _, _) = spawn(&store, &root, "finished").await;
        let (spared, _, _) = spawn(&store, &root, "spared").await;
        let completed = Event::WorkflowCompleted { output: json!(1) };
        append(&store, &finished, None, completed, None)
            .await
            .unwrap();

        assert_eq!(
            store.instance_cancel(&child, false).await.unwrap(),
            AppendOutcome::Appended
        );
        assert_eq!(status(&store, &grandchild).await, Status::Running);
        assert!(journal(&store, &root)
            .await
            .contains(&(child_step, json!({"cancelled": true}))));

        let before = journal(&store, &root).await;
        assert_eq!(
            store.instance_cancel(&root, true).await.unwrap(),
            AppendOutcome::Appended
        );
        assert_eq!(status(&store, &spared).await, Status::Cancelled);
        assert_eq!(status(&store, &finished).await, Status::Completed);
        // The child was already closed, so its own child was not reached through it.
        assert_eq!(status(&store, &grandchild).await, Status::Running);
        // The descendants' deliveries land on a cancelled parent and are refused.
        let after = journal(&store, &root).await;
        assert_eq!(after.len(), before.len() + 1);
        assert_eq!(
            after.last().map(|(step, _)| step.as_str()),
            Some(Marker::Cancelled.step_name())
        );

        let top = start(&store, "top").await;
        let (middle, _, _) = spawn(&store, &top, "middle").await;
        let (bottom, _, _) = spawn(&store, &middle, "bottom").await;
        store.instance_cancel(&top, true).await.unwrap();
        assert_eq!(status(&store, &middle).await, Status::Cancelled);
        assert_eq!(status(&store, &bottom).await, Status::Cancelled);

        let missing = InstanceKey::parse("wf", "missing").unwrap();
        assert!(store
            .instance_cancel(&missing, true)
            .await
            .unwrap_err()
            .is_not_found());
    }
}
