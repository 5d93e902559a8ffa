//! A worker's batch claim reads about as many instance rows as it claims, whatever the backlog
//! and whatever the table looked like when the connection first planned it.
//!
//! The claim walks `workflows_running_claim_idx` in claim order and stops after its limit. A
//! plan that sorted every runnable row instead would read the whole backlog on every claim, and
//! a connection keeps the plan it made while the table was small (a fresh schema, or a quiet
//! one before the backlog arrived): this test plans on an empty table, then claims from 5,000.
//!
//! A binary of its own: beside the other Postgres tests in one process it read the whole
//! backlog (failed in every full run of the merged binary, passed alone), so it runs as it
//! always ran until that is understood.

use keiro_tests::pg::TestDb;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The claim as a worker's pass sends it: 32 rows of `order`, a 30 s lease.
const CLAIM: &str =
    "SELECT count(*) FROM keiro_instances_claim_batch(ARRAY['order'], 'worker-a', 30000, 32, NULL)";

/// Heap rows of `workflows` this transaction has read through indexes or scans so far.
const ROWS_READ: &str = "SELECT (coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0))::bigint \
     FROM pg_stat_xact_user_tables WHERE relid = 'workflows'::regclass";

/// The claim of a worker serving one version (`p_versions`), as a versioned worker sends it.
const CLAIM_SERVING: &str = "SELECT count(*) FROM keiro_instances_claim_batch(\
     ARRAY['order'], 'worker-a', 30000, 32, NULL, ARRAY['v1'])";

/// Also for a worker serving one version, over a backlog of that version: the version filter
/// keeps the walk of the claim index. One test, the two one after the other: side by side in
/// one process they read the whole backlog, as the header says of this test beside others.
#[tokio::test]
async fn a_batch_claim_reads_about_what_it_claims_after_the_backlog_grew() -> TestResult {
    claim_reads_what_it_claims(CLAIM, "NULL").await?;
    claim_reads_what_it_claims(CLAIM_SERVING, "'v1'").await
}

async fn claim_reads_what_it_claims(claim: &str, version: &str) -> TestResult {
    let db = TestDb::new().await;
    let mut client = db.store().pool().get().await?;
    // No statistics but what the test makes: autovacuum's ANALYZE would re-plan the claim.
    client
        .batch_execute("ALTER TABLE workflows SET (autovacuum_enabled = false)")
        .await?;
    // The connection claims while the table is empty, often enough for its plan to settle
    // (plpgsql makes a generic plan after five custom ones).
    for _ in 0..8 {
        let tx = client.transaction().await?;
        let claimed: i64 = tx.query_one(claim, &[]).await?.get(0);
        assert_eq!(claimed, 0);
        tx.rollback().await?;
    }
    // Then the backlog arrives. Each claim is rolled back, so every claim sees all of it.
    client
        .batch_execute(&format!(
            "INSERT INTO workflows (workflow_name, workflow_id, app_version) \
                 SELECT 'order', 'late-' || g, {version} FROM generate_series(1, 5000) g"
        ))
        .await?;
    for _ in 0..3 {
        let tx = client.transaction().await?;
        let before: i64 = tx.query_one(ROWS_READ, &[]).await?.get(0);
        let claimed: i64 = tx.query_one(claim, &[]).await?.get(0);
        let read = tx.query_one(ROWS_READ, &[]).await?.get::<_, i64>(0) - before;
        tx.rollback().await?;
        assert_eq!(claimed, 32);
        // The 32 claimed rows are read twice (the scan, the update); never the backlog.
        assert!(
            read <= 100,
            "a claim of 32 read {read} instance rows of a 5,005-row backlog"
        );
    }
    Ok(())
}
