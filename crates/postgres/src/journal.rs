//! [`JournalStore`] for [`PgStore`]: each operation is one statement, and every one that
//! writes more than one row is a call of a `keiro_*` function from the migrations, so it is one
//! round trip and one transaction. The wake-source operations live in their own modules
//! (`timer`, `awakeable`, `signal`, `child`, `remote`); the trait impl here delegates to them.

use std::time::Duration;

use keiro_journal::store::{
    Append, AppendOutcome, ClosingOutcome, DeliveryOutcome, JournalStore, Park, ParkOutcome, Result,
};
use keiro_journal::{store_span, traced};
use keiro_journal::{
    AwakeableOutcome, ChildSpawn, Deliveries, DeliveryBacklog, EncodedEvent, Event, Fence,
    Generation, Instance, InstanceKey, JournalEntry, Marker, RemoteArm, RemoteArmOutcome,
    ReturnedSignal, SignalOptions, SignalSendOutcome, SignalWait, SignalWaitOutcome, StartRequest,
    Started, Status, StoreError, TimerArm, TimerFiring,
};
use serde_json::Value;
use time::OffsetDateTime;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::batch::{in_batch_order, Batched, SlotHold};
use crate::row::{self, column, instance_columns, malformed};
use crate::store::span_ms;
use crate::{append_lane, awakeable, child, delivery, remote, signal, timer, PgStore};

pub(crate) const START: &str = "starting an instance";
pub(crate) const GET: &str = "reading an instance";
const LOAD: &str = "loading a journal generation";
const HISTORY: &str = "loading a journal's history";
pub(crate) const APPEND: &str = "appending to the journal";
const CONFIRM: &str = "confirming a lease";
const PARK: &str = "parking an instance";
const FAIL_DIVERGED: &str = "failing a diverged instance";

/// The error for an outcome code this build does not know: the schema and the binary disagree.
pub(crate) fn unknown_outcome(operation: &'static str, outcome: &str) -> StoreError {
    malformed(
        operation,
        format_args!("unknown outcome {outcome:?} from the database"),
    )
}

/// [`StoreError::LeaseLost`] for the writer holding `fence`.
pub(crate) fn lease_lost(key: &InstanceKey, fence: &Fence) -> StoreError {
    StoreError::LeaseLost {
        key: key.clone(),
        owner: fence.owner.clone(),
        epoch: fence.epoch,
    }
}

/// [`StoreError::NotFound`] for `key`.
pub(crate) fn not_found(key: &InstanceKey) -> StoreError {
    StoreError::NotFound { key: key.clone() }
}

pub(crate) const INSTANCE_START: &str = concat!(
    "SELECT s.created, ",
    instance_columns!("(s.instance)."),
    " FROM keiro_instance_start($1, $2, $3, $4, $5, $6) s"
);

/// One start alone: `keiro_instance_start`.
async fn instance_start_one(
    store: &PgStore,
    request: &StartRequest,
    slot: Option<&SlotHold>,
) -> Result<Started> {
    let parent_name = request.parent.as_ref().map(|p| p.name.as_str());
    let parent_id = request.parent.as_ref().map(|p| p.id.as_str());
    let row = store
        .query_one_in_slot(
            START,
            INSTANCE_START,
            &[
                &request.key.name.as_str(),
                &request.key.id.as_str(),
                &request.input,
                &parent_name,
                &parent_id,
                &request.priority,
            ],
            slot,
        )
        .await?;
    Ok(Started {
        created: column(&row, "created", START)?,
        instance: row::instance(&row, START)?,
    })
}

const INSTANCES_START: &str = concat!(
    "SELECT s.n, s.created, ",
    instance_columns!("(s.instance)."),
    " FROM keiro_instances_start($1, $2, $3, $4, $5, $6) s"
);

/// Starts of several callers in one statement (see `batch`): an outcome per request, in the
/// batch's order.
async fn instances_start_many(
    store: &PgStore,
    requests: &[StartRequest],
    slot: Option<&SlotHold>,
) -> Result<Vec<Option<Result<Started>>>> {
    let names: Vec<&str> = requests.iter().map(|r| r.key.name.as_str()).collect();
    let ids: Vec<&str> = requests.iter().map(|r| r.key.id.as_str()).collect();
    let inputs: Vec<&Value> = requests.iter().map(|r| &r.input).collect();
    let parent_names: Vec<Option<&str>> = requests
        .iter()
        .map(|r| r.parent.as_ref().map(|p| p.name.as_str()))
        .collect();
    let parent_ids: Vec<Option<&str>> = requests
        .iter()
        .map(|r| r.parent.as_ref().map(|p| p.id.as_str()))
        .collect();
    let priorities: Vec<i32> = requests.iter().map(|r| r.priority).collect();
    let rows = store
        .query_in_slot(
            START,
            INSTANCES_START,
            &[
                &names,
                &ids,
                &inputs,
                &parent_names,
                &parent_ids,
                &priorities,
            ],
            slot,
        )
        .await?;
    Ok(in_batch_order(
        &rows,
        requests.len(),
        START,
        "n",
        |row, _| {
            Some(row::instance(row, START).and_then(|instance| {
                Ok(Started {
                    created: column(row, "created", START)?,
                    instance,
                })
            }))
        },
    ))
}

impl Batched for StartRequest {
    type Output = Started;

    const OPERATION: &'static str = START;

    const NAME: &'static str = "instance_start";

    async fn send_many(
        store: &PgStore,
        batch: &[Self],
        slot: Option<&SlotHold>,
    ) -> Result<Vec<Option<Result<Started>>>> {
        instances_start_many(store, batch, slot).await
    }

    async fn send_one(store: &PgStore, request: &Self, slot: Option<&SlotHold>) -> Result<Started> {
        instance_start_one(store, request, slot).await
    }
}

/// `instance_start` through the store's start lane: concurrent starts share a transaction.
async fn instance_start(store: &PgStore, request: &StartRequest) -> Result<Started> {
    store.lanes().starts.call(store, request.clone()).await
}

/// Several starts at once: one statement when batching is on (falling back to one start at a
/// time when it fails as a whole), else one transaction each.
async fn instances_start(store: &PgStore, requests: &[StartRequest]) -> Vec<Result<Started>> {
    let mut outcomes: Vec<Option<Result<Started>>> = requests.iter().map(|_| None).collect();
    if store.batching() && requests.len() > 1 {
        match instances_start_many(store, requests, None).await {
            Ok(answers) => outcomes = answers,
            Err(error) => {
                tracing::debug!(%error, starts = requests.len(), "a start batch failed as a whole; starting one by one");
            }
        }
    }
    let pending: Vec<usize> = (0..requests.len())
        .filter(|&i| outcomes[i].is_none())
        .collect();
    let sent = alone_by_instance(
        &pending,
        |i| &requests[i].key,
        |i| instance_start_one(store, &requests[i], None),
    )
    .await;
    for (i, answer) in sent {
        outcomes[i] = Some(answer);
    }
    outcomes
        .into_iter()
        .map(|o| o.expect("every start was answered by the batch or alone"))
        .collect()
}

const INSTANCE_GET: &str = concat!(
    "SELECT ",
    instance_columns!(""),
    " FROM workflows WHERE workflow_name = $1 AND workflow_id = $2"
);

async fn instance_get(store: &PgStore, key: &InstanceKey) -> Result<Option<Instance>> {
    let rows = store
        .query(GET, INSTANCE_GET, &[&key.name.as_str(), &key.id.as_str()])
        .await?;
    rows.first().map(|row| row::instance(row, GET)).transpose()
}

// Served by the journal's unique index: its (name, id, generation) prefix.
const JOURNAL_LOAD: &str =
    "SELECT seq, generation, step_name, kind, payload, recorded_at FROM journal \
     WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3 ORDER BY seq";

async fn journal_load(
    store: &PgStore,
    key: &InstanceKey,
    generation: Generation,
) -> Result<Vec<JournalEntry>> {
    let rows = store
        .query(
            LOAD,
            JOURNAL_LOAD,
            &[&key.name.as_str(), &key.id.as_str(), &generation],
        )
        .await?;
    row::entries(&rows, LOAD)
}

// Served by the journal's unique index: its (name, id) prefix.
const JOURNAL_HISTORY: &str =
    "SELECT seq, generation, step_name, kind, payload, recorded_at FROM journal \
     WHERE workflow_name = $1 AND workflow_id = $2 ORDER BY seq";

async fn journal_history(store: &PgStore, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
    let rows = store
        .query(
            HISTORY,
            JOURNAL_HISTORY,
            &[&key.name.as_str(), &key.id.as_str()],
        )
        .await?;
    row::entries(&rows, HISTORY)
}

// `keiro_journal_append_to` itself, not the `keiro_journal_append` wrapper: a LANGUAGE sql
// function returning a record is never inlined, so the wrapper was parsed and planned again on
// every call, which cost about as much as the append (migration 0004).
const JOURNAL_APPEND: &str = "SELECT outcome, recorded, marker \
     FROM keiro_journal_append_to($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// Sends the requests at positions `pending` one at a time: those of one instance in their
/// order, the instances side by side, so none waits behind another instance's lock.
pub(crate) async fn alone_by_instance<'a, O, Fut>(
    pending: &[usize],
    key: impl Fn(usize) -> &'a InstanceKey,
    send: impl Fn(usize) -> Fut,
) -> Vec<(usize, O)>
where
    Fut: std::future::Future<Output = O>,
{
    let mut by_instance: Vec<(&InstanceKey, Vec<usize>)> = Vec::new();
    for &i in pending {
        match by_instance.iter_mut().find(|(k, _)| *k == key(i)) {
            Some((_, at)) => at.push(i),
            None => by_instance.push((key(i), vec![i])),
        }
    }
    let send = &send;
    futures_util::future::join_all(by_instance.into_iter().map(|(_, at)| async move {
        let mut answers = Vec::with_capacity(at.len());
        for i in at {
            answers.push((i, send(i).await));
        }
        answers
    }))
    .await
    .into_iter()
    .flatten()
    .collect()
}

/// One append alone: `keiro_journal_append_to`.
pub(crate) async fn journal_append_one(
    store: &PgStore,
    append: &Append,
    slot: Option<&SlotHold>,
) -> Result<AppendOutcome> {
    let args = AppendArgs::new(append, append.event.encode());
    let row = store
        .query_one_in_slot(APPEND, JOURNAL_APPEND, &args.params(), slot)
        .await?;
    append_outcome(&row, APPEND, &append.key, append.fence.as_ref())
}

/// Refuses an event `journal_append` does not take.
pub(crate) fn appendable(append: &Append) -> Result<()> {
    if matches!(append.event, Event::Resurrected) {
        // A resurrection changes the instance row in ways an append does not; it goes through
        // `instance_resurrect`, which journals it together with that change.
        return Err(StoreError::Database {
            operation: APPEND,
            retryable: false,
            source: "only steps and lifecycle markers go through journal_append".into(),
        });
    }
    Ok(())
}

/// The nine leading parameters every append-shaped function takes, in order: the instance,
/// the writer's generation, the encoded event, and the writer's fence with its renewal.
pub(crate) struct AppendArgs<'a> {
    name: &'a str,
    id: &'a str,
    generation: Option<i32>,
    encoded: EncodedEvent,
    owner: Option<&'a str>,
    epoch: Option<i64>,
    renew_ms: Option<i64>,
}

impl<'a> AppendArgs<'a> {
    pub(crate) fn new(append: &'a Append, encoded: EncodedEvent) -> Self {
        Self {
            name: append.key.name.as_str(),
            id: append.key.id.as_str(),
            generation: append.generation,
            encoded,
            owner: append.fence.as_ref().map(|f| f.owner.as_str()),
            epoch: append.fence.as_ref().map(|f| f.epoch),
            renew_ms: append.renew.map(span_ms),
        }
    }

    /// The parameters; operations with more append them after these.
    pub(crate) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.name,
            &self.id,
            &self.generation,
            &self.encoded.step_name,
            &self.encoded.kind,
            &self.encoded.payload,
            &self.owner,
            &self.epoch,
            &self.renew_ms,
        ]
    }
}

/// The encoded event of an append that a wake-source operation makes together with its own
/// rows (an awakeable's allocation, a child's spawn): always a step, never a marker, which
/// would close the instance that the new rows are about to wait on.
pub(crate) fn encoded_step(append: &Append, operation: &'static str) -> Result<EncodedEvent> {
    match &append.event {
        Event::StepRecorded { .. } => Ok(append.event.encode()),
        _ => Err(StoreError::Database {
            operation,
            retryable: false,
            source: format!("expected a step, got {:?}", append.event.step_name()).into(),
        }),
    }
}

/// Reads the `outcome, recorded, marker` columns every append-shaped function returns (an
/// append to `key` by the holder of `fence`, if any) into its outcome or error.
pub(crate) fn append_outcome(
    row: &Row,
    operation: &'static str,
    key: &InstanceKey,
    fence: Option<&Fence>,
) -> Result<AppendOutcome> {
    let outcome: String = column(row, "outcome", operation)?;
    match outcome.as_str() {
        "appended" => Ok(AppendOutcome::Appended),
        "already_present" => {
            let recorded: Option<Value> = column(row, "recorded", operation)?;
            Ok(AppendOutcome::AlreadyPresent(
                recorded.unwrap_or(Value::Null),
            ))
        }
        "conflict" => Ok(AppendOutcome::Conflict),
        "refused_terminal" => {
            let marker: Option<String> = column(row, "marker", operation)?;
            marker
                .as_deref()
                .and_then(Marker::parse)
                .map(AppendOutcome::RefusedTerminal)
                .ok_or_else(|| {
                    malformed(operation, format_args!("unknown closing marker {marker:?}"))
                })
        }
        "not_found" => Err(not_found(key)),
        "lease_lost" => match fence {
            Some(fence) => Err(lease_lost(key, fence)),
            None => Err(unknown_outcome(operation, "lease_lost without a fence")),
        },
        other => Err(unknown_outcome(operation, other)),
    }
}

const INSTANCE_CONFIRM: &str =
    "SELECT outcome, row_status FROM keiro_instance_confirm($1, $2, $3, $4, $5)";

async fn instance_confirm(
    store: &PgStore,
    key: &InstanceKey,
    fence: &Fence,
    ttl: Duration,
) -> Result<Status> {
    let row = store
        .query_one(
            CONFIRM,
            INSTANCE_CONFIRM,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &fence.owner,
                &fence.epoch,
                &span_ms(ttl),
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", CONFIRM)?;
    match outcome.as_str() {
        "confirmed" | "terminal" => {
            let status: String = column(&row, "row_status", CONFIRM)?;
            row::status(&status, CONFIRM)
        }
        "not_found" => Err(not_found(key)),
        "lease_lost" => Err(lease_lost(key, fence)),
        other => Err(unknown_outcome(CONFIRM, other)),
    }
}

/// A park commits without waiting for its flush (`synchronous_commit` is read at commit, so
/// setting it anywhere in the statement applies): nobody is told a park is durable, and WAL is
/// flushed in order, so the wake that follows a park (a synchronous append, or a report whose
/// run then appends) flushes it first. A crash that drops an unflushed park leaves the run
/// `running` under its old lease, which expires and re-drives it: nothing is lost, and a busy
/// database no longer waits for one flush per parked run. (See migration 0005's header.)
const INSTANCE_PARK: &str = "SELECT p.outcome, p.row_status \
     FROM keiro_instance_park($1, $2, $3, $4, $5, $6, $7) p, \
          set_config('synchronous_commit', 'off', true)";

async fn instance_park(store: &PgStore, park: &Park) -> Result<ParkOutcome> {
    let key = &park.key;
    let owner = park.fence.as_ref().map(|f| f.owner.as_str());
    let epoch = park.fence.as_ref().map(|f| f.epoch);
    let row = store
        .query_one(
            PARK,
            INSTANCE_PARK,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &park.generation,
                &owner,
                &epoch,
                &park.awaited,
                &park.wake_after,
            ],
        )
        .await?;
    park_outcome(&row, park, PARK)
}

/// Reads a park's outcome (`outcome`, `row_status`), for `instance_park` and the park that
/// carries remote dispatches.
pub(crate) fn park_outcome(row: &Row, park: &Park, operation: &'static str) -> Result<ParkOutcome> {
    let key = &park.key;
    let outcome: String = column(row, "outcome", operation)?;
    match outcome.as_str() {
        "suspended" => Ok(ParkOutcome::Suspended),
        "woken" => Ok(ParkOutcome::WokenBeforePark),
        "terminal" => {
            let status: String = column(row, "row_status", operation)?;
            Ok(ParkOutcome::Terminal(row::status(&status, operation)?))
        }
        "not_found" => Err(not_found(key)),
        "lease_lost" => match &park.fence {
            Some(fence) => Err(lease_lost(key, fence)),
            None => Err(unknown_outcome(operation, "lease_lost without a fence")),
        },
        other => Err(unknown_outcome(operation, other)),
    }
}

const INSTANCE_FAIL_DIVERGED: &str =
    "SELECT outcome FROM keiro_instance_fail_diverged($1, $2, $3, $4, $5)";

const SETTLE_LEFTOVERS: &str = "settling a completed run's leftovers";
const INSTANCE_SETTLE_LEFTOVERS: &str =
    "SELECT keiro_instance_settle_leftovers($1, $2, $3) AS settled";

async fn instance_fail_diverged(
    store: &PgStore,
    key: &InstanceKey,
    fence: Option<&Fence>,
    reason: &str,
) -> Result<bool> {
    let owner = fence.map(|f| f.owner.as_str());
    let epoch = fence.map(|f| f.epoch);
    let row = store
        .query_one(
            FAIL_DIVERGED,
            INSTANCE_FAIL_DIVERGED,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &owner,
                &epoch,
                &reason,
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", FAIL_DIVERGED)?;
    match (outcome.as_str(), fence) {
        ("failed", _) => Ok(true),
        ("terminal", _) => Ok(false),
        ("not_found", _) => Err(not_found(key)),
        ("lease_lost", Some(fence)) => Err(lease_lost(key, fence)),
        (other, _) => Err(unknown_outcome(FAIL_DIVERGED, other)),
    }
}

#[async_trait::async_trait]
impl JournalStore for PgStore {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    async fn instance_start(&self, request: &StartRequest) -> Result<Started> {
        let span = store_span!("instance_start", key = request.key);
        traced(span, instance_start(self, request)).await
    }

    async fn instance_get(&self, key: &InstanceKey) -> Result<Option<Instance>> {
        traced(
            store_span!("instance_get", key = key),
            instance_get(self, key),
        )
        .await
    }

    async fn journal_load(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<Vec<JournalEntry>> {
        let span = store_span!("journal_load", key = key);
        traced(span, journal_load(self, key, generation)).await
    }

    async fn journal_history(&self, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
        let span = store_span!("journal_history", key = key);
        traced(span, journal_history(self, key)).await
    }

    async fn journal_append(&self, append: &Append) -> Result<AppendOutcome> {
        let span = store_span!(
            "journal_append",
            key = append.key,
            keiro.workflow.step = %append.event.step_name()
        );
        traced(span, append_lane::journal_append(self, append)).await
    }

    async fn journal_append_batch(&self, appends: &[Append]) -> Vec<Result<AppendOutcome>> {
        let span = store_span!("journal_append_batch", keiro.store.len = appends.len());
        traced(span, append_lane::journal_append_batch(self, appends)).await
    }

    async fn journal_append_closing(
        &self,
        step: &Append,
        completion: &Append,
    ) -> Result<ClosingOutcome> {
        let span = store_span!(
            "journal_append_closing",
            key = step.key,
            keiro.workflow.step = %step.event.step_name()
        );
        traced(
            span,
            append_lane::journal_append_closing(self, step, completion),
        )
        .await
    }

    async fn instances_start(&self, requests: &[StartRequest]) -> Vec<Result<Started>> {
        let span = store_span!("instances_start", keiro.store.len = requests.len());
        traced(span, instances_start(self, requests)).await
    }

    async fn delivery_append(
        &self,
        append: &Append,
        backlog: &DeliveryBacklog,
    ) -> Result<DeliveryOutcome> {
        let span = store_span!("delivery_append", key = append.key, keiro.workflow.step = %append.event.step_name());
        traced(span, delivery::delivery_append(self, append, backlog)).await
    }

    async fn deliveries_read(
        &self,
        key: &InstanceKey,
        generation: Generation,
        read: Deliveries,
    ) -> Result<()> {
        let span = store_span!("deliveries_read", key = key);
        traced(span, delivery::deliveries_read(self, key, generation, read)).await
    }

    async fn instance_confirm(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<Status> {
        let span = store_span!("instance_confirm", key = key);
        traced(span, instance_confirm(self, key, fence, ttl)).await
    }

    async fn instance_park(&self, park: &Park) -> Result<ParkOutcome> {
        let span = store_span!("instance_park", key = park.key);
        traced(span, instance_park(self, park)).await
    }

    async fn instance_settle_leftovers(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<u64> {
        let span = store_span!("instance_settle_leftovers", key = key);
        traced(span, async {
            let row = self
                .query_one(
                    SETTLE_LEFTOVERS,
                    INSTANCE_SETTLE_LEFTOVERS,
                    &[&key.name.as_str(), &key.id.as_str(), &generation],
                )
                .await?;
            let settled: i64 = crate::row::column(&row, "settled", SETTLE_LEFTOVERS)?;
            Ok(u64::try_from(settled).unwrap_or(0))
        })
        .await
    }

    async fn instance_fail_diverged(
        &self,
        key: &InstanceKey,
        fence: Option<&Fence>,
        reason: &str,
    ) -> Result<bool> {
        let span = store_span!("instance_fail_diverged", key = key);
        traced(span, instance_fail_diverged(self, key, fence, reason)).await
    }

    async fn timer_arm(&self, arm: &TimerArm) -> Result<OffsetDateTime> {
        let span = store_span!("timer_arm", key = arm.key, keiro.workflow.step = %arm.step);
        traced(span, timer::timer_arm(self, arm)).await
    }

    async fn timers_fire_due(
        &self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> Result<TimerFiring> {
        let span = store_span!("timers_fire_due");
        traced(span, timer::timers_fire_due(self, now, limit)).await
    }

    async fn timers_requeue_stuck(&self, older_than: Duration) -> Result<u64> {
        let span = store_span!("timers_requeue_stuck");
        traced(span, timer::timers_requeue_stuck(self, older_than)).await
    }

    async fn timers_due_count(&self, now: Option<OffsetDateTime>) -> Result<u64> {
        let span = store_span!("timers_due_count");
        traced(span, timer::timers_due_count(self, now)).await
    }

    async fn awakeable_create(&self, append: &Append, id: Uuid) -> Result<AppendOutcome> {
        let span = store_span!(
            "awakeable_create",
            key = append.key,
            keiro.workflow.step = %append.event.step_name(),
            keiro.awakeable.id = %id
        );
        traced(span, awakeable::awakeable_create(self, append, id)).await
    }

    async fn awakeable_complete(&self, id: Uuid, payload: &Value) -> Result<AwakeableOutcome> {
        let span = store_span!("awakeable_complete", keiro.awakeable.id = %id);
        traced(span, awakeable::awakeable_complete(self, id, payload)).await
    }

    async fn awakeable_cancel(&self, id: Uuid) -> Result<AwakeableOutcome> {
        let span = store_span!("awakeable_cancel", keiro.awakeable.id = %id);
        traced(span, awakeable::awakeable_cancel(self, id)).await
    }

    async fn awakeables_pending(&self) -> Result<u64> {
        traced(
            store_span!("awakeables_pending"),
            awakeable::awakeables_pending(self),
        )
        .await
    }

    async fn signal_wait(&self, wait: &SignalWait) -> Result<SignalWaitOutcome> {
        let span = store_span!(
            "signal_wait",
            key = wait.key,
            keiro.workflow.step = %wait.step,
            keiro.signal.token = %wait.token
        );
        traced(span, signal::signal_wait(self, wait)).await
    }

    async fn signal_send_with(
        &self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome> {
        let span = store_span!("signal_send_with", keiro.signal.token = %token);
        traced(span, signal::signal_send(self, token, payload, options)).await
    }

    async fn signal_withdraw(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
    ) -> Result<bool> {
        let span = store_span!("signal_withdraw", key = key, keiro.workflow.step = %step);
        traced(span, signal::signal_withdraw(self, key, generation, step)).await
    }

    async fn signal_return(
        &self,
        decision: &Append,
        signals: &[ReturnedSignal],
    ) -> Result<AppendOutcome> {
        let span = store_span!(
            "signal_return",
            key = decision.key,
            keiro.workflow.step = %decision.event.step_name()
        );
        traced(span, signal::signal_return(self, decision, signals)).await
    }

    async fn child_spawn(&self, append: &Append, spawn: &ChildSpawn) -> Result<AppendOutcome> {
        let span = store_span!(
            "child_spawn",
            key = append.key,
            keiro.workflow.step = %append.event.step_name(),
            keiro.child = %spawn.child
        );
        traced(span, child::child_spawn(self, append, spawn)).await
    }

    async fn instance_cancel(&self, key: &InstanceKey, cascade: bool) -> Result<AppendOutcome> {
        let span = store_span!("instance_cancel", key = key);
        traced(span, child::instance_cancel(self, key, cascade)).await
    }

    async fn remote_arm(&self, arm: &RemoteArm) -> Result<RemoteArmOutcome> {
        let span = store_span!(
            "remote_arm",
            key = arm.key,
            keiro.workflow.step = %arm.step,
            keiro.remote.step_id = %arm.step_id
        );
        traced(span, async {
            let outcome = remote::remote_arm(self, arm).await?;
            if matches!(outcome, RemoteArmOutcome::Settled { .. }) {
                // The body acts on a settled value at once: the report it comes from, committed
                // asynchronously, must be on disk first.
                crate::flush::flushed(self, &arm.step_id).await?;
            }
            Ok(outcome)
        })
        .await
    }

    async fn instance_park_dispatch(
        &self,
        park: &Park,
        arms: &[RemoteArm],
    ) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
        let span = store_span!("instance_park_dispatch", key = park.key);
        traced(span, crate::park_batch::park_dispatch(self, park, arms)).await
    }
}
