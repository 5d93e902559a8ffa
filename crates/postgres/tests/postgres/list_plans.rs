//! Every list query shape the CLI offers is served by indexes (migrations 0015 and 0020): on 100,000
//! instances and 20,000 remote tasks, analyzed, the planner's own choice for each combination
//! of filters, with and without a cursor, in both orders, has no sequential scan (and a queue
//! key filter walks the list by queue and key, migration 0030). Retention's
//! batch query and the overview's throughput are checked the same way.

use crate::common::TestResult;
use keiro_journal::{Cursor, InstanceKey, ListOrder, ListRequest, Status};
use keiro_postgres::{
    plans::ListStatement, plans::INSTANCES_GC_CANDIDATES, plans::INSTANCES_THROUGHPUT,
};
use keiro_tests::pg::TestDb;
use time::{Duration, OffsetDateTime};

/// 100k instances over 10 workflows and 30 days, statuses as production skews them (mostly
/// completed), one in ten a child of an earlier one; 20k remote tasks, 1% failed.
const LOAD: &str = "\
INSERT INTO workflows (workflow_name, workflow_id, status, created_at, updated_at, completed_at, \
                       parent_name, parent_id, queue, queue_key) \
SELECT 'wf-' || (g % 10), 'id-' || g, \
       CASE WHEN g % 100 < 80 THEN 'completed' WHEN g % 100 < 90 THEN 'running' \
            WHEN g % 100 < 95 THEN 'suspended' WHEN g % 100 < 99 THEN 'failed' ELSE 'cancelled' END, \
       now() - (g * interval '26 seconds'), now() - (g * interval '25 seconds'), \
       CASE WHEN g % 100 < 80 OR g % 100 >= 95 THEN now() - (g * interval '25 seconds') END, \
       CASE WHEN g % 10 = 7 THEN 'wf-' || ((g / 10) % 10) END, \
       CASE WHEN g % 10 = 7 THEN 'id-' || (g / 10) END, \
       CASE WHEN g % 5 = 0 THEN 'q-' || (g % 3) END, \
       CASE WHEN g % 5 = 0 THEN 'k-' || (g % 400) END \
FROM generate_series(1, 100000) g; \
INSERT INTO remote_tasks (step_id, workflow_name, workflow_id, generation, step, journal_step, \
                          grp, input, status, max_attempts, backoff_initial_ms, backoff_max_ms, \
                          backoff_jitter, redispatch_max, settled_at) \
SELECT 'wf-' || (g % 10) || '/id-' || g || '/0/label', 'wf-' || (g % 10), 'id-' || g, 0, \
       'label', 'remote:label', 'label', 'null', \
       CASE WHEN g % 500 = 0 THEN 'failed' WHEN g % 2 = 0 THEN 'completed' ELSE 'pending' END, \
       3, 100, 1000, false, 10, CASE WHEN g % 2 = 0 THEN now() END \
FROM generate_series(1, 100000, 5) g; \
ANALYZE workflows; ANALYZE remote_tasks";

fn requests(now: OffsetDateTime) -> Vec<ListRequest> {
    let cursor = Cursor {
        created_at: now - Duration::days(3),
        key: InstanceKey::parse("wf-3", "id-9963").expect("valid"),
    };
    let mut all = Vec::new();
    // Every combination of the CLI's filters: name, status, since, parent, id prefix, failed remote.
    for mask in 0_u32..64 {
        for with_cursor in [false, true] {
            for order in [ListOrder::NewestFirst, ListOrder::OldestFirst] {
                let mut request = ListRequest::default();
                let filter = &mut request.filter;
                if mask & 1 != 0 {
                    filter.name = Some("wf-3".parse().expect("valid"));
                }
                if mask & 2 != 0 {
                    filter.status = Some(Status::Failed);
                }
                if mask & 4 != 0 {
                    filter.created.since = Some(now - Duration::hours(1));
                }
                if mask & 8 != 0 {
                    filter.parent = Some(InstanceKey::parse("wf-0", "id-50").expect("valid"));
                }
                if mask & 16 != 0 {
                    filter.id_prefix = Some("id-123".to_owned());
                }
                filter.failed_remote = mask & 32 != 0;
                request.order = order;
                if with_cursor {
                    request.cursor = Some(cursor.clone());
                }
                all.push(request);
            }
        }
    }
    // The queue filters (0020), alone and with the filters an operator combines them with.
    for mask in 0_u32..8 {
        for with_cursor in [false, true] {
            for order in [ListOrder::NewestFirst, ListOrder::OldestFirst] {
                let mut request = ListRequest::default();
                request.filter.queue = Some("q-1".to_owned());
                if mask & 1 != 0 {
                    request.filter.queue_key = Some("k-10".to_owned());
                }
                if mask & 2 != 0 {
                    request.filter.status = Some(Status::Running);
                }
                if mask & 4 != 0 {
                    request.filter.name = Some("wf-0".parse().expect("valid"));
                }
                request.order = order;
                if with_cursor {
                    request.cursor = Some(cursor.clone());
                }
                all.push(request);
            }
        }
    }
    // The facade's other windows: a finished range, a created range with both ends. (The
    // updated window is unindexed on purpose: see `ListFilter::updated`.)
    let mut finished = ListRequest::default();
    finished.filter.finished.since = Some(now - Duration::hours(1));
    finished.filter.finished.until = Some(now - Duration::minutes(30));
    all.push(finished);
    let mut created = ListRequest::default();
    created.filter.created.since = Some(now - Duration::days(2));
    created.filter.created.until = Some(now - Duration::days(1));
    all.push(created);
    all
}

#[tokio::test]
async fn no_list_query_shape_scans_a_table_sequentially() -> TestResult {
    let db = TestDb::new().await;
    let client = db.store().pool().get().await?;
    client.batch_execute(LOAD).await?;
    let now = OffsetDateTime::now_utc();
    let mut shapes = 0;
    for request in requests(now) {
        request.validate()?;
        let statement = ListStatement::new(&request);
        let rows = client
            .query(
                &format!("EXPLAIN (FORMAT JSON) {}", statement.sql),
                &statement.params(),
            )
            .await?;
        let plan: serde_json::Value = rows[0].get(0);
        let plan = plan.to_string();
        assert!(
            !plan.contains("Seq Scan"),
            "{request:?}\n{}\n{plan}",
            statement.sql
        );
        // A key is one range of the list by queue and key (0030), with or without a cursor.
        let filter = &request.filter;
        if filter.queue_key.is_some() && filter.status.is_none() && filter.name.is_none() {
            assert!(
                plan.contains("workflows_list_queue_idx"),
                "{request:?}\n{}\n{plan}",
                statement.sql
            );
        }
        shapes += 1;
    }
    assert_eq!(shapes, 64 * 4 + 8 * 4 + 2);

    // Retention's batch walks the terminal instances oldest first through their partial index,
    // probing each one's parent (primary key) and children (the parent index).
    for cutoff in [now - Duration::days(1), now - Duration::days(29)] {
        let rows = client
            .query(
                &format!("EXPLAIN (FORMAT JSON) {INSTANCES_GC_CANDIDATES}"),
                &[&cutoff, &500_i64],
            )
            .await?;
        let plan: serde_json::Value = rows[0].get(0);
        let plan = plan.to_string();
        assert!(!plan.contains("Seq Scan"), "{plan}");
        assert!(plan.contains("workflows_terminal_idx"), "{plan}");
    }

    // The overview's throughput reads one range of the same partial index: the last hour by
    // minute, and a day by hour.
    for (secs, buckets) in [(60_i64, 60_i64), (3600, 24)] {
        let rows = client
            .query(
                &format!("EXPLAIN (FORMAT JSON) {INSTANCES_THROUGHPUT}"),
                &[&None::<OffsetDateTime>, &secs, &buckets],
            )
            .await?;
        let plan: serde_json::Value = rows[0].get(0);
        let plan = plan.to_string();
        assert!(!plan.contains("Seq Scan"), "{plan}");
        assert!(plan.contains("workflows_terminal_idx"), "{plan}");
    }
    // One instance ends every 25 seconds, 85% of them terminal (the statuses above): a day by
    // hour counts about 122 an hour.
    let rows = client
        .query(INSTANCES_THROUGHPUT, &[&Some(now), &3600_i64, &24_i64])
        .await?;
    let total: i64 = rows.iter().map(|row| row.get::<_, i64>("c")).sum();
    assert!(total > 24 * 100 && total <= 24 * 145, "{total}");

    // Sanity: the queries return what they say on this data.
    let mut request = ListRequest::default();
    request.filter.status = Some(Status::Failed);
    request.filter.name = Some("wf-6".parse()?); // g % 100 = 96
    request.limit = 5;
    let statement = ListStatement::new(&request);
    let rows = client
        .query(statement.sql.as_str(), &statement.params())
        .await?;
    assert_eq!(rows.len(), 6, "one probe row beyond the limit");
    for row in &rows {
        assert_eq!(row.get::<_, String>("status"), "failed");
        assert_eq!(row.get::<_, String>("workflow_name"), "wf-6");
    }
    Ok(())
}
