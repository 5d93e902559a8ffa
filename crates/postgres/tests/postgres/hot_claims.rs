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

/// The `keiro_queue_status` trigger gives a slot and a dedup id back when a run on a queue
/// changes status. A run that holds neither (on a queue that counts nothing, with no dedup id)
/// has nothing to give back, and its status change does not call the trigger at all: a plpgsql
/// trigger call was a tenth of what its completion cost PostgreSQL (`SQL_COST_QUEUE=1
/// scripts/sql-cost complete 16`). The runs that hold something still get it back.
#[tokio::test]
async fn a_run_that_holds_nothing_ends_without_the_queue_trigger() -> TestResult {
    let db = TestDb::new().await;
    let mut client = db.store().pool().get().await?;
    client
        .batch_execute(
            "SELECT keiro_queue_declare('light', NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
                                        false, 'fifo', 'refuse', true); \
             SELECT keiro_queue_declare('limited', 8, NULL, NULL, NULL, NULL, NULL, NULL, \
                                        false, 'fifo', NULL, true); \
             INSERT INTO workflows (workflow_name, workflow_id, input, queue, dedup_id, \
                                    queue_admitted) VALUES \
                 ('order', 'plain', '{}', 'light', NULL, false), \
                 ('order', 'deduped', '{}', 'light', 'invoice-7', false), \
                 ('order', 'admitted', '{}', 'limited', NULL, true)",
        )
        .await?;
    // Trigger calls of one transaction, counted by the backend (superuser: the test's role).
    let calls_of = async |client: &mut deadpool_postgres::Object, id: &str| {
        let tx = client.transaction().await?;
        tx.batch_execute("SET LOCAL track_functions = 'pl'").await?;
        // Pending counts also hold earlier transactions' until reported: take the difference.
        const CALLS: &str =
            "SELECT coalesce(pg_stat_get_xact_function_calls('keiro_queue_status'::regproc), 0)";
        let before: i64 = tx.query_one(CALLS, &[]).await?.get(0);
        tx.execute(
            "UPDATE workflows SET status = 'completed', completed_at = now() \
             WHERE workflow_name = 'order' AND workflow_id = $1",
            &[&id],
        )
        .await?;
        let calls = tx.query_one(CALLS, &[]).await?.get::<_, i64>(0) - before;
        let row = tx
            .query_one(
                "SELECT queue_admitted, dedup_id FROM workflows \
                 WHERE workflow_name = 'order' AND workflow_id = $1",
                &[&id],
            )
            .await?;
        tx.commit().await?;
        Ok::<_, tokio_postgres::Error>((
            calls,
            row.get::<_, bool>(0),
            row.get::<_, Option<String>>(1),
        ))
    };
    assert_eq!(
        calls_of(&mut client, "plain").await?,
        (0, false, None),
        "holds nothing"
    );
    assert_eq!(
        calls_of(&mut client, "deduped").await?,
        (1, false, None),
        "gives its dedup id back"
    );
    assert_eq!(
        calls_of(&mut client, "admitted").await?,
        (1, false, None),
        "gives its slot back"
    );
    Ok(())
}
