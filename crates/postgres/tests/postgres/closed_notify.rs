//! An instance notifies `done:<name>/<id>` when it closes only if a result waiter marked it
//! awaited (migration 0016): notifying every close halves throughput (the notify lock is held
//! across the commit's flush), so a run nobody awaits must close silently.

use std::time::Duration;

use crate::common::{key, start, start_completed, Listener, TestResult};
use keiro_journal::{Append, Event, JournalStore};
use keiro_resume::{Notifier, WakeReason};
use keiro_tests::pg::TestDb;
use serde_json::json;

const QUIET: Duration = Duration::from_millis(150);

/// Waits until the instance is marked: the waits of the first `MARK_AFTER` (50 ms) give the run
/// time to close in this process and write nothing; the first wait after it marks the instance
/// awaited before it waits.
async fn wait_marked(wait: &mut Box<dyn keiro_resume::WakeSource>) -> WakeReason {
    wait.wait(Duration::from_millis(10)).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    wait.wait(Duration::from_millis(10)).await
}

#[tokio::test]
async fn only_awaited_instances_notify_when_they_close() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let channel = store.wake_channel().to_owned();
    let done = |id: &str| vec![(channel.clone(), format!("done:order/{id}"))];
    let ids = ["quiet", "completes", "fails", "cancelled", "diverges"];
    for id in ids {
        store
            .instance_start(&start(&key("order", id), json!(null)))
            .await?;
    }
    // Every instance but `quiet` is awaited: a second wait marks it before it waits.
    let mut waits = Vec::new();
    for id in &ids[1..] {
        let mut wait = store.subscribe_closed(&key("order", id));
        wait_marked(&mut wait).await;
        waits.push(wait);
    }
    let mut listener = Listener::on(&store).await?;
    let close = |id: &str, event: Event| Append::external(key("order", id), event);

    store
        .journal_append(&close(
            "quiet",
            Event::WorkflowCompleted { output: json!(1) },
        ))
        .await?;
    assert!(
        listener.drain(QUIET).await.is_empty(),
        "an instance nobody awaits closes without a notification"
    );

    store
        .journal_append(&close(
            "completes",
            Event::WorkflowCompleted { output: json!(2) },
        ))
        .await?;
    assert_eq!(listener.drain(QUIET).await, done("completes"));
    store
        .journal_append(&close(
            "fails",
            Event::WorkflowFailed {
                reason: "no".into(),
            },
        ))
        .await?;
    assert_eq!(listener.drain(QUIET).await, done("fails"));
    store
        .instance_cancel(&key("order", "cancelled"), false)
        .await?;
    assert_eq!(listener.drain(QUIET).await, done("cancelled"));
    store
        .instance_fail_diverged(&key("order", "diverges"), None, "diverged")
        .await?;
    assert_eq!(listener.drain(QUIET).await, done("diverges"));

    // A repeated close changes no status: nothing more.
    store
        .journal_append(&close(
            "completes",
            Event::WorkflowCompleted { output: json!(2) },
        ))
        .await?;
    assert!(listener.drain(QUIET).await.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_waiter_on_an_instance_already_closed_reads_at_once() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("order", "closed");
    start_completed(&store, &k).await?;
    // The mark finds no live row, so the wait says "read now" instead of sleeping an hour.
    let mut wait = store.subscribe_closed(&k);
    let woken = tokio::time::timeout(
        Duration::from_secs(10),
        wait.wait(Duration::from_secs(3600)),
    )
    .await?;
    assert_eq!(woken, WakeReason::Notified);
    Ok(())
}

/// A run closed by this process's store wakes its waiters here, before any of them marked it:
/// a service that starts a run and awaits it, served by its own worker, writes no mark at all.
#[tokio::test]
async fn a_run_closed_in_this_process_wakes_its_waiter_without_a_mark() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("order", "local");
    store.instance_start(&start(&k, json!(null))).await?;
    let mut wait = store.subscribe_closed(&k);
    let closer = {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            store
                .journal_append(&Append::external(
                    k,
                    Event::WorkflowCompleted { output: json!(1) },
                ))
                .await
        })
    };
    let woken = tokio::time::timeout(
        Duration::from_secs(10),
        wait.wait(Duration::from_secs(3600)),
    )
    .await?;
    closer.await??;
    // The listener's first connect may end the wait first: then the close wakes the next one
    // (still within the unmarked 50 ms).
    let woken = if woken == WakeReason::Reconnected {
        tokio::time::timeout(
            Duration::from_secs(10),
            wait.wait(Duration::from_secs(3600)),
        )
        .await?
    } else {
        woken
    };
    assert_eq!(woken, WakeReason::Notified);
    // The outcome comes with the wake: the waiter answers without reading the row again.
    assert_eq!(
        wait.closed_outcome(),
        Some(keiro_resume::ClosedOutcome::Completed(json!(1)))
    );
    let awaited: bool = crate::common::sql(&store)
        .await?
        .query_one(
            "SELECT awaited FROM workflows WHERE workflow_name = $1 AND workflow_id = $2",
            &[&k.name.as_str(), &k.id.as_str()],
        )
        .await?
        .get(0);
    assert!(!awaited, "no mark was written");
    Ok(())
}

/// A result waiter's mark holds the row lock until it commits; a worker claiming at that moment
/// skips the row (`SKIP LOCKED`), so the mark announces a runnable instance again, and only a
/// runnable one (a parked run is woken by its own sources).
#[tokio::test]
async fn marking_a_runnable_instance_awaited_announces_it_again() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let channel = store.wake_channel().to_owned();
    let mut listener = Listener::on(&store).await?;
    let runnable = key("order", "runnable");
    store.instance_start(&start(&runnable, json!(null))).await?;
    assert_eq!(
        listener.drain(QUIET).await,
        vec![(channel.clone(), "order/runnable".to_owned())],
        "the start announces it"
    );
    let mut wait = store.subscribe_closed(&runnable);
    wait_marked(&mut wait).await;
    assert_eq!(
        listener.drain(QUIET).await,
        vec![(channel.clone(), "order/runnable".to_owned())],
        "the mark announces it again"
    );
    wait.wait(Duration::from_millis(10)).await;
    assert!(
        listener.drain(QUIET).await.is_empty(),
        "only the first wait marks"
    );

    let parked = key("order", "parked");
    store.instance_start(&start(&parked, json!(null))).await?;
    let ttl = Duration::from_secs(60);
    let keiro_lease::ClaimOutcome::Acquired(claim) =
        keiro_lease::LeaseStore::instance_claim(&store, &parked, "w", ttl, None).await?
    else {
        panic!("claimable");
    };
    store
        .instance_park(&keiro_journal::store::Park {
            key: parked.clone(),
            generation: 0,
            fence: Some(claim.fence),
            awaited: vec!["sleep:a".into()],
            wake_after: None,
        })
        .await?;
    listener.drain(QUIET).await;
    let mut wait = store.subscribe_closed(&parked);
    wait_marked(&mut wait).await;
    assert!(
        listener.drain(QUIET).await.is_empty(),
        "a parked run is not announced"
    );
    Ok(())
}

/// Result waiters that start at about the same moment share statements: the reads of their
/// runs' rows and the marks that make those runs notify when they close (issue 36, start then
/// await). A run already closed answers its waiter at once; a row another transaction holds is
/// marked once that transaction ends, and the others are not kept waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_result_waiters_share_their_reads_and_marks() -> TestResult {
    const WAITERS: usize = 64;
    let db = TestDb::new().await;
    let store = db.store();
    let keys = |prefix: &str| -> Vec<_> {
        (0..WAITERS)
            .map(|i| key("awaited", &format!("{prefix}{i:02}")))
            .collect()
    };
    let (warm, measured) = (keys("w"), keys("m"));
    let starts: Vec<_> = warm
        .iter()
        .chain(&measured)
        .map(|k| start(k, json!(null)))
        .collect();
    for outcome in store.instances_start(&starts).await {
        assert!(outcome?.created);
    }
    // The listener connects first, so its own statements are not counted below.
    let mut first = store.subscribe_closed(&key("awaited", "nobody"));
    first.wait(Duration::from_millis(10)).await;

    // Every key read at once, by a task each; the first round prepares the statements.
    for (round, keys) in [&warm, &measured].into_iter().enumerate() {
        let before = store.round_trips();
        let mut tasks = tokio::task::JoinSet::new();
        for k in keys.clone() {
            let store = store.clone();
            tasks.spawn(async move { store.instance_get(&k).await });
        }
        while let Some(read) = tasks.join_next().await {
            assert!(read??.is_some());
        }
        let sent = store.round_trips() - before;
        if round == 1 {
            assert!(
                sent < u64::try_from(WAITERS / 2)?,
                "{WAITERS} concurrent reads took {sent} round trips"
            );
        }
    }

    // Every key's waiter marks it at once; in the measured round one run is closed already
    // and one row is held by another transaction.
    let closed = measured[0].clone();
    store
        .journal_append(&Append::external(
            closed.clone(),
            Event::WorkflowCompleted { output: json!(0) },
        ))
        .await?;
    let held = measured[WAITERS / 2].clone();
    let holder = crate::common::sql(&store).await?;
    holder.batch_execute("BEGIN").await?;
    holder
        .execute(
            "SELECT 1 FROM workflows WHERE workflow_name = $1 AND workflow_id = $2 FOR UPDATE",
            &[&held.name.as_str(), &held.id.as_str()],
        )
        .await?;
    // The held row's waiter is among the others, in the middle of the list: its mark waits
    // for the holder, theirs must not.
    let mut held_waiter = None;
    for (round, keys) in [&warm, &measured].into_iter().enumerate() {
        let before = store.round_trips();
        let mut tasks = tokio::task::JoinSet::new();
        for k in keys.iter().cloned() {
            let (store, is_held) = (store.clone(), k == held);
            let waiting = async move {
                let mut wait = store.subscribe_closed(&k);
                wait.wait(Duration::from_millis(60)).await;
                (k, wait.wait(Duration::from_millis(50)).await)
            };
            if is_held {
                held_waiter = Some(tokio::spawn(waiting));
            } else {
                tasks.spawn(waiting);
            }
        }
        tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(joined) = tasks.join_next().await {
                let (k, reason) = joined?;
                if k == closed {
                    assert_eq!(reason, WakeReason::Notified, "a closed run answers at once");
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
        .await
        .map_err(|_| "the marks waited for a row another transaction holds")??;
        let sent = store.round_trips() - before;
        if round == 1 {
            assert!(
                sent < u64::try_from(WAITERS / 2)?,
                "{WAITERS} concurrent marks took {sent} round trips"
            );
        }
    }
    let awaited = |k: &keiro_journal::InstanceKey| {
        let (store, k) = (store.clone(), k.clone());
        async move {
            let client = crate::common::sql(&store).await?;
            let row = client
                .query_one(
                    "SELECT awaited FROM workflows WHERE workflow_name = $1 AND workflow_id = $2",
                    &[&k.name.as_str(), &k.id.as_str()],
                )
                .await?;
            Ok::<bool, Box<dyn std::error::Error + Send + Sync>>(row.get(0))
        }
    };
    for k in warm.iter().chain(&measured[1..]).filter(|k| **k != held) {
        assert!(awaited(k).await?, "{k} is marked");
    }
    assert!(!awaited(&closed).await?, "a closed run is not marked");

    // The held row's waiter marks it once the holder lets go.
    let held_waiter = held_waiter.ok_or("the held row had a waiter")?;
    assert!(!held_waiter.is_finished(), "its mark waits for the holder");
    assert!(!awaited(&held).await?, "not marked while the row is held");
    holder.batch_execute("COMMIT").await?;
    held_waiter.await?;
    assert!(awaited(&held).await?, "marked once the row is free");
    Ok(())
}
