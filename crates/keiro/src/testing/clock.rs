//! Time skipping: the memory store's clock moves; on Postgres, whose clock is the server's, the
//! schema's pending deadlines move earlier instead.

use std::sync::Mutex;
use std::time::Duration;

use crate::Error;

/// What moves when a test advances time, and what the environment owns on its store.
#[derive(Debug)]
pub(crate) enum TestClock {
    /// The memory store's clock runs `offset` ahead of the wall clock.
    Memory {
        store: keiro_memory::MemoryStore,
        offset: Mutex<time::Duration>,
    },
    /// A throwaway schema, dropped with the environment.
    #[cfg(feature = "postgres")]
    Postgres {
        store: keiro_postgres::PgStore,
        config: keiro_postgres::Config,
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
    pub(crate) fn memory(store: keiro_memory::MemoryStore) -> Self {
        Self::Memory {
            store,
            offset: Mutex::new(time::Duration::ZERO),
        }
    }

    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(store: keiro_postgres::PgStore, config: keiro_postgres::Config) -> Self {
        Self::Postgres { store, config }
    }

    pub(crate) async fn advance(&self, by: Duration) -> Result<(), Error> {
        match self {
            Self::Memory { store, offset } => {
                let by = time::Duration::try_from(by).unwrap_or(time::Duration::MAX);
                let mut offset = offset
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *offset = offset.saturating_add(by);
                store.set_clock_offset(*offset);
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
        let Self::Postgres { store, config } = self else {
            return;
        };
        store.pool().close();
        let connection = store.connection_config().clone();
        let tls = store.tls_connector().clone();
        let schema = config.schema.clone();
        // Drop runs inside the test's runtime, which cannot be blocked on; a thread with its
        // own runtime can, and joining it keeps the schema from outliving the environment.
        let dropped = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let (client, driver) = connection.connect(tls).await.map_err(|e| e.to_string())?;
                let driver = tokio::spawn(driver);
                // The schema name is one we generated; DDL takes no bind parameters for names.
                // A lock held by a session of the (now blocked) test runtime must not hang it.
                let dropped = client
                    .batch_execute(&format!(
                        "SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                    ))
                    .await
                    .map_err(|e| e.to_string());
                drop(client);
                let _ = tokio::time::timeout(Duration::from_secs(1), driver).await;
                dropped
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            tracing::warn!(schema = %self.schema(), "the test environment's schema was not dropped");
        }
    }
}

#[cfg(feature = "postgres")]
impl TestClock {
    fn schema(&self) -> &str {
        match self {
            Self::Postgres { config, .. } => &config.schema,
            Self::Memory { .. } => "",
        }
    }
}
