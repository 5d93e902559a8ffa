//! The demo's own reads and writes, beside the store's: the side-effect ledger and the wait log
//! its workflows write, and the bulk reads of instances, journal rows, timers and awakeables
//! that verify every guarantee.
//!
//! The same questions on both stores: `pg.rs` asks them in SQL on the demo schema (one dedicated
//! connection, the schema as its `search_path`), `sqlite.rs` in SQL on the store's file (one
//! connection of the demo's own). Reading 200 instances and 1,000 journal rows in bulk is one
//! query each, where the facade would take one call per instance; and the ledger is
//! deliberately outside the store's transactions (it is the outside world).
//!
//! Every instant is on one clock: PostgreSQL's `clock_timestamp()` (which also stamps the
//! journal, the timers and the awakeables), or for a SQLite file the host's wall clock (which
//! the SQLite store reads for the same stamps).

mod pg;
mod sqlite;

use std::path::Path;

use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::common::Result;

pub(crate) use self::sqlite::prepare_file;

/// The demo's connection to the database its store runs on.
pub(crate) enum Db {
    /// The PostgreSQL demo schema (boxed: its client and statements are large, and a `Db` is
    /// moved around whole).
    Pg(Box<pg::Pg>),
    /// The SQLite file.
    Sqlite(sqlite::Lite),
}

/// Where the demo's workflows are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Progress {
    /// Step results journaled.
    pub(crate) steps: u64,
    /// Instances completed.
    pub(crate) completed: u64,
    /// Instances failed or cancelled (none should be).
    pub(crate) broken: u64,
}

/// An instance row, as the verification reads it.
#[derive(Debug, Clone)]
pub(crate) struct InstanceRow {
    /// The instance id.
    pub(crate) id: String,
    /// Its status.
    pub(crate) status: String,
    /// Its input.
    pub(crate) input: Value,
    /// Its output, once completed.
    pub(crate) output: Option<Value>,
    /// Its last error.
    pub(crate) last_error: Option<String>,
}

/// How often one step of one instance is journaled, and when first.
#[derive(Debug, Clone)]
pub(crate) struct StepRecord {
    /// The instance id.
    pub(crate) id: String,
    /// The step.
    pub(crate) step: String,
    /// Journal rows of it.
    pub(crate) count: i64,
    /// When the first was recorded.
    pub(crate) recorded_at: OffsetDateTime,
}

/// One execution of one step, from the ledger.
#[derive(Debug, Clone)]
pub(crate) struct Execution {
    /// The instance id.
    pub(crate) id: String,
    /// The step.
    pub(crate) step: String,
    /// The worker process that ran it.
    pub(crate) pid: i64,
    /// When its side effect was written.
    pub(crate) ran_at: OffsetDateTime,
}

/// One sleeper's nap: how long after its deadline its run woke.
#[derive(Debug, Clone)]
pub(crate) struct Nap {
    /// The sleeper's id.
    pub(crate) id: String,
    /// The sleep's step name.
    pub(crate) step: String,
    /// Milliseconds from the deadline to the wake (`None`: never woke).
    pub(crate) lag_ms: Option<f64>,
    /// Whether the deadline came while the crash workflows still ran.
    pub(crate) busy: bool,
}

/// One waiter's awakeable: its status and how long after its completion the run woke.
#[derive(Debug, Clone)]
pub(crate) struct Push {
    /// The waiter's id.
    pub(crate) id: String,
    /// The awakeable's status (`None`: no such awakeable).
    pub(crate) status: Option<String>,
    /// Milliseconds from the completion to the wake (`None`: never woke).
    pub(crate) latency_ms: Option<f64>,
}

/// Runs the same call on whichever store the demo is on.
macro_rules! each {
    ($db:expr, $db_var:ident => $call:expr) => {
        match $db {
            Db::Pg($db_var) => $call,
            Db::Sqlite($db_var) => $call,
        }
    };
}

impl Db {
    /// The demo schema's connection (its `search_path`), with the worker's statements prepared.
    pub(crate) async fn postgres(config: &tokio_postgres::Config) -> Result<Self> {
        Ok(Self::Pg(Box::new(pg::Pg::open(config).await?)))
    }

    /// A connection to the SQLite file at `path`, which the store has created.
    pub(crate) async fn sqlite(path: &Path) -> Result<Self> {
        Ok(Self::Sqlite(sqlite::Lite::open(path).await?))
    }

    /// Creates the ledger and the wait log.
    pub(crate) async fn create_tables(&self) -> Result<()> {
        each!(self, db => db.create_tables().await)
    }

    /// The progress counters of `workflow`.
    pub(crate) async fn progress(&self, workflow: &str) -> Result<Progress> {
        each!(self, db => db.progress(workflow).await)
    }

    /// The clock that stamps the journal and the ledger, now.
    pub(crate) async fn clock(&self) -> Result<OffsetDateTime> {
        each!(self, db => db.clock().await)
    }

    /// The ids of `workflow`'s runs whose lease was live at `at`, in id order.
    pub(crate) async fn leased_at(
        &self,
        workflow: &str,
        at: OffsetDateTime,
    ) -> Result<Vec<String>> {
        each!(self, db => db.leased_at(workflow, at).await)
    }

    /// The steps journaled by the instances `ids` of `workflow`.
    pub(crate) async fn steps_of(&self, workflow: &str, ids: &[String]) -> Result<u64> {
        each!(self, db => db.steps_of(workflow, ids).await)
    }

    /// Every instance of the workflows `names`.
    pub(crate) async fn instances(&self, names: &[&str]) -> Result<Vec<InstanceRow>> {
        each!(self, db => db.instances(names).await)
    }

    /// Every journaled step of `workflow`, per instance and step.
    pub(crate) async fn journal_steps(&self, workflow: &str) -> Result<Vec<StepRecord>> {
        each!(self, db => db.journal_steps(workflow).await)
    }

    /// Every execution in the ledger.
    pub(crate) async fn executions(&self) -> Result<Vec<Execution>> {
        each!(self, db => db.executions().await)
    }

    /// The first journal entry (any kind) each of the instances `ids` got after `after`.
    pub(crate) async fn first_entries_after(
        &self,
        workflow: &str,
        ids: &[String],
        after: OffsetDateTime,
    ) -> Result<Vec<(String, OffsetDateTime)>> {
        each!(self, db => db.first_entries_after(workflow, ids, after).await)
    }

    /// How many instances of `name` are running or suspended.
    pub(crate) async fn unfinished(&self, name: &str) -> Result<u64> {
        each!(self, db => db.unfinished(name).await)
    }

    /// The suspended instances of `name` that announced an awakeable under `wait`, with it.
    pub(crate) async fn parked_waiters(
        &self,
        name: &str,
        wait: &str,
    ) -> Result<Vec<(String, Uuid)>> {
        each!(self, db => db.parked_waiters(name, wait).await)
    }

    /// Whether run `id` stamped its wake from `wait`.
    pub(crate) async fn woke(&self, id: &str, wait: &str) -> Result<bool> {
        each!(self, db => db.woke(id, wait).await)
    }

    /// The naps of `sleeper`'s instances, `workflow` being the crash workflows.
    pub(crate) async fn naps(&self, sleeper: &str, workflow: &str) -> Result<Vec<Nap>> {
        each!(self, db => db.naps(sleeper, workflow).await)
    }

    /// The awakeables announced under `wait`.
    pub(crate) async fn pushes(&self, wait: &str) -> Result<Vec<Push>> {
        each!(self, db => db.pushes(wait).await)
    }

    /// Records one execution of `step` of `id` by process `pid`, now. The error is text: a
    /// step's error only needs to display.
    pub(crate) async fn record_execution(
        &self,
        id: &str,
        step: &str,
        pid: i64,
    ) -> Result<(), String> {
        each!(self, db => db.record_execution(id, step, pid).await)
            .map_err(|e| format!("recording {step} of {id} in the ledger: {e}"))
    }

    /// Records that run `id` waits on `awakeable` under `wait`; a re-run of the announcing
    /// step (at-least-once across a crash) announces the same id, so the first row stands.
    pub(crate) async fn announce(
        &self,
        id: &str,
        wait: &str,
        awakeable: Uuid,
    ) -> Result<(), String> {
        each!(self, db => db.announce(id, wait, awakeable).await)
            .map_err(|e| format!("announcing {wait} of {id}: {e}"))
    }

    /// Records that run `id` woke from `wait`, now; the first wake stands, so a re-run of the
    /// step cannot make a wake look later than it was.
    pub(crate) async fn record_wake(&self, id: &str, wait: &str) -> Result<(), String> {
        each!(self, db => db.record_wake(id, wait).await)
            .map_err(|e| format!("recording the wake of {id} from {wait}: {e}"))
    }
}

/// A count from the database, never negative.
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}
