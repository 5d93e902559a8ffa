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

/// A signal buffered beside a registered waiter, a state only made by hand here. The signal,
/// timer, awakeable and child rules are the store contract suite's (`keiro_tests::contract`).
#[cfg(test)]
mod tests {
    use keiro_journal::{
        store::SignalWait, store::SignalWaitOutcome, JournalStore, SignalSendOutcome,
    };
    use serde_json::json;
    use time::Duration as Span;

    use crate::fixtures::{start, store, T0};

    fn wait(key: &keiro_journal::InstanceKey, step: &str, token: &str) -> SignalWait {
        SignalWait {
            key: key.clone(),
            generation: 0,
            step: step.to_owned(),
            token: token.to_owned(),
            fence: None,
        }
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
}
