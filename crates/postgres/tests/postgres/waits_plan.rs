//! `InspectStore::instance_waits` reads one instance's timers, awakeables and signal waits
//! through indexes on their owner, never by scanning a table: on 4,000 instances with 100,000
//! timers, 50,000 awakeables and 40,000 signal waits, analyzed, the planner's own choice.

use crate::common::TestResult;
use keiro_postgres::plans::INSTANCE_WAITS;
use keiro_tests::pg::TestDb;

/// 4,000 instances; each has 25 timers (one in five a signal timeout), 12 or 13 awakeables
/// (one in four pending) and 10 signal waits, the first ones with a timeout.
const LOAD: &str = "\
INSERT INTO workflows (workflow_name, workflow_id, status) \
SELECT 'wf-' || (g % 10), 'id-' || g, 'suspended' FROM generate_series(1, 4000) g; \
INSERT INTO timers (workflow_name, workflow_id, generation, step, kind, token, fire_at, status, \
                    fired_at) \
SELECT 'wf-' || (g % 10), 'id-' || g, s / 10, \
       CASE WHEN s % 5 = 0 THEN 'signal:' || s ELSE 'sleep:' || s END, \
       CASE WHEN s % 5 = 0 THEN 'signal_timeout' ELSE 'sleep' END, \
       CASE WHEN s % 5 = 0 THEN 'token-' || g || '-' || s END, \
       now() + s * interval '1 minute', \
       CASE WHEN s < 20 THEN 'fired' ELSE 'scheduled' END, \
       CASE WHEN s < 20 THEN now() END \
FROM generate_series(1, 4000) g, generate_series(0, 24) s; \
INSERT INTO awakeables (id, workflow_name, workflow_id, generation, status, settled_at) \
SELECT gen_random_uuid(), 'wf-' || (g % 10), 'id-' || g, a / 5, \
       CASE WHEN a % 4 = 0 THEN 'pending' ELSE 'completed' END, \
       CASE WHEN a % 4 <> 0 THEN now() END \
FROM generate_series(1, 4000) g, generate_series(0, 12) a WHERE (g + a) % 26 <> 0; \
INSERT INTO signal_waiters (token, workflow_name, workflow_id, generation, step) \
SELECT 'token-' || g || '-' || (w * 5), 'wf-' || (g % 10), 'id-' || g, (w * 5) / 10, \
       'signal:' || (w * 5) \
FROM generate_series(1, 4000) g, generate_series(0, 9) w; \
ANALYZE workflows; ANALYZE timers; ANALYZE awakeables; ANALYZE signal_waiters";

#[tokio::test]
async fn an_instances_waits_are_read_through_indexes() -> TestResult {
    let db = TestDb::new().await;
    let client = db.store().pool().get().await?;
    client.batch_execute(LOAD).await?;
    for (name, id, limit) in [
        ("wf-7", "id-1237", 51_i64),
        ("wf-0", "id-40", 2),
        ("wf-3", "nope", 51),
    ] {
        let rows = client
            .query(
                &format!("EXPLAIN (FORMAT JSON) {INSTANCE_WAITS}"),
                &[&name, &id, &limit],
            )
            .await?;
        let plan: serde_json::Value = rows[0].get(0);
        let plan = plan.to_string();
        assert!(!plan.contains("Seq Scan"), "{name}/{id}: {plan}");
        for index in ["timers_pkey", "awakeables_owner_idx", "signal_waiters_pkey"] {
            assert!(plan.contains(index), "{name}/{id}: {index} unused: {plan}");
        }
    }

    // Sanity: the statement returns that instance's rows, each kind cut to the limit.
    let rows = client
        .query(INSTANCE_WAITS, &[&"wf-7", &"id-1237", &11_i64])
        .await?;
    let count = |source: &str| {
        rows.iter()
            .filter(|row| row.get::<_, String>(0) == source)
            .count()
    };
    assert_eq!(
        (count("timer"), count("awakeable"), count("signal_wait")),
        (11, 11, 10)
    );
    Ok(())
}
