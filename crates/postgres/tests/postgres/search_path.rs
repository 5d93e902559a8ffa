//! keiro's functions resolve names through their own `search_path` (migration 0009), never
//! through the caller's: a built-in shadowed in a schema the caller searches first is not
//! called (the CVE-2018-1058 pattern), and every function of the schema keeps that setting.

use std::time::Duration;

use crate::common::{key, start, TestResult};
use keiro_journal::{Append, AppendOutcome, Event, JournalStore};
use keiro_postgres::{Config, PgStore};
use keiro_tests::pg::TestDb;
use serde_json::json;

/// Runs `sql` on its own connection when dropped, so what a test made outside its `TestDb`
/// schema goes even when the test fails half-way.
struct DropWith {
    connection: tokio_postgres::Config,
    sql: String,
}

impl Drop for DropWith {
    fn drop(&mut self) {
        let connection = self.connection.clone();
        let sql = std::mem::take(&mut self.sql);
        // The test's runtime cannot be blocked on from inside it; a thread with its own can.
        let done = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let (client, driver) = connection
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
        if !matches!(done, Ok(Ok(()))) {
            eprintln!("warning: cleanup `{}` failed: {done:?}", self.sql);
        }
    }
}

#[tokio::test]
async fn a_built_in_shadowed_on_the_callers_search_path_is_not_called() -> TestResult {
    let db = TestDb::new().await;
    // Another role's schema the caller searches before keiro's. A schema of this test's own
    // stands in for `public`, so no other session (parallel tests included) ever sees it.
    let shadow = format!("{}_shadow", db.schema());
    let _cleanup = DropWith {
        connection: db.store().connection_config().clone(),
        sql: format!("DROP SCHEMA IF EXISTS \"{shadow}\" CASCADE"),
    };
    let admin = db.store().pool().get().await?;
    // Both ways a shadow wins: `to_jsonb(text)` matches a text argument exactly, so it beats
    // the built-in `pg_catalog.to_jsonb(anyelement)` wherever it sits on the path; `now()` has
    // the built-in's very signature, so it wins when searched before pg_catalog.
    admin
        .batch_execute(&format!(
            "CREATE SCHEMA \"{shadow}\"; \
             CREATE TABLE \"{shadow}\".calls (function text); \
             CREATE FUNCTION \"{shadow}\".to_jsonb(p text) RETURNS jsonb \
             LANGUAGE plpgsql AS $$ \
             BEGIN \
                 INSERT INTO \"{shadow}\".calls VALUES ('to_jsonb'); \
                 RETURN pg_catalog.to_jsonb('shadowed'::text); \
             END $$; \
             CREATE FUNCTION \"{shadow}\".now() RETURNS timestamptz \
             LANGUAGE plpgsql AS $$ \
             BEGIN \
                 INSERT INTO \"{shadow}\".calls VALUES ('now'); \
                 RETURN pg_catalog.now(); \
             END $$;"
        ))
        .await?;

    // One connection, so the store's next operations run in the session set up here.
    let store = PgStore::connect(Config {
        pool_size: 1,
        ..db.config()
    })
    .await?;
    let session = store.pool().get().await?;
    session
        .batch_execute(&format!(
            "SET search_path = \"{shadow}\", pg_catalog, \"{}\"",
            db.schema()
        ))
        .await?;
    drop(session);

    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let failed = Append::external(
        k.clone(),
        Event::WorkflowFailed {
            reason: "boom".into(),
        },
    );
    assert_eq!(
        store.journal_append(&failed).await?,
        AppendOutcome::Appended
    );
    // The failure stamped `completed_at = now()`; its repeat converges on the recorded reason,
    // which `keiro_journal_append_to` reads back from the row with `to_jsonb(last_error)`.
    let repeat = store.journal_append(&failed).await?;

    let session = store.pool().get().await?;
    let path: String = session.query_one("SHOW search_path", &[]).await?.get(0);
    assert!(
        path.starts_with(&format!("{shadow},")),
        "the operations ran in the shadowing session: {path}"
    );
    let calls: Vec<String> = admin
        .query(&format!("SELECT function FROM \"{shadow}\".calls"), &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(calls.is_empty(), "shadows were called: {calls:?}");
    assert_eq!(repeat, AppendOutcome::AlreadyPresent(json!("boom")));
    Ok(())
}

#[tokio::test]
async fn every_function_of_the_schema_pins_its_search_path() -> TestResult {
    // `CREATE OR REPLACE FUNCTION` drops the SET clauses of the function it replaces, so a
    // later migration that forgets to set the search_path again is caught here.
    let db = TestDb::new().await;
    let client = db.store().pool().get().await?;
    // pg_catalog is not listed: unlisted, it is searched first (see 0009).
    let wanted = format!("search_path={}, pg_temp", db.schema());
    let rows = client
        .query(
            "SELECT p.oid::regprocedure::text, coalesce(p.proconfig, '{}') \
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = current_schema() ORDER BY 1",
            &[],
        )
        .await?;
    assert!(
        rows.len() > 30,
        "keiro's functions are there: {}",
        rows.len()
    );
    let unpinned: Vec<(String, Vec<String>)> = rows
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .filter(|(_, settings): &(String, Vec<String>)| !settings.contains(&wanted))
        .collect();
    assert!(
        unpinned.is_empty(),
        "functions without `{wanted}`: {unpinned:#?}"
    );
    Ok(())
}
