//! The witness table: one row per execution of a step, written by the step itself on a
//! connection of its own, outside the journal and its transactions.
//!
//! A witness is the outside world's view of a side effect (the payment, the e-mail): it is
//! committed before the step's action returns, so before the append or report that journals the
//! step's result begins. The invariants compare witnesses against the journal.
//!
//! On PostgreSQL the table is in the chaos schema, stamped by the database clock; on SQLite it
//! is in the store's file, stamped by the host's wall clock inside the witness's own
//! `BEGIN IMMEDIATE` transaction, so while it holds the file's write lock, as the store's writer
//! stamps the journal: the two stamps order as the transactions do.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keiro::{store::Generation, Ctx, InstanceKey};
use time::OffsetDateTime;
use tokio_postgres::{Client, Statement};

use crate::common::{open_connection, Result, ResultExt};

/// How long a SQLite witness waits for the file's write lock, which the workers' writers take
/// in turn: long, since a witness that fails fails its step, which then runs again.
pub(crate) const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Creates the witness table in the SQLite file.
pub(crate) const WITNESS_CREATE_SQLITE: &str = "CREATE TABLE chaos_witness (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_name TEXT    NOT NULL,
    workflow_id   TEXT    NOT NULL,
    generation    INTEGER NOT NULL,
    step          TEXT    NOT NULL,
    pid           INTEGER NOT NULL,
    holder        TEXT    NOT NULL,
    epoch         INTEGER,
    written_at    INTEGER NOT NULL
)";

/// The SQLite twin of the PostgreSQL record; `written_at` is bound, read inside the
/// transaction.
const WITNESS_RECORD_SQLITE: &str = "INSERT INTO chaos_witness
    (workflow_name, workflow_id, generation, step, pid, holder, epoch, written_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";

/// Creates the witness table in the chaos schema (the connection's `search_path`).
pub(crate) const WITNESS_CREATE_PG: &str = "CREATE TABLE chaos_witness (
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

/// A process's witness connection, to the store's database.
pub(crate) enum Witness {
    /// A PostgreSQL connection, reopened when a restart dropped it (boxed: its configuration
    /// is large).
    Pg(Box<PgWitness>),
    /// A connection to the SQLite file.
    Sqlite(SqliteWitness),
}

impl Witness {
    /// Opens the witness connection to PostgreSQL with the store's settings (so the chaos
    /// schema is its `search_path`).
    pub(crate) async fn postgres(config: &tokio_postgres::Config) -> Result<Self> {
        Ok(Self::Pg(Box::new(PgWitness::open(config).await?)))
    }

    /// Opens the witness connection to the SQLite file at `path`.
    pub(crate) async fn sqlite(path: &Path) -> Result<Self> {
        let path = path.to_owned();
        let conn = tokio::task::spawn_blocking(move || open_sqlite(&path))
            .await
            .context("opening the witness connection")??;
        Ok(Self::Sqlite(SqliteWitness {
            conn: Arc::new(Mutex::new(conn)),
            pid: i64::from(std::process::id()),
        }))
    }

    /// Records one execution of `step` of `key` by `holder`. One attempt: a failure fails the
    /// step, which runs again later, like any side effect whose service was unreachable.
    pub(crate) async fn record(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
        holder: &Holder,
    ) -> Result<()> {
        match self {
            Self::Pg(witness) => witness.record(key, generation, step, holder).await,
            Self::Sqlite(witness) => witness.record(key, generation, step, holder).await,
        }
    }
}

/// Opens a connection of the chaos command's own to the SQLite file at `path`: the witnesses'
/// busy timeout, and `synchronous = NORMAL` (in WAL mode a commit survives the process being
/// killed, the one crash the run injects on SQLite; the store's own commits stay FULL).
pub(crate) fn open_sqlite(path: &Path) -> Result<rusqlite::Connection> {
    crate::lite::open(path, WHO, SQLITE_BUSY_TIMEOUT)
}

/// Who opens the chaos run's connections, in their errors.
pub(crate) const WHO: &str = "the chaos witnesses";

/// The witness connection of a process on SQLite.
pub(crate) struct SqliteWitness {
    conn: Arc<Mutex<rusqlite::Connection>>,
    pid: i64,
}

impl SqliteWitness {
    async fn record(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
        holder: &Holder,
    ) -> Result<()> {
        let conn = Arc::clone(&self.conn);
        let row = (
            key.name.as_str().to_owned(),
            key.id.as_str().to_owned(),
            generation,
            step.to_owned(),
            self.pid,
            holder.name.clone(),
            holder.epoch,
        );
        tokio::task::spawn_blocking(move || -> rusqlite::Result<()> {
            let conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            conn.execute_batch("BEGIN IMMEDIATE")?;
            // Read under the write lock: after every transaction committed before this one.
            let written_at = OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000;
            let written_at = i64::try_from(written_at).unwrap_or(i64::MAX);
            let inserted = conn
                .prepare_cached(WITNESS_RECORD_SQLITE)
                .and_then(|mut insert| {
                    insert.execute(rusqlite::params![
                        row.0, row.1, row.2, row.3, row.4, row.5, row.6, written_at
                    ])
                });
            match inserted {
                Ok(_) => conn.execute_batch("COMMIT"),
                Err(error) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    Err(error)
                }
            }
        })
        .await
        .context("writing a witness")?
        .context("writing a witness")
    }
}

/// One witness connection per process, reopened when PostgreSQL dropped it.
pub(crate) struct PgWitness {
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

impl PgWitness {
    /// Opens the witness connection with the store's settings (so the chaos schema is its
    /// `search_path`).
    async fn open(config: &tokio_postgres::Config) -> Result<Self> {
        let mut config = config.clone();
        config.connect_timeout(RECONNECT_TIMEOUT);
        let connection = Connection::open(&config).await?;
        Ok(Self {
            config,
            pid: i64::from(std::process::id()),
            connection: tokio::sync::Mutex::new(Some(Arc::new(connection))),
        })
    }

    /// Records one execution, after reopening a connection an earlier restart closed.
    async fn record(
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
