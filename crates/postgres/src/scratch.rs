//! Dropping a store's schema from anywhere, even from a `Drop` running on a runtime that can
//! no longer be blocked on or is shutting down: what a test's scratch schema needs.

use std::time::Duration;

use crate::error::{Error, Failure, Result};
use crate::tls::rustls_error;
use crate::PgStore;

/// How long [`PgStore::drop_schema_blocking`] waits for a lock before giving up and leaving
/// the schema behind: 5 s.
pub const DROP_SCHEMA_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the dedicated connection's driver gets to say goodbye to the server once the
/// schema is gone.
const DRIVER_CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

const DROP_SCHEMA: &str = "dropping the store's schema";

impl PgStore {
    /// Drops this store's schema and everything in it (`DROP SCHEMA .. CASCADE`): the end of
    /// a scratch schema a test or a tool created. Destructive; never call it on a schema that
    /// holds data anyone wants.
    ///
    /// It closes the pool's idle connections first (so nothing of this store holds the
    /// schema's locks), then connects once with the store's own settings, TLS included, on a
    /// thread of its own with a runtime of its own, and waits for it. So it may be called from
    /// a `Drop` running inside an async runtime (which cannot be blocked on) or while that
    /// runtime shuts down. A lock held elsewhere is waited for at most
    /// [`DROP_SCHEMA_LOCK_TIMEOUT`]. Clones of this store stop working.
    ///
    /// ```no_run
    /// # fn demo(store: keiro_postgres::PgStore) -> Result<(), keiro_postgres::Error> {
    /// store.drop_schema_blocking()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect) for the connection; [`Error::Database`] when the server
    /// refuses the drop (a lock timeout, a missing privilege); [`Error::Unavailable`] when no
    /// thread or runtime could be started.
    pub fn drop_schema_blocking(&self) -> Result<()> {
        self.pool().close();
        let connection = self.connection_config().clone();
        let tls = self.tls_connector().clone();
        let mode = tls.mode();
        // `Config` refuses a schema name that is not a plain identifier, so quoting it needs
        // no escaping; DDL takes no bind parameters for names.
        let drop_sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema());
        let lock_timeout = format!("{}ms", DROP_SCHEMA_LOCK_TIMEOUT.as_millis());
        let dropping = std::thread::spawn(move || -> Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::Unavailable {
                    operation: DROP_SCHEMA,
                    source: Box::new(e),
                })?;
            runtime.block_on(async move {
                let (client, driver) = connection.connect(tls).await.map_err(|e| {
                    if rustls_error(&e).is_some() {
                        return Error::Tls {
                            operation: DROP_SCHEMA,
                            mode,
                            source: Box::new(e),
                        };
                    }
                    Failure::from(e).into_error(DROP_SCHEMA)
                })?;
                let driver = tokio::spawn(driver);
                let dropped = async {
                    // A lock held by a session of a runtime that is now blocked must not hang
                    // this thread, nor the one joining it.
                    client
                        .execute(
                            "SELECT set_config('lock_timeout', $1, false)",
                            &[&lock_timeout],
                        )
                        .await?;
                    client.batch_execute(&drop_sql).await
                }
                .await
                .map_err(|e| Failure::from(e).into_error(DROP_SCHEMA));
                drop(client);
                let _ = tokio::time::timeout(DRIVER_CLOSE_TIMEOUT, driver).await;
                dropped
            })
        });
        dropping.join().unwrap_or_else(|_| {
            Err(Error::Unavailable {
                operation: DROP_SCHEMA,
                source: "the thread dropping the schema panicked".into(),
            })
        })
    }
}
