//! [`SqliteStore`]: the handle, its writer and readers, and its operations.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keiro_journal::store::{
    Append, AppendOutcome, ClosingOutcome, DeliveryOutcome, Error as StoreError, Park, ParkOutcome,
    Result,
};
use keiro_journal::{
    Deliveries, DeliveryBacklog, Event, Fence, FiredTimer, Generation, Instance, InstanceKey,
    JournalEntry, StartRequest, Started, Status, StepKind, TimerArm, TimerDue, TimerFiring,
    TimerKind, WorkflowName,
};
use keiro_lease::{
    Claim, ClaimGate, ClaimOutcome, Crash, CrashOutcome, ResurrectOutcome, StartClaim,
};
use rusqlite::Connection;
use time::OffsetDateTime;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::{self, malformed};
use crate::instance::{self, ConfirmCode, FailDivergedCode, ParkCode};
use crate::journal::{self, AppendCode, AppendTo, DeliveryCode};
use crate::lease::{self, CrashCode, ResurrectCode};
use crate::row::{self, Stored};
use crate::timer::{self, ArmCode};
use crate::writer::Writer;
use crate::{open, storable};

/// The longest span the store adds to an instant, in milliseconds: the Postgres store's bound
/// (100 years), so both stores cut the same `Duration::MAX`.
const SPAN_MS_MAX: i64 = 100 * 366 * 24 * 60 * 60 * 1000;

/// A span in milliseconds, as the plpgsql rules take it.
fn span_ms(span: Duration) -> i64 {
    i64::try_from(span.as_millis()).map_or(SPAN_MS_MAX, |ms| ms.min(SPAN_MS_MAX))
}

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
const ARM: &str = "arming a timer";
const FIRE_DUE: &str = "firing due timers";
const REQUEUE_STUCK: &str = "requeueing stuck timers";
const DUE_COUNT: &str = "counting due timers";
const CLAIM: &str = "claiming an instance";
const START_CLAIMED: &str = "starting an instance claimed";
const CLAIM_BATCH: &str = "claiming a batch of instances";
const RENEW: &str = "renewing a lease";
const RELEASE: &str = "releasing a lease";
const FORCE_RELEASE: &str = "force-releasing a lease";
const RECORD_CRASH: &str = "recording a crash";
const RESURRECT: &str = "resurrecting an instance";

/// keiro's store on one SQLite file. Cheap to clone: clones share the writer, the readers and
/// the clock. The writer thread stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    config: Config,
    clock: Clock,
    writer: Writer,
    /// Idle read connections.
    readers: Mutex<Vec<Connection>>,
}

fn not_found(key: &InstanceKey) -> StoreError {
    StoreError::NotFound { key: key.clone() }
}

fn lease_lost(key: &InstanceKey, owner: &str, epoch: i64) -> StoreError {
    StoreError::LeaseLost {
        key: key.clone(),
        owner: owner.to_owned(),
        epoch,
    }
}

impl SqliteStore {
    /// Opens the database file at `path`, creating it if needed: refuses a directory, a file
    /// that is not a SQLite database, a read-only file and a file migrated by a newer keiro;
    /// sets WAL mode, the synchronous level of `config` (FULL unless opted out), the busy
    /// timeout and foreign keys, and reads each back; applies pending migrations.
    ///
    /// # Errors
    ///
    /// The [`Error`](crate::Error) naming what was refused.
    pub fn open(path: impl AsRef<Path>, config: Config) -> crate::Result<Self> {
        config.validate()?;
        let path = path.as_ref();
        let clock = Clock::default();
        let conn = open::writer(path, &config, row::micros(clock.now()))?;
        let reader = open::reader(path, &config)?;
        let writer = Writer::start(
            conn,
            clock.clone(),
            config.batch_max,
            "keiro-sqlite-writer".into(),
        )
        .map_err(|source| crate::Error::Thread {
            path: open::owned(path),
            source,
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                path: open::owned(path),
                config,
                clock,
                writer,
                readers: Mutex::new(vec![reader]),
            }),
        })
    }

    /// The database file's path.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Pins the store's clock at `at` (every operation then reads that instant), or lets it run
    /// again with `None`. For tests: leases, backoff gates and wake times are judged on it.
    pub fn pin_clock(&self, at: Option<OffsetDateTime>) {
        self.inner.clock.pin(at);
    }

    /// Moves the store's clock `by` ahead (a pinned one too). For tests.
    pub fn advance_clock(&self, by: Duration) {
        self.inner.clock.advance(by);
    }

    /// How many write transactions this store's writer committed since it opened: with
    /// [`SqliteStore`]'s group commit, fewer than the write operations it answered.
    pub fn commits(&self) -> u64 {
        self.inner.writer.commits()
    }

    /// The store's clock now.
    pub fn now(&self) -> OffsetDateTime {
        self.inner.clock.now()
    }

    /// Runs `read` on a read connection, in one read transaction (one snapshot), off the
    /// async runtime.
    async fn read<T, F>(&self, operation: &'static str, read: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, OffsetDateTime) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let now = inner.clock.now();
        let joined = tokio::task::spawn_blocking(move || {
            let idle = inner
                .readers
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            let conn = match idle {
                Some(conn) => conn,
                None => open::reader(&inner.path, &inner.config).map_err(|e| {
                    StoreError::Unavailable {
                        operation,
                        source: Box::new(e),
                    }
                })?,
            };
            conn.execute_batch("BEGIN")
                .map_err(|e| error::store(operation, e))?;
            let answer = read(&conn, now);
            // A read transaction writes nothing; ending it only frees its snapshot.
            let ended = conn.execute_batch("COMMIT");
            if ended.is_ok() {
                let mut idle = inner.readers.lock().unwrap_or_else(PoisonError::into_inner);
                if idle.len() < inner.config.readers {
                    idle.push(conn);
                }
            }
            answer
        })
        .await;
        joined.map_err(|e| StoreError::Unavailable {
            operation,
            source: Box::new(e),
        })?
    }

    // ----- Instances and the journal (JournalStore's methods, as they are implemented) -----

    /// Creates the instance row `running` with its input, idempotently by key
    /// (`JournalStore::instance_start`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for an input PostgreSQL would refuse; `Unavailable` when the file is
    /// locked past the busy timeout or the commit failed.
    pub async fn instance_start(&self, request: &StartRequest) -> Result<Started> {
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
                Ok(Started {
                    instance: row.instance(START)?,
                    created,
                })
            })
            .await
    }

    /// Starts several instances, each its own operation of the writer's shared transaction
    /// (`JournalStore::instances_start`): one refused input never fails the others.
    pub async fn instances_start(&self, requests: &[StartRequest]) -> Vec<Result<Started>> {
        let starts = requests.iter().map(|r| self.instance_start(r));
        join_all(starts).await
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
    /// As [`journal_append`](Self::journal_append); an error of either append fails both
    /// (the operation's savepoint is rolled back).
    pub async fn journal_append_closing(
        &self,
        step: &Append,
        completion: &Append,
    ) -> Result<ClosingOutcome> {
        appendable(step)?;
        appendable(completion)?;
        storable::append(APPEND, step)?;
        storable::append(APPEND, completion)?;
        let (step, completion) = (step.clone(), completion.clone());
        self.inner
            .writer
            .write(APPEND, move |conn, now| {
                let first = append_in(conn, now, &step)?;
                if !step.recorded_by(&first) {
                    return Ok(ClosingOutcome {
                        step: first,
                        completion: None,
                    });
                }
                let closed = append_in(conn, now, &completion)?;
                Ok(ClosingOutcome {
                    step: first,
                    completion: Some(closed),
                })
            })
            .await
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
        let bytes = bigint(keiro_journal::encoded_len(&payload));
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
                match instance::instance_park(
                    conn,
                    now,
                    park.key.name.as_str(),
                    park.key.id.as_str(),
                    park.generation,
                    fence,
                    &park.awaited,
                    park.wake_after,
                )? {
                    ParkCode::Suspended => Ok(ParkOutcome::Suspended),
                    ParkCode::Woken => Ok(ParkOutcome::WokenBeforePark),
                    ParkCode::Terminal(status) => {
                        Ok(ParkOutcome::Terminal(row::status(&status, PARK)?))
                    }
                    ParkCode::NotFound => Err(not_found(&park.key)),
                    ParkCode::LeaseLost => {
                        let (owner, epoch) = fence.unwrap_or_default();
                        Err(lease_lost(&park.key, owner, epoch))
                    }
                }
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
                let code = instance::instance_cancel(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    cascade,
                )?;
                append_outcome(code, &key, None)
            })
            .await
    }

    /// Arms a timer, first arm wins; the effective `fire_at` (the first arm's), computed on the
    /// store's clock: `now + span` (cut to `TimerDue::AFTER_MAX`) or the instant itself
    /// (`JournalStore::timer_arm`).
    ///
    /// # Errors
    ///
    /// `NotFound`; `ValueRefused` for a step or token holding a NUL.
    pub async fn timer_arm(&self, arm: &TimerArm) -> Result<OffsetDateTime> {
        storable::text(ARM, "step name", &arm.step)?;
        if let TimerKind::SignalTimeout { token } = &arm.kind {
            storable::text(ARM, "signal token", token)?;
        }
        let arm = arm.clone();
        self.inner
            .writer
            .write(ARM, move |conn, now| {
                let fire_at = match arm.due {
                    TimerDue::At(at) => at,
                    TimerDue::After(_) => arm
                        .due
                        .span()
                        .map_or(now, |span| crate::clock::later(now, span)),
                };
                let token = match &arm.kind {
                    TimerKind::SignalTimeout { token } => Some(token.as_str()),
                    _ => None,
                };
                match timer::timer_arm(
                    conn,
                    now,
                    arm.key.name.as_str(),
                    arm.key.id.as_str(),
                    arm.generation,
                    &arm.step,
                    arm.kind.as_str(),
                    token,
                    fire_at,
                )? {
                    ArmCode::Armed(at) | ArmCode::Present(at) => row::instant(at, ARM),
                    ArmCode::NotFound => Err(not_found(&arm.key)),
                }
            })
            .await
    }

    /// Fires up to `limit` timers due at `now` (the store's clock when `None`), oldest first,
    /// each with its journal append and the owner's row change, in one transaction
    /// (`JournalStore::timers_fire_due`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a stored key keiro cannot read.
    pub async fn timers_fire_due(
        &self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> Result<TimerFiring> {
        self.inner
            .writer
            .write(FIRE_DUE, move |conn, clock| {
                let (fired_at, fired, next_due) = timer::timers_fire_due(conn, clock, now, limit)?;
                let fired = fired
                    .into_iter()
                    .map(|(name, id, step, fire_at, delivered)| {
                        Ok(FiredTimer {
                            key: row::key(&name, &id, FIRE_DUE)?,
                            step,
                            fire_at: row::instant(fire_at, FIRE_DUE)?,
                            fired_at,
                            delivered,
                        })
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(TimerFiring {
                    fired,
                    next_due: row::instant_opt(next_due, FIRE_DUE)?,
                    clock: fired_at,
                })
            })
            .await
    }

    /// Returns timers stuck in `firing` for longer than `older_than` to `scheduled`; how many
    /// (`JournalStore::timers_requeue_stuck`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn timers_requeue_stuck(&self, older_than: Duration) -> Result<u64> {
        self.inner
            .writer
            .write(REQUEUE_STUCK, move |conn, now| {
                timer::timers_requeue_stuck(conn, now, span_ms(older_than))
            })
            .await
    }

    /// How many scheduled timers are due at `now` (`JournalStore::timers_due_count`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when a read connection cannot be opened.
    pub async fn timers_due_count(&self, now: Option<OffsetDateTime>) -> Result<u64> {
        self.read(DUE_COUNT, move |conn, clock| {
            timer::timers_due_count(conn, now.unwrap_or(clock))
        })
        .await
    }

    // ----- Leases (LeaseStore's methods, as they are implemented) -----

    /// Exact discovery (`LeaseStore::instances_runnable`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a stored key keiro cannot read.
    pub async fn instances_runnable(
        &self,
        now: Option<OffsetDateTime>,
        limit: Option<i64>,
    ) -> Result<Vec<InstanceKey>> {
        self.read(lease::RUNNABLE, move |conn, clock| {
            lease::instances_runnable(conn, now.unwrap_or(clock), limit)?
                .into_iter()
                .map(|(name, id)| row::key(&name, &id, lease::RUNNABLE))
                .collect()
        })
        .await
    }

    /// Claims `key` for `owner` until `now + ttl` (`LeaseStore::instance_claim`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instance_claim(
        &self,
        key: &InstanceKey,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        let (key, owner) = (key.clone(), owner.to_owned());
        self.inner
            .writer
            .write(CLAIM, move |conn, clock| {
                let claimed = lease::instance_claim(
                    conn,
                    clock,
                    key.name.as_str(),
                    key.id.as_str(),
                    &owner,
                    span_ms(ttl),
                    now,
                )?;
                claim_outcome(claimed, CLAIM)
            })
            .await
    }

    /// Starts `request`'s instance already leased to `owner` until `now + ttl`, in one
    /// operation, notifying nobody (`LeaseStore::instance_start_claimed`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for an input PostgreSQL would refuse; `Malformed` for a row keiro cannot
    /// read (the claim is then undone with the operation).
    pub async fn instance_start_claimed(
        &self,
        request: &StartRequest,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<StartClaim> {
        storable::value(START_CLAIMED, &request.input)?;
        let (request, owner) = (request.clone(), owner.to_owned());
        self.inner
            .writer
            .write(START_CLAIMED, move |conn, clock| {
                let parent = request
                    .parent
                    .as_ref()
                    .map(|p| (p.name.as_str(), p.id.as_str()));
                let (created, claimed) = lease::instance_start_claimed(
                    conn,
                    clock,
                    request.key.name.as_str(),
                    request.key.id.as_str(),
                    &request.input,
                    parent,
                    request.priority,
                    &owner,
                    span_ms(ttl),
                    now,
                )?;
                Ok(StartClaim {
                    created,
                    claim: claim_outcome(claimed, START_CLAIMED)?,
                })
            })
            .await
    }

    /// Claims up to `limit` runnable instances of `names` (`LeaseStore::instances_claim_batch`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instances_claim_batch(
        &self,
        names: &[WorkflowName],
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        let names: Vec<String> = names.iter().map(|n| n.as_str().to_owned()).collect();
        let owner = owner.to_owned();
        self.inner
            .writer
            .write(CLAIM_BATCH, move |conn, clock| {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                lease::instances_claim_batch(conn, clock, &names, &owner, span_ms(ttl), limit, now)?
                    .into_iter()
                    .map(|(row, journal)| claim(&row, journal, CLAIM_BATCH))
                    .collect()
            })
            .await
    }

    /// Renews a held lease to `now + ttl` (`LeaseStore::instance_lease_renew`).
    ///
    /// # Errors
    ///
    /// `LeaseLost` when the fence no longer matches; `NotFound`.
    pub async fn instance_lease_renew(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<()> {
        let (key, fence) = (key.clone(), fence.clone());
        self.inner
            .writer
            .write(RENEW, move |conn, now| {
                match lease::instance_lease_renew(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    &fence.owner,
                    fence.epoch,
                    span_ms(ttl),
                )? {
                    Some(true) => Ok(()),
                    Some(false) => Err(lease_lost(&key, &fence.owner, fence.epoch)),
                    None => Err(not_found(&key)),
                }
            })
            .await
    }

    /// Releases a held lease; when `progressed`, also resets attempts, error and gate
    /// (`LeaseStore::instance_release`). `false` when the fence no longer matched.
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn instance_release(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        progressed: bool,
    ) -> Result<bool> {
        let (key, fence) = (key.clone(), fence.clone());
        self.inner
            .writer
            .write(RELEASE, move |conn, now| {
                lease::instance_release(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    &fence.owner,
                    fence.epoch,
                    progressed,
                )
            })
            .await
    }

    /// Drops whatever lease the instance has (`LeaseStore::instance_lease_force_release`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn instance_lease_force_release(&self, key: &InstanceKey) -> Result<bool> {
        let key = key.clone();
        self.inner
            .writer
            .write(FORCE_RELEASE, move |conn, now| {
                lease::instance_lease_force_release(conn, now, key.name.as_str(), key.id.as_str())
            })
            .await
    }

    /// Records a crash of the run holding `fence` and releases its lease; at the ceiling the
    /// run is failed (`LeaseStore::instance_record_crash`).
    ///
    /// # Errors
    ///
    /// `LeaseLost`, `NotFound`, `ValueRefused` for an error text holding a NUL.
    pub async fn instance_record_crash(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        crash: &Crash,
    ) -> Result<CrashOutcome> {
        storable::text(RECORD_CRASH, "failure reason", &crash.error)?;
        let (key, fence, crash) = (key.clone(), fence.clone(), crash.clone());
        self.inner
            .writer
            .write(
                RECORD_CRASH,
                move |conn, now| match lease::instance_record_crash(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    &fence.owner,
                    fence.epoch,
                    &crash.error,
                    span_ms(crash.retry_delay),
                    crash.max_attempts,
                )? {
                    CrashCode::Retrying(attempts, next_attempt_at) => Ok(CrashOutcome::Retrying {
                        attempts,
                        next_attempt_at,
                    }),
                    CrashCode::Failed(attempts) => Ok(CrashOutcome::Failed { attempts }),
                    CrashCode::Terminal => Ok(CrashOutcome::AlreadyTerminal),
                    CrashCode::NotFound => Err(not_found(&key)),
                    CrashCode::LeaseLost => Err(lease_lost(&key, &fence.owner, fence.epoch)),
                },
            )
            .await
    }

    /// Returns a failed instance to `running`, appending `Resurrected`
    /// (`LeaseStore::instance_resurrect`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn instance_resurrect(&self, key: &InstanceKey) -> Result<ResurrectOutcome> {
        let key = key.clone();
        self.inner
            .writer
            .write(RESURRECT, move |conn, now| match lease::instance_resurrect(
                conn,
                now,
                key.name.as_str(),
                key.id.as_str(),
            )? {
                ResurrectCode::Resurrected => Ok(ResurrectOutcome::Resurrected),
                ResurrectCode::NotFailed(status) => Ok(ResurrectOutcome::NotFailed(row::status(
                    &status, RESURRECT,
                )?)),
                ResurrectCode::NotFound => Ok(ResurrectOutcome::NotFound),
            })
            .await
    }
}

/// Awaits every future, answers in order. The writer batches whatever is queued together, so
/// futures polled together share a commit.
async fn join_all<T, F: std::future::Future<Output = T>>(
    futures: impl Iterator<Item = F>,
) -> Vec<T> {
    let futures: Vec<_> = futures.map(Box::pin).collect();
    let mut answers = Vec::with_capacity(futures.len());
    // Each `write` queues its job on its first poll; polling them in turn queues every job
    // before the first answer is awaited.
    let mut pending: Vec<_> = futures.into_iter().map(Some).collect();
    let mut results: Vec<Option<T>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (slot, result) in pending.iter_mut().zip(results.iter_mut()) {
            if let Some(future) = slot {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(answer) => {
                        *result = Some(answer);
                        *slot = None;
                    }
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    answers.extend(results.into_iter().flatten());
    answers
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

/// One append by the append rules, as its outcome or error.
fn append_in(conn: &Connection, now: OffsetDateTime, append: &Append) -> Result<AppendOutcome> {
    let encoded = append.event.encode();
    let outcome = journal::journal_append_to(
        conn,
        now,
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
        },
    )?;
    append_outcome(outcome, &append.key, append.fence.as_ref())
}

/// An append's code as its outcome or error, for an append to `key` by the holder of `fence`.
fn append_outcome(
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

/// A claim's answer: acquired with its row and journal, or the refusal classified at the
/// instant the claim was judged at.
fn claim_outcome(claimed: lease::Claimed, operation: &'static str) -> Result<ClaimOutcome> {
    let Some(row) = claimed.instance else {
        return Ok(keiro_lease::classify_refusal(None, claimed.clock).into());
    };
    if claimed.granted {
        return Ok(ClaimOutcome::Acquired(Box::new(claim(
            &row,
            claimed.journal,
            operation,
        )?)));
    }
    let gate = ClaimGate {
        status: row::status(&row.status, operation)?,
        lease_expires_at: row::instant_opt(row.lease_expires_at, operation)?,
        next_attempt_at: row::instant_opt(row.next_attempt_at, operation)?,
    };
    Ok(keiro_lease::classify_refusal(Some(gate), claimed.clock).into())
}

/// A granted claim: the fence, the row after it, the journal.
fn claim(row: &Stored, journal: Vec<JournalEntry>, operation: &'static str) -> Result<Claim> {
    let instance = row.instance(operation)?;
    let owner = instance
        .lease_owner
        .clone()
        .ok_or_else(|| malformed(operation, "a claimed row has no lease owner"))?;
    Ok(Claim {
        fence: Fence {
            owner,
            epoch: instance.lease_epoch,
        },
        instance,
        journal,
    })
}
