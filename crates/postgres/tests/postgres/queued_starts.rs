//! A batch of starts on one declared queue with no dedup id (a producer's usual batch) reads
//! its queue's row once, where any other batch of queued starts probes `keiro_queues` once a
//! request (`keiro_queues_start`). The contract suite checks that both answer alike
//! (`contract::queue::start`); only the table's own counters show which path a batch took, and
//! that the one-read path still starts a run free only in a READ COMMITTED transaction.

use crate::common::{TestResult, DECLARE_LIGHT_QUEUE};
use keiro_tests::pg::TestDb;

/// Eight starts of `wf` on queue `$2` (ids `$1-0` .. `$1-7`), priority `$3` on the last; the
/// rows created.
const START_EIGHT: &str = "SELECT count(*) FILTER (WHERE s.created) \
     FROM keiro_queues_start(array_fill('wf'::text, ARRAY[8]), \
         ARRAY(SELECT $1::text || '-' || g FROM generate_series(0, 7) g), \
         array_fill('null'::jsonb, ARRAY[8]), array_fill(NULL::text, ARRAY[8]), \
         array_fill(NULL::text, ARRAY[8]), array_fill(0, ARRAY[7]) || $3::integer, \
         array_fill($2::text, ARRAY[8]), array_fill(NULL::text, ARRAY[8]), \
         array_fill(NULL::text, ARRAY[8]), array_fill(NULL::timestamptz, ARRAY[8])) s";

/// Index scans of `keiro_queues` this transaction has started so far.
const QUEUE_SCANS: &str = "SELECT coalesce(idx_scan, 0)::bigint FROM pg_stat_xact_user_tables \
     WHERE relid = 'keiro_queues'::regclass";

/// Runs `START_EIGHT` in a transaction of `isolation` and returns (runs created, index scans
/// of `keiro_queues`).
async fn start_eight(
    client: &mut deadpool_postgres::Object,
    isolation: tokio_postgres::IsolationLevel,
    prefix: &str,
    queue: &str,
    last_priority: i32,
) -> Result<(i64, i64), tokio_postgres::Error> {
    let tx = client
        .build_transaction()
        .isolation_level(isolation)
        .start()
        .await?;
    let before: i64 = tx.query_one(QUEUE_SCANS, &[]).await?.get(0);
    let created: i64 = tx
        .query_one(START_EIGHT, &[&prefix, &queue, &last_priority])
        .await?
        .get(0);
    let after: i64 = tx.query_one(QUEUE_SCANS, &[]).await?.get(0);
    tx.commit().await?;
    Ok((created, after - before))
}

#[tokio::test]
async fn a_batch_on_one_queue_reads_its_queue_once_and_starts_free_only_in_read_committed(
) -> TestResult {
    use tokio_postgres::IsolationLevel::{ReadCommitted, RepeatableRead};
    let db = TestDb::new().await;
    let mut client = db.store().pool().get().await?;
    client.batch_execute(DECLARE_LIGHT_QUEUE).await?;
    let free = "SELECT count(*) FILTER (WHERE queue_free), count(*) FROM workflows \
                WHERE workflow_id LIKE $1 || '-%'";

    let (created, scans) = start_eight(&mut client, ReadCommitted, "rc", "q", 0).await?;
    assert_eq!(created, 8);
    assert_eq!(scans, 1, "one read of the queue for the batch");
    let row = client.query_one(free, &[&"rc"]).await?;
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (8, 8));

    // Another isolation level cannot see a change committed after its snapshot: the runs wait.
    let (created, _) = start_eight(&mut client, RepeatableRead, "rr", "q", 0).await?;
    assert_eq!(created, 8);
    let row = client.query_one(free, &[&"rr"]).await?;
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (0, 8));

    // A priority the queue does not take sends the batch through the general statement, which
    // probes the queue once a request and refuses that start alone.
    let (created, scans) = start_eight(&mut client, ReadCommitted, "pr", "q", 5).await?;
    assert_eq!(created, 7);
    assert!(
        scans > 1,
        "the general statement read the queue {scans} time(s)"
    );
    Ok(())
}
