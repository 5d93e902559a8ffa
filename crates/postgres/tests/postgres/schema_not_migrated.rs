//! A store whose schema does not hold what this build needs answers a typed error naming the
//! schema and how to migrate it, on every call, as a user embedding the resume worker meets it
//! (`PgStore::connect` without `migrate`): a schema that does not exist, one that was never
//! migrated, one an older build migrated (a migration, or the function files' revision,
//! behind), one dropped after the store checked it, and a lazy store that never checked. Once
//! the schema is migrated (here or by another process) the same store works.

use crate::common::{key, start, TestResult};
use keiro_journal::{JournalStore, StoreError};
use keiro_lease::LeaseStore;
use keiro_postgres::builds::OtherBuild as _;
use keiro_postgres::PgStore;
use keiro_resume::ScheduleStore;
use keiro_tests::pg::TestDb;
use serde_json::json;

/// Checks that `err` says that `schema` is not migrated, with `problem` in its reason, and
/// tells how to migrate it.
fn assert_not_migrated(err: &StoreError, schema: &str, problem: &str) {
    let text = err.to_string();
    assert!(
        text.contains(&format!("schema {schema} "))
            && text.contains(&format!("keiro migrate --schema {schema}"))
            && text.contains(problem),
        "{text}"
    );
    assert!(
        matches!(err, StoreError::SchemaNotMigrated { schema: s, .. } if s == schema),
        "{err:?}"
    );
    assert!(err.is_schema_not_migrated() && !err.is_retryable());
}

/// Empties the test's schema: dropped, or recreated empty.
async fn drop_schema(db: &TestDb, recreate: bool) -> TestResult {
    let schema = db.schema();
    let recreate = if recreate {
        format!("; CREATE SCHEMA \"{schema}\"")
    } else {
        String::new()
    };
    db.store()
        .pool()
        .get()
        .await?
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE{recreate}"))
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_schema_that_does_not_exist_is_named_until_it_is_migrated() -> TestResult {
    let db = TestDb::new().await;
    drop_schema(&db, false).await?;
    let store = PgStore::connect(db.config()).await?;
    let k = key("order", "o-1");
    let err = store
        .instance_start(&start(&k, json!(1)))
        .await
        .expect_err("no schema");
    assert_not_migrated(&err, db.schema(), "does not exist");
    // Every kind of call, not just the first.
    let err = store.instance_get(&k).await.expect_err("no schema");
    assert_not_migrated(&err, db.schema(), "does not exist");
    let err = store.schedules_list().await.expect_err("no schema");
    assert_not_migrated(&err, db.schema(), "does not exist");
    let err = store
        .instances_runnable(None, Some(10))
        .await
        .expect_err("no schema");
    assert_not_migrated(&err, db.schema(), "does not exist");

    // Migrated by another process: the same store works at its next call.
    PgStore::connect(db.config()).await?.migrate().await?;
    assert!(store.instance_start(&start(&k, json!(1))).await?.created);
    Ok(())
}

#[tokio::test]
async fn a_schema_never_migrated_is_named_and_migrate_fixes_it() -> TestResult {
    let db = TestDb::new().await;
    drop_schema(&db, true).await?;
    let store = PgStore::connect(db.config()).await?;
    let k = key("order", "o-1");
    let err = store
        .instance_start(&start(&k, json!(1)))
        .await
        .expect_err("nothing migrated");
    assert_not_migrated(&err, db.schema(), "never migrated");
    store.migrate().await?;
    assert!(store.instance_start(&start(&k, json!(1))).await?.created);
    Ok(())
}

#[tokio::test]
async fn a_schema_an_older_build_migrated_is_named_with_what_it_lacks() -> TestResult {
    let db = TestDb::new().await;
    drop_schema(&db, false).await?;
    // As a build that knew the migrations up to 0016 left it: its functions work, but this
    // build's schedules (0017) are missing.
    PgStore::connect(db.config()).await?.migrate_to(16).await?;
    let store = PgStore::connect(db.config()).await?;
    let k = key("order", "o-1");
    let err = store
        .instance_start(&start(&k, json!(1)))
        .await
        .expect_err("an older schema");
    assert_not_migrated(&err, db.schema(), "lacks migration 17 (schedules)");
    let err = store.schedules_list().await.expect_err("an older schema");
    assert_not_migrated(&err, db.schema(), "lacks migration 17 (schedules)");
    store.migrate().await?;
    assert!(store.schedules_list().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn function_files_of_an_older_revision_are_named() -> TestResult {
    let db = TestDb::new().await;
    let admin = db.store().pool().get().await?;
    // What a schema the previous build's files were applied to records: its revision.
    admin
        .batch_execute(
            "UPDATE keiro_function_revisions SET revision = revision - 1 \
             WHERE revision = (SELECT max(revision) FROM keiro_function_revisions)",
        )
        .await?;
    let store = PgStore::connect(db.config()).await?;
    let err = store
        .instance_get(&key("order", "o-1"))
        .await
        .expect_err("older function files");
    assert_not_migrated(&err, db.schema(), "function files of revision");
    store.migrate().await?;
    assert_eq!(store.instance_get(&key("order", "o-1")).await?, None);
    Ok(())
}

#[tokio::test]
async fn a_lazy_store_and_a_schema_dropped_after_connecting_name_the_schema() -> TestResult {
    let db = TestDb::new().await;
    let checked = PgStore::connect(db.config()).await?;
    let lazy = PgStore::connect_lazy(db.config())?;
    let k = key("order", "o-1");
    assert!(checked.instance_start(&start(&k, json!(1))).await?.created);
    drop_schema(&db, false).await?;
    // What PostgreSQL finds missing, named as the schema's problem.
    let err = checked.instance_get(&k).await.expect_err("dropped");
    assert_not_migrated(&err, db.schema(), "does not exist");
    let err = lazy
        .instance_start(&start(&k, json!(1)))
        .await
        .expect_err("dropped");
    assert_not_migrated(&err, db.schema(), "keiro_instance_start");
    // Then checked before each call, with the schema's own reason.
    let err = lazy.instance_get(&k).await.expect_err("dropped");
    assert_not_migrated(&err, db.schema(), "does not exist");
    checked.migrate().await?;
    assert!(lazy.instance_start(&start(&k, json!(1))).await?.created);
    Ok(())
}
