//! Time skipping: the SQLite store's clock moves; on Postgres, whose clock is the server's, the
//! schema's pending deadlines move earlier instead.

use std::time::Duration;

use crate::Error;

/// What moves when a test advances time, and what the environment owns on its store.
#[derive(Debug)]
pub(crate) enum TestClock {
    /// The SQLite store's own clock, moved ahead of the wall clock; the store (a temporary
    /// file) goes with the environment.
    Sqlite { store: keiro_sqlite::SqliteStore },
    /// A throwaway schema, dropped with the environment.
    #[cfg(feature = "postgres")]
    Postgres {
        store: keiro_postgres::PgStore,
        config: Box<keiro_postgres::Config>,
    },
}

/// Every pending deadline of a keiro schema, moved `$1` milliseconds earlier: as if the
/// server's clock had moved that far forward. One transaction.
#[cfg(feature = "postgres")]
const SHIFT_DEADLINES: &str = "
    UPDATE timers SET fire_at = fire_at - $1::bigint * interval '1 millisecond'
        WHERE status <> 'fired';
    UPDATE workflows SET
        wake_after = wake_after - $1::bigint * interval '1 millisecond',
        next_attempt_at = next_attempt_at - $1::bigint * interval '1 millisecond',
        lease_expires_at = lease_expires_at - $1::bigint * interval '1 millisecond';";

impl TestClock {
    pub(crate) fn sqlite(store: keiro_sqlite::SqliteStore) -> Self {
        Self::Sqlite { store }
    }

    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(store: keiro_postgres::PgStore, config: keiro_postgres::Config) -> Self {
        Self::Postgres {
            store,
            config: Box::new(config),
        }
    }

    pub(crate) async fn advance(&self, by: Duration) -> Result<(), Error> {
        match self {
            Self::Sqlite { store } => {
                store.advance_clock(by);
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Self::Postgres { store, .. } => {
                let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
                let mut client = store.pool().get().await.map_err(postgres_error)?;
                let tx = client.transaction().await.map_err(postgres_error)?;
                for statement in SHIFT_DEADLINES.split(';').filter(|s| !s.trim().is_empty()) {
                    tx.execute(statement, &[&ms])
                        .await
                        .map_err(postgres_error)?;
                }
                tx.commit().await.map_err(postgres_error)?;
                Ok(())
            }
        }
    }
}

#[cfg(feature = "postgres")]
fn postgres_error(error: impl std::fmt::Display) -> Error {
    Error::Store(keiro_journal::StoreError::Database {
        operation: "testing_advance",
        retryable: false,
        source: error.to_string().into(),
    })
}

#[cfg(feature = "postgres")]
impl Drop for TestClock {
    fn drop(&mut self) {
        let Self::Postgres { store, .. } = self else {
            return;
        };
        let dropped = store.drop_schema_blocking();
        if let Err(error) = dropped {
            tracing::warn!(
                schema = %self.schema(),
                error = %keiro_journal::error_chain(&error),
                "the test environment's schema was not dropped"
            );
        }
    }
}

#[cfg(feature = "postgres")]
impl TestClock {
    fn schema(&self) -> &str {
        match self {
            Self::Postgres { config, .. } => &config.schema,
            Self::Sqlite { .. } => "",
        }
    }
}
