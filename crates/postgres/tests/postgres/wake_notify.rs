//! Wakes are notified on `<schema>.wake`, in the transaction that makes them, and only then.

use std::time::Duration;

use crate::common::{key, start, Listener, TestResult};
use keiro_journal::{store::Park, Append, Event, JournalStore, StepKind};
use keiro_lease::{ClaimOutcome, LeaseStore};
use keiro_tests::pg::TestDb;
use serde_json::json;

const QUIET: Duration = Duration::from_millis(150);

#[tokio::test]
async fn notifications_go_out_exactly_at_the_wake_points() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let mut listener = Listener::on(&store).await?;
    let k = key("order", "o-1");
    let one_wake = vec![(store.wake_channel().to_owned(), "order/o-1".to_owned())];
    let step = |name: &str| {
        Append::external(
            k.clone(),
            Event::StepRecorded {
                step: name.into(),
                kind: StepKind::Sleep,
                result: json!(null),
            },
        )
    };
    let park = |fence| Park {
        key: k.clone(),
        generation: 0,
        fence: Some(fence),
        awaited: vec!["sleep:a".into()],
        wake_after: None,
    };
    let ttl = Duration::from_secs(60);

    store.instance_start(&start(&k, json!(null))).await?;
    assert_eq!(listener.drain(QUIET).await, one_wake, "start creates");
    store.instance_start(&start(&k, json!(null))).await?;
    assert!(
        listener.drain(QUIET).await.is_empty(),
        "a repeated start creates nothing"
    );

    let ClaimOutcome::Acquired(claim) = store.instance_claim(&k, "w", ttl, None).await? else {
        panic!("claimable");
    };
    store.journal_append(&step("other")).await?;
    store.instance_park(&park(claim.fence)).await?;
    assert!(
        listener.drain(QUIET).await.is_empty(),
        "a step on a running row and a park wake nobody"
    );

    store.journal_append(&step("sleep:a")).await?;
    assert_eq!(
        listener.drain(QUIET).await,
        one_wake,
        "a step on a parked row wakes it"
    );

    let ClaimOutcome::Acquired(claim) = store.instance_claim(&k, "w", ttl, None).await? else {
        panic!("claimable");
    };
    store.instance_park(&park(claim.fence)).await?;
    assert_eq!(listener.drain(QUIET).await, one_wake, "woken before park");

    let next = Append {
        generation: Some(0),
        ..Append::external(
            k.clone(),
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!(1),
            },
        )
    };
    store.journal_append(&next).await?;
    assert_eq!(listener.drain(QUIET).await, one_wake, "continue-as-new");

    let fail = Append::external(k.clone(), Event::WorkflowFailed { reason: "x".into() });
    store.journal_append(&fail).await?;
    assert!(
        listener.drain(QUIET).await.is_empty(),
        "failing wakes nobody"
    );
    store.instance_resurrect(&k).await?;
    assert_eq!(listener.drain(QUIET).await, one_wake, "resurrect");
    Ok(())
}

/// A remote task of a limited queue that leaves `running` wakes the remote workers while tasks
/// of its queue wait (queue.sql's `remote_tasks_queue_slot_freed`), and only then.
#[tokio::test]
async fn a_queued_tasks_freed_slot_wakes_the_remote_workers() -> TestResult {
    use keiro_lease::QueueStore;
    use keiro_remote::{ClaimRequest, Transport};

    let db = TestDb::new().await;
    let store = db.store();
    let spec = keiro_journal::queue::QueueSpec::new("q")?.concurrency(1);
    store.queue_declare(&spec).await?;
    let k = key("owner", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    for step in ["s1", "s2"] {
        let arm = keiro_journal::store::RemoteArm {
            group: "g".into(),
            queue: Some("q".into()),
            ..crate::common::remote_arm(&k, step, json!(step))
        };
        store.remote_arm(&arm).await?;
    }
    let request = ClaimRequest {
        groups: vec!["g".into()],
        worker: "w".into(),
        limit: 10,
        claim_ttl: Duration::from_secs(60),
    };
    let mut listener = Listener::on(&store).await?;
    let remote = (store.wake_channel().to_owned(), "remote".to_owned());

    let first = store.tasks_claim(&request).await?;
    assert_eq!(first.len(), 1, "one slot");
    assert!(
        listener.drain(QUIET).await.is_empty(),
        "a claim wakes nobody"
    );
    store.task_complete(&first[0].step_id, &json!(1)).await?;
    assert!(
        listener.drain(QUIET).await.contains(&remote),
        "the freed slot wakes the remote workers: s2 waits for it"
    );

    let second = store.tasks_claim(&request).await?;
    assert_eq!(second.len(), 1);
    listener.drain(QUIET).await;
    store.task_complete(&second[0].step_id, &json!(2)).await?;
    assert!(
        !listener.drain(QUIET).await.contains(&remote),
        "no task of the queue waits"
    );
    Ok(())
}
