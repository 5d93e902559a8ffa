//! Discovery is served by the partial index `workflows_active_idx`.

use crate::common::TestResult;
use keiro_postgres::plans::INSTANCES_RUNNABLE;
use keiro_tests::pg::TestDb;
use time::OffsetDateTime;

#[tokio::test]
async fn the_discovery_query_can_use_the_partial_index() -> TestResult {
    let db = TestDb::new().await;
    let mut client = db.store().pool().get().await?;
    // Rows in every state, terminal ones dominating as they do in production.
    client
        .batch_execute(
            "INSERT INTO workflows (workflow_name, workflow_id, status, completed_at) \
                 SELECT 'order', 'done-' || g, 'completed', now() FROM generate_series(1, 500) g; \
             INSERT INTO workflows (workflow_name, workflow_id, status) \
                 SELECT 'order', 'run-' || g, 'running' FROM generate_series(1, 5) g; \
             INSERT INTO workflows (workflow_name, workflow_id, status, wake_after) \
                 SELECT 'order', 'park-' || g, 'suspended', now() + interval '1 hour' FROM generate_series(1, 5) g; \
             ANALYZE workflows",
        )
        .await?;
    let tx = client.transaction().await?;
    // With sequential scans priced out, the plan shows whether the predicate is indexable at
    // all; a predicate the planner cannot prove to imply the index's would still seq-scan.
    tx.batch_execute("SET LOCAL enable_seqscan = off").await?;
    for now in [None, Some(OffsetDateTime::now_utc())] {
        let plan: Vec<String> = tx
            .query(
                &format!("EXPLAIN {INSTANCES_RUNNABLE}"),
                &[&now, &Some(10_i64)],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let plan = plan.join("\n");
        assert!(plan.contains("workflows_active_idx"), "{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
    }
    tx.rollback().await?;
    Ok(())
}
