//! Exactly-once database steps: `ctx.transaction(name, |tx| ..)`.
//!
//! keiro's journal lives in the application's own database, so a step whose effects are
//! statements on that database can commit them in the same transaction as its journal row:
//! either both happen or neither. A crash before the commit leaves no trace and the step runs
//! again; a crash after it replays the journaled result and never runs the closure again; a
//! worker that lost its lease has its append refused by the run's fence and rolls back.
//!
//! The user's statements run with PostgreSQL's default `search_path` (`"$user", public`), not
//! with keiro's schema, which the store's connections otherwise use; the journal append names
//! keiro's schema itself.

use keiro_journal::{
    AppendOutcome, BoxFuture, Ctx, Event, SelfJournalError, SelfJournaled, StepJournal,
    StepOptions, WorkflowError,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_postgres::Transaction;

use crate::error::Failure;
use crate::journal::{append_outcome, AppendArgs};
use crate::PgStore;

/// The operation name store errors of a transaction step carry.
const OPERATION: &str = "transaction_step";

/// PostgreSQL's own default, for the application's statements.
const APP_SEARCH_PATH: &str = "SET LOCAL search_path TO \"$user\", public";

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
    /// Runs `work` in a transaction on the store's database and journals its result under
    /// `name` in that same transaction, so its statements take effect exactly once: on replay
    /// the journaled result is returned and no transaction is opened.
    ///
    /// `work` runs with PostgreSQL's default `search_path`; qualify your tables, or `SET LOCAL
    /// search_path` first, if they live elsewhere. An `Err` from `work`, or a panic inside it,
    /// rolls the transaction back and crashes the run, which the resume worker retries, as for a
    /// failing [`Ctx::step`]. The lease is kept alive while `work` runs; a run that lost it
    /// anyway is refused at the append and rolls back.
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
        F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>> + Send + 'a;

    /// [`transaction`](Self::transaction) under a retry policy, as
    /// [`Ctx::step_with`] runs a plain step: an `Err` from `work` (or a panic) rolls its
    /// transaction back and counts as a failed attempt, journaled; the next attempt runs in a
    /// new transaction after the policy's wait; when the attempts are spent, or the policy
    /// does not retry the error, the body gets [`WorkflowError::StepFailed`]. `work` is called
    /// once per attempt, so it is `Fn`.
    ///
    /// # Errors
    ///
    /// As [`Ctx::step_with`], and [`WorkflowError::Unsupported`] when the run's store is not a
    /// [`PgStore`].
    fn transaction_with<'a, T, E, F>(
        &'a self,
        name: &'a str,
        options: &'a StepOptions,
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
        F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>> + Send + 'a,
    {
        Box::pin(async move {
            let store = pg_store(self, name)?;
            self.step_journaled_by(name, |journal| run(store, journal, work))
                .await
        })
    }

    fn transaction_with<'a, T, E, F>(
        &'a self,
        name: &'a str,
        options: &'a StepOptions,
        work: F,
    ) -> BoxFuture<'a, Result<T, WorkflowError>>
    where
        T: Serialize + DeserializeOwned + Send + 'a,
        E: std::fmt::Display + Send + 'static,
        F: for<'t> Fn(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>> + Send + Sync + 'a,
    {
        Box::pin(async move {
            let store = pg_store(self, name)?;
            let work = &work;
            self.step_journaled_with(name, options, |journal| run(store.clone(), journal, work))
                .await
        })
    }
}

/// The run's store as the Postgres store a transaction step needs.
fn pg_store(ctx: &Ctx, step: &str) -> Result<PgStore, WorkflowError> {
    ctx.store()
        .as_any()
        .and_then(|any| any.downcast_ref::<PgStore>())
        .cloned()
        .ok_or_else(|| WorkflowError::Unsupported {
            step: step.to_owned(),
            reason: format!(
                "a transaction step needs the Postgres store; this run's store is {:?}",
                ctx.store()
            ),
        })
}

/// One fresh run of a transaction step: the user's statements, then the step's fenced append,
/// committed together only when the append was taken.
async fn run<T, E, F>(
    store: PgStore,
    journal: StepJournal<'_>,
    work: F,
) -> Result<SelfJournaled, SelfJournalError<E>>
where
    T: Serialize,
    F: for<'t> FnOnce(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, E>>,
{
    let mut client = store
        .client(OPERATION)
        .await
        .map_err(SelfJournalError::Store)?;
    let tx = client.transaction().await.map_err(database)?;
    tx.batch_execute(APP_SEARCH_PATH).await.map_err(database)?;
    store.count_round_trips(2);
    // An error or a panic drops `tx`, which rolls it back.
    let value = work(&tx).await.map_err(SelfJournalError::Action)?;
    let append = journal
        .append_for(&value)
        .map_err(SelfJournalError::Refused)?;
    let json = match &append.event {
        Event::StepRecorded { result, .. } => result.clone(),
        _ => unreachable!("append_for makes a step's append"),
    };
    let args = AppendArgs::new(&append, append.event.encode());
    // Qualified by keiro's schema: the session's search_path is now the application's.
    let sql = format!(
        "SELECT outcome, recorded, marker \
         FROM \"{}\".keiro_journal_append_to($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        store.schema()
    );
    let statement = tx.prepare_cached(&sql).await.map_err(database)?;
    let row = tx
        .query_one(&statement, &args.params())
        .await
        .map_err(database)?;
    let outcome = append_outcome(&row, OPERATION, &append.key, append.fence.as_ref())
        .map_err(SelfJournalError::Store)?;
    if outcome == AppendOutcome::Appended {
        tx.commit().await.map_err(database)?;
    } else {
        // Another holder journaled the step, or the run is closed: its effects, or none, stand.
        tx.rollback().await.map_err(database)?;
    }
    store.count_round_trips(2);
    Ok(SelfJournaled {
        value: json,
        outcome,
    })
}

fn database<E>(error: tokio_postgres::Error) -> SelfJournalError<E> {
    SelfJournalError::Store(Failure::from(error).into_store(OPERATION))
}
