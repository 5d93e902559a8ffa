//! Runs of a queue that counts nothing start free (migration 0027) and the ordinary claim
//! takes them; a change that makes the queue count, or pauses it, turns its free runs into
//! waiting ones. Only SQL shows what this file covers: a start that read the queue as free
//! just before such a change commits must not leave a free run behind it, which the queue's
//! advisory lock (shared by starts, exclusive for the change) prevents; and a start in a
//! transaction that is not READ COMMITTED makes a waiting run instead. The rules themselves
//! are the contract suite's (`keiro_tests::contract::queue::light`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{TestResult, DECLARE_LIGHT_QUEUE};
use keiro_tests::pg::TestDb;

/// Live free runs of queue `q`.
const FREE_LIVE: &str = "SELECT count(*) FROM workflows \
     WHERE queue = 'q' AND queue_free AND status IN ('running', 'suspended')";

#[tokio::test]
async fn no_start_leaves_a_free_run_behind_a_limit_or_a_pause() -> TestResult {
    let db = TestDb::new().await;
    let pool = db.store().pool().clone();
    let light = DECLARE_LIGHT_QUEUE;
    let limited = "SELECT keiro_queue_declare('q', 2, NULL, NULL, NULL, NULL, NULL, NULL, \
                   false, 'fifo', NULL, true)";
    pool.get().await?.batch_execute(light).await?;

    // Starters: single starts and batches of four, as fast as they go, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let mut starters = tokio::task::JoinSet::new();
    for s in 0..6 {
        let (pool, stop) = (pool.clone(), stop.clone());
        starters.spawn(async move {
            let client = pool.get().await?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if s % 2 == 0 {
                    client
                        .execute(
                            "SELECT 1 FROM keiro_queue_start('wf', $1, 'null', NULL, NULL, 0, \
                             'q', NULL, NULL, NULL, false)",
                            &[&format!("s{s}-{n}")],
                        )
                        .await?;
                } else {
                    let ids: Vec<String> = (0..4).map(|i| format!("s{s}-{n}-{i}")).collect();
                    client
                        .execute(
                            "SELECT 1 FROM keiro_queues_start(array_fill('wf'::text, ARRAY[4]), \
                             $1, array_fill('null'::jsonb, ARRAY[4]), \
                             array_fill(NULL::text, ARRAY[4]), array_fill(NULL::text, ARRAY[4]), \
                             array_fill(0, ARRAY[4]), array_fill('q'::text, ARRAY[4]), \
                             array_fill(NULL::text, ARRAY[4]), array_fill(NULL::text, ARRAY[4]), \
                             array_fill(NULL::timestamptz, ARRAY[4]))",
                            &[&ids],
                        )
                        .await?;
                }
                n += 1;
            }
            Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(n)
        });
    }

    let admin = pool.get().await?;
    let mut stale = Vec::new();
    for round in 0..16 {
        // Let free runs pile up, then take the queue out of the free state while starts run.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let pause = round % 2 == 1;
        if pause {
            admin
                .execute("SELECT keiro_queue_set_paused('q', true)", &[])
                .await?;
        } else {
            admin.batch_execute(limited).await?;
        }
        // Every start that began before the change has committed by now (they take
        // microseconds); none after it makes a free run.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let free: i64 = admin.query_one(FREE_LIVE, &[]).await?.get(0);
        stale.push(free);
        if pause {
            admin
                .execute("SELECT keiro_queue_set_paused('q', false)", &[])
                .await?;
        } else {
            admin.batch_execute(light).await?;
        }
    }
    // The free state came back after the last change: the starters, still running, make free
    // runs again (waited for, not assumed: on a loaded host the last change may leave them no
    // time before a fixed stop).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let free = loop {
        let free: i64 = admin.query_one(FREE_LIVE, &[]).await?.get(0);
        if free > 0 || tokio::time::Instant::now() > deadline {
            break free;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    stop.store(true, Ordering::Relaxed);
    let mut started = 0;
    while let Some(joined) = starters.join_next().await {
        started += joined??;
    }
    assert!(started > 100, "the starters ran ({started} calls)");
    assert!(
        stale.iter().all(|&n| n == 0),
        "free runs left behind each change: {stale:?}"
    );
    assert!(free > 0, "no run started free after the last change");
    Ok(())
}

/// A start in a transaction that is not READ COMMITTED cannot see a change that commits after
/// its snapshot, so it makes a waiting run, not a free one; the claim of a worker serving the
/// queue still takes it, through admission (`admitted` true), and an ordinary claim does not.
#[tokio::test]
async fn a_start_under_repeatable_read_waits_and_is_admitted() -> TestResult {
    let db = TestDb::new().await;
    let mut client = db.store().pool().get().await?;
    client.batch_execute(DECLARE_LIGHT_QUEUE).await?;
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .start()
        .await?;
    tx.execute(
        "SELECT 1 FROM keiro_queue_start('wf', 'rr', 'null', NULL, NULL, 0, 'q', NULL, NULL, \
         NULL, false)",
        &[],
    )
    .await?;
    tx.commit().await?;
    client
        .execute(
            "SELECT 1 FROM keiro_queue_start('wf', 'rc', 'null', NULL, NULL, 0, 'q', NULL, NULL, \
             NULL, false)",
            &[],
        )
        .await?;
    let free = |id: &'static str| {
        let client = &client;
        async move {
            client
                .query_one(
                    "SELECT queue_free FROM workflows WHERE workflow_id = $1",
                    &[&id],
                )
                .await
                .map(|row| row.get::<_, bool>(0))
        }
    };
    assert!(!free("rr").await?, "a repeatable-read start waits");
    assert!(free("rc").await?, "a read-committed start is free");

    let ordinary = client
        .query(
            "SELECT 1 FROM keiro_instances_claim_batch(ARRAY['wf'], 'w', 60000, 10, NULL)",
            &[],
        )
        .await?;
    assert!(
        ordinary.is_empty(),
        "a claim serving no queue takes neither"
    );
    let mut claims: Vec<(bool, String)> = client
        .query(
            "SELECT c.admitted, (c.instance).workflow_id FROM \
             keiro_instances_claim_and_admit(ARRAY['wf'], ARRAY['q'], 'w', 60000, 10, NULL) c",
            &[],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    claims.sort();
    assert_eq!(
        claims,
        [(false, "rc".to_owned()), (true, "rr".to_owned())],
        "the free run by the ordinary claim, the waiting one by admission"
    );
    Ok(())
}
