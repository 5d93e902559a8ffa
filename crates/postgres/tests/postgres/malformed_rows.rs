//! Rows that do not read as keiro data are typed `Malformed` errors, never panics.

use std::time::Duration;

use crate::common::{key, start, TestResult};
use keiro_journal::{JournalStore, StoreError};
use keiro_lease::{ClaimOutcome, LeaseStore};
use keiro_tests::pg::TestDb;
use serde_json::json;

#[tokio::test]
async fn undecodable_rows_are_malformed_and_a_claim_gives_its_lease_back() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let client = store.pool().get().await?;
    client
        .batch_execute(
            "INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload) \
             VALUES ('order', 'o-1', 0, 'x', 'no-such-kind', 'null')",
        )
        .await?;

    let err = store.journal_load(&k, 0).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Malformed {
                operation: "loading a journal generation",
                ..
            }
        ),
        "{err:?}"
    );
    let err = store
        .instance_claim(&k, "w", Duration::from_secs(60), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Malformed {
                operation: "claiming an instance",
                ..
            }
        ),
        "{err:?}"
    );
    let row = store.instance_get(&k).await?.expect("exists");
    assert_eq!(row.lease_owner, None, "the lease went back");

    // A key the identity rules reject cannot come back out as an InstanceKey.
    client
        .batch_execute(
            "INSERT INTO workflows (workflow_name, workflow_id) VALUES ('bad:name', 'o-2')",
        )
        .await?;
    let err = store.instances_runnable(None, None).await.unwrap_err();
    assert!(matches!(err, StoreError::Malformed { .. }), "{err:?}");
    assert!(matches!(
        store
            .instance_claim(&key("order", "missing"), "w", Duration::from_secs(1), None)
            .await?,
        ClaimOutcome::Unavailable
    ));
    Ok(())
}

/// An admission that meets a run whose journal does not read as keiro data gives that run's
/// lease back and hands over the others it admitted, as a batch claim does: one bad row never
/// stops its queue.
#[tokio::test]
async fn an_admission_gives_back_an_unreadable_run_and_keeps_the_others() -> TestResult {
    use keiro_journal::queue::{QueueSpec, QueueStart};
    use keiro_lease::QueueStore;
    let db = TestDb::new().await;
    let store = db.store();
    // A queue that counts slots, so its runs wait for admission (a queue that counts nothing
    // starts them free, and the ordinary claim, covered above, takes them).
    store
        .queue_declare(&QueueSpec::new("q")?.concurrency(10))
        .await?;
    for id in ["bad", "good"] {
        let mut request = start(&key("order", id), json!(null));
        request.queue = Some(QueueStart::new("q"));
        store.instance_start(&request).await?;
    }
    let client = store.pool().get().await?;
    client
        .batch_execute(
            "INSERT INTO journal (workflow_name, workflow_id, generation, step_name, kind, payload) \
             VALUES ('order', 'bad', 0, 'x', 'no-such-kind', 'null')",
        )
        .await?;
    let names = [keiro_journal::WorkflowName::new("order")?];
    let claims = store
        .queue_admit(
            &["q".to_owned()],
            &names,
            "w",
            Duration::from_secs(60),
            10,
            None,
        )
        .await?;
    let ids: Vec<&str> = claims.iter().map(|c| c.instance.key.id.as_str()).collect();
    assert_eq!(ids, ["good"]);
    let bad = store
        .instance_get(&key("order", "bad"))
        .await?
        .expect("exists");
    assert_eq!(bad.lease_owner, None, "the lease went back");
    Ok(())
}
