//! What migration 0021 changed that only SQL shows: a claim, and the admission of a run on a
//! queue that counts nothing, change no indexed column, so PostgreSQL writes them as heap-only
//! (HOT) updates, with no new index entry. The outcomes are the contract suite's
//! (`keiro_tests::contract::lease::claim`, `keiro_tests::contract::queue::light`).

use crate::common::{key, start, TestResult};
use keiro_journal::JournalStore;
use keiro_tests::pg::TestDb;
use serde_json::json;

/// Runs `claim` (which returns rows) in a transaction of its own and returns the rows it
/// returned, the updates of `workflows` it made, and how many of those were HOT.
async fn counted(
    client: &mut deadpool_postgres::Object,
    claim: &str,
) -> Result<(i64, i64, i64), Box<dyn std::error::Error + Send + Sync>> {
    // The backend's pending counts, which also hold earlier transactions' until it reports
    // them when idle: within one transaction the difference is this transaction's.
    const COUNTS: &str = "SELECT pg_stat_get_xact_tuples_updated('workflows'::regclass), \
                                 pg_stat_get_xact_tuples_hot_updated('workflows'::regclass)";
    let tx = client.transaction().await?;
    let before = tx.query_one(COUNTS, &[]).await?;
    let claimed = i64::try_from(tx.query(claim, &[]).await?.len())?;
    let after = tx.query_one(COUNTS, &[]).await?;
    tx.commit().await?;
    let delta = |i: usize| after.get::<_, i64>(i) - before.get::<_, i64>(i);
    Ok((claimed, delta(0), delta(1)))
}

#[tokio::test]
async fn a_claim_and_a_light_admission_are_heap_only_updates() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    for i in 0..8 {
        store
            .instance_start(&start(&key("order", &format!("o-{i}")), json!({"n": i})))
            .await?;
    }
    let mut client = store.pool().get().await?;
    client
        .batch_execute(
            "SELECT keiro_queue_declare('light', NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
                                        false, 'fifo', NULL, true); \
             SELECT keiro_queue_declare('limited', 8, NULL, NULL, NULL, NULL, NULL, NULL, \
                                        false, 'fifo', NULL, true); \
             INSERT INTO workflows (workflow_name, workflow_id, input, queue) \
             SELECT 'order', 'q-' || i, '{}', CASE WHEN i < 8 THEN 'light' ELSE 'limited' END \
             FROM generate_series(0, 15) i",
        )
        .await?;

    let claim = "SELECT * FROM keiro_instances_claim_batch(ARRAY['order'], 'w', 60000, 4, NULL)";
    assert_eq!(
        counted(&mut client, claim).await?,
        (4, 4, 4),
        "an ordinary claim"
    );
    let light = "SELECT * FROM keiro_queue_admit(ARRAY['light'], ARRAY['order'], 'w', 60000, 4, \
                                                 NULL)";
    assert_eq!(
        counted(&mut client, light).await?,
        (4, 4, 4),
        "a light admission"
    );
    // A queue that counts slots marks its runs, which moves them between indexes.
    let limited = "SELECT * FROM keiro_queue_admit(ARRAY['limited'], ARRAY['order'], 'w', \
                                                   60000, 4, NULL)";
    assert_eq!(
        counted(&mut client, limited).await?,
        (4, 4, 0),
        "a limited admission"
    );
    Ok(())
}
