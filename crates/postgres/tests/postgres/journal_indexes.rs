//! The journal's indexes (migration 0029): every step writes one entry into each of them, so
//! the journal keeps only the step key, which every read of it uses; and that key names the
//! rows for logical replication, so a team's publication of the table does not refuse the
//! deletes retention cascades into it.

use std::time::Duration;

use crate::common::{key, sql, start_completed, TestResult};
use keiro_journal::{GcRequest, RetentionStore};
use keiro_tests::pg::TestDb;

#[tokio::test]
async fn the_journal_has_the_step_key_as_its_only_index() -> TestResult {
    let db = TestDb::new().await;
    let client = sql(&db.store()).await?;
    let rows = client
        .query(
            "SELECT indexrelid::regclass::text, indisreplident FROM pg_index \
             WHERE indrelid = 'journal'::regclass ORDER BY 1",
            &[],
        )
        .await?;
    let indexes: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        indexes,
        [("journal_step_key".to_owned(), true)],
        "an index of the journal no statement reads costs every step an entry"
    );
    Ok(())
}

#[tokio::test]
async fn retention_deletes_journal_rows_a_publication_replicates() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    start_completed(&store, &key("order", "old")).await?;

    // A publication that replicates deletes of the journal, as a `FOR ALL TABLES` one would.
    // Publication names are the database's, not the schema's: this one is the test's own.
    let publication = format!("{}_journal", db.schema());
    let client = sql(&store).await?;
    client
        .batch_execute(&format!(
            "CREATE PUBLICATION \"{publication}\" FOR TABLE journal"
        ))
        .await?;
    let request = GcRequest {
        now: Some(time::OffsetDateTime::now_utc() + time::Duration::hours(2)),
        ..GcRequest::new(Duration::from_secs(3600))
    };
    let collected = store.instances_gc(&request).await;
    client
        .batch_execute(&format!("DROP PUBLICATION \"{publication}\""))
        .await?;
    assert_eq!(collected?.instances, 1);
    let left: i64 = client
        .query_one("SELECT count(*) FROM journal", &[])
        .await?
        .get(0);
    assert_eq!(left, 0, "the instance's journal went with it");
    Ok(())
}
