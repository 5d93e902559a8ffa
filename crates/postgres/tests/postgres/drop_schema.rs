//! `PgStore::drop_schema_blocking`: a scratch schema goes away from a `Drop` running on a
//! runtime that cannot be blocked on, over the store's own TLS settings (`sslmode=require`
//! refuses a plain connection, which the test kits' hand-rolled drops used to open), and a
//! lock held by that blocked runtime makes it give up instead of hanging.

use std::time::{Duration, Instant};

use crate::common::TestResult;
use keiro_postgres::{Config, Error, PgStore, DROP_SCHEMA_LOCK_TIMEOUT};
use keiro_tests::pg::test_database_url;
use tokio_postgres::NoTls;

/// A scratch schema of its own, migrated.
async fn scratch(url: String) -> Result<PgStore, Error> {
    let schema = format!(
        "keiro_test_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..16]
    );
    let store = PgStore::connect(Config {
        schema,
        pool_size: 2,
        ..Config::new(url)
    })
    .await?;
    store.migrate().await?;
    Ok(store)
}

async fn schema_exists(schema: &str) -> Result<bool, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(&test_database_url(), NoTls).await?;
    tokio::spawn(connection);
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await?;
    row.try_get(0)
}

async fn server_has_tls() -> Result<bool, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(&test_database_url(), NoTls).await?;
    tokio::spawn(connection);
    let ssl: String = client.query_one("SHOW ssl", &[]).await?.get(0);
    Ok(ssl == "on")
}

/// Drops its store's schema when dropped, as a test kit's guard does.
struct Guard(PgStore);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0
            .drop_schema_blocking()
            .expect("the schema is dropped");
    }
}

// A current-thread runtime: blocking on it from the drop would deadlock, so the drop must not.
#[tokio::test(flavor = "current_thread")]
async fn a_guard_drops_its_schema_over_tls_from_inside_the_runtime() -> TestResult {
    let url = test_database_url();
    let url = if server_has_tls().await? {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}sslmode=require")
    } else {
        println!("the test server has ssl = off; checking the plain connection only");
        url
    };
    let store = scratch(url).await?;
    let schema = store.schema().to_owned();
    assert!(schema_exists(&schema).await?);
    drop(Guard(store));
    assert!(!schema_exists(&schema).await?, "schema {schema} is gone");
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn a_lock_held_by_the_blocked_runtime_times_out_instead_of_hanging() -> TestResult {
    let store = scratch(test_database_url()).await?;
    let schema = store.schema().to_owned();
    // A transaction of this runtime's that holds a lock on one of the schema's tables; it
    // cannot finish while the drop below blocks this runtime's only thread.
    let (client, connection) = tokio_postgres::connect(&test_database_url(), NoTls).await?;
    tokio::spawn(connection);
    client
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE \"{schema}\".workflows IN ACCESS SHARE MODE"
        ))
        .await?;
    let began = Instant::now();
    let refused = store.drop_schema_blocking();
    assert!(
        matches!(refused, Err(Error::Database { .. })),
        "{refused:?}"
    );
    assert!(began.elapsed() < DROP_SCHEMA_LOCK_TIMEOUT + Duration::from_secs(5));
    client.batch_execute("ROLLBACK").await?;
    assert!(schema_exists(&schema).await?);
    // Once the lock is gone the drop succeeds (a fresh store: the first one's pool is closed).
    let again = PgStore::connect(Config {
        schema: schema.clone(),
        ..Config::new(test_database_url())
    })
    .await?;
    again.drop_schema_blocking()?;
    assert!(!schema_exists(&schema).await?);
    Ok(())
}
