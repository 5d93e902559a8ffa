//! keiro's own connections run READ COMMITTED whatever the database, the role or the URL makes
//! the default: its functions take a lock (a signal token's, an instance row's) and then read
//! what committed before they got it, which only a statement snapshot taken after the lock
//! sees. A REPEATABLE READ or SERIALIZABLE snapshot is taken when the statement starts, before
//! the lock, so a send would buffer a signal past a waiter that registered while it waited.

use std::time::Duration;

use crate::common::{backend_pid, blocked_by, key, recorded, sql, start_parked, TestResult};
use keiro_journal::{JournalStore, SignalSendOutcome};
use keiro_postgres::{Config, PgStore};
use keiro_tests::pg::TestDb;
use serde_json::json;

/// A login role with a running role's grants on a test's schema and
/// `default_transaction_isolation = 'serializable'` as its own default (`ALTER ROLE .. SET`),
/// dropped with its grants when this is dropped. The setting is the role's, so no other
/// session on the server sees it.
struct SerializableRole {
    name: String,
    admin: tokio_postgres::Config,
}

impl SerializableRole {
    async fn create(db: &TestDb) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        // Roles are shared by the whole server, so the name comes from the test's own schema.
        let name = format!("{}_serializable", db.schema());
        let schema = db.schema();
        // Both names are generated identifiers; role and schema names take no bind parameters.
        sql(&db.store())
            .await?
            .batch_execute(&format!(
                "CREATE ROLE \"{name}\" LOGIN; \
                 ALTER ROLE \"{name}\" SET default_transaction_isolation = 'serializable'; \
                 GRANT USAGE ON SCHEMA \"{schema}\" TO \"{name}\"; \
                 GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{schema}\" \
                     TO \"{name}\"; \
                 GRANT USAGE ON ALL SEQUENCES IN SCHEMA \"{schema}\" TO \"{name}\"; \
                 GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA \"{schema}\" TO \"{name}\";"
            ))
            .await?;
        Ok(Self {
            name,
            admin: db.store().connection_config().clone(),
        })
    }

    /// The test schema's configuration, logging in as this role (trust authentication, as in
    /// the contributing guide).
    fn config(&self, db: &TestDb) -> Config {
        Config {
            url: with_param(db.url(), "user", &self.name),
            ..db.config()
        }
    }
}

impl Drop for SerializableRole {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let sql = format!(
            "DROP OWNED BY \"{name}\"; DROP ROLE \"{name}\"",
            name = self.name
        );
        // The test's runtime cannot be blocked on from inside it; a thread with its own can.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let (client, driver) = admin
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                let driver = tokio::spawn(driver);
                let result = client.batch_execute(&sql).await.map_err(|e| e.to_string());
                drop(client);
                let _ = tokio::time::timeout(Duration::from_secs(1), driver).await;
                result
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: role {} was not dropped: {dropped:?}", self.name);
        }
    }
}

/// `url` with `key=value` added, as a URL query parameter or a key/value pair. `value` is a
/// plain word here (a role name, `-c..` with `%20` for a space).
fn with_param(url: &str, key: &str, value: &str) -> String {
    if url.contains("://") {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}{key}={value}")
    } else {
        format!("{url} {key}={value}")
    }
}

/// What a pooled connection of `store` says its session and a fresh transaction run at.
async fn isolation_of(
    store: &PgStore,
) -> Result<(String, String), Box<dyn std::error::Error + Send + Sync>> {
    let mut client = sql(store).await?;
    let default: String = client
        .query_one("SHOW default_transaction_isolation", &[])
        .await?
        .get(0);
    let tx = client.transaction().await?;
    let level: String = tx
        .query_one("SHOW transaction_isolation", &[])
        .await?
        .get(0);
    tx.rollback().await?;
    Ok((default, level))
}

#[tokio::test]
async fn a_roles_default_isolation_does_not_reach_keiros_connections() -> TestResult {
    let db = TestDb::new().await;
    let role = SerializableRole::create(&db).await?;
    // The role's default is in effect for a connection of its own.
    let (client, driver) = tokio_postgres::connect(
        &with_param(db.url(), "user", &role.name),
        tokio_postgres::NoTls,
    )
    .await?;
    let driver = tokio::spawn(driver);
    let own: String = client
        .query_one("SHOW default_transaction_isolation", &[])
        .await?
        .get(0);
    assert_eq!(own, "serializable");
    drop(client);
    driver.await??;

    let store = PgStore::connect(role.config(&db)).await?;
    assert_eq!(
        isolation_of(&store).await?,
        ("read committed".to_owned(), "read committed".to_owned())
    );
    Ok(())
}

#[tokio::test]
async fn a_urls_default_isolation_does_not_reach_keiros_connections() -> TestResult {
    let db = TestDb::new().await;
    let config = Config {
        url: with_param(
            db.url(),
            "options",
            "-c%20default_transaction_isolation%3Dserializable",
        ),
        ..db.config()
    };
    let store = PgStore::connect(config).await?;
    assert_eq!(
        isolation_of(&store).await?,
        ("read committed".to_owned(), "read committed".to_owned())
    );
    Ok(())
}

/// The semantics the pin keeps: a send that waited for the token's lock while a wait on the
/// token registered and committed delivers to that waiter. Under the role's SERIALIZABLE
/// default the send's snapshot predates the waiter, and it buffered the signal past it: the
/// waiter stayed parked with the signal beside it.
#[tokio::test]
async fn a_send_on_a_serializable_roles_store_delivers_to_a_waiter_that_came_while_it_waited(
) -> TestResult {
    let db = TestDb::new().await;
    let admin = db.store();
    let role = SerializableRole::create(&db).await?;
    let store = PgStore::connect(role.config(&db)).await?;
    let k = key("waiter", "w-1");
    start_parked(&admin, &k).await?;

    // A transaction of the test's holds the token's lock, so the send waits for it...
    let mut holder = sql(&admin).await?;
    let tx = holder.transaction().await?;
    tx.execute("SELECT keiro_signal_lock('tok')", &[]).await?;
    let pid = backend_pid(&tx).await?;
    let send = tokio::spawn({
        let store = store.clone();
        async move { store.signal_send("tok", &json!("go")).await }
    });
    blocked_by(&admin, pid, "the send never waited for the token's lock").await?;
    // ... while the wait registers under that lock (the lock is the session's, so the wait
    // takes it again) and commits.
    let outcome: String = tx
        .query_one(
            "SELECT outcome FROM keiro_signal_wait($1, $2, 0, 'signal:tok:1', 'tok', NULL, NULL)",
            &[&k.name.as_str(), &k.id.as_str()],
        )
        .await?
        .get(0);
    assert_eq!(outcome, "waiting");
    tx.commit().await?;

    assert_eq!(
        send.await??,
        SignalSendOutcome::Delivered { to: k.clone() },
        "the send must see the waiter that committed before it got the lock"
    );
    assert_eq!(
        recorded(&admin, &k, "signal:tok:1").await?,
        vec![json!({"ok": "go"})]
    );
    Ok(())
}

#[tokio::test]
async fn restore_session_puts_back_every_setting_keiro_pins() -> TestResult {
    let db = TestDb::new().await;
    let store = PgStore::connect(Config {
        pool_size: 1,
        ..db.config()
    })
    .await?;
    let client = sql(&store).await?;
    client
        .batch_execute(
            "SET search_path TO public; \
             SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        )
        .await?;
    store.restore_session(&**client).await?;
    let path: String = client.query_one("SHOW search_path", &[]).await?.get(0);
    let default: String = client
        .query_one("SHOW default_transaction_isolation", &[])
        .await?
        .get(0);
    let pinned = db.config().session_settings();
    assert_eq!(
        pinned,
        [
            ("search_path", path),
            ("default_transaction_isolation", default)
        ],
    );
    // And keiro's statements work on it again (its tables are found through the path).
    drop(client);
    let k = key("order", "o-1");
    store
        .instance_start(&crate::common::start(&k, json!(null)))
        .await?;
    Ok(())
}
