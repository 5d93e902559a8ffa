//! The pool the store's statements run on: connections bound to one schema, the round-trip
//! counter, and what the store knows of its schema. Every store operation (`ops`) runs its
//! statement through a [`Db`]; the store handle ([`PgStore`](crate::PgStore)) owns one, beside
//! its lanes and its wake listener.

use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::{Object, Pool};
use keiro_journal::StoreError;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement};

use crate::error::Failure;
use crate::migrate::RoundTrips;
use crate::readiness::{self, SchemaCheck};

/// The connection pool of one schema, and the counters the store reports.
pub(crate) struct Db {
    pool: Pool,
    schema: String,
    round_trips: AtomicU64,
    /// Whether the schema holds what this build needs (`readiness`).
    schema_check: SchemaCheck,
}

impl Db {
    pub(crate) fn new(pool: Pool, schema: String) -> Self {
        Self {
            pool,
            schema,
            round_trips: AtomicU64::new(0),
            schema_check: SchemaCheck::default(),
        }
    }

    /// The connection pool.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The schema every connection's `search_path` names.
    pub(crate) fn schema(&self) -> &str {
        &self.schema
    }

    /// Round trips counted so far.
    pub(crate) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    pub(crate) fn count_round_trips(&self, n: u64) {
        self.round_trips.fetch_add(n, Ordering::Relaxed);
    }

    /// What this store knows of its schema.
    pub(crate) fn schema_check(&self) -> &SchemaCheck {
        &self.schema_check
    }

    /// A pooled connection for one store operation. On a schema found lacking, the schema is
    /// checked again on it first: [`StoreError::SchemaNotMigrated`] until it is migrated.
    pub(crate) async fn client(&self, operation: &'static str) -> Result<Object, StoreError> {
        let client = self
            .pool
            .get()
            .await
            .map_err(|e| Failure::from(e).into_store(operation))?;
        if self.schema_check.lacking() {
            self.count_round_trips(2);
            let found = readiness::check(&client, self.schema())
                .await
                .map_err(|e| Failure::from(e).into_store(operation))?;
            self.schema_check.set(&found);
            if let Some(error) = found.error(operation, self.schema()) {
                return Err(error);
            }
        }
        Ok(client)
    }

    /// The store error of a failed statement of `operation`; one that met a missing object
    /// (the schema is gone or older than this build) is [`StoreError::SchemaNotMigrated`],
    /// and the next operation checks the schema first.
    pub(crate) fn failed(
        &self,
        operation: &'static str,
        error: tokio_postgres::Error,
    ) -> StoreError {
        let failure = Failure::from(error);
        if failure.is_missing_object() {
            self.schema_check.suspect();
        }
        failure.into_store_in(operation, self.schema())
    }

    /// Prepares `sql` once per connection; a cache hit costs no round trip and is not counted.
    async fn prepared(
        &self,
        client: &Object,
        sql: &str,
    ) -> Result<Statement, tokio_postgres::Error> {
        // The connection is ours alone until dropped, so a change of its cache size is exactly
        // a miss of this call.
        let cached = client.statement_cache.size();
        let prepared = client.prepare_cached(sql).await;
        if prepared.is_err() || client.statement_cache.size() != cached {
            self.count_round_trips(1);
        }
        prepared
    }

    /// Runs one prepared statement and returns its rows.
    pub(crate) async fn query(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let client = self.client(operation).await?;
        let statement = self
            .prepared(&client, sql)
            .await
            .map_err(|e| self.failed(operation, e))?;
        self.count_round_trips(1);
        client
            .query(&statement, params)
            .await
            .map_err(|e| self.failed(operation, e))
    }

    /// Runs one prepared statement that returns exactly one row.
    pub(crate) async fn query_one(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, StoreError> {
        let rows = self.query(operation, sql, params).await?;
        exactly_one(operation, rows)
    }

    /// Runs one prepared statement and returns the number of rows it changed.
    pub(crate) async fn execute(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = self.client(operation).await?;
        let statement = self
            .prepared(&client, sql)
            .await
            .map_err(|e| self.failed(operation, e))?;
        self.count_round_trips(1);
        client
            .execute(&statement, params)
            .await
            .map_err(|e| self.failed(operation, e))
    }
}

impl RoundTrips for Db {
    fn count_round_trips(&self, n: u64) {
        Db::count_round_trips(self, n);
    }
}

/// The one row a statement must return.
fn exactly_one(operation: &'static str, mut rows: Vec<Row>) -> Result<Row, StoreError> {
    if rows.len() != 1 {
        return Err(StoreError::Malformed {
            operation,
            detail: format!("expected exactly one row, got {}", rows.len()),
        });
    }
    Ok(rows.swap_remove(0))
}
