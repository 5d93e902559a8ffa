//! The chaos command's reads on the SQLite store's file, through a connection of its own.
//! Instants are microseconds since the Unix epoch on the host's wall clock, as the store and
//! the witnesses keep them; the workflow names are bound as one JSON array (`json_each`).

use std::path::Path;

use super::{InstanceRow, JournalRow, Rows, WitnessRow, PROGRESS};
use crate::chaos::witness::{self, WITNESS_CREATE_SQLITE};
use crate::common::{Result, ResultExt};
use crate::lite::{self, instant, json};

const INSTANCES: &str = "SELECT workflow_name, workflow_id, status, output, last_error, queue,
    queue_key, queue_admitted, queue_admitted_at
    FROM workflows WHERE workflow_name IN (SELECT value FROM json_each(?1))";

const JOURNAL: &str = "SELECT workflow_name, workflow_id, generation, step_name, kind, recorded_at
    FROM journal WHERE workflow_name IN (SELECT value FROM json_each(?1))";

const WITNESSES: &str = "SELECT workflow_name, workflow_id, generation, step, pid, holder, epoch,
    written_at, lease_expires_at, ended_at FROM chaos_witness";

/// The chaos command's connection to the file; its calls run off the async runtime, one at a
/// time.
pub(crate) struct Lite {
    conn: lite::Lite,
}

impl Lite {
    /// Opens the file the store made, with the witnesses' busy timeout (its one write, the
    /// table, may meet a worker's transaction).
    pub(crate) async fn open(path: &Path) -> Result<Self> {
        Ok(Self {
            conn: lite::Lite::open(path, witness::WHO, witness::SQLITE_BUSY_TIMEOUT).await?,
        })
    }

    pub(crate) async fn create_witness_table(&self) -> Result<()> {
        self.conn
            .call("creating the witness table", |conn| {
                conn.execute_batch(WITNESS_CREATE_SQLITE)
            })
            .await
    }

    pub(crate) async fn progress(&self) -> Result<(i64, i64)> {
        self.conn
            .call("reading the progress", |conn| {
                conn.prepare_cached(PROGRESS)?
                    .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))
            })
            .await
    }

    /// The three reads in one read transaction: one snapshot, as the run has ended.
    pub(crate) async fn load(&self, workflows: &[&str]) -> Result<Rows> {
        let names = serde_json::to_string(workflows).context("encoding the workflow names")?;
        self.conn
            .call(
                "reading the instance rows, the journal and the witnesses",
                move |conn| {
                    let read = conn.unchecked_transaction()?;
                    let instances = read
                        .prepare(INSTANCES)?
                        .query_map([&names], |row| {
                            Ok(InstanceRow {
                                name: row.get(0)?,
                                id: row.get(1)?,
                                status: row.get(2)?,
                                output: row
                                    .get::<_, Option<String>>(3)?
                                    .map(|text| json(&text))
                                    .transpose()?,
                                last_error: row.get(4)?,
                                queue: row.get(5)?,
                                queue_key: row.get(6)?,
                                queue_admitted: row.get(7)?,
                                queue_admitted_at: row
                                    .get::<_, Option<i64>>(8)?
                                    .map(instant)
                                    .transpose()?,
                            })
                        })?
                        .collect::<rusqlite::Result<_>>()?;
                    let journal = read
                        .prepare(JOURNAL)?
                        .query_map([&names], |row| {
                            Ok(JournalRow {
                                key: (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?),
                                kind: row.get(4)?,
                                recorded_at: instant(row.get(5)?)?,
                            })
                        })?
                        .collect::<rusqlite::Result<_>>()?;
                    let witnesses = read
                        .prepare(WITNESSES)?
                        .query_map([], |row| {
                            Ok(WitnessRow {
                                key: (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?),
                                pid: row.get(4)?,
                                holder: row.get(5)?,
                                epoch: row.get(6)?,
                                written_at: instant(row.get(7)?)?,
                                lease_expires_at: row
                                    .get::<_, Option<i64>>(8)?
                                    .map(instant)
                                    .transpose()?,
                                ended_at: row.get::<_, Option<i64>>(9)?.map(instant).transpose()?,
                            })
                        })?
                        .collect::<rusqlite::Result<_>>()?;
                    read.finish()?;
                    Ok(Rows {
                        instances,
                        journal,
                        witnesses,
                    })
                },
            )
            .await
    }
}
