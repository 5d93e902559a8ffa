//! The witness table: one row per execution of a step, written by the step itself on a
//! connection of its own, outside the journal and its transactions.
//!
//! A witness is the outside world's view of a side effect (the payment, the e-mail): it is
//! committed before the step's action returns, so before the append or report that journals the
//! step's result begins. The invariants compare witnesses against the journal.

use std::sync::Arc;
use std::time::Duration;

use keiro::{store::Generation, Ctx, InstanceKey};
use tokio_postgres::{Client, Statement};

use crate::common::open_connection;

/// Creates the witness table in the chaos schema (the connection's `search_path`).
pub(crate) const WITNESS_CREATE: &str = "CREATE TABLE chaos_witness (
    seq           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_name text        NOT NULL,
    workflow_id   text        NOT NULL,
    generation    integer     NOT NULL,
    step          text        NOT NULL,
    pid           bigint      NOT NULL,
    holder        text        NOT NULL,
    epoch         bigint,
    written_at    timestamptz NOT NULL
)";

/// `clock_timestamp()`, not `now()`: the moment the row was written, on the database clock that
/// also stamps the journal's `recorded_at`, so the two compare.
const WITNESS_RECORD: &str = "INSERT INTO chaos_witness
    (workflow_name, workflow_id, generation, step, pid, holder, epoch, written_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp())";

/// How long reopening a dropped witness connection may take. Short: while PostgreSQL restarts
/// a step must fail fast rather than write its witness seconds late, when its lease may be
/// gone (a late write is exactly what the stale-holder invariant looks for).
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Who executed a step: the lease (owner and epoch) a worker ran it under, or the claim
/// (remote worker, attempt, dispatch) a remote worker ran it under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    /// A readable identity, as stored.
    pub(crate) name: String,
    /// The lease epoch, for local steps; remote claims have none.
    pub(crate) epoch: Option<i64>,
}

impl Holder {
    /// The lease `ctx` runs under (an unfenced run, which the chaos workers never make, shows
    /// as `unfenced`).
    pub(crate) fn of_run(ctx: &Ctx) -> Self {
        match &ctx.options().fence {
            Some(fence) => Self {
                name: format!("{}#{}", fence.owner, fence.epoch),
                epoch: Some(fence.epoch),
            },
            None => Self {
                name: "unfenced".to_owned(),
                epoch: None,
            },
        }
    }

    /// A remote worker's claim of a task.
    pub(crate) fn of_task(worker: &str, task: &keiro::remote::TaskContext) -> Self {
        Self {
            name: format!(
                "{worker}/attempt {}/dispatch {}",
                task.attempt, task.dispatches
            ),
            epoch: None,
        }
    }
}

/// One witness connection per process, reopened when PostgreSQL dropped it.
pub(crate) struct Witness {
    config: tokio_postgres::Config,
    pid: i64,
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
}

struct Connection {
    client: Client,
    record: Statement,
}

impl Connection {
    async fn open(config: &tokio_postgres::Config) -> crate::common::Result<Self> {
        let client = open_connection(config).await?;
        let record = client.prepare(WITNESS_RECORD).await?;
        Ok(Self { client, record })
    }
}

impl Witness {
    /// Opens the witness connection with the store's settings (so the chaos schema is its
    /// `search_path`).
    pub(crate) async fn open(config: &tokio_postgres::Config) -> crate::common::Result<Self> {
        let mut config = config.clone();
        config.connect_timeout(RECONNECT_TIMEOUT);
        let connection = Connection::open(&config).await?;
        Ok(Self {
            config,
            pid: i64::from(std::process::id()),
            connection: tokio::sync::Mutex::new(Some(Arc::new(connection))),
        })
    }

    /// Records one execution of `step` of `key` by `holder`. One attempt (after reopening a
    /// connection an earlier restart closed): a failure fails the step, which runs again later,
    /// like any side effect whose service was unreachable.
    pub(crate) async fn record(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
        holder: &Holder,
    ) -> crate::common::Result<()> {
        let connection = self.connection().await?;
        connection
            .client
            .execute(
                &connection.record,
                &[
                    &key.name.as_str(),
                    &key.id.as_str(),
                    &generation,
                    &step,
                    &self.pid,
                    &holder.name,
                    &holder.epoch,
                ],
            )
            .await?;
        Ok(())
    }

    async fn connection(&self) -> crate::common::Result<Arc<Connection>> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            if !connection.client.is_closed() {
                return Ok(Arc::clone(connection));
            }
        }
        *slot = None;
        let connection = Arc::new(Connection::open(&self.config).await?);
        *slot = Some(Arc::clone(&connection));
        Ok(connection)
    }
}
