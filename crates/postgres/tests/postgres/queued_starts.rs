//! A batch of starts on one declared queue with no dedup id (a producer's usual batch) reads
//! its queue's row once, where any other batch of queued starts probes `keiro_queues` once a
//! request (`keiro_queues_start`). The contract suite checks that both answer alike
//! (`contract::queue::start`); only the table's own counters show which path a batch took, and
//! that the one-read path still starts a run free only in a READ COMMITTED transaction. And
//! what a queued start writes beyond a plain one: its entry in the list by queue and key, which
//! a start batch's runs share (migration 0030).

use crate::common::{TestResult, DECLARE_LIGHT_QUEUE};
use keiro_tests::pg::TestDb;

/// Starts of `wf` on the queues `$2` (an item each; NULL: no queue), ids `$1-1` .. `$1-n`,
/// key `$4`, priority `$3` on the last; the rows created.
const START_BATCH: &str = "SELECT count(*) FILTER (WHERE s.created) \
     FROM keiro_queues_start(array_fill('wf'::text, ARRAY[cardinality($2::text[])]), \
         ARRAY(SELECT $1::text || '-' || g FROM generate_series(1, cardinality($2)) g), \
         array_fill('null'::jsonb, ARRAY[cardinality($2)]), \
         array_fill(NULL::text, ARRAY[cardinality($2)]), \
         array_fill(NULL::text, ARRAY[cardinality($2)]), \
         array_fill(0, ARRAY[cardinality($2) - 1]) || $3::integer, $2, \
         array_fill($4::text, ARRAY[cardinality($2)]), \
         array_fill(NULL::text, ARRAY[cardinality($2)]), \
         array_fill(NULL::timestamptz, ARRAY[cardinality($2)])) s";

/// Index scans of `keiro_queues` this transaction has started so far.
const QUEUE_SCANS: &str = "SELECT coalesce(idx_scan, 0)::bigint FROM pg_stat_xact_user_tables \
     WHERE relid = 'keiro_queues'::regclass";

/// Runs `START_BATCH` of eight starts on `queue` in a transaction of `isolation` and returns
/// (runs created, index scans of `keiro_queues`).
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
    let queues = vec![Some(queue); 8];
    let created: i64 = tx
        .query_one(
            START_BATCH,
            &[&prefix, &queues, &last_priority, &None::<&str>],
        )
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

    // A batch whose later item has no queue is not one queue's: each run is on its own item's.
    let mixed: i64 = client
        .query_one(
            START_BATCH,
            &[&"mx", &vec![Some("q"), None], &0, &None::<&str>],
        )
        .await?
        .get(0);
    assert_eq!(mixed, 2);
    let queues: Vec<Option<String>> = client
        .query(
            "SELECT queue FROM workflows WHERE workflow_id LIKE 'mx-%' ORDER BY workflow_id",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(queues, [Some("q".to_owned()), None]);
    Ok(())
}

/// The list by queue and key (0030) keys on the key and the start's time alone, so the runs of
/// one start batch (one transaction time) and their rows' later versions share index entries
/// (PostgreSQL's posting lists) where a key ending with each run's name and id gave every run
/// an entry of its own: 400 runs started in one batch and then ended fit one leaf page.
#[tokio::test]
async fn a_start_batch_shares_its_entries_of_the_list_by_queue() -> TestResult {
    let db = TestDb::new().await;
    let client = db.store().pool().get().await?;
    client.batch_execute(DECLARE_LIGHT_QUEUE).await?;
    let started: i64 = client
        .query_one(
            START_BATCH,
            &[&"run", &vec![Some("q"); 400], &0, &Some("tenant")],
        )
        .await?
        .get(0);
    assert_eq!(started, 400);
    // Their ends: a status change is a new row version, with a new entry in every index.
    client
        .execute(
            "UPDATE workflows SET status = 'completed', completed_at = now() \
             WHERE workflow_name = 'wf'",
            &[],
        )
        .await?;
    let pages: i64 = client
        .query_one(
            "SELECT pg_relation_size('workflows_list_queue_idx') \
                    / current_setting('block_size')::bigint",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(
        pages, 2,
        "the metapage and one leaf hold the batch's 800 row versions"
    );
    Ok(())
}
