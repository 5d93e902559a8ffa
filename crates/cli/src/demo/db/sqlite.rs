//! The demo's reads and writes on the SQLite store's file, through a connection of the demo's
//! own (outside the store's writer: the ledger shares no transaction with the journal).
//! Instants are microseconds since the Unix epoch on the host's wall clock, as the store keeps
//! them; lists are bound as one JSON array (`json_each`).

use std::path::Path;
use std::time::Duration;

use rusqlite::{params, OptionalExtension};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{count, Execution, InstanceRow, Nap, Progress, Push, StepRecord};
use crate::common::{replace_scratch_file, Result, ResultExt};
use crate::lite::{self, instant, json};

/// How long a demo write waits for the store's write lock (its writer commits in batches).
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const TABLES_CREATE: &str = "CREATE TABLE demo_ledger (
    workflow_id TEXT    NOT NULL,
    step        TEXT    NOT NULL,
    pid         INTEGER NOT NULL,
    ran_at      INTEGER NOT NULL
);
CREATE TABLE demo_waits (
    workflow_id  TEXT    NOT NULL,
    wait         TEXT    NOT NULL,
    awakeable_id TEXT,
    announced_at INTEGER,
    woke_at      INTEGER,
    PRIMARY KEY (workflow_id, wait)
)";

/// The table that tells a demo file from someone's data.
const MARKER: &str = "demo_ledger";

/// Makes way for a fresh demo file at `path`: removes the one an earlier demo left there, and
/// refuses any other file, which may be data.
pub(crate) fn prepare_file(path: &Path) -> Result<()> {
    replace_scratch_file(path, MARKER, "demo")
}

/// The instant as the store keeps it.
fn micros(at: OffsetDateTime) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1000).unwrap_or(i64::MAX)
}

/// The JSON array `json_each` reads a list from.
fn list<T: serde::Serialize>(items: &[T]) -> String {
    serde_json::to_string(items).expect("a list of strings encodes as JSON")
}

/// The demo's connection to the file; its calls run off the async runtime, one at a time.
pub(crate) struct Lite {
    conn: lite::Lite,
}

impl Lite {
    /// Opens the file the store made. `synchronous = NORMAL` for the demo's own rows: in WAL
    /// mode a commit survives the process being killed, which is all the ledger must survive.
    pub(crate) async fn open(path: &Path) -> Result<Self> {
        Ok(Self {
            conn: lite::Lite::open(path, "the demo", BUSY_TIMEOUT).await?,
        })
    }

    /// Collects the rows of `sql` with `params`, each read by `row`.
    async fn rows<T, P, R>(
        &self,
        what: &str,
        sql: &'static str,
        params: P,
        row: R,
    ) -> Result<Vec<T>>
    where
        T: Send + 'static,
        P: rusqlite::Params + Send + 'static,
        R: FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T> + Send + 'static,
    {
        self.conn
            .call(what, move |conn| {
                conn.prepare_cached(sql)?
                    .query_map(params, row)?
                    .collect::<rusqlite::Result<Vec<T>>>()
            })
            .await
    }

    pub(crate) async fn create_tables(&self) -> Result<()> {
        self.conn
            .call("creating the demo's ledger and wait table", |conn| {
                conn.execute_batch(TABLES_CREATE)
            })
            .await
    }

    pub(crate) async fn progress(&self, workflow: &str) -> Result<Progress> {
        let workflow = workflow.to_owned();
        let (steps, completed, broken) = self
            .conn
            .call("reading the demo's progress", move |conn| {
                conn.prepare_cached(PROGRESS)?
                    .query_row(params![workflow], |row| {
                        Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                    })
            })
            .await?;
        Ok(Progress {
            steps: count(steps),
            completed: count(completed),
            broken: count(broken),
        })
    }

    pub(crate) async fn clock(&self) -> Result<OffsetDateTime> {
        Ok(OffsetDateTime::now_utc())
    }

    pub(crate) async fn leased_at(
        &self,
        workflow: &str,
        at: OffsetDateTime,
    ) -> Result<Vec<String>> {
        let params = (workflow.to_owned(), micros(at));
        self.rows(
            "reading the runs in flight at the kill",
            LEASED_AT,
            params,
            |row| row.get(0),
        )
        .await
    }

    pub(crate) async fn steps_of(&self, workflow: &str, ids: &[String]) -> Result<u64> {
        let params = (workflow.to_owned(), list(ids));
        let steps = self
            .conn
            .call("counting the steps of the runs in flight", move |conn| {
                conn.prepare_cached(STEPS_OF)?
                    .query_row(params, |row| row.get::<_, i64>(0))
            })
            .await?;
        Ok(count(steps))
    }

    pub(crate) async fn instances(&self, names: &[&str]) -> Result<Vec<InstanceRow>> {
        let what = format!("reading the instances of {names:?}");
        self.rows(&what, INSTANCES, (list(names),), |row| {
            Ok(InstanceRow {
                id: row.get(0)?,
                status: row.get(1)?,
                input: json(&row.get::<_, String>(2)?)?,
                output: row
                    .get::<_, Option<String>>(3)?
                    .map(|text| json(&text))
                    .transpose()?,
                last_error: row.get(4)?,
            })
        })
        .await
    }

    pub(crate) async fn journal_steps(&self, workflow: &str) -> Result<Vec<StepRecord>> {
        self.rows(
            "reading the demo's journal",
            JOURNAL_STEPS,
            (workflow.to_owned(),),
            |row| {
                Ok(StepRecord {
                    id: row.get(0)?,
                    step: row.get(1)?,
                    count: row.get(2)?,
                    recorded_at: instant(row.get(3)?)?,
                })
            },
        )
        .await
    }

    pub(crate) async fn executions(&self) -> Result<Vec<Execution>> {
        self.rows("reading the demo's ledger", EXECUTIONS, (), |row| {
            Ok(Execution {
                id: row.get(0)?,
                step: row.get(1)?,
                pid: row.get(2)?,
                ran_at: instant(row.get(3)?)?,
            })
        })
        .await
    }

    pub(crate) async fn first_entries_after(
        &self,
        workflow: &str,
        ids: &[String],
        after: OffsetDateTime,
    ) -> Result<Vec<(String, OffsetDateTime)>> {
        let params = (workflow.to_owned(), list(ids), micros(after));
        self.rows(
            "reading the recovery of the interrupted runs",
            FIRST_ENTRIES_AFTER,
            params,
            |row| Ok((row.get(0)?, instant(row.get(1)?)?)),
        )
        .await
    }

    pub(crate) async fn unfinished(&self, name: &str) -> Result<u64> {
        let name = name.to_owned();
        let what = format!("counting unfinished {name} runs");
        let unfinished = self
            .conn
            .call(&what, move |conn| {
                conn.prepare_cached(UNFINISHED)?
                    .query_row(params![name], |row| row.get::<_, i64>(0))
            })
            .await?;
        Ok(count(unfinished))
    }

    pub(crate) async fn parked_waiters(
        &self,
        name: &str,
        wait: &str,
    ) -> Result<Vec<(String, Uuid)>> {
        let params = (name.to_owned(), wait.to_owned());
        let rows: Vec<(String, String)> = self
            .rows(
                "reading the parked waiters",
                PARKED_WAITERS,
                params,
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .await?;
        rows.into_iter()
            .map(|(id, awakeable)| {
                let awakeable = Uuid::parse_str(&awakeable)
                    .context(format!("reading the awakeable id of {id}"))?;
                Ok((id, awakeable))
            })
            .collect()
    }

    pub(crate) async fn woke(&self, id: &str, wait: &str) -> Result<bool> {
        let params = (id.to_owned(), wait.to_owned());
        let what = format!("reading the wake of {id}");
        let woke = self
            .conn
            .call(&what, move |conn| {
                conn.prepare_cached(WOKE)?
                    .query_row(params, |row| row.get::<_, bool>(0))
                    .optional()
            })
            .await?;
        Ok(woke == Some(true))
    }

    pub(crate) async fn naps(&self, sleeper: &str, workflow: &str) -> Result<Vec<Nap>> {
        let params = (sleeper.to_owned(), workflow.to_owned());
        self.rows("reading the sleepers' timers", NAPS, params, |row| {
            Ok(Nap {
                id: row.get(0)?,
                step: row.get(1)?,
                lag_ms: row.get(2)?,
                busy: row.get::<_, Option<bool>>(3)?.unwrap_or(false),
            })
        })
        .await
    }

    pub(crate) async fn pushes(&self, wait: &str) -> Result<Vec<Push>> {
        self.rows(
            "reading the waiters' awakeables",
            PUSHES,
            (wait.to_owned(),),
            |row| {
                Ok(Push {
                    id: row.get(0)?,
                    status: row.get(1)?,
                    latency_ms: row.get(2)?,
                })
            },
        )
        .await
    }

    /// Runs the write `sql` with `params`, after stamping the wall clock into them.
    async fn write<P>(&self, what: &str, sql: &'static str, params: P) -> Result<()>
    where
        P: rusqlite::Params + Send + 'static,
    {
        self.conn
            .call(what, move |conn| {
                conn.prepare_cached(sql)?.execute(params).map(drop)
            })
            .await
    }

    /// The time is read before the write waits for the lock: the moment the step ran.
    pub(crate) async fn record_execution(&self, id: &str, step: &str, pid: i64) -> Result<()> {
        let now = micros(OffsetDateTime::now_utc());
        let params = (id.to_owned(), step.to_owned(), pid, now);
        self.write("writing the ledger", LEDGER_RECORD, params)
            .await
    }

    pub(crate) async fn announce(&self, id: &str, wait: &str, awakeable: Uuid) -> Result<()> {
        let now = micros(OffsetDateTime::now_utc());
        let params = (id.to_owned(), wait.to_owned(), awakeable.to_string(), now);
        self.write("writing the wait log", WAIT_ANNOUNCE, params)
            .await
    }

    pub(crate) async fn record_wake(&self, id: &str, wait: &str) -> Result<()> {
        let now = micros(OffsetDateTime::now_utc());
        let params = (id.to_owned(), wait.to_owned(), now);
        self.write("writing the wait log", WAIT_WOKE, params).await
    }
}

const LEDGER_RECORD: &str =
    "INSERT INTO demo_ledger (workflow_id, step, pid, ran_at) VALUES (?1, ?2, ?3, ?4)";

const WAIT_ANNOUNCE: &str = "INSERT INTO demo_waits (workflow_id, wait, awakeable_id, announced_at)
    VALUES (?1, ?2, ?3, ?4)
    ON CONFLICT (workflow_id, wait) DO NOTHING";

/// `coalesce` keeps the first wake.
const WAIT_WOKE: &str = "INSERT INTO demo_waits (workflow_id, wait, woke_at) VALUES (?1, ?2, ?3)
    ON CONFLICT (workflow_id, wait)
    DO UPDATE SET woke_at = coalesce(demo_waits.woke_at, excluded.woke_at)";

const WOKE: &str =
    "SELECT woke_at IS NOT NULL FROM demo_waits WHERE workflow_id = ?1 AND wait = ?2";

const PROGRESS: &str = "SELECT
    (SELECT count(*) FROM journal WHERE workflow_name = ?1 AND kind = 'step'),
    (SELECT count(*) FROM workflows WHERE workflow_name = ?1 AND status = 'completed'),
    (SELECT count(*) FROM workflows WHERE workflow_name = ?1 AND status IN ('failed', 'cancelled'))";

/// Runs a worker held a live lease on.
const LEASED_AT: &str = "SELECT workflow_id FROM workflows
    WHERE workflow_name = ?1 AND status IN ('running', 'suspended')
      AND lease_owner IS NOT NULL AND lease_expires_at > ?2
    ORDER BY workflow_id";

const STEPS_OF: &str = "SELECT count(*) FROM journal
    WHERE workflow_name = ?1 AND workflow_id IN (SELECT value FROM json_each(?2)) AND kind = 'step'";

const INSTANCES: &str = "SELECT workflow_id, status, input, output, last_error FROM workflows
    WHERE workflow_name IN (SELECT value FROM json_each(?1))";

const JOURNAL_STEPS: &str = "SELECT workflow_id, step_name, count(*), min(recorded_at) FROM journal
    WHERE workflow_name = ?1 AND kind = 'step'
    GROUP BY workflow_id, step_name";

const EXECUTIONS: &str = "SELECT workflow_id, step, pid, ran_at FROM demo_ledger";

const FIRST_ENTRIES_AFTER: &str = "SELECT workflow_id, min(recorded_at) FROM journal
    WHERE workflow_name = ?1 AND workflow_id IN (SELECT value FROM json_each(?2))
      AND recorded_at > ?3
    GROUP BY workflow_id";

const UNFINISHED: &str =
    "SELECT count(*) FROM workflows WHERE workflow_name = ?1 AND status IN ('running', 'suspended')";

const PARKED_WAITERS: &str = "SELECT w.workflow_id, d.awakeable_id
    FROM workflows w JOIN demo_waits d ON d.workflow_id = w.workflow_id AND d.wait = ?2
    WHERE w.workflow_name = ?1 AND w.status = 'suspended' AND d.awakeable_id IS NOT NULL";

/// Each nap's timer, joined with the wake its run stamped after it, and whether its deadline
/// came before the last crash workflow completed (while a worker was busy with them).
const NAPS: &str = "SELECT t.workflow_id, t.step,
    (d.woke_at - t.fire_at) / 1000.0,
    t.fire_at <= (SELECT max(completed_at) FROM workflows WHERE workflow_name = ?2)
  FROM timers t
  LEFT JOIN demo_waits d ON d.workflow_id = t.workflow_id AND t.step = 'sleep:' || d.wait
  WHERE t.workflow_name = ?1";

/// Each announced awakeable, joined with its settlement and the wake its run stamped.
const PUSHES: &str = "SELECT d.workflow_id, a.status, (d.woke_at - a.settled_at) / 1000.0
  FROM demo_waits d LEFT JOIN awakeables a ON a.id = d.awakeable_id
  WHERE d.wait = ?1";
