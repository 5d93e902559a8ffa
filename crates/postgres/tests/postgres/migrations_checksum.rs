//! An applied migration that differs from the embedded file is refused.

use crate::common::TestResult;
use keiro_postgres::Error;
use keiro_tests::pg::TestDb;

#[tokio::test]
async fn an_edited_migration_is_refused() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let client = store.pool().get().await?;
    // As if 0001 had been edited after it was applied: the recorded checksum no longer matches.
    client
        .execute(
            "UPDATE keiro_migrations SET checksum = '\\x00'::bytea WHERE version = 1",
            &[],
        )
        .await?;
    drop(client);

    let err = store.migrate().await.expect_err("the checksum differs");
    assert!(
        matches!(&err, Error::MigrationChanged { version: 1, name: "init", schema } if schema == db.schema()),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    Ok(())
}
