//! At a table's production shape, the statements that walk an index in list or claim order
//! stop after about the rows they return. The bench's scale mode (`keiro bench --mode scale`)
//! measures these on 1,000,000 finished and 100,000 live instances; here the same shape is
//! 400,000 and 40,000, analyzed and vacuumed, filled once for every check (about 20 s): the
//! smallest size at which the planner's choice for a finished window is the one it makes at a
//! million (at 300,000 it still reads the window through `workflows_terminal_idx`; checked
//! with `EXPLAIN` on the bench's table). The rows read tell a walk that stops from one that
//! passes the backlog, which a "no sequential scan" check cannot (both plans are index scans).

use crate::common::TestResult;
use keiro_journal::{ListRequest, Status};
use keiro_postgres::plans::{ListStatement, INSTANCES_GC_CANDIDATES, INSTANCES_RUNNABLE};
use keiro_tests::pg::TestDb;
use time::{Duration, OffsetDateTime};

/// 400,000 finished runs over 30 days (g = 1 the newest), then 40,000 live ones in the last
/// hour, four in five runnable: the bench's scale shape at two fifths.
const LOAD: &[&str] = &[
    "INSERT INTO workflows (workflow_name, workflow_id, status, output, created_at, updated_at, \
         completed_at, parent_name, parent_id, queue, queue_key) \
     SELECT 'scale-' || (g % 10), 'done-' || lpad(g::text, 8, '0'), \
            CASE WHEN g % 100 < 96 THEN 'completed' WHEN g % 100 < 99 THEN 'failed' \
                 ELSE 'cancelled' END, '1', \
            now() - g * interval '6480 milliseconds' - interval '2 minutes', \
            now() - g * interval '6480 milliseconds', now() - g * interval '6480 milliseconds', \
            CASE WHEN g % 10 = 7 THEN 'scale-' || ((g + 3) % 10) END, \
            CASE WHEN g % 10 = 7 THEN 'done-' || lpad((g + 3)::text, 8, '0') END, \
            CASE WHEN g % 5 = 0 THEN 'q-' || (g % 3) END, \
            CASE WHEN g % 5 = 0 THEN 'k-' || (g % 400) END \
     FROM generate_series(1, 400000) g",
    "INSERT INTO workflows (workflow_name, workflow_id, status, created_at, updated_at, wake_after) \
     SELECT 'scale-' || (g % 10), 'live-' || lpad(g::text, 8, '0'), \
            CASE WHEN g % 5 = 0 THEN 'suspended' ELSE 'running' END, \
            now() - g * interval '90 milliseconds', now() - g * interval '90 milliseconds', \
            CASE WHEN g % 5 = 0 THEN now() + interval '1 hour' END \
     FROM generate_series(1, 40000) g",
    "VACUUM ANALYZE workflows",
];

/// Heap rows of `workflows` this transaction has read through indexes or scans so far.
const ROWS_READ: &str = "SELECT (coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0))::bigint \
     FROM pg_stat_xact_user_tables WHERE relid = 'workflows'::regclass";

/// Runs `sql` in a transaction of its own and returns (rows it returned, workflows rows read).
async fn rows_read(
    client: &mut deadpool_postgres::Object,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<(usize, i64), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    let before: i64 = tx.query_one(ROWS_READ, &[]).await?.get(0);
    let returned = tx.query(sql, params).await?.len();
    let after: i64 = tx.query_one(ROWS_READ, &[]).await?.get(0);
    tx.rollback().await?;
    Ok((returned, after - before))
}

/// Every check on one fill (filling is most of the time).
#[tokio::test]
async fn at_scale_list_discovery_and_retention_read_about_what_they_return() -> TestResult {
    let db = TestDb::new().await;
    let mut client = db.store().pool().get().await?;
    for statement in LOAD {
        client.batch_execute(statement).await?;
    }
    finished_window(&mut client).await?;
    retention(&mut client).await?;
    discovery(&mut client).await
}

/// A page of runs finished in a window stops at the window's end.
async fn finished_window(client: &mut deadpool_postgres::Object) -> TestResult {
    let now = OffsetDateTime::now_utc();
    let mut request = ListRequest::default();
    request.filter.finished.since = Some(now - Duration::days(11));
    request.filter.finished.until = Some(now - Duration::days(10));
    for status in [None, Some(Status::Completed)] {
        request.filter.status = status;
        let statement = ListStatement::new(&request);
        let (returned, read) = rows_read(client, &statement.sql, &statement.params()).await?;
        assert_eq!(returned, 51, "a full page and the probe row");
        // Bounded by the window's end (a run finishes after it is created), the newest-first
        // walk of the created_at index starts there. Before, it passed the 133,000 runs
        // finished since and the 40,000 live ones (about 0.5 s here, 1 s at a million).
        assert!(
            read <= 1_000,
            "a page of a finished window ({status:?}) read {read} rows"
        );
    }
    Ok(())
}

/// A retention batch walks the expired runs oldest first and stops at its size.
async fn retention(client: &mut deadpool_postgres::Object) -> TestResult {
    let cutoff = OffsetDateTime::now_utc() - Duration::days(27);
    let (returned, read) = rows_read(client, INSTANCES_GC_CANDIDATES, &[&cutoff, &500_i64]).await?;
    assert_eq!(returned, 500);
    // Each candidate, its parent probe and its child probe: never the table.
    assert!(read <= 2_000, "a retention batch of 500 read {read} rows");
    Ok(())
}

/// A limited discovery reads about the rows it returns, whatever the backlog.
async fn discovery(client: &mut deadpool_postgres::Object) -> TestResult {
    let (returned, read) = rows_read(
        client,
        INSTANCES_RUNNABLE,
        &[&None::<OffsetDateTime>, &Some(32_i64)],
    )
    .await?;
    assert_eq!(returned, 32);
    // Before: every one of the 32,000 runnable rows was read and sorted for 32.
    assert!(read <= 100, "a discovery of 32 read {read} rows");
    // Unlimited, it returns them all (the drain's use), the due suspended ones among them.
    client
        .batch_execute(
            "UPDATE workflows SET wake_after = now() - interval '1 second' \
             WHERE workflow_id IN ('live-00000005', 'live-00000010')",
        )
        .await?;
    let all = client
        .query(INSTANCES_RUNNABLE, &[&None::<OffsetDateTime>, &None::<i64>])
        .await?;
    assert_eq!(all.len(), 32_002);
    // In claim order: the oldest runnable first (g = 40,000 is parked, not due).
    let first: String = all[0].get("workflow_id");
    assert_eq!(first, "live-00039999");
    Ok(())
}
