//! The chaos command's own connection, which outlives PostgreSQL restarts: a query that fails
//! because the server went away reconnects and tries again.

use std::time::{Duration, Instant};

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use crate::common::{failure, open_connection, Result};

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The pause between two tries of a query the server did not answer.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A connection to the chaos schema that reconnects after a restart.
pub(crate) struct Db {
    config: tokio_postgres::Config,
    client: Option<Client>,
}

impl Db {
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

    /// Runs a batch of statements (DDL) once.
    pub(crate) async fn batch(&mut self, sql: &str) -> Result<()> {
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
