//! The store's group-commit lanes, one per batched operation: concurrent calls of that
//! operation share one statement and one commit. `lane` is the lane itself, generic over the
//! request; each other file here is one batched operation: its request, the statement that
//! carries a batch of them (an operation of `ops`), and the calls the store traits make.
//! `stats` is what each lane counts as its batches leave: batches, calls, and where the calls'
//! time went (queue, statement, hand-off).

use std::sync::Arc;

use keiro_journal::store::{
    Append, AppendOutcome, ClosingOutcome, Park, ParkOutcome, Result, StreamOutcome,
};
use keiro_journal::{
    batch::BatchLimits, store::RemoteArm, store::RemoteArmOutcome, store::StartRequest, Instance,
    InstanceKey, Started,
};
use keiro_lease::StartClaim;

use crate::db::Db;
use crate::ops::lease::StartClaimed;
use crate::ops::message::MessageWrite;

mod append;
mod awaited;
mod lane;
mod message;
mod park;
mod read;
mod start;
mod start_claimed;
mod stats;

use lane::Lane;
pub use stats::{CallTime, LaneStats};

/// What each group-commit lane of a store sent so far ([`PgStore::batch_stats`](crate::PgStore::batch_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Journal appends and completions (`keiro_journal_append_batch`).
    pub appends: LaneStats,
    /// Starts (`keiro_instances_start`).
    pub starts: LaneStats,
    /// Direct starts, leased to their callers (`keiro_instances_start_claimed`).
    pub direct_starts: LaneStats,
    /// Parks with their remote dispatches (`keiro_instances_park_dispatch`).
    pub parks: LaneStats,
    /// Reads of instance rows (`instance_get`, result waiters above all).
    pub reads: LaneStats,
    /// Result waiters' marks of their instances as awaited.
    pub awaited_marks: LaneStats,
    /// Event and stream writes (`keiro_messages_write`).
    pub messages: LaneStats,
}

impl BatchStats {
    /// What was sent between `earlier` and `self` (two reads of the same store).
    #[must_use]
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            appends: self.appends.since(&earlier.appends),
            starts: self.starts.since(&earlier.starts),
            direct_starts: self.direct_starts.since(&earlier.direct_starts),
            parks: self.parks.since(&earlier.parks),
            reads: self.reads.since(&earlier.reads),
            awaited_marks: self.awaited_marks.since(&earlier.awaited_marks),
            messages: self.messages.since(&earlier.messages),
        }
    }
}

/// The store's lanes, one per batched operation.
pub(crate) struct Lanes {
    /// Parks with their remote dispatches (`keiro_instances_park_dispatch`).
    parks: Lane<park::ParkRequest>,
    /// Journal appends (`keiro_journal_append_batch`).
    appends: Lane<append::AppendRequest>,
    /// Instance starts (`keiro_instances_start`).
    starts: Lane<StartRequest>,
    /// Direct starts, leased to their callers (`keiro_instances_start_claimed`).
    direct_starts: Lane<StartClaimed>,
    /// Reads of instance rows.
    reads: Lane<read::ReadRequest>,
    /// Result waiters' awaited marks.
    awaited_marks: Lane<awaited::MarkRequest>,
    /// Event and stream writes (`keiro_messages_write`).
    messages: Lane<message::MessageRequest>,
}

impl Lanes {
    /// Lanes that batch concurrent calls when `batching`, cutting batches at `limits`.
    pub(crate) fn new(batching: bool, limits: BatchLimits) -> Self {
        Self {
            parks: Lane::new(batching, limits),
            appends: Lane::new(batching, limits),
            starts: Lane::new(batching, limits),
            direct_starts: Lane::new(batching, limits),
            reads: Lane::new(batching, limits),
            awaited_marks: Lane::new(batching, limits),
            messages: Lane::new(batching, limits),
        }
    }

    /// Whether concurrent calls share transactions.
    pub(crate) fn batching(&self) -> bool {
        self.appends.batching()
    }

    /// What each lane sent so far.
    pub(crate) fn stats(&self) -> BatchStats {
        BatchStats {
            appends: self.appends.stats(),
            starts: self.starts.stats(),
            direct_starts: self.direct_starts.stats(),
            parks: self.parks.stats(),
            reads: self.reads.stats(),
            awaited_marks: self.awaited_marks.stats(),
            messages: self.messages.stats(),
        }
    }

    /// `journal_append` through the append lane.
    pub(crate) async fn journal_append(
        &self,
        db: &Arc<Db>,
        append: &Append,
    ) -> Result<AppendOutcome> {
        append::journal_append(&self.appends, db, append).await
    }

    /// `journal_append_closing` through the append lane.
    pub(crate) async fn journal_append_closing(
        &self,
        db: &Arc<Db>,
        step: &Append,
        completion: &Append,
    ) -> Result<ClosingOutcome> {
        append::journal_append_closing(&self.appends, db, step, completion).await
    }

    /// `journal_append_batch`: one statement when batching is on.
    pub(crate) async fn journal_append_batch(
        &self,
        db: &Db,
        appends: &[Append],
    ) -> Vec<Result<AppendOutcome>> {
        append::journal_append_batch(self.batching(), db, appends).await
    }

    /// `instance_start` through the start lane.
    pub(crate) async fn instance_start(
        &self,
        db: &Arc<Db>,
        request: &StartRequest,
    ) -> Result<Started> {
        self.starts.call(db, request.clone()).await
    }

    /// `instances_start`: one statement when batching is on.
    pub(crate) async fn instances_start(
        &self,
        db: &Db,
        requests: &[StartRequest],
    ) -> Vec<Result<Started>> {
        start::instances_start(self.batching(), db, requests).await
    }

    /// `instance_start_claimed` through the direct start lane, which takes its slots from the
    /// append lane's: a direct run's caller starts it and then appends its steps, so the
    /// callers of both lanes are the same runs, and on one slot they stay together (a batch of
    /// starts taking turns with a batch of steps). The lane keeps one spare slot of its own
    /// for when half a batch of starts waits behind the append lane's batches.
    pub(crate) async fn instance_start_claimed(
        &self,
        db: &Arc<Db>,
        start: StartClaimed,
    ) -> Result<StartClaim> {
        self.direct_starts
            .call_on_slots_of(db, start, &self.appends)
            .await
    }

    /// `instance_park_dispatch` through the park lane.
    pub(crate) async fn instance_park_dispatch(
        &self,
        db: &Arc<Db>,
        park: &Park,
        arms: &[RemoteArm],
    ) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
        park::instance_park_dispatch(&self.parks, db, park, arms).await
    }

    /// `instance_get` through the read lane.
    pub(crate) async fn instance_get(
        &self,
        db: &Arc<Db>,
        key: &InstanceKey,
    ) -> Result<Option<Instance>> {
        self.reads.call(db, read::ReadRequest(key.clone())).await
    }

    /// A result waiter's mark of `key` as awaited, through the awaited lane: `false` when the
    /// instance is no longer live.
    pub(crate) async fn instance_mark_awaited(
        &self,
        db: &Arc<Db>,
        key: &InstanceKey,
    ) -> Result<bool> {
        self.awaited_marks
            .call(db, awaited::MarkRequest(key.clone()))
            .await
    }

    /// An event or stream write through the message lane. An event's or a close's outcome is
    /// a [`StreamOutcome::Append`].
    pub(crate) async fn message_write(
        &self,
        db: &Arc<Db>,
        append: &Append,
        write: MessageWrite,
    ) -> Result<StreamOutcome> {
        message::message_write(&self.messages, db, append, write).await
    }
}
