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
//!
//! Each row also keeps, read in the statement that writes it, the expiry the run's lease had
//! then if the lease was still the holder's (its epoch): the latest the slot the step ran under
//! could last had the worker died at once. Under `--profile queue` a local step also stamps its
//! row's `ended_at` once its work is done ([`Witness::end`]): the queue invariants measure from
//! these how many runs were in a step at once.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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
    written_at    INTEGER NOT NULL,
    lease_expires_at INTEGER,
    ended_at      INTEGER
)";

/// The SQLite twin of the PostgreSQL record; `written_at` is bound, read inside the
/// transaction (which holds the file's write lock, so the lease read is the latest).
const WITNESS_RECORD_SQLITE: &str = "INSERT INTO chaos_witness
    (workflow_name, workflow_id, generation, step, pid, holder, epoch, written_at,
     lease_expires_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8,
            (SELECT w.lease_expires_at FROM workflows w
             WHERE w.workflow_name = ?1 AND w.workflow_id = ?2 AND w.lease_epoch = ?7))
    RETURNING seq, lease_expires_at";

/// The SQLite twin of [`WITNESS_END`].
const WITNESS_END_SQLITE: &str = "UPDATE chaos_witness SET ended_at = ?2 WHERE seq = ?1";

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
    written_at    timestamptz NOT NULL,
    lease_expires_at timestamptz,
    ended_at      timestamptz
)";

/// `clock_timestamp()`, not `now()`: the moment the row was written, on the database clock that
/// also stamps the journal's `recorded_at`, so the two compare. The lease is read by the same
/// statement, from a snapshot taken as it starts: after the append (or claim) that last renewed
/// it, which committed before the step began.
const WITNESS_RECORD: &str = "INSERT INTO chaos_witness
    (workflow_name, workflow_id, generation, step, pid, holder, epoch, written_at,
     lease_expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, clock_timestamp(),
            (SELECT w.lease_expires_at FROM workflows w
             WHERE w.workflow_name = $1 AND w.workflow_id = $2 AND w.lease_epoch = $7))
    RETURNING seq, written_at, lease_expires_at";

/// Stamps the end of a step's work on the database clock.
const WITNESS_END: &str = "UPDATE chaos_witness SET ended_at = clock_timestamp() WHERE seq = $1";

/// The pause between two tries of a step's end witness.
const END_RETRY: Duration = Duration::from_millis(50);

/// How long past the lease's expiry a step keeps trying to write its end witness: the step
/// must not give up (and crash its run, which gives its slot back) before the lease it began
/// under could have expired, since the checks count an unended step until then.
const END_MARGIN: Duration = Duration::from_millis(200);

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

/// A witness row just written: its id, and how long the run's lease had left when it was
/// written (on the database clock), or `None` when the lease was no longer the holder's (or the
/// step holds no lease: a remote one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Begun {
    seq: i64,
    lease_left: Option<Duration>,
    /// When the row was known written, on this process's clock.
    written: Instant,
}

impl Begun {
    fn new(seq: i64, lease_left: Option<time::Duration>) -> Self {
        Self {
            seq,
            lease_left: lease_left.map(|left| left.try_into().unwrap_or(Duration::ZERO)),
            written: Instant::now(),
        }
    }

    /// Until when, on this process's clock, the step may keep trying to write its end: past the
    /// latest its lease could have expired (the row was written no later than `written`, so
    /// `written + lease_left` is no earlier than the expiry), by [`END_MARGIN`]. Once, with no
    /// lease of its own.
    fn end_deadline(&self) -> Instant {
        self.lease_left
            .map_or(self.written, |left| self.written + left + END_MARGIN)
    }
}

/// A process's witness connection, to the store's database.
pub(crate) struct Witness {
    conn: Conn,
    ends: bool,
}

enum Conn {
    /// A PostgreSQL connection, reopened when a restart dropped it (boxed: its configuration
    /// is large).
    Pg(Box<PgWitness>),
    /// A connection to the SQLite file.
    Sqlite(SqliteWitness),
}

impl Witness {
    /// Opens the witness connection to PostgreSQL with the store's settings (so the chaos
    /// schema is its `search_path`); `ends`: local steps stamp their end ([`Self::end`]).
    pub(crate) async fn postgres(config: &tokio_postgres::Config, ends: bool) -> Result<Self> {
        Ok(Self {
            conn: Conn::Pg(Box::new(PgWitness::open(config).await?)),
            ends,
        })
    }

    /// Opens the witness connection to the SQLite file at `path`; `ends` as for
    /// [`Self::postgres`].
    pub(crate) async fn sqlite(path: &Path, ends: bool) -> Result<Self> {
        let path = path.to_owned();
        let conn = tokio::task::spawn_blocking(move || open_sqlite(&path))
            .await
            .context("opening the witness connection")??;
        Ok(Self {
            conn: Conn::Sqlite(SqliteWitness {
                conn: Arc::new(Mutex::new(conn)),
                pid: i64::from(std::process::id()),
            }),
            ends,
        })
    }

    /// Whether local steps stamp their end (`--profile queue`).
    pub(crate) fn records_ends(&self) -> bool {
        self.ends
    }

    /// Records one execution of `step` of `key` by `holder`. One attempt: a failure fails the
    /// step, which runs again later, like any side effect whose service was unreachable.
    pub(crate) async fn record(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
        holder: &Holder,
    ) -> Result<Begun> {
        match &self.conn {
            Conn::Pg(witness) => witness.record(key, generation, step, holder).await,
            Conn::Sqlite(witness) => witness.record(key, generation, step, holder).await,
        }
    }

    /// Stamps the end of the step `begun` recorded, trying again while the lease it began under
    /// may still hold its slot. Giving up earlier would fail the step and crash its run, which
    /// gives the slot back before the expiry the checks count an unended step to, and another
    /// run could then be admitted inside what they count as this one's step.
    pub(crate) async fn end(&self, begun: &Begun) -> Result<()> {
        let deadline = begun.end_deadline();
        loop {
            let ended = match &self.conn {
                Conn::Pg(witness) => witness.end(begun.seq).await,
                Conn::Sqlite(witness) => witness.end(begun.seq).await,
            };
            match ended {
                Ok(()) => return Ok(()),
                Err(error) if Instant::now() >= deadline => return Err(error),
                Err(_) => tokio::time::sleep(END_RETRY).await,
            }
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

/// Now on the host's wall clock, in the store's microseconds.
fn micros_now() -> i64 {
    i64::try_from(OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000).unwrap_or(i64::MAX)
}

/// Runs `write` in a `BEGIN IMMEDIATE` transaction (so under the file's write lock) with the
/// instant read once the lock is held, and commits it, or rolls it back on an error.
fn under_write_lock<T>(
    conn: &rusqlite::Connection,
    write: impl FnOnce(&rusqlite::Connection, i64) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    // Read under the write lock: after every transaction committed before this one.
    match write(conn, micros_now()) {
        Ok(value) => {
            conn.execute_batch("COMMIT")?;
            Ok(value)
        }
        Err(error) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(error)
        }
    }
}

impl SqliteWitness {
    async fn record(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
        holder: &Holder,
    ) -> Result<Begun> {
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
        let (seq, left) = tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            under_write_lock(&conn, |conn, written_at| {
                let (seq, lease): (i64, Option<i64>) =
                    conn.prepare_cached(WITNESS_RECORD_SQLITE)?.query_row(
                        rusqlite::params![
                            row.0, row.1, row.2, row.3, row.4, row.5, row.6, written_at
                        ],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )?;
                Ok((seq, lease.map(|lease| lease.saturating_sub(written_at))))
            })
        })
        .await
        .context("writing a witness")?
        .context("writing a witness")?;
        Ok(Begun::new(seq, left.map(time::Duration::microseconds)))
    }

    async fn end(&self, seq: i64) -> Result<()> {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            under_write_lock(&conn, |conn, ended_at| {
                conn.prepare_cached(WITNESS_END_SQLITE)?
                    .execute(rusqlite::params![seq, ended_at])
                    .map(drop)
            })
        })
        .await
        .context("ending a witness")?
        .context("ending a witness")
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
    end: Statement,
}

impl Connection {
    async fn open(config: &tokio_postgres::Config) -> crate::common::Result<Self> {
        let client = open_connection(config).await?;
        let record = client.prepare(WITNESS_RECORD).await?;
        let end = client.prepare(WITNESS_END).await?;
        Ok(Self {
            client,
            record,
            end,
        })
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
    ) -> crate::common::Result<Begun> {
        let connection = self.connection().await?;
        let row = connection
            .client
            .query_one(
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
        let written_at: OffsetDateTime = row.get(1);
        let lease: Option<OffsetDateTime> = row.get(2);
        Ok(Begun::new(
            row.get(0),
            lease.map(|lease| lease - written_at),
        ))
    }

    /// Stamps the end of witness `seq`, after reopening a closed connection.
    async fn end(&self, seq: i64) -> crate::common::Result<()> {
        let connection = self.connection().await?;
        connection.client.execute(&connection.end, &[&seq]).await?;
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
