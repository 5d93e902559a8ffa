//! The demo's reads and writes on the PostgreSQL demo schema (the connection's `search_path`).
//! Instants are `clock_timestamp()`: the moment a row is written, on the database clock that
//! also stamps the journal's `recorded_at`, the timers and the awakeables.

use serde_json::Value;
use time::OffsetDateTime;
use tokio_postgres::{Client, Statement};
use uuid::Uuid;

use super::{count, Execution, InstanceRow, Nap, Progress, Push, StepRecord};
use crate::common::{open_connection, Result, ResultExt};

/// The ledger: one row per execution of a step.
const LEDGER_CREATE: &str = "CREATE TABLE demo_ledger (
    workflow_id text        NOT NULL,
    step        text        NOT NULL,
    pid         bigint      NOT NULL,
    ran_at      timestamptz NOT NULL
)";

/// The wait log: one row per wait, the awakeable a waiter announced, and when each run woke
/// from each wait.
const WAITS_CREATE: &str = "CREATE TABLE demo_waits (
    workflow_id  text        NOT NULL,
    wait         text        NOT NULL,
    awakeable_id uuid,
    announced_at timestamptz,
    woke_at      timestamptz,
    PRIMARY KEY (workflow_id, wait)
)";

const LEDGER_RECORD: &str =
    "INSERT INTO demo_ledger (workflow_id, step, pid, ran_at) VALUES ($1, $2, $3, clock_timestamp())";

const WAIT_ANNOUNCE: &str = "INSERT INTO demo_waits (workflow_id, wait, awakeable_id, announced_at)
    VALUES ($1, $2, $3, clock_timestamp())
    ON CONFLICT (workflow_id, wait) DO NOTHING";

/// `coalesce` keeps the first wake.
const WAIT_WOKE: &str = "INSERT INTO demo_waits AS w (workflow_id, wait, woke_at)
    VALUES ($1, $2, clock_timestamp())
    ON CONFLICT (workflow_id, wait) DO UPDATE SET woke_at = coalesce(w.woke_at, excluded.woke_at)";

const WOKE: &str =
    "SELECT woke_at IS NOT NULL FROM demo_waits WHERE workflow_id = $1 AND wait = $2";

/// The demo schema's connection, with the statements run at every step (or every few
/// milliseconds) prepared once, at their first use (the tables exist by then).
pub(crate) struct Pg {
    client: Client,
    prepared: tokio::sync::OnceCell<Prepared>,
}

/// The statements [`Pg`] prepares once.
struct Prepared {
    record: Statement,
    announce: Statement,
    record_wake: Statement,
    woke: Statement,
}

impl Pg {
    /// Opens a dedicated connection with the store's settings (so the demo schema is its
    /// `search_path`), outside the store's pool: its writes share no transaction with the
    /// journal.
    pub(crate) async fn open(config: &tokio_postgres::Config) -> Result<Self> {
        let client = open_connection(config)
            .await
            .context("opening the demo's connection")?;
        Ok(Self {
            client,
            prepared: tokio::sync::OnceCell::new(),
        })
    }

    async fn prepared(&self) -> Result<&Prepared> {
        self.prepared
            .get_or_try_init(|| async {
                Ok(Prepared {
                    record: prepare(&self.client, LEDGER_RECORD).await?,
                    announce: prepare(&self.client, WAIT_ANNOUNCE).await?,
                    record_wake: prepare(&self.client, WAIT_WOKE).await?,
                    woke: prepare(&self.client, WOKE).await?,
                })
            })
            .await
    }

    pub(crate) async fn create_tables(&self) -> Result<()> {
        self.client
            .batch_execute(LEDGER_CREATE)
            .await
            .context("creating the demo ledger")?;
        self.client
            .batch_execute(WAITS_CREATE)
            .await
            .context("creating the demo's wait table")
    }

    pub(crate) async fn progress(&self, workflow: &str) -> Result<Progress> {
        let row = self
            .client
            .query_one(PROGRESS, &[&workflow])
            .await
            .context("reading the demo's progress")?;
        Ok(Progress {
            steps: count(row.get(0)),
            completed: count(row.get(1)),
            broken: count(row.get(2)),
        })
    }

    pub(crate) async fn clock(&self) -> Result<OffsetDateTime> {
        Ok(self
            .client
            .query_one(CLOCK, &[])
            .await
            .context("reading the database clock")?
            .get(0))
    }

    pub(crate) async fn leased_at(
        &self,
        workflow: &str,
        at: OffsetDateTime,
    ) -> Result<Vec<String>> {
        Ok(self
            .client
            .query(LEASED_AT, &[&workflow, &at])
            .await
            .context("reading the runs in flight at the kill")?
            .iter()
            .map(|row| row.get(0))
            .collect())
    }

    pub(crate) async fn steps_of(&self, workflow: &str, ids: &[String]) -> Result<u64> {
        let steps: i64 = self
            .client
            .query_one(STEPS_OF, &[&workflow, &ids])
            .await
            .context("counting the steps of the runs in flight")?
            .get(0);
        Ok(count(steps))
    }

    pub(crate) async fn instances(&self, names: &[&str]) -> Result<Vec<InstanceRow>> {
        let rows = self
            .client
            .query(INSTANCES, &[&names])
            .await
            .context(format!("reading the instances of {names:?}"))?;
        Ok(rows
            .iter()
            .map(|row| InstanceRow {
                id: row.get(0),
                status: row.get(1),
                input: row.get::<_, Value>(2),
                output: row.get(3),
                last_error: row.get(4),
            })
            .collect())
    }

    pub(crate) async fn journal_steps(&self, workflow: &str) -> Result<Vec<StepRecord>> {
        let rows = self
            .client
            .query(JOURNAL_STEPS, &[&workflow])
            .await
            .context("reading the demo's journal")?;
        Ok(rows
            .iter()
            .map(|row| StepRecord {
                id: row.get(0),
                step: row.get(1),
                count: row.get(2),
                recorded_at: row.get(3),
            })
            .collect())
    }

    pub(crate) async fn executions(&self) -> Result<Vec<Execution>> {
        let rows = self
            .client
            .query(EXECUTIONS, &[])
            .await
            .context("reading the demo's ledger")?;
        Ok(rows
            .iter()
            .map(|row| Execution {
                id: row.get(0),
                step: row.get(1),
                pid: row.get(2),
                ran_at: row.get(3),
            })
            .collect())
    }

    pub(crate) async fn first_entries_after(
        &self,
        workflow: &str,
        ids: &[String],
        after: OffsetDateTime,
    ) -> Result<Vec<(String, OffsetDateTime)>> {
        Ok(self
            .client
            .query(FIRST_ENTRIES_AFTER, &[&workflow, &ids, &after])
            .await
            .context("reading the recovery of the interrupted runs")?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect())
    }

    pub(crate) async fn unfinished(&self, name: &str) -> Result<u64> {
        let unfinished: i64 = self
            .client
            .query_one(UNFINISHED, &[&name])
            .await
            .context(format!("counting unfinished {name} runs"))?
            .get(0);
        Ok(count(unfinished))
    }

    pub(crate) async fn parked_waiters(
        &self,
        name: &str,
        wait: &str,
    ) -> Result<Vec<(String, Uuid)>> {
        Ok(self
            .client
            .query(PARKED_WAITERS, &[&name, &wait])
            .await
            .context("reading the parked waiters")?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect())
    }

    pub(crate) async fn woke(&self, id: &str, wait: &str) -> Result<bool> {
        Ok(self
            .client
            .query_opt(&self.prepared().await?.woke, &[&id, &wait])
            .await
            .context(format!("reading the wake of {id}"))?
            .is_some_and(|row| row.get::<_, bool>(0)))
    }

    pub(crate) async fn naps(&self, sleeper: &str, workflow: &str) -> Result<Vec<Nap>> {
        let rows = self
            .client
            .query(NAPS, &[&sleeper, &workflow])
            .await
            .context("reading the sleepers' timers")?;
        Ok(rows
            .iter()
            .map(|row| Nap {
                id: row.get(0),
                step: row.get(1),
                lag_ms: row.get(2),
                busy: row.get::<_, Option<bool>>(3).unwrap_or(false),
            })
            .collect())
    }

    pub(crate) async fn pushes(&self, wait: &str) -> Result<Vec<Push>> {
        let rows = self
            .client
            .query(PUSHES, &[&wait])
            .await
            .context("reading the waiters' awakeables")?;
        Ok(rows
            .iter()
            .map(|row| Push {
                id: row.get(0),
                status: row.get(1),
                latency_ms: row.get(2),
            })
            .collect())
    }

    pub(crate) async fn record_execution(&self, id: &str, step: &str, pid: i64) -> Result<()> {
        self.client
            .execute(&self.prepared().await?.record, &[&id, &step, &pid])
            .await
            .map(drop)
            .map_err(Into::into)
    }

    pub(crate) async fn announce(&self, id: &str, wait: &str, awakeable: Uuid) -> Result<()> {
        self.client
            .execute(&self.prepared().await?.announce, &[&id, &wait, &awakeable])
            .await
            .map(drop)
            .map_err(Into::into)
    }

    pub(crate) async fn record_wake(&self, id: &str, wait: &str) -> Result<()> {
        self.client
            .execute(&self.prepared().await?.record_wake, &[&id, &wait])
            .await
            .map(drop)
            .map_err(Into::into)
    }
}

async fn prepare(client: &Client, sql: &str) -> Result<Statement> {
    client
        .prepare(sql)
        .await
        .context("preparing a statement of the demo")
}

const PROGRESS: &str = "SELECT
    (SELECT count(*) FROM journal WHERE workflow_name = $1 AND kind = 'step'),
    (SELECT count(*) FROM workflows WHERE workflow_name = $1 AND status = 'completed'),
    (SELECT count(*) FROM workflows WHERE workflow_name = $1 AND status IN ('failed', 'cancelled'))";

const CLOCK: &str = "SELECT clock_timestamp()";

/// Runs a worker held a live lease on.
const LEASED_AT: &str = "SELECT workflow_id FROM workflows
    WHERE workflow_name = $1 AND status IN ('running', 'suspended')
      AND lease_owner IS NOT NULL AND lease_expires_at > $2
    ORDER BY workflow_id";

const STEPS_OF: &str =
    "SELECT count(*) FROM journal WHERE workflow_name = $1 AND workflow_id = ANY($2) AND kind = 'step'";

const INSTANCES: &str = "SELECT workflow_id, status, input, output, last_error FROM workflows
    WHERE workflow_name = ANY($1)";

const JOURNAL_STEPS: &str = "SELECT workflow_id, step_name, count(*), min(recorded_at) FROM journal
    WHERE workflow_name = $1 AND kind = 'step'
    GROUP BY workflow_id, step_name";

const EXECUTIONS: &str = "SELECT workflow_id, step, pid, ran_at FROM demo_ledger";

const FIRST_ENTRIES_AFTER: &str = "SELECT workflow_id, min(recorded_at) FROM journal
    WHERE workflow_name = $1 AND workflow_id = ANY($2) AND recorded_at > $3
    GROUP BY workflow_id";

const UNFINISHED: &str =
    "SELECT count(*) FROM workflows WHERE workflow_name = $1 AND status IN ('running', 'suspended')";

const PARKED_WAITERS: &str = "SELECT w.workflow_id, d.awakeable_id
    FROM workflows w JOIN demo_waits d ON d.workflow_id = w.workflow_id AND d.wait = $2
    WHERE w.workflow_name = $1 AND w.status = 'suspended' AND d.awakeable_id IS NOT NULL";

/// Each nap's timer, joined with the wake its run stamped after it, and whether its deadline
/// came before the last crash workflow completed (while a worker was busy with them).
const NAPS: &str = "SELECT t.workflow_id, t.step,
    extract(epoch FROM d.woke_at - t.fire_at)::float8 * 1000,
    t.fire_at <= (SELECT max(completed_at) FROM workflows WHERE workflow_name = $2)
  FROM timers t
  LEFT JOIN demo_waits d ON d.workflow_id = t.workflow_id AND t.step = 'sleep:' || d.wait
  WHERE t.workflow_name = $1";

/// Each announced awakeable, joined with its settlement and the wake its run stamped.
const PUSHES: &str = "SELECT d.workflow_id, a.status,
    extract(epoch FROM d.woke_at - a.settled_at)::float8 * 1000
  FROM demo_waits d LEFT JOIN awakeables a ON a.id = d.awakeable_id
  WHERE d.wait = $1";
