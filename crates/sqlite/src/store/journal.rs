//! [`SqliteStore`]'s instance and journal operations (`JournalStore`'s methods, as they are
//! implemented).

use std::time::Duration;

use keiro_journal::store::{
    Append, AppendOutcome, ClosingOutcome, DeliveryOutcome, Error as StoreError, Park, ParkOutcome,
    Result,
};
use keiro_journal::{
    store::EncodedEvent, store::StartRequest, Deliveries, DeliveryBacklog, Event, Fence,
    Generation, Instance, InstanceKey, JournalEntry, Started, Status, StepKind,
};
use rusqlite::Connection;
use time::OffsetDateTime;

use crate::cached::Cached;
use crate::error::{self, malformed};
use crate::instance::{self, ConfirmCode, FailDivergedCode, ParkCode};
use crate::journal::{self, AppendCode, AppendTo, Closing, DeliveryCode};
use crate::row;
use crate::storable;
use crate::{child, remote};

use super::{join_all, lease_lost, not_found, span_ms, SqliteStore};

const START: &str = "starting an instance";
const GET: &str = "reading an instance";
const LOAD: &str = "loading a journal";
const HISTORY: &str = "loading a journal's history";
const APPEND: &str = "appending to the journal";
const DELIVER: &str = "journaling a delivery";
const READ: &str = "counting the deliveries a run read";
const CONFIRM: &str = "confirming a lease";
const PARK: &str = "parking an instance";
const FAIL_DIVERGED: &str = "failing a diverged run";
const SETTLE: &str = "settling a completed run's leftovers";
const CANCEL: &str = "cancelling an instance";

impl SqliteStore {
    /// Creates the instance row `running` with its input, idempotently by key
    /// (`JournalStore::instance_start`). A request with a queue is started on it (the queue's
    /// checks first; the run then waits for admission).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for an input PostgreSQL would refuse; `QueueRefused` for a start its
    /// queue refuses; `Unavailable` when the file is locked past the busy timeout or the commit
    /// failed.
    pub async fn instance_start(&self, request: &StartRequest) -> Result<Started> {
        if let Some(queue) = &request.queue {
            return self.queue_start(request, queue).await;
        }
        storable::value(START, &request.input)?;
        let request = request.clone();
        self.inner
            .writer
            .write(START, move |conn, now| {
                let parent = request
                    .parent
                    .as_ref()
                    .map(|p| (p.name.as_str(), p.id.as_str()));
                let (created, row) = instance::instance_start(
                    conn,
                    now,
                    request.key.name.as_str(),
                    request.key.id.as_str(),
                    &request.input,
                    parent,
                    request.priority,
                )?;
                if created {
                    crate::attribute::attributes_put(
                        conn,
                        now,
                        request.key.name.as_str(),
                        request.key.id.as_str(),
                        &request.attributes,
                    )?;
                }
                Ok(Started {
                    instance: row.instance(START)?,
                    created,
                })
            })
            .await
    }

    /// Starts several instances, each its own operation of the writer's shared transaction
    /// (`JournalStore::instances_start`): one refused input never fails the others. In the
    /// Postgres store's order: the starts on no queue first (one statement there), then those
    /// on a queue one by one in the requests' order, so each sees the ones before it (a second
    /// start of one dedup id finds the first). Answered in the requests' order.
    pub async fn instances_start(&self, requests: &[StartRequest]) -> Vec<Result<Started>> {
        let (plain, queued): (Vec<usize>, Vec<usize>) =
            (0..requests.len()).partition(|&i| requests[i].queue.is_none());
        let order: Vec<usize> = plain.into_iter().chain(queued).collect();
        let answers = join_all(order.iter().map(|&i| self.instance_start(&requests[i]))).await;
        let mut placed: Vec<Option<Result<Started>>> = requests.iter().map(|_| None).collect();
        for (i, answer) in order.into_iter().zip(answers) {
            placed[i] = Some(answer);
        }
        placed.into_iter().flatten().collect()
    }

    /// Reads the instance row (`JournalStore::instance_get`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instance_get(&self, key: &InstanceKey) -> Result<Option<Instance>> {
        let key = key.clone();
        self.read(GET, move |conn, _| {
            row::instance_row(conn, key.name.as_str(), key.id.as_str(), GET)?
                .map(|row| row.instance(GET))
                .transpose()
        })
        .await
    }

    /// Loads one generation's journal in append order (`JournalStore::journal_load`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn journal_load(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<Vec<JournalEntry>> {
        let key = key.clone();
        self.read(LOAD, move |conn, _| {
            row::journal_generation(conn, key.name.as_str(), key.id.as_str(), generation, LOAD)
        })
        .await
    }

    /// Loads every generation's journal in append order (`JournalStore::journal_history`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn journal_history(&self, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
        const JOURNAL_HISTORY: &str = "SELECT seq, generation, step_name, kind, payload, \
             recorded_at FROM journal WHERE workflow_name = ?1 AND workflow_id = ?2 ORDER BY seq";
        let key = key.clone();
        self.read(HISTORY, move |conn, _| {
            let stored = conn
                .prepare_cached(JOURNAL_HISTORY)
                .and_then(|mut s| {
                    s.query_map([key.name.as_str(), key.id.as_str()], row::stored_entry)?
                        .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(|e| error::store(HISTORY, e))?;
            stored.into_iter().map(|e| row::entry(e, HISTORY)).collect()
        })
        .await
    }

    /// Appends one event and moves the instance row in one transaction, by the append rules
    /// (`JournalStore::journal_append`).
    ///
    /// # Errors
    ///
    /// `NotFound`, `LeaseLost` (a fenced append whose fence no longer matches),
    /// `ValueRefused`, and a non-retryable `Database` error for a `Resurrected` event (it goes
    /// through `instance_resurrect`).
    pub async fn journal_append(&self, append: &Append) -> Result<AppendOutcome> {
        appendable(append)?;
        storable::append(APPEND, append)?;
        let append = append.clone();
        self.inner
            .writer
            .write(APPEND, move |conn, now| append_in(conn, now, &append))
            .await
    }

    /// Appends several events, each its own operation of the writer's shared transaction,
    /// with an outcome per append in order (`JournalStore::journal_append_batch`).
    pub async fn journal_append_batch(&self, appends: &[Append]) -> Vec<Result<AppendOutcome>> {
        join_all(appends.iter().map(|a| self.journal_append(a))).await
    }

    /// Appends a run's last step and then, if the step left its own value, its completion,
    /// both in one operation (`JournalStore::journal_append_closing`).
    ///
    /// # Errors
    ///
    /// As [`journal_append`](Self::journal_append), each append as if alone: an error of the
    /// step writes nothing; an error of the completion (its output refused, say) is answered
    /// after the step is written, as two appends one after the other would leave it (the
    /// completion runs in a savepoint of its own, so it leaves nothing).
    pub async fn journal_append_closing(
        &self,
        step: &Append,
        completion: &Append,
    ) -> Result<ClosingOutcome> {
        appendable(step)?;
        appendable(completion)?;
        storable::append(APPEND, step)?;
        // Refused before the writer, as PostgreSQL refuses a parameter; answered after the step.
        let completion_refused = storable::append(APPEND, completion).err();
        let (step, completion) = (step.clone(), completion.clone());
        self.inner
            .writer
            .write(APPEND, move |conn, now| {
                let first = append_in(conn, now, &step)?;
                if !step.recorded_by(&first) {
                    return Ok(Ok(ClosingOutcome {
                        step: first,
                        completion: None,
                    }));
                }
                if let Some(refused) = completion_refused {
                    return Ok(Err(refused));
                }
                let closed = in_savepoint(conn, || append_in(conn, now, &completion))?;
                Ok(closed.map(|closed| ClosingOutcome {
                    step: first,
                    completion: Some(closed),
                }))
            })
            .await?
    }

    /// Journals a delivery (an unfenced `await` record) by the append rules unless it would
    /// take the generation's unread deliveries past `backlog` (`JournalStore::delivery_append`).
    ///
    /// # Errors
    ///
    /// A non-retryable `Database` error for anything but an unfenced `await` step;
    /// `ValueRefused`; `NotFound`.
    pub async fn delivery_append(
        &self,
        append: &Append,
        backlog: &DeliveryBacklog,
    ) -> Result<DeliveryOutcome> {
        let (step, payload) = match &append.event {
            Event::StepRecorded {
                step,
                kind: StepKind::Await,
                result,
            } if append.fence.is_none() => (step.clone(), result.clone()),
            _ => {
                return Err(StoreError::Database {
                    operation: DELIVER,
                    retryable: false,
                    source: "a delivery is an unfenced await record".into(),
                })
            }
        };
        storable::append(DELIVER, append)?;
        let bigint = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let bytes = bigint(keiro_journal::store::encoded_len(&payload));
        let (unread_max, unread_bytes_max) = (bigint(backlog.deliveries), bigint(backlog.bytes));
        let (key, generation) = (append.key.clone(), append.generation);
        self.inner
            .writer
            .write(DELIVER, move |conn, now| {
                let code = journal::delivery_append(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    generation,
                    &step,
                    &payload,
                    bytes,
                    unread_max,
                    unread_bytes_max,
                )?;
                let count = |n: i64| usize::try_from(n).unwrap_or(0);
                match code {
                    DeliveryCode::Backlog(unread, unread_bytes) => {
                        Ok(DeliveryOutcome::Backlog(Deliveries {
                            count: count(unread),
                            bytes: count(unread_bytes),
                        }))
                    }
                    DeliveryCode::Append(code) => {
                        append_outcome(code, &key, None).map(DeliveryOutcome::Append)
                    }
                }
            })
            .await
    }

    /// Records that the run of `key` on `generation` has read `read` deliveries of that
    /// generation in all (`JournalStore::deliveries_read`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn deliveries_read(
        &self,
        key: &InstanceKey,
        generation: Generation,
        read: Deliveries,
    ) -> Result<()> {
        let key = key.clone();
        let count = i64::try_from(read.count).unwrap_or(i64::from(i32::MAX));
        let bytes = i64::try_from(read.bytes).unwrap_or(i64::MAX);
        self.inner
            .writer
            .write(READ, move |conn, _| {
                journal::deliveries_read(
                    conn,
                    key.name.as_str(),
                    key.id.as_str(),
                    generation,
                    count.min(i64::from(i32::MAX)),
                    bytes,
                )
            })
            .await
    }

    /// Confirms a fenced run may go on: renews the lease to `now + ttl` and returns the
    /// status (`JournalStore::instance_confirm`).
    ///
    /// # Errors
    ///
    /// `LeaseLost` when the fence no longer matches; `NotFound`.
    pub async fn instance_confirm(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<Status> {
        let (key, fence) = (key.clone(), fence.clone());
        self.inner
            .writer
            .write(CONFIRM, move |conn, now| match instance::instance_confirm(
                conn,
                now,
                key.name.as_str(),
                key.id.as_str(),
                &fence.owner,
                fence.epoch,
                span_ms(ttl),
            )? {
                ConfirmCode::Confirmed(status) | ConfirmCode::Terminal(status) => {
                    row::status(&status, CONFIRM)
                }
                ConfirmCode::NotFound => Err(not_found(&key)),
                ConfirmCode::LeaseLost => Err(lease_lost(&key, &fence.owner, fence.epoch)),
            })
            .await
    }

    /// Parks a run waiting on wake sources, releasing its lease (`JournalStore::instance_park`).
    ///
    /// # Errors
    ///
    /// `LeaseLost` when the fence no longer matches; `NotFound`.
    pub async fn instance_park(&self, park: &Park) -> Result<ParkOutcome> {
        for step in &park.awaited {
            storable::text(PARK, "step name", step)?;
        }
        let park = park.clone();
        self.inner
            .writer
            .write(PARK, move |conn, now| {
                let fence = park.fence.as_ref().map(|f| (f.owner.as_str(), f.epoch));
                let code = instance::instance_park(
                    conn,
                    now,
                    park.key.name.as_str(),
                    park.key.id.as_str(),
                    park.generation,
                    fence,
                    &park.awaited,
                    park.wake_after,
                )?;
                park_outcome(code, &park)
            })
            .await
    }

    /// Marks a diverged run `failed` with `reason` without a journal row
    /// (`JournalStore::instance_fail_diverged`); `false` when the row was already terminal.
    ///
    /// # Errors
    ///
    /// `LeaseLost`, `NotFound`, `ValueRefused` for a reason holding a NUL.
    pub async fn instance_fail_diverged(
        &self,
        key: &InstanceKey,
        fence: Option<&Fence>,
        reason: &str,
    ) -> Result<bool> {
        storable::text(FAIL_DIVERGED, "failure reason", reason)?;
        let (key, fence, reason) = (key.clone(), fence.cloned(), reason.to_owned());
        self.inner
            .writer
            .write(FAIL_DIVERGED, move |conn, now| {
                let held = fence.as_ref().map(|f| (f.owner.as_str(), f.epoch));
                match instance::instance_fail_diverged(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    held,
                    &reason,
                )? {
                    FailDivergedCode::Failed => Ok(true),
                    FailDivergedCode::Terminal => Ok(false),
                    FailDivergedCode::NotFound => Err(not_found(&key)),
                    FailDivergedCode::LeaseLost => {
                        let (owner, epoch) = held.unwrap_or_default();
                        Err(lease_lost(&key, owner, epoch))
                    }
                }
            })
            .await
    }

    /// Settles what a completed run left live in `generation` (its pending or claimed remote
    /// tasks, its pending awakeables become `cancelled`); nothing unless the instance is
    /// completed. How many were settled (`JournalStore::instance_settle_leftovers`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn instance_settle_leftovers(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<u64> {
        let key = key.clone();
        self.inner
            .writer
            .write(SETTLE, move |conn, now| {
                instance::instance_settle_leftovers(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    generation,
                )
            })
            .await
    }

    /// Appends the cancel marker to `key` and, when `cascade`, to every live descendant, in
    /// one transaction; the outcome for `key` itself (`JournalStore::instance_cancel`).
    ///
    /// # Errors
    ///
    /// `NotFound` for a missing instance.
    pub async fn instance_cancel(&self, key: &InstanceKey, cascade: bool) -> Result<AppendOutcome> {
        let key = key.clone();
        self.inner
            .writer
            .write(CANCEL, move |conn, now| {
                let cancelled = instance::instance_cancel(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    cascade,
                )?;
                for (name, id, generation) in &cancelled.tasks {
                    remote::remote_tasks_cancel(conn, now, name, id, *generation)?;
                }
                append_outcome(cancelled.code, &key, None)
            })
            .await
    }
}

/// A park's code as its outcome or error.
pub(super) fn park_outcome(code: ParkCode, park: &Park) -> Result<ParkOutcome> {
    match code {
        ParkCode::Suspended => Ok(ParkOutcome::Suspended),
        ParkCode::Woken => Ok(ParkOutcome::WokenBeforePark),
        ParkCode::Terminal(status) => Ok(ParkOutcome::Terminal(row::status(&status, PARK)?)),
        ParkCode::NotFound => Err(not_found(&park.key)),
        ParkCode::LeaseLost => {
            let (owner, epoch) = park
                .fence
                .as_ref()
                .map(|f| (f.owner.as_str(), f.epoch))
                .unwrap_or_default();
            Err(lease_lost(&park.key, owner, epoch))
        }
    }
}

/// Refuses an event `journal_append` does not take.
fn appendable(append: &Append) -> Result<()> {
    if matches!(append.event, keiro_journal::Event::Resurrected) {
        return Err(StoreError::Database {
            operation: APPEND,
            retryable: false,
            source: "only steps and lifecycle markers go through journal_append".into(),
        });
    }
    Ok(())
}

/// Runs `body` inside a savepoint of its own: its error rolls back what it wrote and is
/// returned inside `Ok`, so the operation around it keeps what it wrote before.
fn in_savepoint<T>(conn: &Connection, body: impl FnOnce() -> Result<T>) -> Result<Result<T>> {
    let sql = |text: &str| {
        conn.execute_cached(text, [])
            .map_err(|e| crate::error::store(APPEND, e))
    };
    sql("SAVEPOINT closing")?;
    match body() {
        Ok(value) => {
            sql("RELEASE closing")?;
            Ok(Ok(value))
        }
        Err(e) => {
            sql("ROLLBACK TO closing")?;
            sql("RELEASE closing")?;
            Ok(Err(e))
        }
    }
}

/// `append` as the append rules' arguments, its event encoded as `encoded`.
pub(super) fn append_to<'a>(append: &'a Append, encoded: &'a EncodedEvent) -> AppendTo<'a> {
    AppendTo {
        name: append.key.name.as_str(),
        id: append.key.id.as_str(),
        generation: append.generation,
        step: &encoded.step_name,
        kind: encoded.kind,
        payload: &encoded.payload,
        owner: append.fence.as_ref().map(|f| f.owner.as_str()),
        epoch: append.fence.as_ref().map(|f| f.epoch),
        renew_ms: append.renew.map(span_ms),
    }
}

/// Refuses anything but a step where an operation journals one (a wake source's allocation,
/// a spawn, a race's decision), as the Postgres store does before it asks the database.
pub(super) fn encoded_step(append: &Append, operation: &'static str) -> Result<EncodedEvent> {
    match &append.event {
        Event::StepRecorded { .. } => Ok(append.event.encode()),
        _ => Err(StoreError::Database {
            operation,
            retryable: false,
            source: format!("expected a step, got {:?}", append.event.step_name()).into(),
        }),
    }
}

/// One append by the append rules, and what a closing marker leaves to do, as its outcome or
/// error.
fn append_in(conn: &Connection, now: OffsetDateTime, append: &Append) -> Result<AppendOutcome> {
    let encoded = append.event.encode();
    let (outcome, closing) = journal::journal_append_to(conn, now, append_to(append, &encoded))?;
    close(conn, now, &append.key, closing)?;
    append_outcome(outcome, &append.key, append.fence.as_ref())
}

/// Carries out what a closing marker just written to `key` leaves to do, in the plpgsql
/// append's order: the generation's remote tasks are cancelled, then the result is delivered
/// to a waiting parent.
fn close(
    conn: &Connection,
    now: OffsetDateTime,
    key: &InstanceKey,
    closing: Closing,
) -> Result<()> {
    let (name, id) = (key.name.as_str(), key.id.as_str());
    if let Some(generation) = closing.cancel_tasks {
        remote::remote_tasks_cancel(conn, now, name, id, generation)?;
    }
    if closing.deliver {
        child::child_deliver(conn, now, name, id)?;
    }
    Ok(())
}

/// An append's code as its outcome or error, for an append to `key` by the holder of `fence`.
pub(super) fn append_outcome(
    code: AppendCode,
    key: &InstanceKey,
    fence: Option<&Fence>,
) -> Result<AppendOutcome> {
    match code {
        AppendCode::Appended(_) => Ok(AppendOutcome::Appended),
        AppendCode::AlreadyPresent(value) => Ok(AppendOutcome::AlreadyPresent(value)),
        AppendCode::Conflict => Ok(AppendOutcome::Conflict),
        AppendCode::RefusedTerminal(marker) => Ok(AppendOutcome::RefusedTerminal(marker)),
        AppendCode::NotFound => Err(not_found(key)),
        AppendCode::LeaseLost => match fence {
            Some(fence) => Err(lease_lost(key, &fence.owner, fence.epoch)),
            None => Err(malformed(APPEND, "lease_lost without a fence")),
        },
    }
}
