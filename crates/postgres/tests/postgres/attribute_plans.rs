//! The list's attribute filters are served by migration 0026's indexes: on 100,000 instances
//! with four attributes each, analyzed, an equality on a text attribute, a range on a number
//! and a range on a time (alone, combined with the other filters, with a cursor, in both
//! orders) read the attribute index of their kind and scan no table sequentially.

use crate::common::TestResult;
use keiro_journal::attribute::{AttrFilter, AttrOp, AttrValue};
use keiro_journal::{Cursor, InstanceKey, ListOrder, ListRequest, Status};
use keiro_postgres::plans::ListStatement;
use keiro_tests::pg::TestDb;
use time::{Duration, OffsetDateTime};

/// 100k instances over 10 workflows and 30 days (statuses as `list_plans` skews them), each
/// with a customer (one of 2,000), an amount (0 to 99,999), a due time (one a minute) and a
/// region (one of two: not selective at all).
const LOAD: &str = "\
INSERT INTO workflows (workflow_name, workflow_id, status, created_at, updated_at, completed_at) \
SELECT 'wf-' || (g % 10), 'id-' || g, \
       CASE WHEN g % 100 < 80 THEN 'completed' WHEN g % 100 < 90 THEN 'running' \
            WHEN g % 100 < 95 THEN 'suspended' WHEN g % 100 < 99 THEN 'failed' ELSE 'cancelled' END, \
       now() - (g * interval '26 seconds'), now() - (g * interval '25 seconds'), \
       CASE WHEN g % 100 < 80 OR g % 100 >= 95 THEN now() - (g * interval '25 seconds') END \
FROM generate_series(1, 100000) g; \
INSERT INTO workflow_attributes (workflow_name, workflow_id, attr, kind, value, text_value) \
SELECT 'wf-' || (g % 10), 'id-' || g, 'customer', 'text', \
       jsonb_build_object('type', 'text', 'value', 'c-' || (g % 2000)), 'c-' || (g % 2000) \
FROM generate_series(1, 100000) g; \
INSERT INTO workflow_attributes (workflow_name, workflow_id, attr, kind, value, text_value) \
SELECT 'wf-' || (g % 10), 'id-' || g, 'region', 'text', \
       jsonb_build_object('type', 'text', 'value', CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END), \
       CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END \
FROM generate_series(1, 100000) g; \
INSERT INTO workflow_attributes (workflow_name, workflow_id, attr, kind, value, num_value) \
SELECT 'wf-' || (g % 10), 'id-' || g, 'amount', 'int', \
       jsonb_build_object('type', 'int', 'value', (g * 7919) % 100000), (g * 7919) % 100000 \
FROM generate_series(1, 100000) g; \
INSERT INTO workflow_attributes (workflow_name, workflow_id, attr, kind, value, time_value) \
SELECT 'wf-' || (g % 10), 'id-' || g, 'due', 'time', \
       jsonb_build_object('type', 'time', 'value', \
           to_char(timestamptz '2030-01-01 00:00:00+00' + g * interval '1 minute', \
                   'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')), \
       timestamptz '2030-01-01 00:00:00+00' + g * interval '1 minute' \
FROM generate_series(1, 100000) g; \
ANALYZE workflows; ANALYZE workflow_attributes";

fn due(minutes: i64) -> AttrValue {
    AttrValue::Time(
        OffsetDateTime::from_unix_timestamp(1_893_456_000).expect("2030-01-01")
            + Duration::minutes(minutes),
    )
}

#[tokio::test]
async fn attribute_filters_on_100k_instances_use_their_index() -> TestResult {
    let db = TestDb::new().await;
    let client = db.store().pool().get().await?;
    client.batch_execute(LOAD).await?;
    let now = OffsetDateTime::now_utc();
    let cursor = Cursor {
        created_at: now - Duration::days(3),
        key: InstanceKey::parse("wf-3", "id-9963").expect("valid"),
    };
    let selective: [(Vec<AttrFilter>, &str); 4] = [
        (
            vec![AttrFilter::eq("customer", "c-42")],
            "workflow_attributes_text_idx",
        ),
        (
            vec![AttrFilter::new("amount", AttrOp::Ge, 99_900)],
            "workflow_attributes_num_idx",
        ),
        (
            vec![
                AttrFilter::new("amount", AttrOp::Gt, 5_000),
                AttrFilter::new("amount", AttrOp::Le, 5_040),
            ],
            "workflow_attributes_num_idx",
        ),
        (
            vec![
                AttrFilter::new("due", AttrOp::Ge, due(50_000)),
                AttrFilter::new("due", AttrOp::Lt, due(50_030)),
            ],
            "workflow_attributes_time_idx",
        ),
    ];
    let mut shapes = 0;
    for (attributes, index) in &selective {
        for mask in 0_u32..4 {
            for with_cursor in [false, true] {
                for order in [ListOrder::NewestFirst, ListOrder::OldestFirst] {
                    let mut request = ListRequest::default();
                    request.filter.attributes.clone_from(attributes);
                    if mask & 1 != 0 {
                        request.filter.name = Some("wf-2".parse()?);
                    }
                    if mask & 2 != 0 {
                        request.filter.status = Some(Status::Completed);
                    }
                    request.order = order;
                    if with_cursor {
                        request.cursor = Some(cursor.clone());
                    }
                    request.validate()?;
                    let plan = plan_of(&client, &request).await?;
                    assert!(!plan.contains("Seq Scan"), "{request:?}\n{plan}");
                    assert!(plan.contains(index), "{request:?} reads {index}\n{plan}");
                    shapes += 1;
                }
            }
        }
    }
    assert_eq!(shapes, 4 * 4 * 2 * 2);
    // An attribute half the runs carry: the planner may walk the list's own index instead
    // and probe each row's attribute, but it scans nothing whole either way.
    let mut request = ListRequest::default();
    request.filter.attributes = vec![AttrFilter::eq("region", "eu")];
    let plan = plan_of(&client, &request).await?;
    assert!(!plan.contains("Seq Scan"), "{plan}");

    // Sanity: the filters return what they say on this data (g * 7919 % 100000 >= 99900 for
    // 100 values of g, every one a distinct amount).
    let mut request = ListRequest::default();
    request.filter.attributes = vec![AttrFilter::new("amount", AttrOp::Ge, 99_900)];
    request.limit = 1000;
    let statement = ListStatement::new(&request);
    let rows = client
        .query(statement.sql.as_str(), &statement.params())
        .await?;
    assert_eq!(rows.len(), 100);
    let mut request = ListRequest::default();
    request.filter.attributes = vec![AttrFilter::eq("customer", "c-42")];
    request.limit = 1000;
    let statement = ListStatement::new(&request);
    let rows = client
        .query(statement.sql.as_str(), &statement.params())
        .await?;
    assert_eq!(rows.len(), 50, "one run in 2,000");
    Ok(())
}

async fn plan_of(
    client: &tokio_postgres::Client,
    request: &ListRequest,
) -> Result<String, tokio_postgres::Error> {
    let statement = ListStatement::new(request);
    let rows = client
        .query(
            &format!("EXPLAIN (FORMAT JSON) {}", statement.sql),
            &statement.params(),
        )
        .await?;
    let plan: serde_json::Value = rows[0].get(0);
    Ok(plan.to_string())
}
