//! The journal's rules in memory (`crates/migrations/functions/journal.sql`): starting instances, appending
//! events, confirming, parking and failing diverged runs, each one function over [`State`].
//! [`impls`] implements `JournalStore` for `MemoryStore` over them.
//!
//! An append decides in a fixed order, each step returning before anything is written: a
//! missing instance, a writer on another generation, a step that is already recorded, a
//! terminal row, a stale fence; only then is the row journaled and the instance row moved.
//! The order is the contract: a recorded step answers `AlreadyPresent` even on a closed
//! instance, and a closed instance answers `RefusedTerminal` even to a stale holder.
//!
//! Deciding and writing are separate functions ([`Plan`], then the write of its [`Slot`]), so
//! an operation that pairs an append with writes of its own (registering an awakeable,
//! creating a child) can refuse those before the journal is touched, and every wake source
//! journals through exactly these rules.

use std::time::Duration;

use keiro_journal::store::encoded_len;
use keiro_journal::store::{Append, AppendOutcome, DeliveryOutcome, Park, ParkOutcome, Result};
use keiro_journal::{
    store::StartRequest, Deliveries, DeliveryBacklog, Event, Fence, Generation, Instance,
    InstanceKey, JournalEntry, Marker, Started, Status, StepKind, StoreError,
};
use serde_json::Value;

mod impls;

use crate::clock::later;
use crate::state::{
    clear_lease, closing_marker, holds, lease_lost, refused, reset_attempts, Entry, JournalRow,
};
use crate::State;

const APPEND: &str = "appending to the journal";
const DELIVER: &str = "journaling a delivery";
/// The journal names of deliveries start with it (`keiro_journal`'s `await_step_name`).
const AWAIT_PREFIX: &str = "await:";

/// Where an append that passed every check writes: the generation it went to and the name
/// its row is stored under.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) generation: Generation,
    step_name: String,
}

/// What an append will do, decided before anything is written, so an operation that pairs an
/// append with writes of its own can refuse those before the journal is touched.
#[derive(Debug)]
pub(crate) enum Plan {
    /// Nothing is written; this is the outcome.
    Decided(AppendOutcome),
    /// The append lands in this slot.
    Write(Slot),
}

impl State {
    pub(crate) fn instance_start(&mut self, request: &StartRequest) -> Started {
        if let Some(entry) = self.instances.get(&request.key) {
            return Started {
                instance: entry.row.clone(),
                created: false,
            };
        }
        let row = self.instance_create(
            &request.key,
            request.input.clone(),
            request.parent.clone(),
            request.priority,
        );
        Started {
            instance: row,
            created: true,
        }
    }

    /// Inserts a fresh `running` row at generation 0 and notifies it, as a start does. The
    /// caller has checked that `key` is free.
    pub(crate) fn instance_create(
        &mut self,
        key: &InstanceKey,
        input: Value,
        parent: Option<InstanceKey>,
        priority: i32,
    ) -> Instance {
        let row = self.instance_insert(key, input, parent, priority);
        self.wake(key);
        row
    }

    /// Inserts a fresh `running` row at generation 0 without notifying anyone. The caller has
    /// checked that `key` is free.
    pub(crate) fn instance_insert(
        &mut self,
        key: &InstanceKey,
        input: Value,
        parent: Option<InstanceKey>,
        priority: i32,
    ) -> Instance {
        let now = self.clock.now();
        let row = Instance {
            key: key.clone(),
            generation: 0,
            status: Status::Running,
            input,
            output: None,
            attempts: 0,
            last_error: None,
            next_attempt_at: None,
            lease_owner: None,
            lease_epoch: 0,
            lease_expires_at: None,
            wake_after: None,
            parent,
            priority,
            created_at: now,
            updated_at: now,
            completed_at: None,
        };
        if let Some(parent) = &row.parent {
            self.adopt(parent, key);
        }
        self.instances.insert(key.clone(), Entry::new(row.clone()));
        row
    }

    /// Applies every rule of `journal_append`: decides, then writes when the decision is to.
    /// Wake sources journal through here too, so their appends follow exactly the same rules.
    pub(crate) fn append(&mut self, append: &Append) -> Result<AppendOutcome> {
        match self.append_plan(append)? {
            Plan::Decided(outcome) => Ok(outcome),
            Plan::Write(slot) => {
                self.append_write(append, slot)?;
                Ok(AppendOutcome::Appended)
            }
        }
    }

    /// `delivery_append` (crates/migrations/functions/journal.sql `keiro_delivery_append`): a delivery goes
    /// through the append rules, but a new row of the current generation that would take its
    /// unread deliveries past `backlog` is refused, unless the run is parked on its step.
    pub(crate) fn delivery_append(
        &mut self,
        append: &Append,
        backlog: &DeliveryBacklog,
    ) -> Result<DeliveryOutcome> {
        let len = match &append.event {
            Event::StepRecorded {
                kind: StepKind::Await,
                result,
                ..
            } if append.fence.is_none() => encoded_len(result),
            _ => return Err(refused(DELIVER, "a delivery is an unfenced await record")),
        };
        let slot = match self.append_plan(append)? {
            Plan::Decided(outcome) => return Ok(DeliveryOutcome::Append(outcome)),
            Plan::Write(slot) => slot,
        };
        let entry = self.entry_mut(&append.key)?;
        let generation = entry.row.generation;
        let unread = entry.deliveries.unread(generation);
        let answers_the_park = entry.deliveries.parked_on.contains(&slot.step_name);
        if !backlog.admits(unread, len) && !answers_the_park {
            return Ok(DeliveryOutcome::Backlog(unread));
        }
        let book = &mut entry.deliveries;
        if book.generation != Some(generation) {
            // The counters start over on a new generation (`parked_on` is the park's).
            book.generation = Some(generation);
            book.delivered = Deliveries::default();
            book.read = Deliveries::default();
        }
        book.delivered.count += 1;
        book.delivered.bytes += len;
        self.append_write(append, slot)?;
        Ok(DeliveryOutcome::Append(AppendOutcome::Appended))
    }

    /// `deliveries_read`: the run's awaits have read `read` deliveries of `generation` in all.
    fn deliveries_read(
        &mut self,
        key: &InstanceKey,
        generation: Generation,
        read: Deliveries,
    ) -> Result<()> {
        let entry = self.entry_mut(key)?;
        let book = &mut entry.deliveries;
        if entry.row.generation == generation && book.generation == Some(generation) {
            book.read.count = book.read.count.max(read.count);
            book.read.bytes = book.read.bytes.max(read.bytes);
        }
        Ok(())
    }

    /// The checks of an append, in their contractual order, without writing anything.
    pub(crate) fn append_plan(&self, append: &Append) -> Result<Plan> {
        let marker = append.event.marker();
        if marker.is_none() && !matches!(append.event, Event::StepRecorded { .. }) {
            // `Resurrected` carries an instance-row change of its own; letting it in here
            // would journal a resurrection without performing it.
            return Err(refused(
                APPEND,
                "only steps and lifecycle markers go through journal_append",
            ));
        }
        let entry = self
            .instances
            .get(&append.key)
            .ok_or_else(|| StoreError::NotFound {
                key: append.key.clone(),
            })?;
        let step_name = append.event.step_name();
        let step_name: &str = &step_name;
        let generation = append.generation.unwrap_or(entry.row.generation);

        if generation != entry.row.generation {
            // A writer on another generation only ever learns what is there; a retried
            // continue-as-new finds its own marker and converges.
            return Ok(Plan::Decided(match entry.step(generation, step_name) {
                Some(stored) => AppendOutcome::AlreadyPresent(stored.payload.clone()),
                None => AppendOutcome::Conflict,
            }));
        }
        if let Event::StepRecorded { kind, .. } = &append.event {
            // Before the terminal check, so retrying a recorded step stays idempotent after
            // the instance closed.
            if let Some(stored) = entry.step(generation, step_name) {
                return Ok(Plan::Decided(if stored.kind == kind.as_str() {
                    AppendOutcome::AlreadyPresent(stored.payload.clone())
                } else {
                    AppendOutcome::Conflict
                }));
            }
        }
        if let Some(closing) = closing_marker(entry.row.status) {
            return Ok(Plan::Decided(match marker {
                Some(marker) if marker == closing => {
                    AppendOutcome::AlreadyPresent(recorded_value(&entry.row, closing))
                }
                _ => AppendOutcome::RefusedTerminal(closing),
            }));
        }
        if let Some(fence) = &append.fence {
            if !holds(&entry.row, fence) {
                return Err(lease_lost(&append.key, fence));
            }
        }

        let step_name = match marker {
            // A failure may recur after a resurrection; its rows stay unique by numbering.
            Some(Marker::Failed) => entry.repeatable_name(generation, step_name),
            _ => step_name.to_owned(),
        };
        if entry.step(generation, &step_name).is_some() {
            // Only a once-per-generation marker can get here (a continue-as-new that named its
            // own generation as the next one); Postgres would hit the unique index.
            return Ok(Plan::Decided(AppendOutcome::Conflict));
        }
        Ok(Plan::Write(Slot {
            generation,
            step_name,
        }))
    }

    /// Writes an append that [`append_plan`](Self::append_plan) cleared: the journal row, the
    /// instance row's move, the wake, and the result delivery of a child that went terminal.
    pub(crate) fn append_write(&mut self, append: &Append, slot: Slot) -> Result<()> {
        let now = self.clock.now();
        let encoded = append.event.encode();
        let seq = self.seq.next()?;
        let generation = slot.generation;
        let entry = self.entry_mut(&append.key)?;
        entry.push(JournalRow {
            seq,
            generation,
            step_name: slot.step_name,
            kind: encoded.kind,
            payload: encoded.payload,
            recorded_at: now,
        })?;

        let row = &mut entry.row;
        row.updated_at = now;
        let mut wake = false;
        let mut closed = false;
        match &append.event {
            Event::WorkflowCompleted { output } => {
                row.status = Status::Completed;
                row.output = Some(output.clone());
                row.completed_at = Some(now);
                clear_lease(row);
                reset_attempts(row);
                row.wake_after = None;
                closed = true;
            }
            Event::WorkflowFailed { reason } => {
                row.status = Status::Failed;
                row.last_error = Some(reason.clone());
                row.completed_at = Some(now);
                clear_lease(row);
                row.wake_after = None;
                closed = true;
            }
            Event::WorkflowCancelled => {
                row.status = Status::Cancelled;
                row.completed_at = Some(now);
                clear_lease(row);
                row.wake_after = None;
                closed = true;
            }
            Event::WorkflowContinuedAsNew {
                next_generation,
                input,
            } => {
                row.generation = *next_generation;
                row.input = input.clone();
                row.status = Status::Running;
                clear_lease(row);
                reset_attempts(row);
                row.wake_after = None;
                row.output = None;
                wake = true;
                // The new generation's run has parked on nothing yet.
                entry.deliveries.parked_on.clear();
            }
            // Only steps remain: everything else was turned away by the plan.
            _ => {
                wake = row.status == Status::Suspended;
                row.status = Status::Running;
                if let (Some(_), Some(renew)) = (&append.fence, append.renew) {
                    row.lease_expires_at = Some(later(now, renew));
                }
            }
        }
        if matches!(
            append.event,
            Event::WorkflowCancelled | Event::WorkflowContinuedAsNew { .. }
        ) {
            // Nothing of this generation will await its remote steps any more.
            self.remote_tasks_cancel(&append.key, generation);
            // Nor its awakeables (Postgres: 0012's trigger on the marker's row).
            self.awakeables_cancel(&append.key, generation);
        }
        if wake {
            self.wake(&append.key);
        }
        if closed {
            self.close(&append.key);
            self.deliver_to_parent(&append.key)?;
        }
        Ok(())
    }

    fn instance_confirm(
        &mut self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<Status> {
        let now = self.clock.now();
        let row = &mut self.entry_mut(key)?.row;
        if row.status.is_terminal() {
            // The run must learn it is over even if its lease went with the terminal write.
            return Ok(row.status);
        }
        if !holds(row, fence) {
            return Err(lease_lost(key, fence));
        }
        row.lease_expires_at = Some(later(now, ttl));
        row.updated_at = now;
        Ok(row.status)
    }

    /// Refuses a park whose fence is stale before anything is written for it: a
    /// park-and-dispatch arms its tasks before it parks, and the memory store has no rollback,
    /// so a refused park would otherwise leave its tasks behind. A terminal run is answered by
    /// the park itself.
    fn park_fence_check(&mut self, park: &Park) -> Result<()> {
        let row = &self.entry_mut(&park.key)?.row;
        match &park.fence {
            Some(fence) if !row.status.is_terminal() && !holds(row, fence) => {
                Err(lease_lost(&park.key, fence))
            }
            _ => Ok(()),
        }
    }

    fn instance_park(&mut self, park: &Park) -> Result<ParkOutcome> {
        let now = self.clock.now();
        let entry = self.entry_mut(&park.key)?;
        if entry.row.status.is_terminal() {
            return Ok(ParkOutcome::Terminal(entry.row.status));
        }
        if let Some(fence) = &park.fence {
            if !holds(&entry.row, fence) {
                return Err(lease_lost(&park.key, fence));
            }
        }
        // Decided under the same lock as the wake's append, so a wake that landed first is
        // seen here and never masked by a `suspended` written after it.
        let woken = park.generation != entry.row.generation
            || park
                .awaited
                .iter()
                .any(|step| entry.step(park.generation, step).is_some());
        if park.generation == entry.row.generation {
            // What a delivery past the bound may still answer (`delivery_append`), woken or
            // not: deliveries the run does not read wake it too.
            entry.deliveries.parked_on = park
                .awaited
                .iter()
                .filter(|step| step.starts_with(AWAIT_PREFIX))
                .cloned()
                .collect();
        }
        let row = &mut entry.row;
        clear_lease(row);
        reset_attempts(row);
        row.updated_at = now;
        // A woken park leaves the status alone: whatever woke it already made the row
        // `running`, and a stale generation's park has no say over the current one's status.
        if woken {
            self.wake(&park.key);
            return Ok(ParkOutcome::WokenBeforePark);
        }
        row.status = Status::Suspended;
        row.wake_after = park.wake_after;
        Ok(ParkOutcome::Suspended)
    }

    fn instance_fail_diverged(
        &mut self,
        key: &InstanceKey,
        fence: Option<&Fence>,
        reason: &str,
    ) -> Result<bool> {
        let now = self.clock.now();
        let row = &mut self.entry_mut(key)?.row;
        if row.status.is_terminal() {
            return Ok(false);
        }
        if let Some(fence) = fence {
            if !holds(row, fence) {
                return Err(lease_lost(key, fence));
            }
        }
        row.status = Status::Failed;
        row.last_error = Some(reason.to_owned());
        row.completed_at = Some(now);
        clear_lease(row);
        row.updated_at = now;
        self.close(key);
        self.deliver_to_parent(key)?;
        Ok(true)
    }

    fn journal_load(&self, key: &InstanceKey, generation: Generation) -> Result<Vec<JournalEntry>> {
        self.instances.get(key).map_or(Ok(Vec::new()), |entry| {
            entry.load(generation, "loading a journal generation")
        })
    }

    fn journal_history(&self, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
        self.instances.get(key).map_or(Ok(Vec::new()), |entry| {
            entry.history("loading a journal's history")
        })
    }
}

/// The value a repeated closing marker converges on, read from the row because a failure
/// recorded by divergence has no journal row to read it from.
fn recorded_value(row: &Instance, closing: Marker) -> Value {
    match closing {
        Marker::Completed => row.output.clone().unwrap_or(Value::Null),
        Marker::Failed => row.last_error.clone().map_or(Value::Null, Value::String),
        Marker::Cancelled | Marker::ContinuedAsNew => Value::Null,
    }
}

/// How the state stores repeated markers. What an append answers is the store contract
/// suite's (`keiro_tests::contract::journal`).
#[cfg(test)]
mod tests {
    use keiro_journal::store::marker_name;
    use keiro_journal::JournalStore;
    use keiro_lease::LeaseStore;

    use super::*;
    use crate::fixtures::{append, start, store};

    #[tokio::test]
    async fn a_failure_after_resurrection_gets_a_numbered_row() {
        let store = store();
        let key = start(&store, "a").await;
        let fail = |reason: &str| Event::WorkflowFailed {
            reason: reason.into(),
        };
        append(&store, &key, None, fail("one"), None).await.unwrap();
        store.instance_resurrect(&key).await.unwrap();
        assert_eq!(
            append(&store, &key, None, fail("two"), None).await.unwrap(),
            AppendOutcome::Appended
        );
        let names = store.inspect(|state| {
            let entry = &state.instances[&key];
            [
                entry.step(0, marker_name::FAILED).is_some(),
                entry
                    .step(0, &format!("{}/2", marker_name::FAILED))
                    .is_some(),
            ]
        });
        assert_eq!(names, [true, true]);
        let events: Vec<_> = store
            .journal_history(&key)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.event)
            .collect();
        assert_eq!(events, [fail("one"), Event::Resurrected, fail("two")]);
    }
}
