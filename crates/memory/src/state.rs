//! The instance rows and their journals (the rows [`State`] holds), the journal sequence, the
//! notifications an operation raises, and the small rules every operation shares.

use std::collections::HashMap;

use keiro_journal::store::{Error, Result};
use keiro_journal::{
    Deliveries, Event, Fence, Generation, Instance, InstanceKey, JournalEntry, Marker, Status,
};
use serde_json::Value;
use time::OffsetDateTime;

use crate::notify::Notification;
use crate::State;

impl State {
    /// The entry of `key`, or [`Error::NotFound`].
    pub(crate) fn entry_mut(&mut self, key: &InstanceKey) -> Result<&mut Entry> {
        self.instances
            .get_mut(key)
            .ok_or_else(|| Error::NotFound { key: key.clone() })
    }

    /// Queues a wake notification for `key`.
    pub(crate) fn wake(&mut self, key: &InstanceKey) {
        self.notifications.push(Notification::Instance(key.clone()));
    }

    /// Queues the wake-up of `key`'s result waiters: it reached a terminal status.
    pub(crate) fn close(&mut self, key: &InstanceKey) {
        self.closed.push(key.clone());
    }

    /// The instances closed since the last call.
    pub(crate) fn take_closed(&mut self) -> Vec<InstanceKey> {
        std::mem::take(&mut self.closed)
    }

    /// Queues a "timer armed" notification.
    pub(crate) fn timer_armed(&mut self) {
        self.notifications.push(Notification::TimerArmed);
    }

    /// Queues a "remote task claimable" notification, once per operation: Postgres folds
    /// identical NOTIFY payloads of one transaction into one as well.
    pub(crate) fn remote_tasks_ready(&mut self) {
        if !self.notifications.contains(&Notification::RemoteTasks) {
            self.notifications.push(Notification::RemoteTasks);
        }
    }

    /// Stores `event` under `step_name` in `generation` of `key` as it is, without the rules
    /// of an append and without touching the instance row: for the events an operation
    /// writes beside a row change of its own (a resurrection, a step reset).
    pub(crate) fn record(
        &mut self,
        key: &InstanceKey,
        generation: Generation,
        step_name: String,
        event: &Event,
    ) -> Result<()> {
        let now = self.clock.now();
        let encoded = event.encode();
        let seq = self.seq.next()?;
        self.entry_mut(key)?.push(JournalRow {
            seq,
            generation,
            step_name,
            kind: encoded.kind,
            payload: encoded.payload,
            recorded_at: now,
        })
    }

    /// The notifications queued since the last call.
    pub(crate) fn take_notifications(&mut self) -> Vec<Notification> {
        std::mem::take(&mut self.notifications)
    }

    /// Records that `child`'s row names `parent`.
    pub(crate) fn adopt(&mut self, parent: &InstanceKey, child: &InstanceKey) {
        self.children
            .entry(parent.clone())
            .or_default()
            .insert(child.clone());
    }
}

/// The global journal sequence, like the `seq` identity column: starts at 1, never reused.
#[derive(Debug, Default)]
pub(crate) struct Sequence {
    last: i64,
}

impl Sequence {
    /// The next sequence number.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] once `i64` is exhausted, as a `bigint` identity would fail.
    pub(crate) fn next(&mut self) -> Result<i64> {
        let next = self.last.checked_add(1).ok_or_else(|| {
            refused(
                "appending to the journal",
                "the journal sequence is exhausted",
            )
        })?;
        self.last = next;
        Ok(next)
    }
}

/// One stored journal row, kept exactly as [`Event::encode`] produced it (apart from the
/// unique names of repeatable markers) so loads go through [`Event::decode`] as in Postgres.
#[derive(Debug, Clone)]
pub(crate) struct JournalRow {
    pub(crate) seq: i64,
    pub(crate) generation: Generation,
    pub(crate) step_name: String,
    pub(crate) kind: &'static str,
    pub(crate) payload: Value,
    pub(crate) recorded_at: OffsetDateTime,
}

impl JournalRow {
    fn decode(&self, operation: &'static str) -> Result<JournalEntry> {
        let event =
            Event::decode(&self.step_name, self.kind, self.payload.clone()).map_err(|e| {
                Error::Malformed {
                    operation,
                    detail: e.to_string(),
                }
            })?;
        Ok(JournalEntry {
            seq: self.seq,
            generation: self.generation,
            event,
            recorded_at: self.recorded_at,
        })
    }
}

/// Where a child's result envelope is journaled: the parent's spawning generation and the
/// step it awaits (the `parent_generation` and `parent_step` columns; the parent's key is the
/// row's `parent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParentLink {
    pub(crate) generation: Generation,
    pub(crate) step: String,
}

/// An instance row and its journal.
///
/// The journal lives with its instance rather than in one global list because every read is
/// per instance (the Postgres unique index serves those reads as a prefix scan the same way).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The instance row.
    pub(crate) row: Instance,
    /// Set for a spawned child: where its terminal transaction journals its result. The
    /// `Instance` snapshot has no field for it, so it lives beside the row.
    pub(crate) link: Option<ParentLink>,
    /// Every generation's rows, in `seq` order because rows are only ever pushed.
    journal: Vec<JournalRow>,
    /// `(generation, step_name) -> position in journal`: the unique index, for O(1) lookups.
    steps: HashMap<Generation, HashMap<String, usize>>,
    /// The deliveries' bound's bookkeeping (the `workflows` columns of migration 0019).
    pub(crate) deliveries: DeliveryBook,
}

/// What the bound on unread deliveries knows of an instance (journal.rs `delivery_append`).
#[derive(Debug, Clone, Default)]
pub(crate) struct DeliveryBook {
    /// The generation `delivered` and `read` count in; on any other they count as empty.
    pub(crate) generation: Option<Generation>,
    /// The deliveries journaled into that generation by `delivery_append`.
    pub(crate) delivered: Deliveries,
    /// Of them, what the run reported its awaits read.
    pub(crate) read: Deliveries,
    /// The `await:` steps the park that suspended the run waits on.
    pub(crate) parked_on: Vec<String>,
}

impl DeliveryBook {
    /// The deliveries of `generation` no await has read.
    pub(crate) fn unread(&self, generation: Generation) -> Deliveries {
        if self.generation == Some(generation) {
            self.delivered.less(self.read)
        } else {
            Deliveries::default()
        }
    }
}

impl Entry {
    /// A fresh instance with an empty journal.
    pub(crate) fn new(row: Instance) -> Self {
        Self {
            row,
            link: None,
            journal: Vec::new(),
            steps: HashMap::new(),
            deliveries: DeliveryBook::default(),
        }
    }

    /// How many journal rows it has, every generation (retention counts what it deletes).
    pub(crate) fn journal_len(&self) -> usize {
        self.journal.len()
    }

    /// The row stored under `step_name` in `generation`.
    pub(crate) fn step(&self, generation: Generation, step_name: &str) -> Option<&JournalRow> {
        let position = *self.steps.get(&generation)?.get(step_name)?;
        self.journal.get(position)
    }

    /// Stores a row. The caller has checked that `step_name` is free in `generation`; a taken
    /// name is refused rather than overwritten, so the unique index can never be broken.
    pub(crate) fn push(&mut self, row: JournalRow) -> Result<()> {
        let names = self.steps.entry(row.generation).or_default();
        if names.contains_key(&row.step_name) {
            return Err(refused(
                "appending to the journal",
                "the step name is already taken in this generation",
            ));
        }
        names.insert(row.step_name.clone(), self.journal.len());
        self.journal.push(row);
        Ok(())
    }

    /// One generation's rows in append order.
    pub(crate) fn rows(&self, generation: Generation) -> impl Iterator<Item = &JournalRow> {
        self.journal
            .iter()
            .filter(move |row| row.generation == generation)
    }

    /// The name a repeatable marker (`failed`, `resurrected`) is stored under in `generation`:
    /// the bare name the first time, then `<name>/<n>` for the n-th occurrence.
    pub(crate) fn repeatable_name(&self, generation: Generation, base: &str) -> String {
        if self.step(generation, base).is_none() {
            return base.to_owned();
        }
        // Names are taken in order, so the first free suffix is the occurrence count + 1.
        (2u64..)
            .map(|n| format!("{base}/{n}"))
            .find(|name| self.step(generation, name).is_none())
            .expect("an unbounded range always has a name not among finitely many rows")
    }

    /// One generation's entries in append order.
    pub(crate) fn load(
        &self,
        generation: Generation,
        operation: &'static str,
    ) -> Result<Vec<JournalEntry>> {
        self.journal
            .iter()
            .filter(|row| row.generation == generation)
            .map(|row| row.decode(operation))
            .collect()
    }

    /// Every generation's entries in append order.
    pub(crate) fn history(&self, operation: &'static str) -> Result<Vec<JournalEntry>> {
        self.journal
            .iter()
            .map(|row| row.decode(operation))
            .collect()
    }
}

/// Whether `row` is leased to exactly `fence` (owner and epoch; expiry is not consulted, as in
/// the Postgres `WHERE` clauses: a lapsed lease nobody took over still fences correctly).
pub(crate) fn holds(row: &Instance, fence: &Fence) -> bool {
    row.lease_owner.as_deref() == Some(fence.owner.as_str()) && row.lease_epoch == fence.epoch
}

/// Drops the lease; the epoch stays so later claims keep counting up from it.
pub(crate) fn clear_lease(row: &mut Instance) {
    row.lease_owner = None;
    row.lease_expires_at = None;
}

/// Forgets the crash history: attempts, last error and backoff gate.
pub(crate) fn reset_attempts(row: &mut Instance) {
    row.attempts = 0;
    row.last_error = None;
    row.next_attempt_at = None;
}

/// The marker that closed a terminal status.
pub(crate) fn closing_marker(status: Status) -> Option<Marker> {
    match status {
        Status::Completed => Some(Marker::Completed),
        Status::Failed => Some(Marker::Failed),
        Status::Cancelled => Some(Marker::Cancelled),
        Status::Running | Status::Suspended => None,
    }
}

/// [`Error::LeaseLost`] for a writer holding `fence`.
pub(crate) fn lease_lost(key: &InstanceKey, fence: &Fence) -> Error {
    Error::LeaseLost {
        key: key.clone(),
        owner: fence.owner.clone(),
        epoch: fence.epoch,
    }
}

/// The store refusing a request it cannot carry out, as the database would with an exception.
pub(crate) fn refused(operation: &'static str, why: &str) -> Error {
    Error::Database {
        operation,
        retryable: false,
        source: why.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn instance() -> Instance {
        let now = OffsetDateTime::UNIX_EPOCH;
        Instance {
            key: InstanceKey::parse("wf", "one").unwrap(),
            generation: 0,
            status: Status::Running,
            input: Value::Null,
            output: None,
            attempts: 0,
            last_error: None,
            next_attempt_at: None,
            lease_owner: None,
            lease_epoch: 0,
            lease_expires_at: None,
            wake_after: None,
            parent: None,
            priority: 0,
            created_at: now,
            updated_at: now,
            completed_at: None,
        }
    }

    fn row(seq: i64, generation: Generation, step_name: &str) -> JournalRow {
        JournalRow {
            seq,
            generation,
            step_name: step_name.to_owned(),
            kind: "step",
            payload: json!(seq),
            recorded_at: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn the_index_is_unique_per_generation_and_loads_keep_append_order() {
        let mut entry = Entry::new(instance());
        entry.push(row(1, 0, "a")).unwrap();
        entry.push(row(2, 1, "a")).unwrap();
        entry.push(row(3, 0, "b")).unwrap();
        assert!(entry.push(row(4, 0, "a")).is_err());
        assert_eq!(entry.step(1, "a").map(|r| r.seq), Some(2));
        let seqs = |entries: Vec<JournalEntry>| entries.iter().map(|e| e.seq).collect::<Vec<_>>();
        assert_eq!(seqs(entry.load(0, "test").unwrap()), [1, 3]);
        assert_eq!(seqs(entry.history("test").unwrap()), [1, 2, 3]);
    }

    #[test]
    fn repeatable_names_count_occurrences_within_a_generation() {
        let mut entry = Entry::new(instance());
        let base = keiro_journal::store::marker_name::FAILED;
        assert_eq!(entry.repeatable_name(0, base), base);
        entry.push(row(1, 0, base)).unwrap();
        assert_eq!(entry.repeatable_name(0, base), format!("{base}/2"));
        assert_eq!(entry.repeatable_name(1, base), base);
        entry.push(row(2, 0, &format!("{base}/2"))).unwrap();
        assert_eq!(entry.repeatable_name(0, base), format!("{base}/3"));
    }

    #[test]
    fn an_undecodable_row_is_malformed() {
        let mut entry = Entry::new(instance());
        entry
            .push(JournalRow {
                kind: "failed",
                ..row(1, 0, keiro_journal::store::marker_name::FAILED)
            })
            .unwrap();
        assert!(matches!(
            entry.load(0, "test"),
            Err(Error::Malformed { .. })
        ));
    }

    #[test]
    fn the_sequence_starts_at_one() {
        let mut seq = Sequence::default();
        assert_eq!(seq.next().unwrap(), 1);
        assert_eq!(seq.next().unwrap(), 2);
    }
}
