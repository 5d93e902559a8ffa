//! The chaos command's own connection to PostgreSQL, which outlives restarts: a query that
//! fails because the server went away reconnects and tries again. It reads the rows the
//! invariants need into their plain structs.

use std::time::{Duration, Instant};

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use super::{InstanceRow, JournalRow, Rows, WitnessRow, LOAD_WITHIN, PROGRESS};
use crate::chaos::witness::WITNESS_CREATE_PG;
use crate::common::{failure, open_connection, Result, ResultExt};

const INSTANCES: &str = "SELECT workflow_name, workflow_id, status, output, last_error, queue,
    queue_key, queue_admitted, queue_admitted_at
    FROM workflows WHERE workflow_name = ANY($1)";

const JOURNAL: &str = "SELECT workflow_name, workflow_id, generation, step_name, kind, recorded_at
    FROM journal WHERE workflow_name = ANY($1)";

const WITNESSES: &str = "SELECT workflow_name, workflow_id, generation, step, pid, holder, epoch,
    written_at, lease_expires_at, ended_at FROM chaos_witness";

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The pause between two tries of a query the server did not answer.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A connection to the chaos schema that reconnects after a restart.
pub(crate) struct Pg {
    config: tokio_postgres::Config,
    client: Option<Client>,
}

impl Pg {
    /// A connection with the store's settings (the chaos schema is its `search_path`); opened
    /// by the first query.
    pub(crate) fn new(config: &tokio_postgres::Config) -> Self {
        let mut config = config.clone();
        config.connect_timeout(CONNECT_TIMEOUT);
        Self {
            config,
            client: None,
        }
    }

    /// Runs `sql` once; a failure because the server went away also drops the connection, so
    /// the next call reconnects.
    pub(crate) async fn query_once(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = Some(open_connection(&self.config).await?);
        }
        let Some(client) = self.client.as_ref() else {
            return Err(failure("no connection"));
        };
        match client.query(sql, params).await {
            Ok(rows) => Ok(rows),
            Err(error) => {
                if is_transient(&error) {
                    self.client = None;
                }
                Err(error.into())
            }
        }
    }

    /// Runs `sql`, trying again while the server is away, for up to `within`. An error the
    /// server itself gives (a bad query) is returned at once.
    pub(crate) async fn query(
        &mut self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        within: Duration,
    ) -> Result<Vec<Row>> {
        let began = Instant::now();
        loop {
            match self.query_once(sql, params).await {
                Ok(rows) => return Ok(rows),
                Err(error) if retryable(error.as_ref()) && began.elapsed() < within => {
                    tracing::debug!(error = %error, "chaos: query failed; trying again");
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Creates the witness table.
    pub(crate) async fn create_witness_table(&mut self) -> Result<()> {
        self.batch(WITNESS_CREATE_PG)
            .await
            .context("creating the witness table")
    }

    /// Steps journaled and instances done, one try.
    pub(crate) async fn progress(&mut self) -> Result<(i64, i64)> {
        let rows = self.query_once(PROGRESS, &[]).await?;
        let row = rows.first().ok_or_else(|| failure("no progress row"))?;
        Ok((row.get(0), row.get(1)))
    }

    /// Reads the rows the checks need, trying again while the server is away.
    pub(crate) async fn load(&mut self, workflows: &[&str]) -> Result<Rows> {
        let names: Vec<String> = workflows.iter().map(|name| (*name).to_owned()).collect();
        let instances = self
            .query(INSTANCES, &[&names], LOAD_WITHIN)
            .await
            .context("reading the instance rows")?
            .iter()
            .map(|row| InstanceRow {
                name: row.get(0),
                id: row.get(1),
                status: row.get(2),
                output: row.get(3),
                last_error: row.get(4),
                queue: row.get(5),
                queue_key: row.get(6),
                queue_admitted: row.get(7),
                queue_admitted_at: row.get(8),
            })
            .collect();
        let journal = self
            .query(JOURNAL, &[&names], LOAD_WITHIN)
            .await
            .context("reading the journal")?
            .iter()
            .map(|row| JournalRow {
                key: (row.get(0), row.get(1), row.get(2), row.get(3)),
                kind: row.get(4),
                recorded_at: row.get(5),
            })
            .collect();
        let witnesses = self
            .query(WITNESSES, &[], LOAD_WITHIN)
            .await
            .context("reading the witnesses")?
            .iter()
            .map(|row| WitnessRow {
                key: (row.get(0), row.get(1), row.get(2), row.get(3)),
                pid: row.get(4),
                holder: row.get(5),
                epoch: row.get(6),
                written_at: row.get(7),
                lease_expires_at: row.get(8),
                ended_at: row.get(9),
            })
            .collect();
        Ok(Rows {
            instances,
            journal,
            witnesses,
        })
    }

    /// Runs a batch of statements (DDL) once.
    async fn batch(&mut self, sql: &str) -> Result<()> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.client = Some(open_connection(&self.config).await?);
        }
        let Some(client) = self.client.as_ref() else {
            return Err(failure("no connection"));
        };
        client.batch_execute(sql).await?;
        Ok(())
    }
}

/// Whether `error` says the server went away (or is not back yet), rather than that the query
/// is wrong: no server error at all (I/O, closed connection), or a server error of class 08
/// (connection exception) or 57 (operator intervention: shutdown, starting up).
fn is_transient(error: &tokio_postgres::Error) -> bool {
    match error.as_db_error() {
        None => true,
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57")
        }
    }
}

/// [`is_transient`] through the CLI's boxed errors; an error that is not a database one (a
/// failed connect is wrapped in context) counts as transient when its source is.
fn retryable(error: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(pg) = e.downcast_ref::<tokio_postgres::Error>() {
            return is_transient(pg);
        }
        current = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::Error;

    #[test]
    fn an_error_without_a_database_cause_is_not_retried() {
        let error: Error = failure("bad input");
        assert!(!retryable(error.as_ref()));
    }
}
