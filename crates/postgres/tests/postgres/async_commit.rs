//! Nothing a run acts on comes from an unflushed commit: the remote path commits its reports
//! asynchronously, so an arm that hands a settled result straight to the body must return only
//! once that report is on disk (issue 12, item 5).
//!
//! The check reads WAL positions instead of crashing the server (a crash would break every
//! test running beside this one): right after the report is acknowledged, the end of WAL is at
//! or past the report's commit record; once the arm returns its value, WAL must be flushed at
//! least that far. Without the flush, the WAL writer reaches that point only after
//! `wal_writer_delay` (200 ms by default), so on a quiet server the value was handed over
//! while a crash could still have taken the report back.

use std::time::Duration;

use crate::common::{key, start, TestResult};
use keiro_journal::{
    store::remote_step_id, store::RemoteArm, store::RemoteArmOutcome, Backoff, JournalStore,
};
use keiro_remote::{ClaimRequest, ReportOutcome, Transport};
use keiro_tests::pg::TestDb;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_arm_returns_only_once_its_report_is_flushed() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (client, connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    // Several rounds: each must hold, however the WAL writer's timing falls.
    for round in 0..10 {
        let owner = key("owner", &format!("o-{round}"));
        store.instance_start(&start(&owner, json!(null))).await?;
        let arm = RemoteArm {
            step_id: remote_step_id(&owner, 0, "label"),
            key: owner.clone(),
            generation: 0,
            step: "label".into(),
            journal_step: "remote:label".into(),
            group: "label".into(),
            input: json!(round),
            priority: 0,
            traceparent: None,
            max_attempts: 1,
            backoff: Backoff::default(),
            redispatch_after: None,
            redispatch_max: 10,
            queue: None,
            queue_key: None,
            fence: None,
        };
        assert!(matches!(
            store.remote_arm(&arm).await?,
            RemoteArmOutcome::Dispatched { .. }
        ));
        let request = ClaimRequest {
            groups: vec!["label".into()],
            worker: "w".into(),
            limit: 1,
            claim_ttl: Duration::from_secs(60),
        };
        assert_eq!(store.tasks_claim(&request).await?.len(), 1);
        let reported = store.task_complete(&arm.step_id, &json!("v1")).await?;
        assert_eq!(reported, ReportOutcome::Delivered);
        let after_report: String = client
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await?
            .get(0);
        let outcome = store.remote_arm(&arm).await?;
        assert!(
            matches!(&outcome, RemoteArmOutcome::Settled { value, .. } if value == &json!({"ok": "v1"})),
            "{outcome:?}"
        );
        let flushed: bool = client
            .query_one(
                "SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn",
                &[&after_report],
            )
            .await?
            .get(0);
        assert!(
            flushed,
            "round {round}: the arm handed over a result whose report is not on disk yet"
        );
    }
    Ok(())
}
