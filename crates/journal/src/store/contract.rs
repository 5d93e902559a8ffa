//! The storage contract itself: the store traits' requests, outcomes and errors, and
//! `JournalStore`. [`store`](super) re-exports all of it beside the machinery the stores share.
//! The error is defined with the journal's data (`model`) and re-exported here.

use std::fmt;
use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::model::instance::StartRequest;
use crate::model::remote::{RemoteArm, RemoteArmOutcome};
use crate::model::update::{SignalStarted, UpdateAnswer, UpdateSend, UpdateSendOutcome};
use crate::model::wake::{
    AwakeableOutcome, ChildSpawn, ReturnedSignal, SignalOptions, SignalSendOutcome, SignalWait,
    SignalWaitOutcome, TimerArm, TimerFiring,
};
use crate::{
    Deliveries, DeliveryBacklog, Event, Fence, Generation, Instance, InstanceKey, JournalEntry,
    Marker, Started, Status,
};

/// The contract's error is defined with the journal's data, so the error a body sees can carry
/// it without depending on the contract.
pub use crate::model::store_error::Error;

/// One append to the journal.
#[derive(Debug, Clone, PartialEq)]
pub struct Append {
    /// The instance appended to.
    pub key: InstanceKey,
    /// The generation the writer is on; `None` appends to the current one (wake sources do).
    pub generation: Option<Generation>,
    /// The event.
    pub event: Event,
    /// The writer's lease. When set, the append is refused with [`Error::LeaseLost`] unless
    /// the instance is still leased to exactly this owner and epoch.
    pub fence: Option<Fence>,
    /// When fenced, extend the lease to `now + renew` in the same transaction.
    pub renew: Option<Duration>,
}

impl Append {
    /// An unfenced append to the current generation, as a wake source makes.
    pub fn external(key: InstanceKey, event: Event) -> Self {
        Self {
            key,
            generation: None,
            event,
            fence: None,
            renew: None,
        }
    }
}

impl Append {
    /// Whether `outcome`, the answer to this append, leaves this append's value in the journal:
    /// it was appended, or the same step was recorded already with an equal value.
    pub fn recorded_by(&self, outcome: &AppendOutcome) -> bool {
        match outcome {
            AppendOutcome::Appended => true,
            AppendOutcome::AlreadyPresent(recorded) => match &self.event {
                Event::StepRecorded { result, .. } => recorded == result,
                _ => false,
            },
            AppendOutcome::RefusedTerminal(_) | AppendOutcome::Conflict => false,
        }
    }
}

/// What [`JournalStore::journal_append_closing`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct ClosingOutcome {
    /// The step's outcome.
    pub step: AppendOutcome,
    /// The completion's outcome, or `None` when it was not tried because the step did not
    /// leave its own value in the journal ([`Append::recorded_by`]): the run that computed its
    /// output from that value must not close a journal that holds another.
    pub completion: Option<AppendOutcome>,
}

/// [`JournalStore::journal_append_closing`] as two appends made by `append`, one after the
/// other: the step, then the completion only if the step left its own value. The trait's
/// default, and the fallback of a store whose one-transaction form failed as a whole.
///
/// # Errors
///
/// The error of whichever append failed.
pub async fn closing_one_after_the_other<'a, F, Fut>(
    step: &'a Append,
    completion: &'a Append,
    append: F,
) -> Result<ClosingOutcome>
where
    F: Fn(&'a Append) -> Fut,
    Fut: std::future::Future<Output = Result<AppendOutcome>>,
{
    let first = append(step).await?;
    if !step.recorded_by(&first) {
        return Ok(ClosingOutcome {
            step: first,
            completion: None,
        });
    }
    let closed = append(completion).await?;
    Ok(ClosingOutcome {
        step: first,
        completion: Some(closed),
    })
}

/// What an append did. The four outcomes are exhaustive for a well-formed request.
#[derive(Debug, Clone, PartialEq)]
pub enum AppendOutcome {
    /// The event was recorded, and the instance row updated in the same transaction.
    Appended,
    /// The same step (or the same marker) was already recorded; carries the recorded value, which
    /// every writer adopts, so racing writers converge on the first result.
    AlreadyPresent(Value),
    /// The instance is terminal and this marker closed it: after `completed`, `failed` or
    /// `cancelled` no step lands, and after any marker no other marker lands.
    RefusedTerminal(Marker),
    /// The writer is on a generation that is no longer current, or the step was recorded by a
    /// different kind of call. Nothing was written.
    Conflict,
}

/// A stream append's bounds, as [`JournalStore::stream_write`] checks them against the
/// stream's whole length (every generation's appends).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamWrite {
    /// The stream's key ([`validate_message_key`](super::validate_message_key)).
    pub key: String,
    /// The most items the stream may hold.
    pub items_max: u64,
    /// The most encoded bytes the stream may hold.
    pub bytes_max: u64,
}

/// What [`JournalStore::update_answer`](crate::JournalStore::update_answer) did.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateAnswerOutcome {
    /// It went through the append rules, with this outcome; when appended, the update is
    /// answered.
    Append(AppendOutcome),
    /// Refused, nothing written: the instance has no update of that name under that id.
    Unknown,
    /// Refused, nothing written: the update was answered already (or settled unanswered).
    Answered,
}

/// What [`JournalStore::stream_write`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamOutcome {
    /// It went through the append rules, with this outcome; when appended, the item is the
    /// stream's next offset.
    Append(AppendOutcome),
    /// Refused, nothing written: the run closed the stream.
    Closed,
    /// Refused, nothing written: the stream holds `items` items of `bytes` encoded bytes, and
    /// this one would take it past [`StreamWrite::items_max`] or [`StreamWrite::bytes_max`].
    Full {
        /// The items it holds.
        items: u64,
        /// Their encoded bytes.
        bytes: u64,
    },
}

/// What [`JournalStore::attributes_set`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum AttributesOutcome {
    /// It went through the append rules, with this outcome; when appended, the attributes
    /// hold the set's values.
    Append(AppendOutcome),
    /// Refused, nothing written: the run would carry `count` attribute names, more than
    /// [`ATTRIBUTES_MAX`](crate::attribute::ATTRIBUTES_MAX).
    TooMany {
        /// The names it would carry.
        count: u64,
    },
}

/// What a delivery did ([`JournalStore::delivery_append`]).
#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryOutcome {
    /// It went through the append rules, with this outcome.
    Append(AppendOutcome),
    /// Refused, nothing written: the generation holds these unread deliveries, and one more
    /// would take them past the caller's [`DeliveryBacklog`].
    Backlog(Deliveries),
}

/// A request to park an instance that is waiting on `awaited` steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Park {
    /// The instance.
    pub key: InstanceKey,
    /// The generation the run is on.
    pub generation: Generation,
    /// The run's lease, released by the park.
    pub fence: Option<Fence>,
    /// The steps the run waits for; if any is already journaled the row stays `running`.
    pub awaited: Vec<String>,
    /// When the instance becomes due again without a wake (a sleep's deadline, or the
    /// reconcile fallback). `None` parks until a wake flips the row.
    pub wake_after: Option<OffsetDateTime>,
}

/// What a park did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkOutcome {
    /// The row is `suspended`; nothing the run waits for had landed.
    Suspended,
    /// An awaited step landed before the park, so the row stays `running` and the next pass
    /// re-drives it. The wake is never masked.
    WokenBeforePark,
    /// The instance went terminal meanwhile; nothing was written.
    Terminal(Status),
}

/// `Result` with the store's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The journal and instance operations every store implements.
///
/// Object-safe so the workflow context can hold an `Arc<dyn JournalStore>` and workflow bodies
/// are not generic over the store.
///
/// Each operation runs in a `keiro.store.<operation>` tracing span (as do those of the other
/// store traits): a store of your own opens it with [`store_span!`](macro@crate::store_span) and
/// [`traced`](crate::span::traced), so a trace reads the same whichever store served it.
#[async_trait::async_trait]
pub trait JournalStore: Send + Sync + fmt::Debug + 'static {
    /// This store as [`Any`](std::any::Any), so that a store crate's own kind of step finds its
    /// store behind a [`Ctx`](crate::Ctx) (the Postgres store's transaction step), and the
    /// facade finds a built-in store's push behind a shared handle. `None` by default: a store
    /// of your own need not say what it is.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// The payload codec this store seals payloads with, when it is a decorator that applies
    /// one (the facade's `KeiroBuilder::codec`): a store's own kind of step that writes in its
    /// caller's transaction, past the trait (the Postgres store's transaction step and its
    /// stream append), seals with it too. `None` by default.
    fn payload_codec(&self) -> Option<std::sync::Arc<dyn crate::codec::Codec>> {
        None
    }

    /// Creates the instance row `running` with its input, idempotently by key.
    async fn instance_start(&self, request: &StartRequest) -> Result<Started>;

    /// Starts several instances, each exactly as [`instance_start`](Self::instance_start)
    /// would, with an outcome per request in the requests' order (`created: false` for a key
    /// that already existed, including one that appears earlier in the same call). A store may
    /// do it in one transaction (the Postgres store does, and starts one by one when that
    /// transaction fails as a whole, so one refused input never fails the others); the
    /// default starts them one at a time.
    async fn instances_start(&self, requests: &[StartRequest]) -> Vec<Result<Started>> {
        let mut outcomes = Vec::with_capacity(requests.len());
        for request in requests {
            outcomes.push(self.instance_start(request).await);
        }
        outcomes
    }

    /// Reads the instance row.
    async fn instance_get(&self, key: &InstanceKey) -> Result<Option<Instance>>;

    /// Loads one generation's journal in append order, in one query.
    async fn journal_load(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<Vec<JournalEntry>>;

    /// Loads every generation's journal in append order (inspection, tests).
    async fn journal_history(&self, key: &InstanceKey) -> Result<Vec<JournalEntry>>;

    /// Appends one event and updates the instance row, in one transaction:
    ///
    /// - a step that is already recorded returns [`AppendOutcome::AlreadyPresent`] (this check
    ///   comes first, so a retry of a recorded step is idempotent even after a marker);
    /// - a step into a `failed`/`cancelled` instance, or a marker into a terminal one, returns
    ///   [`AppendOutcome::RefusedTerminal`] with the winning marker;
    /// - a fresh step flips a `suspended` row to `running` (a wake) and notifies listeners;
    /// - a marker moves the row to its terminal status (or the next generation), clears the
    ///   lease and the crash counters;
    /// - a terminal row is never moved back by an append.
    async fn journal_append(&self, append: &Append) -> Result<AppendOutcome>;

    /// Appends several events, each exactly as [`journal_append`](Self::journal_append)
    /// would, in the order of the appends of each instance, with an outcome (or error) per
    /// append in the appends' order: a lost lease, a terminal instance or a refused value of
    /// one append is that append's answer and never fails the others. A store may do it in one
    /// transaction (the Postgres store does, sending the appends alone when that transaction
    /// fails as a whole); the default appends them one at a time.
    async fn journal_append_batch(&self, appends: &[Append]) -> Vec<Result<AppendOutcome>> {
        let mut outcomes = Vec::with_capacity(appends.len());
        for append in appends {
            outcomes.push(self.journal_append(append).await);
        }
        outcomes
    }

    /// Appends a run's last step and then its completion, the completion only if the step left
    /// its own value in the journal ([`Append::recorded_by`]; otherwise
    /// [`ClosingOutcome::completion`] is `None` and nothing more is written). Each is the append
    /// [`journal_append`](Self::journal_append) would make, with the same outcomes. A store may
    /// make both in one transaction (the Postgres store does, as one request of its append
    /// lane); the default appends them one after the other, which is as safe: a run stopped
    /// between the two finds its step journaled when it is resumed.
    ///
    /// # Errors
    ///
    /// The error of whichever append failed; after an error of the completion the step may be
    /// journaled.
    async fn journal_append_closing(
        &self,
        step: &Append,
        completion: &Append,
    ) -> Result<ClosingOutcome> {
        closing_one_after_the_other(step, completion, |append| self.journal_append(append)).await
    }

    /// Journals a delivery: `append` (an `await:<step>` step of kind [`StepKind::Await`],
    /// unfenced, as [`delivery_append`](super::delivery_append) makes it) exactly as
    /// [`journal_append`](Self::journal_append) would, unless it is a new row of the current
    /// generation of a live instance that would take the generation's deliveries no await has
    /// read past `backlog` and its step is not one the parked (`suspended`) run waits on: then
    /// nothing is written and the outcome is [`DeliveryOutcome::Backlog`] with the unread
    /// deliveries. A delivery appended counts as unread until the run reports it read
    /// ([`deliveries_read`](Self::deliveries_read)); the count starts empty on every
    /// generation. See the `delivery` module docs.
    ///
    /// [`StepKind::Await`]: crate::StepKind::Await
    async fn delivery_append(
        &self,
        append: &Append,
        backlog: &DeliveryBacklog,
    ) -> Result<DeliveryOutcome>;

    /// Records that the run of `key` on `generation` has read `read` deliveries of that
    /// generation in all (its awaits' total, which only grows): the deliveries it read no
    /// longer count against [`delivery_append`](Self::delivery_append)'s bound. Does nothing
    /// when the generation is not the current one or holds no delivery the store counted.
    async fn deliveries_read(
        &self,
        key: &InstanceKey,
        generation: Generation,
        read: Deliveries,
    ) -> Result<()>;

    /// Confirms a fenced run may go on: renews the lease to `now + ttl` and returns the status.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the fence no longer matches.
    async fn instance_confirm(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<Status>;

    /// Parks a run waiting on wake sources, releasing its lease; see [`Park`].
    async fn instance_park(&self, park: &Park) -> Result<ParkOutcome>;

    /// Settles what a completed run left live in `generation`: its pending or claimed remote
    /// tasks become `cancelled` (a claimed one's heartbeat learns it, its report is refused),
    /// its pending awakeables `cancelled`; nothing is journaled. Does nothing unless the
    /// instance is completed. The run calls it after its completion only when its journal
    /// holds a decided race or an awakeable allocation. Returns how many were settled.
    async fn instance_settle_leftovers(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<u64>;

    /// Marks a run whose code diverged from its journal `failed` with `reason`, releasing its
    /// lease, without appending to the journal, so a fixed deploy can resume the very same journal
    /// after an operator resurrects it. Returns `false` when the row was already terminal.
    async fn instance_fail_diverged(
        &self,
        key: &InstanceKey,
        fence: Option<&Fence>,
        reason: &str,
    ) -> Result<bool>;

    // ----- Wake sources -------------------------------------------------------------------
    //
    // Every operation that resolves a wake source journals the awaited step into the owner and
    // flips the owner's row to `running` (with a notification) in the same transaction.

    /// Arms a timer, first arm wins; returns the effective `fire_at` (the first arm's). The
    /// store computes `fire_at` with its own clock: `now() + span` for
    /// [`TimerDue::After`](super::TimerDue::After) (cut to
    /// [`TimerDue::AFTER_MAX`](super::TimerDue::AFTER_MAX)), the instant itself for
    /// [`TimerDue::At`](super::TimerDue::At).
    async fn timer_arm(&self, arm: &TimerArm) -> Result<OffsetDateTime>;

    /// Fires up to `limit` timers due at `now` (store clock when `None`), oldest first, each in
    /// the same transaction as its journal append and the owner's row flip. Concurrent callers
    /// never fire the same timer (`FOR UPDATE SKIP LOCKED`). A timer whose step is already
    /// journaled, whose owner is terminal, or whose signal wait was already satisfied is marked
    /// fired without journaling anything.
    async fn timers_fire_due(&self, now: Option<OffsetDateTime>, limit: i64)
        -> Result<TimerFiring>;

    /// Returns timers stuck in `firing` for longer than `older_than` to `scheduled`; returns how
    /// many. (Firing is one transaction, so this only heals rows left by an interrupted
    /// operator action or an older keiro.)
    async fn timers_requeue_stuck(&self, older_than: Duration) -> Result<u64>;

    /// How many scheduled timers are due at `now`: the timer backlog.
    async fn timers_due_count(&self, now: Option<OffsetDateTime>) -> Result<u64>;

    /// Journals the awakeable allocation step `append` (its value is the awakeable id) and
    /// registers the pending awakeable `id` owned by the appending instance, in one transaction.
    /// A replayed allocation returns `AlreadyPresent` with the first id and registers nothing.
    async fn awakeable_create(&self, append: &Append, id: Uuid) -> Result<AppendOutcome>;

    /// Completes a pending awakeable with `payload` and journals [`Envelope::ok`](crate::Envelope::ok)
    /// under `awk:<id>` into its owner, in one transaction. Idempotent.
    async fn awakeable_complete(&self, id: Uuid, payload: &Value) -> Result<AwakeableOutcome>;

    /// Cancels a pending awakeable and journals [`Envelope::cancelled`](crate::Envelope::cancelled)
    /// into its owner, in one transaction. Idempotent.
    async fn awakeable_cancel(&self, id: Uuid) -> Result<AwakeableOutcome>;

    /// How many awakeables are pending.
    async fn awakeables_pending(&self) -> Result<u64>;

    /// Arms a signal wait under the token's lock: consumes the oldest buffered signal for the
    /// token (journaling it at once) or registers the waiter.
    async fn signal_wait(&self, wait: &SignalWait) -> Result<SignalWaitOutcome>;

    /// Withdraws the signal waiter of `step` (a wait that lost a [`Ctx::select`](crate::Ctx::select)
    /// race), so a signal sent from now on goes to the next waiter or the buffer instead of
    /// being swallowed by a wait the body no longer makes. A signal already delivered to it
    /// stays journaled. Returns whether a waiter was removed.
    async fn signal_withdraw(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
    ) -> Result<bool>;

    /// Sends a signal under the token's lock: delivers it to the oldest live waiter (journaled
    /// as [`Envelope::ok`](crate::Envelope::ok), owner woken) or buffers it until
    /// `options.time_to_live()` has passed. An expired buffered signal is never delivered;
    /// each send deletes its token's expired signals and a few expired ones of any token.
    ///
    /// # Errors
    ///
    /// [`Error::ValueRefused`] for a token [`validate_signal_token`](super::validate_signal_token)
    /// rejects, before anything is written.
    async fn signal_send_with(
        &self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome>;

    /// Journals `decision`, the winner of a [`Ctx::select`](crate::Ctx::select) race, and, only
    /// when it is appended, gives each of `signals` (what the race's losing waits took) back to
    /// its token, in one transaction: each is offered to the token's waiters as a send would
    /// offer it, and those no waiter takes are buffered ahead of every signal buffered for the
    /// token since, in the order given, for [`SIGNAL_TTL_DEFAULT`](crate::SIGNAL_TTL_DEFAULT).
    /// So a signal a losing wait took is neither lost nor delivered twice: the loser's
    /// journaled copy is never read again, since every replay takes the recorded winner. Any
    /// other outcome writes nothing.
    ///
    /// # Errors
    ///
    /// As [`journal_append`](Self::journal_append); [`Error::ValueRefused`] for a token
    /// [`validate_signal_token`](super::validate_signal_token) rejects, before anything is
    /// written.
    async fn signal_return(
        &self,
        decision: &Append,
        signals: &[ReturnedSignal],
    ) -> Result<AppendOutcome>;

    /// [`signal_send_with`](Self::signal_send_with) with the default options: a buffered
    /// signal expires after [`SIGNAL_TTL_DEFAULT`](crate::SIGNAL_TTL_DEFAULT).
    async fn signal_send(&self, token: &str, payload: &Value) -> Result<SignalSendOutcome> {
        self.signal_send_with(token, payload, &SignalOptions::default())
            .await
    }

    /// Journals the spawn step `append` (its value names the child) and creates the child
    /// instance `running`, linked to the parent and to `spawn.await_step`, in one transaction.
    /// A replayed spawn returns `AlreadyPresent` and creates nothing.
    ///
    /// From then on the child's terminal transaction (completion, failure including the crash
    /// ceiling and divergence, cancellation) journals its result envelope into the parent's
    /// spawning generation under `await_step` and wakes the parent.
    ///
    /// A running child has one parent. When an instance with the child's key exists: it adopts
    /// the spawner if it has no parent or its parent is the spawner itself (an earlier
    /// generation: the link moves to this one); its result is journaled under `await_step` at
    /// once if it is terminal; and if it is running for another instance, the spawn is refused:
    /// the spawn step is journaled with `"taken": {"name", "id"}` (the other parent) added to
    /// its value, [`Envelope::taken`](crate::Envelope::taken) under `await_step`, and the
    /// outcome is `AlreadyPresent` with the stored value, which the body turns into
    /// [`WorkflowError::ChildTaken`](crate::WorkflowError::ChildTaken).
    async fn child_spawn(&self, append: &Append, spawn: &ChildSpawn) -> Result<AppendOutcome>;

    /// Appends the cancel marker to `key` and, when `cascade`, to every live descendant, in one
    /// transaction. Returns the outcome for `key` itself.
    async fn instance_cancel(&self, key: &InstanceKey, cascade: bool) -> Result<AppendOutcome>;

    // ----- Events and streams --------------------------------------------------------------
    //
    // Written by the run only, each write a fenced step-like append in the same transaction
    // as the row readers read, so replay writes nothing twice and readers see exactly what the
    // journal holds. Each notifies the instance's readers at commit.

    /// Journals the event step `append` (kind [`StepKind::Event`](crate::StepKind::Event), its
    /// value the event's value) and, only when it is appended, makes that value the current
    /// value of event `key` of the instance (its version one more), in one transaction. A
    /// replayed write (`AlreadyPresent`) writes nothing. Outcomes and errors as
    /// [`journal_append`](Self::journal_append).
    async fn event_set(&self, append: &Append, key: &str) -> Result<AppendOutcome>;

    /// Journals the stream step `append` (kind [`StepKind::Stream`](crate::StepKind::Stream),
    /// its value the item) and, only when it is appended, adds the item to stream
    /// `write.key` at its next offset (0, 1, ... without gaps), in one transaction. A step
    /// already journaled answers `AlreadyPresent` and writes nothing. Otherwise a closed stream
    /// answers [`StreamOutcome::Closed`] and a full one [`StreamOutcome::Full`], with nothing
    /// written. Errors as [`journal_append`](Self::journal_append).
    async fn stream_write(&self, append: &Append, write: &StreamWrite) -> Result<StreamOutcome>;

    /// Journals the close step `append` of stream `key` and, only when it is appended, marks
    /// the stream closed (creating it empty if it was never written), in one transaction.
    /// Outcomes and errors as [`journal_append`](Self::journal_append).
    async fn stream_close(&self, append: &Append, key: &str) -> Result<AppendOutcome>;

    // ----- Search attributes ----------------------------------------------------------------

    /// Journals the attributes step `append` (kind
    /// [`StepKind::Attributes`](crate::StepKind::Attributes), its value `attributes` as JSON)
    /// and, only when it is appended, sets each of `attributes` on the instance (replacing an
    /// earlier value of the name), in one transaction. A step already journaled answers
    /// `AlreadyPresent` and writes nothing. Otherwise, when the instance would then carry more
    /// than [`ATTRIBUTES_MAX`](crate::attribute::ATTRIBUTES_MAX) names, it answers
    /// [`AttributesOutcome::TooMany`] with nothing written. `attributes` were validated by the
    /// caller ([`Attributes::validate`](crate::attribute::Attributes::validate)). Errors as
    /// [`journal_append`](Self::journal_append).
    async fn attributes_set(
        &self,
        append: &Append,
        attributes: &crate::attribute::Attributes,
    ) -> Result<AttributesOutcome>;

    // ----- Updates --------------------------------------------------------------------------
    //
    // A caller's request into a run, answered once by the run (`model::update`). The send and
    // the take ride on the signal machinery (one token per instance and update name).

    /// Sends update `send` in one transaction: starts the instance first when `send.start`
    /// asks and it does not exist; then, with an update already under `send.id`, answers
    /// `Sent { created: false, state }` when its name and request are the same and
    /// [`UpdateSendOutcome::Conflict`] when not; else refuses an unknown instance
    /// ([`UpdateSendOutcome::NotFound`]) and a terminal one ([`UpdateSendOutcome::Finished`]);
    /// else writes the update `requested` and offers it (`{"id", "name", "request"}`) on
    /// [`update_token`](crate::update::update_token) as
    /// [`signal_send_with`](Self::signal_send_with) does: to the run waiting in
    /// `ctx.next_update` (journaled, the run woken), or buffered until the run takes it.
    ///
    /// # Errors
    ///
    /// [`Error::ValueRefused`] for a request the store cannot keep, before anything is
    /// written; [`Error::Unavailable`] and [`Error::Database`].
    async fn update_send(&self, send: &UpdateSend) -> Result<UpdateSendOutcome>;

    /// Journals the answer step `append` (kind [`StepKind::Update`](crate::StepKind::Update),
    /// `{"ok": reply}` or `{"rejected": message}`) and, only when it is appended, settles update
    /// `answer.id` of the instance `replied` or `rejected` with that value and notifies its
    /// callers, in one transaction. A replayed answer is `AlreadyPresent` and writes nothing. An
    /// answer step not journaled yet is refused, with nothing written, when the instance has no
    /// such update ([`UpdateAnswerOutcome::Unknown`]) or it is no longer `requested`
    /// ([`UpdateAnswerOutcome::Answered`]). Errors as [`journal_append`](Self::journal_append).
    async fn update_answer(
        &self,
        append: &Append,
        answer: &UpdateAnswer,
    ) -> Result<UpdateAnswerOutcome>;

    /// Starts `start` if it does not exist (as [`instance_start`](Self::instance_start); no
    /// queue) and sends the signal (as [`signal_send_with`](Self::signal_send_with)), in one
    /// transaction: signal-with-start.
    ///
    /// # Errors
    ///
    /// As the two operations; [`Error::ValueRefused`] for a start on a queue, before anything
    /// is written.
    async fn signal_with_start(
        &self,
        start: &StartRequest,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalStarted>;

    /// Arms a remote step, in one transaction (see [`RemoteArm`]):
    ///
    /// - no task with `step_id`: write it `pending` (available now), notify remote workers,
    ///   return `Dispatched` with the redispatch deadline (`now + redispatch_after`);
    /// - a task with its result: return `Settled` with the envelope journaled under its
    ///   current journal step;
    /// - a task still pending or claimed whose redispatch deadline has passed: with fewer than
    ///   `redispatch_max` dispatches, dispatch it again (pending, available now, claim dropped,
    ///   new deadline) and return `Redispatched`; otherwise fail it with code
    ///   `remote_step_lost`, journal the error envelope into the owner (flipping its row) and
    ///   return `Settled { lost: true }`;
    /// - otherwise return `Waiting` with its deadline.
    ///
    /// A stale fence returns [`Error::LeaseLost`] and writes nothing; an owner that is terminal
    /// or on another generation gets `Waiting { deadline: None }` and nothing is written (the
    /// park that follows sees the terminal row).
    async fn remote_arm(&self, arm: &RemoteArm) -> Result<RemoteArmOutcome>;

    /// Arms remote steps and parks the run, as [`remote_arm`](Self::remote_arm) for each arm
    /// (in order) followed by [`instance_park`](Self::instance_park), with `wake_after` moved
    /// to the earliest deadline an arm returned. A run that dispatches remote steps and then
    /// suspends (the usual case) so writes its tasks and its park in one transaction: the
    /// dispatch is atomic with the suspension, and costs no transaction of its own.
    ///
    /// An arm refused for a stale fence ([`Error::LeaseLost`]) or a missing instance stops the
    /// operation with that error and nothing is written. A store that cannot do it in one
    /// transaction may rely on this default: each arm is idempotent, so the sequence is safe.
    async fn instance_park_dispatch(
        &self,
        park: &Park,
        arms: &[RemoteArm],
    ) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
        let mut park = park.clone();
        let mut outcomes = Vec::with_capacity(arms.len());
        for arm in arms {
            let outcome = self.remote_arm(arm).await?;
            if let Some(deadline) = outcome.deadline() {
                park.wake_after = Some(park.wake_after.map_or(deadline, |w| w.min(deadline)));
            }
            outcomes.push(outcome);
        }
        Ok((self.instance_park(&park).await?, outcomes))
    }
}
