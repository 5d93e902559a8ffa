//! Exactly-once database steps: `ctx.transaction(name, |tx| ..)`.
//!
//! keiro's journal lives in the application's own database, so a step whose effects are
//! statements on that database can commit them in the same transaction as its journal row:
//! either both happen or neither. A crash before the commit leaves no trace and the step runs
//! again; a crash after it replays the journaled result and never runs the closure again.
//!
//! One try of a step, on a connection lent from the store's pool:
//!
//! 1. `BEGIN ISOLATION LEVEL <level>` ([`TransactionOptions::isolation`], READ COMMITTED by
//!    default, whatever the session's default).
//! 2. `SET LOCAL search_path TO "$user", public`, and `keiro_instance_hold`, sent together: the
//!    instance row is locked and the run's fence checked before the user's first statement.
//! 3. The closure.
//! 4. The step's fenced journal append (`keiro_journal_append_to`, named with keiro's schema).
//! 5. `COMMIT` when the append answered `appended`; otherwise the transaction is dropped
//!    (rolled back): another holder journaled the step, or the run is over.
//! 6. The session is reset and the connection given back (`session`), so nothing the closure
//!    set on it (`SET` without `LOCAL`, a role, advisory locks, temporary tables) reaches the
//!    next user of the pool.
//!
//! Why the row is locked first. Every keiro write to a running instance goes through its row:
//! the lease heartbeat (every `lease_ttl / 3` while an action runs), deliveries, cancels,
//! claims. Under REPEATABLE READ or SERIALIZABLE, a row changed after the transaction's
//! snapshot cannot be locked by it any more ("could not serialize access due to concurrent
//! update"), so a closure longer than a third of the lease could never reach a committed
//! append. The alternative, keeping the heartbeat off the row while a step runs, fixes only the
//! heartbeat, and leaves a long step unprotected once its lease runs out. Holding the row from
//! the first statement makes every other writer wait for the commit instead; the lock is then
//! the lease itself (nobody can take it over while it is held), so the heartbeat skips its
//! renewals meanwhile ([`StepJournal::hold_lease`]) and the append renews the lease as it
//! commits. A lease lost before the step began is found by the hold, before any of the user's
//! statements ran. The price: a cancel, a delivery or a child's result for this instance waits
//! for the step's commit, and `SET TRANSACTION ISOLATION LEVEL` cannot be used inside the
//! closure (it must come before any query), hence [`TransactionOptions::isolation`].
//!
//! Failures. The closure's own `Err` (or a panic) rolls back and is a failed attempt, as for a
//! plain step. A failure the database reports after the closure returned `Ok` is also the
//! step's own failure, a [`TransactionFailure`] keeping the SQLSTATE and the server's message:
//! a transaction the closure left aborted (SQLSTATE 25P02 at the append: a statement failed and
//! its error was not returned), a `COMMIT` refused (a deferred constraint, class 23), or any
//! other refusal of the append. Serialization failures (40001) and deadlocks (40P01), wherever
//! they happen (the hold, the closure's statements, the append, the commit), are retried in
//! place first, in a new transaction, up to [`SERIALIZATION_TRIES_MAX`] tries with a short
//! backoff, and then fail the step the same way. Only a database that cannot be reached (or a
//! `COMMIT` that got no answer, which may have committed: the next drive's journal tells) is a
//! store error, which stops the run with no attempt counted.

use std::any::Any;
use std::error::Error as StdError;
use std::time::Duration;

use keiro_journal::{
    store::SelfJournalError, store::SelfJournaled, store::StepJournal, AppendOutcome, BoxFuture,
    Ctx, Event, Marker, StepOptions, StoreError, WorkflowError,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::error::{DbError, SqlState};
use tokio_postgres::{IsolationLevel, Transaction};

use crate::error::{classify_code, server_reason, Class, Failure};
use crate::ops::journal::{append_outcome, AppendArgs};
use crate::ops::{lease_lost, not_found, unknown_outcome};
use crate::row::column;
use crate::session::Lent;
use crate::PgStore;

/// The operation name store errors of a transaction step carry.
const OPERATION: &str = "transaction_step";

/// PostgreSQL's own default, for the application's statements.
const APP_SEARCH_PATH: &str = "SET LOCAL search_path TO \"$user\", public";

/// How many times one attempt of a transaction step tries its transaction while it meets
/// serialization failures (SQLSTATE 40001) or deadlocks (40P01), the first try included; the
/// last such failure then fails the attempt.
pub const SERIALIZATION_TRIES_MAX: u32 = 5;

/// The wait before the second try after a serialization failure or deadlock; it doubles for
/// each further try, up to [`SERIALIZATION_BACKOFF_MAX`], with up to half of it drawn at random.
const SERIALIZATION_BACKOFF_INITIAL: Duration = Duration::from_millis(10);

/// The longest wait between two tries after serialization failures or deadlocks.
const SERIALIZATION_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// How a transaction step runs: its isolation level and its retry policy.
///
/// ```
/// use keiro_journal::StepOptions;
/// use keiro_postgres::tokio_postgres::IsolationLevel;
/// use keiro_postgres::TransactionOptions;
///
/// let options = TransactionOptions::new()
///     .isolation(IsolationLevel::Serializable)
///     .retry(StepOptions::new(5));
/// assert!(matches!(options.isolation, IsolationLevel::Serializable));
/// // A retry policy alone converts, for `transaction_with(name, &policy, ..)`.
/// let options = TransactionOptions::from(&StepOptions::new(3));
/// assert_eq!(options.retry.map(|policy| policy.max_attempts), Some(3));
/// ```
#[derive(Debug, Clone)]
pub struct TransactionOptions {
    /// The transaction's isolation level, given to `BEGIN` (the session's default does not
    /// apply). A closure cannot change it with `SET TRANSACTION`: keiro's lock on the instance
    /// row is the transaction's first query. Defaults to `IsolationLevel::ReadCommitted`.
    pub isolation: IsolationLevel,
    /// The step's retry policy: a failed attempt is journaled and retried in place, and the
    /// body gets [`WorkflowError::StepFailed`] when the attempts are spent. `None` follows the
    /// plain step's rule: a failure crashes the run, which the resume worker retries with crash
    /// backoff. Defaults to `None`.
    pub retry: Option<StepOptions>,
}

impl Default for TransactionOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl TransactionOptions {
    /// READ COMMITTED, without a retry policy.
    pub fn new() -> Self {
        Self {
            isolation: IsolationLevel::ReadCommitted,
            retry: None,
        }
    }

    /// Sets the isolation level.
    #[must_use]
    pub fn isolation(mut self, isolation: IsolationLevel) -> Self {
        self.isolation = isolation;
        self
    }

    /// Sets the retry policy.
    #[must_use]
    pub fn retry(mut self, policy: StepOptions) -> Self {
        self.retry = Some(policy);
        self
    }
}

/// READ COMMITTED under `policy`.
impl From<StepOptions> for TransactionOptions {
    fn from(policy: StepOptions) -> Self {
        Self::new().retry(policy)
    }
}

/// READ COMMITTED under `policy`.
impl From<&StepOptions> for TransactionOptions {
    fn from(policy: &StepOptions) -> Self {
        Self::new().retry(policy.clone())
    }
}

/// Where in a transaction step the database refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransactionStage {
    /// keiro's lock on the instance row, before the closure.
    Hold,
    /// A statement of the closure's, whose error the closure returned.
    Statement,
    /// keiro's journal append, after the closure.
    Append,
    /// The `COMMIT`.
    Commit,
}

impl TransactionStage {
    fn describe(self) -> &'static str {
        match self {
            Self::Hold => "at keiro's lock of the instance row",
            Self::Statement => "at a statement of the closure",
            Self::Append => "at the step's journal append",
            Self::Commit => "at the commit",
        }
    }
}

/// Why a transaction step failed when its closure did not (or failed only with serialization
/// failures): the step's own failure, counted against its retry policy, and the `message` of
/// the [`WorkflowError::StepFailed`] (or the run's recorded error) it ends in.
///
/// ```
/// use keiro_postgres::{TransactionFailure, TransactionStage};
///
/// let failure = TransactionFailure {
///     stage: TransactionStage::Commit,
///     code: "23503".into(),
///     message: "insert or update on table \"ledger\" violates foreign key constraint".into(),
///     tries: 1,
/// };
/// assert_eq!(
///     failure.to_string(),
///     "the database refused the transaction at the commit: insert or update on table \
///      \"ledger\" violates foreign key constraint (SQLSTATE 23503)"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct TransactionFailure {
    /// Where the database refused.
    pub stage: TransactionStage,
    /// The SQLSTATE, such as `25P02` or `23505`.
    pub code: String,
    /// The server's message, with its detail.
    pub message: String,
    /// How many times the transaction was tried in this attempt: more than once only after
    /// serialization failures and deadlocks, which are tried again in place.
    pub tries: u32,
}

impl TransactionFailure {
    fn new(stage: TransactionStage, error: &DbError, tries: u32) -> Self {
        Self {
            stage,
            code: error.code().code().to_owned(),
            message: server_reason(error),
            tries,
        }
    }

    fn describe(&self) -> String {
        let Self {
            stage,
            code,
            message,
            tries,
        } = self;
        let stage = stage.describe();
        if is_conflict(&SqlState::from_code(code)) {
            format!(
                "the transaction met a serialization failure or deadlock {stage} on each of its \
                 {tries} tries: {message} (SQLSTATE {code})"
            )
        } else if *code == SqlState::IN_FAILED_SQL_TRANSACTION.code() {
            format!(
                "the closure returned Ok from a transaction it had left aborted (a statement \
                 failed and its error was not returned), so {stage}: {message} (SQLSTATE {code})"
            )
        } else {
            format!("the database refused the transaction {stage}: {message} (SQLSTATE {code})")
        }
    }
}

/// Exactly-once database steps on the Postgres store, as methods of [`Ctx`].
///
/// ```no_run
/// use keiro_journal::{Ctx, WorkflowError};
/// use keiro_postgres::TransactionStep;
///
/// async fn transfer(ctx: Ctx, cents: i64) -> Result<(), WorkflowError> {
///     ctx.transaction("move-money", move |tx| {
///         Box::pin(async move {
///             tx.execute("UPDATE accounts SET balance = balance - $1 WHERE id = 'a'", &[&cents])
///                 .await?;
///             tx.execute("UPDATE accounts SET balance = balance + $1 WHERE id = 'b'", &[&cents])
///                 .await?;
///             Ok::<_, tokio_postgres::Error>(())
///         })
///     })
///     .await
/// }
/// ```
pub trait TransactionStep {
    /// Runs `work` in a READ COMMITTED transaction on the store's database and journals its
    /// result under `name` in that same transaction, so its statements take effect exactly
    /// once: on replay the journaled result is returned and no transaction is opened.
    ///
    /// `work` runs with PostgreSQL's default `search_path`; qualify your tables, or `SET LOCAL
    /// search_path` first, if they live elsewhere. Session state it sets does not outlive the
    /// step: the connection is reset before it goes back to the pool. The instance's row is
    /// locked from before `work` runs to the end of the transaction: nobody can take the run
    /// over meanwhile (so the lease needs no renewal), and a run whose lease was lost is
    /// refused before `work` runs. keiro calls about the same instance made on other
    /// connections wait for the commit, so make them inside `work`, on `tx`.
    ///
    /// A failure follows the plain step's rule: an `Err` from `work`, a panic inside it, or a
    /// [`TransactionFailure`] (a transaction `work` left aborted, a refused `COMMIT`) rolls the
    /// transaction back and crashes the run, which the resume worker retries with crash
    /// backoff. A serialization failure or deadlock is first tried again in place, in a new
    /// transaction, up to [`SERIALIZATION_TRIES_MAX`] times; keiro sees one in `work`'s error
    /// when its type is `tokio_postgres::Error`, or a `Box<dyn Error + Send + Sync>` whose
    /// source chain holds one. `work` may so run more than once, hence `Fn`.
    ///
    /// # Errors
    ///
    /// As [`Ctx::step`], and [`WorkflowError::Unsupported`] when the run's store is not a
    /// [`PgStore`].
    fn transaction<'a, T, E, F>(
        &'a self,
        name: &'a str,
        work: F,
    ) -> BoxFuture<'a, Result<T, WorkflowError>>
    where
        T: Serialize + DeserializeOwned + Send + 'a,
        E: std::fmt::Display + Send + 'static,
        F: for<'t> Fn(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>> + Send + Sync + 'a;

    /// [`transaction`](Self::transaction) at the isolation level and under the retry policy
    /// of `options` (a [`TransactionOptions`], or a [`StepOptions`] for READ COMMITTED under
    /// that policy). Under a policy, as [`Ctx::step_with`] runs a plain step: a failed attempt
    /// (an `Err` from `work`, a panic, a [`TransactionFailure`]) rolls its transaction back and
    /// is journaled; the next attempt runs in a new transaction after the policy's wait; when
    /// the attempts are spent, or the policy does not retry the error, the body gets
    /// [`WorkflowError::StepFailed`], whose message keeps a failure's SQLSTATE. A policy's
    /// `retry_if` over `work`'s error type does not see a [`TransactionFailure`], which is
    /// retried (one over `Box<dyn Error + Send + Sync>` sees it boxed).
    ///
    /// ```no_run
    /// use keiro_journal::{Ctx, StepOptions, WorkflowError};
    /// use keiro_postgres::tokio_postgres::IsolationLevel;
    /// use keiro_postgres::{TransactionOptions, TransactionStep};
    ///
    /// async fn reserve(ctx: Ctx, seat: String) -> Result<bool, WorkflowError> {
    ///     let options = TransactionOptions::new()
    ///         .isolation(IsolationLevel::Serializable)
    ///         .retry(StepOptions::new(3));
    ///     let reserved = ctx
    ///         .transaction_with("reserve", options, |tx| {
    ///             let seat = seat.clone();
    ///             Box::pin(async move {
    ///                 tx.execute("INSERT INTO app.reservations (seat) VALUES ($1)", &[&seat])
    ///                     .await?;
    ///                 Ok::<_, tokio_postgres::Error>(())
    ///             })
    ///         })
    ///         .await;
    ///     match reserved {
    ///         Ok(()) => Ok(true),
    ///         // Taken (SQLSTATE 23505 in the message), three times over.
    ///         Err(WorkflowError::StepFailed { .. }) => Ok(false),
    ///         Err(other) => Err(other),
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Ctx::step_with`] (or [`Ctx::step`] without a policy), and
    /// [`WorkflowError::Unsupported`] when the run's store is not a [`PgStore`].
    fn transaction_with<'a, T, E, F>(
        &'a self,
        name: &'a str,
        options: impl Into<TransactionOptions>,
        work: F,
    ) -> BoxFuture<'a, Result<T, WorkflowError>>
    where
        T: Serialize + DeserializeOwned + Send + 'a,
        E: std::fmt::Display + Send + 'static,
        F: for<'t> Fn(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>> + Send + Sync + 'a;
}

impl TransactionStep for Ctx {
    fn transaction<'a, T, E, F>(
        &'a self,
        name: &'a str,
        work: F,
    ) -> BoxFuture<'a, Result<T, WorkflowError>>
    where
        T: Serialize + DeserializeOwned + Send + 'a,
        E: std::fmt::Display + Send + 'static,
        F: for<'t> Fn(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>> + Send + Sync + 'a,
    {
        self.transaction_with(name, TransactionOptions::new(), work)
    }

    fn transaction_with<'a, T, E, F>(
        &'a self,
        name: &'a str,
        options: impl Into<TransactionOptions>,
        work: F,
    ) -> BoxFuture<'a, Result<T, WorkflowError>>
    where
        T: Serialize + DeserializeOwned + Send + 'a,
        E: std::fmt::Display + Send + 'static,
        F: for<'t> Fn(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>> + Send + Sync + 'a,
    {
        let TransactionOptions { isolation, retry } = options.into();
        Box::pin(async move {
            let store = pg_store(self, name)?;
            let (store, work) = (&store, &work);
            match &retry {
                None => {
                    self.step_journaled_by(name, |journal| run(store, journal, isolation, work))
                        .await
                }
                Some(policy) => {
                    self.step_journaled_with(name, policy, |journal| {
                        run(store, journal, isolation, work)
                    })
                    .await
                }
            }
        })
    }
}

/// The run's store as the Postgres store a transaction step needs.
fn pg_store(ctx: &Ctx, step: &str) -> Result<PgStore, WorkflowError> {
    keiro_journal::store::run_store(ctx)
        .as_any()
        .and_then(|any| any.downcast_ref::<PgStore>())
        .cloned()
        .ok_or_else(|| WorkflowError::Unsupported {
            step: step.to_owned(),
            reason: format!(
                "a transaction step needs the Postgres store; this run's store is {:?}",
                keiro_journal::store::run_store(ctx)
            ),
        })
}

/// How one try of a transaction step ended.
enum Tried<E> {
    /// For good: what the attempt reports.
    Done(Result<SelfJournaled, SelfJournalError<E>>),
    /// A serialization failure or deadlock: the transaction may be tried again.
    Conflict(TransactionStage, Box<DbError>),
}

/// One attempt of a transaction step: tries its transaction until one try ends for good, or
/// serialization failures and deadlocks have used [`SERIALIZATION_TRIES_MAX`] tries.
async fn run<T, E, F>(
    store: &PgStore,
    journal: StepJournal<'_>,
    isolation: IsolationLevel,
    work: &F,
) -> Result<SelfJournaled, SelfJournalError<E>>
where
    T: Serialize,
    E: 'static,
    F: for<'t> Fn(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        let (stage, error) = match try_once(store, &journal, isolation, work).await {
            Tried::Done(done) => return done,
            Tried::Conflict(stage, error) => (stage, error),
        };
        if tries >= SERIALIZATION_TRIES_MAX {
            let failure = TransactionFailure::new(stage, &error, tries);
            return Err(SelfJournalError::Failed(Box::new(failure)));
        }
        tracing::debug!(
            keiro.workflow.step = journal.step(),
            code = error.code().code(),
            tries,
            "transaction step met a serialization failure or deadlock; trying again"
        );
        tokio::time::sleep(conflict_backoff(tries)).await;
    }
}

/// The wait after `tries` tries that met serialization failures or deadlocks.
fn conflict_backoff(tries: u32) -> Duration {
    let doubled = SERIALIZATION_BACKOFF_INITIAL
        .saturating_mul(1 << tries.saturating_sub(1).min(16))
        .min(SERIALIZATION_BACKOFF_MAX);
    doubled.mul_f64(1.0 - 0.5 * keiro_journal::store::unit_random())
}

/// One try: a transaction on a lent connection, which goes back to the pool reset.
async fn try_once<T, E, F>(
    store: &PgStore,
    journal: &StepJournal<'_>,
    isolation: IsolationLevel,
    work: &F,
) -> Tried<E>
where
    T: Serialize,
    E: 'static,
    F: for<'t> Fn(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
{
    let mut client = match store.client(OPERATION).await {
        Ok(client) => Lent::new(client),
        Err(error) => return Tried::Done(Err(SelfJournalError::Store(error))),
    };
    let tried = {
        // From here until the transaction ends the heartbeat renews nothing: the row is (about
        // to be) locked by this transaction, which keeps every other writer out.
        let _held = journal.hold_lease();
        transact(store, &mut client, journal, isolation, work).await
    };
    client.give_back(store.db(), store.session_reset()).await;
    tried
}

/// The transaction of one try. Every way out drops the transaction before the connection is
/// reset: dropped uncommitted, it queues its `ROLLBACK` ahead of the reset.
async fn transact<T, E, F>(
    store: &PgStore,
    client: &mut deadpool_postgres::Object,
    journal: &StepJournal<'_>,
    isolation: IsolationLevel,
    work: &F,
) -> Tried<E>
where
    T: Serialize,
    E: 'static,
    F: for<'t> Fn(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
{
    let tx = match client
        .build_transaction()
        .isolation_level(isolation)
        .start()
        .await
    {
        Ok(tx) => tx,
        Err(error) => return Tried::Done(Err(database(error))),
    };
    store.count_round_trips(1);
    if let Some(done) = hold(store, &tx, journal).await {
        return done;
    }
    // An error or a panic drops `tx`, which rolls it back.
    let value = match work(&tx).await {
        Ok(value) => value,
        Err(error) => {
            return match conflict_in(&error) {
                Some(conflict) => Tried::Conflict(TransactionStage::Statement, conflict),
                None => Tried::Done(Err(SelfJournalError::Action(error))),
            }
        }
    };
    let append = match journal.append_for(&value) {
        Ok(append) => append,
        Err(refused) => return Tried::Done(Err(SelfJournalError::Refused(refused))),
    };
    let json = match &append.event {
        Event::StepRecorded { result, .. } => result.clone(),
        _ => unreachable!("append_for makes a step's append"),
    };
    // The handle's payload codec, when the run's store applies one: the row is sealed as the
    // store's own appends are, and a value recorded already is opened.
    let codec = journal.payload_codec();
    let mut stored = append.event.encode();
    if let Some(codec) = &codec {
        match codec.seal(&stored.payload) {
            Ok(sealed) => stored.payload = sealed,
            Err(source) => {
                return Tried::Done(Err(SelfJournalError::Store(StoreError::Codec {
                    operation: OPERATION,
                    source,
                })))
            }
        }
    }
    let args = AppendArgs::new(&append, stored);
    // Qualified by keiro's schema: the session's search_path is now the application's.
    let sql = format!(
        "SELECT outcome, recorded, marker \
         FROM \"{}\".keiro_journal_append_to($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        store.schema()
    );
    let row = match tx.prepare_cached(&sql).await {
        Ok(statement) => tx.query_one(&statement, &args.params()).await,
        Err(error) => Err(error),
    };
    store.count_round_trips(1);
    let row = match row {
        Ok(row) => row,
        Err(error) => return refused(TransactionStage::Append, error),
    };
    let outcome = match append_outcome(&row, OPERATION, &append.key, append.fence.as_ref()) {
        Ok(AppendOutcome::AlreadyPresent(recorded)) if codec.is_some() => {
            let codec = codec.as_deref().expect("checked");
            match keiro_journal::codec::open_all(codec, recorded) {
                Ok(opened) => AppendOutcome::AlreadyPresent(opened),
                Err(source) => {
                    return Tried::Done(Err(SelfJournalError::Store(StoreError::Codec {
                        operation: OPERATION,
                        source,
                    })))
                }
            }
        }
        Ok(outcome) => outcome,
        Err(error) => return Tried::Done(Err(SelfJournalError::Store(error))),
    };
    if outcome == AppendOutcome::Appended {
        store.count_round_trips(1);
        if let Err(error) = tx.commit().await {
            return refused(TransactionStage::Commit, error);
        }
    }
    // Otherwise another holder journaled the step, or the run is closed: its effects, or none,
    // stand, and `tx` is dropped, rolled back.
    Tried::Done(Ok(SelfJournaled {
        value: json,
        outcome,
    }))
}

/// Locks the instance row and checks the run's fence, before the closure's first statement
/// (see the module docs); the application's search_path is set in the same round trip.
/// `None` when the row is held and the fence good.
async fn hold<E>(
    store: &PgStore,
    tx: &deadpool_postgres::Transaction<'_>,
    journal: &StepJournal<'_>,
) -> Option<Tried<E>> {
    let sql = format!(
        "SELECT outcome, row_status FROM \"{}\".keiro_instance_hold($1, $2, $3, $4)",
        store.schema()
    );
    let key = journal.key();
    let fence = journal.fence();
    let (owner, epoch) = (fence.map(|f| f.owner.as_str()), fence.map(|f| f.epoch));
    let held = async {
        let statement = tx.prepare_cached(&sql).await?;
        tx.query_one(
            &statement,
            &[&key.name.as_str(), &key.id.as_str(), &owner, &epoch],
        )
        .await
    };
    // Sent together: neither waits for the other's answer.
    let (path, held) = tokio::join!(tx.batch_execute(APP_SEARCH_PATH), held);
    store.count_round_trips(2);
    let row = match path.and(held) {
        Ok(row) => row,
        Err(error) => {
            return Some(match error.as_db_error() {
                Some(db) if is_conflict(db.code()) => {
                    Tried::Conflict(TransactionStage::Hold, Box::new(db.clone()))
                }
                _ => Tried::Done(Err(database(error))),
            })
        }
    };
    match hold_outcome(&row, journal) {
        Ok(None) => None,
        Ok(Some(marker)) => Some(Tried::Done(Ok(SelfJournaled {
            // As an append on a closed run answers: the context halts on it.
            value: Value::Null,
            outcome: AppendOutcome::RefusedTerminal(marker),
        }))),
        Err(error) => Some(Tried::Done(Err(SelfJournalError::Store(error)))),
    }
}

/// What `keiro_instance_hold` answered: nothing when the row is held, the marker of a closed
/// run, or the store error of a lost lease or a missing row.
fn hold_outcome(
    row: &tokio_postgres::Row,
    journal: &StepJournal<'_>,
) -> Result<Option<Marker>, keiro_journal::StoreError> {
    let outcome: String = column(row, "outcome", OPERATION)?;
    match (outcome.as_str(), journal.fence()) {
        ("held", _) => Ok(None),
        ("lease_lost", Some(fence)) => Err(lease_lost(journal.key(), fence)),
        ("not_found", _) => Err(not_found(journal.key())),
        ("terminal", _) => {
            let status: String = column(row, "row_status", OPERATION)?;
            Marker::parse(&status)
                .map(Some)
                .ok_or_else(|| unknown_outcome(OPERATION, &status))
        }
        (other, _) => Err(unknown_outcome(OPERATION, other)),
    }
}

/// What a refusal of the append or the commit means, after the closure returned `Ok`.
fn refused<E>(stage: TransactionStage, error: tokio_postgres::Error) -> Tried<E> {
    let Some(db) = error.as_db_error() else {
        // No answer (a broken connection): a store error. A commit may have committed; the
        // next drive's journal tells.
        return Tried::Done(Err(database(error)));
    };
    match classify_code(db.code()) {
        Class::Retryable => Tried::Conflict(stage, Box::new(db.clone())),
        // No connection, or keiro's own function missing (a schema this build cannot run on):
        // a store error, nothing of the step's.
        Class::Unavailable | Class::MissingObject => Tried::Done(Err(database(error))),
        // The step's own value, refused at its append: the run fails at once, as for any step.
        Class::ValueRefused if stage == TransactionStage::Append => {
            Tried::Done(Err(database(error)))
        }
        // The server answered with an error, so nothing committed: the transaction's own
        // failure, such as an aborted transaction (25P02) or a deferred constraint (class 23).
        Class::ValueRefused | Class::Refused => Tried::Done(Err(SelfJournalError::Failed(
            Box::new(TransactionFailure::new(stage, db, 1)),
        ))),
    }
}

/// Whether a SQLSTATE is a serialization failure or a deadlock, which another try of the same
/// transaction may not meet.
fn is_conflict(code: &SqlState) -> bool {
    *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
}

/// The serialization failure or deadlock in the closure's error, when keiro can see one: the
/// error is a `tokio_postgres::Error`, or a `Box<dyn Error + Send + Sync>` whose source chain
/// holds one. Of any other type the closure's error is its own.
fn conflict_in<E: 'static>(error: &E) -> Option<Box<DbError>> {
    let any: &dyn Any = error;
    let mut cause: Option<&(dyn StdError + 'static)> =
        if let Some(error) = any.downcast_ref::<tokio_postgres::Error>() {
            Some(error)
        } else if let Some(error) = any.downcast_ref::<Box<dyn StdError + Send + Sync>>() {
            Some(&**error)
        } else {
            None
        };
    while let Some(error) = cause {
        if let Some(db) = error
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::as_db_error)
            .or_else(|| error.downcast_ref::<DbError>())
        {
            return is_conflict(db.code()).then(|| Box::new(db.clone()));
        }
        cause = error.source();
    }
    None
}

fn database<E>(error: tokio_postgres::Error) -> SelfJournalError<E> {
    SelfJournalError::Store(Failure::from(error).into_store(OPERATION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conflict_backoff_doubles_up_to_its_cap_with_jitter() {
        for tries in 1..40 {
            let wait = conflict_backoff(tries);
            let full = SERIALIZATION_BACKOFF_INITIAL
                .saturating_mul(1 << (tries - 1).min(16))
                .min(SERIALIZATION_BACKOFF_MAX);
            assert!(
                wait <= full && wait >= full / 2,
                "{tries}: {wait:?} of {full:?}"
            );
        }
    }

    #[test]
    fn failures_name_their_stage_and_keep_the_sqlstate() {
        let failure = |stage, code: &str, tries| TransactionFailure {
            stage,
            code: code.into(),
            message: "the server said so".into(),
            tries,
        };
        let aborted = failure(TransactionStage::Append, "25P02", 1).to_string();
        assert!(
            aborted.contains("left aborted") && aborted.ends_with("(SQLSTATE 25P02)"),
            "{aborted}"
        );
        let conflicts = failure(TransactionStage::Commit, "40001", 5).to_string();
        assert!(
            conflicts.contains("at the commit on each of its 5 tries"),
            "{conflicts}"
        );
        let refused = failure(TransactionStage::Commit, "23505", 1).to_string();
        assert_eq!(
            refused,
            "the database refused the transaction at the commit: the server said so \
             (SQLSTATE 23505)"
        );
    }

    #[test]
    fn a_closure_error_of_another_type_is_never_a_conflict() {
        assert!(conflict_in(&"40001".to_owned()).is_none());
        let boxed: Box<dyn StdError + Send + Sync> = "serialization failure".into();
        assert!(conflict_in(&boxed).is_none());
    }
}
