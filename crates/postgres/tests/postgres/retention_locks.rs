//! Retention never waits for a wake-source row another transaction holds. A late report on a
//! remote task of a run that failed long ago (failed runs keep their tasks) locks the task and
//! then the run's row; retention locks the run's row and then deletes its tasks: waiting for
//! the task there would deadlock the two (the server would abort one after
//! `deadlock_timeout`). Retention leaves such an instance for a later batch instead.

use std::time::Duration;

use crate::common::{remote_arm, sql, start, TestResult};
use keiro_journal::{Append, Event, GcRequest, InstanceKey, JournalStore, RetentionStore};
use keiro_tests::pg::TestDb;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_leaves_an_instance_whose_task_a_report_holds() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = InstanceKey::parse("fan", "old")?;
    store.instance_start(&start(&k, json!(null))).await?;
    let task = remote_arm(&k, "print", json!("x"));
    store.remote_arm(&task).await?;
    store
        .journal_append(&Append::external(
            k.clone(),
            Event::WorkflowFailed {
                reason: "gave up".into(),
            },
        ))
        .await?;
    let request = GcRequest {
        now: Some(time::OffsetDateTime::now_utc() + time::Duration::hours(2)),
        ..GcRequest::new(Duration::from_secs(3600))
    };
    assert_eq!(store.instances_gc_eligible(&request).await?, 1);

    // A report on the task: its row first (then it would lock the run's).
    let mut reporter = sql(&store).await?;
    let report = reporter.transaction().await?;
    report
        .execute(
            "SELECT 1 FROM remote_tasks WHERE step_id = $1 FOR UPDATE",
            &[&task.step_id],
        )
        .await?;
    let batch = tokio::time::timeout(Duration::from_secs(5), store.instances_gc(&request))
        .await
        .map_err(|_| "retention waited for the task the report holds")??;
    assert_eq!(batch.instances, 0, "{batch:?}");
    // The report goes on to the run's row, which retention no longer holds.
    tokio::time::timeout(
        Duration::from_secs(5),
        report.execute(
            "SELECT 1 FROM workflows WHERE workflow_name = 'fan' AND workflow_id = 'old' \
             FOR UPDATE",
            &[],
        ),
    )
    .await
    .map_err(|_| "the report waited for retention")??;
    report.commit().await?;

    // Once the report is done, the next batch takes the instance with its task.
    let batch = store.instances_gc(&request).await?;
    assert_eq!((batch.instances, batch.remote_tasks), (1, 1), "{batch:?}");
    assert!(store.instance_get(&k).await?.is_none());
    Ok(())
}
