//! Remote steps on the Postgres store alone: one round trip per operation, parks sent at once
//! sharing a transaction, a park the database refuses, the remote functions' plan settings,
//! the columns a cancellation settles, races held with a test transaction (an arm against a
//! cancellation, a park against a report), and the LISTEN subscription's filter. The rules
//! every store keeps for remote steps are the contract suite's (`keiro_tests::contract::remote`).

use std::time::Duration;

use crate::common::{
    backend_pid, blocked_by, key, remote_arm as arm, sql, start, status, TestResult,
};
use keiro_journal::{
    store::remote_step_id, store::Park, store::ParkOutcome, store::RemoteArm,
    store::RemoteArmOutcome, AppendOutcome, InstanceKey, JournalStore, Status, StoreError,
};
use keiro_postgres::{Config, PgStore};
use keiro_remote::{
    ClaimRequest, ClaimedTask, RemoteAdmin, RemoteTask, TaskFailure, TaskStatus, Transport,
};
use keiro_resume::{Notifier, WakeFilter, WakeReason};
use keiro_tests::pg::TestDb;
use serde_json::{json, Value};
use time::OffsetDateTime;
use uuid::Uuid;

type Error = Box<dyn std::error::Error + Send + Sync>;

fn claim_request(groups: &[&str], worker: &str, limit: u32, ttl: Duration) -> ClaimRequest {
    ClaimRequest {
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        worker: worker.into(),
        limit,
        claim_ttl: ttl,
    }
}

/// Claims up to `limit` tasks of `groups` with a one-minute claim.
async fn claim_tasks(
    store: &PgStore,
    groups: &[&str],
    limit: u32,
) -> Result<Vec<ClaimedTask>, Error> {
    Ok(store
        .tasks_claim(&claim_request(
            groups,
            "w-1",
            limit,
            Duration::from_secs(60),
        ))
        .await?)
}

/// The stored task `step_id` of `k`.
async fn task(store: &PgStore, k: &InstanceKey, step_id: &str) -> Result<RemoteTask, Error> {
    store
        .remote_tasks(k)
        .await?
        .into_iter()
        .find(|t| t.step_id == step_id)
        .ok_or_else(|| format!("no task {step_id}").into())
}

fn failure(message: &str, code: Option<&str>, retryable: bool) -> TaskFailure {
    TaskFailure {
        message: message.into(),
        code: code.map(str::to_owned),
        retryable,
    }
}

#[tokio::test]
async fn remote_workers_are_notified_and_nothing_else_is() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    let mut remote = store.subscribe(WakeFilter::RemoteTasks);
    let mut timers = store.subscribe(WakeFilter::Timers);
    assert_eq!(
        remote.wait(Duration::from_secs(10)).await,
        WakeReason::Reconnected
    );
    assert_eq!(
        timers.wait(Duration::from_secs(10)).await,
        WakeReason::Reconnected
    );
    // An instance wake is not for remote workers.
    store.instance_start(&start(&owner, Value::Null)).await?;
    assert_eq!(
        remote.wait(Duration::from_millis(300)).await,
        WakeReason::Timeout
    );
    store.remote_arm(&arm(&owner, "label", json!(1))).await?;
    assert_eq!(
        remote.wait(Duration::from_secs(10)).await,
        WakeReason::Notified
    );
    assert_eq!(
        timers.wait(Duration::from_millis(300)).await,
        WakeReason::Timeout
    );
    Ok(())
}

/// Runs `operation` twice (the first prepares its statement) and returns the round trips of
/// the second run.
async fn second_run_round_trips<F, Fut>(store: &PgStore, operation: F) -> Result<u64, Error>
where
    F: Fn(u32) -> Fut,
    Fut: std::future::Future<Output = Result<(), StoreError>>,
{
    operation(0).await?;
    let before = store.round_trips();
    operation(1).await?;
    Ok(store.round_trips() - before)
}

#[tokio::test]
async fn each_remote_operation_is_one_round_trip() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let (s, k) = (&store, &owner);

    let arm_step = |n: u32| async move {
        s.remote_arm(&RemoteArm {
            group: "g".into(),
            max_attempts: 3,
            ..arm(k, &format!("s{n}"), json!(n))
        })
        .await
        .map(drop)
    };
    assert_eq!(second_run_round_trips(s, arm_step).await?, 1, "remote_arm");
    let rearm = |_| async move { s.remote_arm(&arm(k, "s0", json!(0))).await.map(drop) };
    assert_eq!(second_run_round_trips(s, rearm).await?, 1, "re-arm");
    let claim = |_| async move {
        let request = claim_request(&["g", "h"], "w", 1, Duration::from_secs(60));
        let claimed = s.tasks_claim(&request).await?;
        assert_eq!(claimed.len(), 1);
        Ok(())
    };
    assert_eq!(second_run_round_trips(s, claim).await?, 1, "tasks_claim");
    let heartbeat = |n: u32| async move {
        s.task_heartbeat(
            &remote_step_id(k, 0, &format!("s{n}")),
            Uuid::new_v4(),
            Duration::from_secs(1),
        )
        .await
        .map(drop)
    };
    assert_eq!(
        second_run_round_trips(s, heartbeat).await?,
        1,
        "task_heartbeat"
    );
    let fail = |n: u32| async move {
        s.task_fail(
            &remote_step_id(k, 0, &format!("s{n}")),
            Uuid::new_v4(),
            &failure("x", None, true),
            Duration::ZERO,
        )
        .await
        .map(drop)
    };
    assert_eq!(second_run_round_trips(s, fail).await?, 1, "task_fail");
    let complete = |n: u32| async move {
        s.task_complete(&remote_step_id(k, 0, &format!("s{n}")), &json!(n))
            .await
            .map(drop)
    };
    assert_eq!(
        second_run_round_trips(s, complete).await?,
        1,
        "task_complete"
    );
    let redispatch = |_| async move { s.remote_redispatch_pending(k).await.map(drop) };
    assert_eq!(
        second_run_round_trips(s, redispatch).await?,
        1,
        "remote_redispatch_pending"
    );
    let requeue = |_| async move { s.instance_requeue(k).await.map(drop) };
    assert_eq!(
        second_run_round_trips(s, requeue).await?,
        1,
        "instance_requeue"
    );
    let retry = |n: u32| async move {
        let fix = key("owner", &format!("o-1~retry~0000000{n}"));
        s.instance_retry_with_input(k, &fix, &json!(n))
            .await
            .map(drop)
    };
    assert_eq!(
        second_run_round_trips(s, retry).await?,
        1,
        "instance_retry_with_input"
    );
    let tasks = |_| async move { s.remote_tasks(k).await.map(drop) };
    assert_eq!(second_run_round_trips(s, tasks).await?, 1, "remote_tasks");
    Ok(())
}

#[tokio::test]
async fn park_dispatch_writes_the_tasks_and_the_park_in_one_round_trip() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "pd-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let park = |awaited: Vec<String>| keiro_journal::store::Park {
        key: owner.clone(),
        generation: 0,
        fence: None,
        awaited,
        wake_after: None,
    };
    // Prepare the statement once, on another instance's run.
    let other = key("owner", "pd-0");
    store.instance_start(&start(&other, Value::Null)).await?;
    let warm = keiro_journal::store::Park {
        key: other.clone(),
        ..park(vec!["remote:w".into()])
    };
    store
        .instance_park_dispatch(&warm, &[arm(&other, "w", json!(0))])
        .await?;

    let arms = [
        RemoteArm {
            redispatch_after: Some(Duration::from_secs(30)),
            ..arm(&owner, "a", json!(1))
        },
        arm(&owner, "b", json!(2)),
    ];
    let before = store.round_trips();
    let (parked, outcomes) = store
        .instance_park_dispatch(&park(vec!["remote:a".into(), "remote:b".into()]), &arms)
        .await?;
    assert_eq!(store.round_trips() - before, 1);
    assert_eq!(parked, keiro_journal::store::ParkOutcome::Suspended);
    assert_eq!(outcomes.len(), 2);
    Ok(())
}

#[tokio::test]
async fn parks_sent_at_once_share_a_transaction() -> TestResult {
    let db = TestDb::new().await;
    // One connection, so the statements the warm-up prepares are prepared wherever the parks
    // below run (a lone park and a batch may otherwise land on connections that never saw
    // their statement, and a preparation counts as a round trip).
    let store = PgStore::connect(Config {
        pool_size: 1,
        ..db.config()
    })
    .await?;
    let park = |owner: &InstanceKey, awaited: &[&str]| keiro_journal::store::Park {
        key: owner.clone(),
        generation: 0,
        fence: None,
        awaited: awaited.iter().map(|s| format!("remote:{s}")).collect(),
        wake_after: None,
    };
    // Prepare the statements first, so the round trips counted below are executions only.
    let warm: Vec<InstanceKey> = (0..3).map(|i| key("warm", &format!("w-{i}"))).collect();
    for owner in &warm {
        store.instance_start(&start(owner, Value::Null)).await?;
    }
    // At once: the first alone, the other two as a batch, so both statements are prepared.
    let mut warming = tokio::task::JoinSet::new();
    for owner in &warm {
        let (store, owner) = (store.clone(), owner.clone());
        warming.spawn(async move {
            store
                .instance_park_dispatch(&park(&owner, &["s"]), &[arm(&owner, "s", json!(0))])
                .await
        });
    }
    while let Some(parked) = warming.join_next().await {
        parked??;
    }

    // Twelve plain parks, listed against their key order (the batch runs them in key order).
    let plain: Vec<InstanceKey> = (0..12)
        .rev()
        .map(|i| key("p", &format!("p-{i:02}")))
        .collect();
    let two = key("p", "two-arms");
    let settled = key("p", "settled");
    let fenced = key("p", "fenced");
    let missing = key("p", "missing");
    for owner in plain.iter().chain([&two, &settled, &fenced]) {
        store.instance_start(&start(owner, Value::Null)).await?;
    }
    // `settled`'s task exists and has its result: the re-arm learns it and the park wakes.
    store.remote_arm(&arm(&settled, "s", json!(1))).await?;
    store
        .task_complete(&remote_step_id(&settled, 0, "s"), &json!("done"))
        .await?;

    let mut requests: Vec<(keiro_journal::store::Park, Vec<RemoteArm>)> = plain
        .iter()
        .enumerate()
        .map(|(i, owner)| (park(owner, &["s"]), vec![arm(owner, "s", json!(i))]))
        .collect();
    requests.push((
        park(&two, &["a", "b"]),
        vec![arm(&two, "a", json!("a")), arm(&two, "b", json!("b"))],
    ));
    requests.push((park(&settled, &["s"]), vec![arm(&settled, "s", json!(1))]));
    requests.push((
        keiro_journal::store::Park {
            fence: Some(keiro_journal::Fence {
                owner: "somebody-else".into(),
                epoch: 7,
            }),
            ..park(&fenced, &["s"])
        },
        vec![arm(&fenced, "s", json!(0))],
    ));
    requests.push((park(&missing, &["s"]), vec![arm(&missing, "s", json!(0))]));

    let before = store.round_trips();
    let mut parking = tokio::task::JoinSet::new();
    for (i, (park, arms)) in requests.iter().cloned().enumerate() {
        let store = store.clone();
        parking.spawn(async move { (i, store.instance_park_dispatch(&park, &arms).await) });
    }
    let mut answers: Vec<Option<_>> = requests.iter().map(|_| None).collect();
    while let Some(answer) = parking.join_next().await {
        let (i, outcome) = answer?;
        answers[i] = Some(outcome);
    }
    let round_trips = store.round_trips() - before;
    // The first park finds the lane idle and goes alone; the others queue behind it and leave
    // together, as one transaction.
    assert!(
        round_trips <= 2,
        "{} parks sent at once took {round_trips} round trips",
        requests.len()
    );

    // What each park answers is the contract suite's
    // (`remote::arm::parks_sent_at_once_each_get_their_own_answer`).
    assert!(answers.iter().all(Option::is_some), "every park answered");
    Ok(())
}

#[tokio::test]
async fn a_park_that_fails_does_not_fail_the_parks_sent_with_it() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owners: Vec<InstanceKey> = (0..4).map(|i| key("p", &format!("q-{i}"))).collect();
    for owner in &owners {
        store.instance_start(&start(owner, Value::Null)).await?;
    }
    let park = |owner: &InstanceKey| keiro_journal::store::Park {
        key: owner.clone(),
        generation: 0,
        fence: None,
        awaited: vec!["remote:s".into()],
        wake_after: None,
    };
    // A step id too long for the task table's primary key index (random, so compression
    // cannot shrink it under the limit): its INSERT raises, which rolls back the whole batch
    // statement it rides in. The context never builds one (names are capped at 200 bytes); it
    // stands for any park the database refuses.
    let noise: String = (0..400)
        .map(|_| Uuid::new_v4().simple().to_string())
        .collect();
    let broken = RemoteArm {
        step_id: format!("{}/{noise}", remote_step_id(&owners[0], 0, "s")),
        ..arm(&owners[0], "s", json!(0))
    };
    let mut parking = tokio::task::JoinSet::new();
    for (i, owner) in owners.iter().enumerate() {
        let arms = if i == 0 {
            vec![broken.clone()]
        } else {
            vec![arm(owner, "s", json!(i))]
        };
        let (store, park) = (store.clone(), park(owner));
        parking.spawn(async move { (i, store.instance_park_dispatch(&park, &arms).await) });
    }
    while let Some(answer) = parking.join_next().await {
        let (i, outcome) = answer?;
        if i == 0 {
            assert!(outcome.is_err(), "the broken park fails: {outcome:?}");
            assert_eq!(status(&store, &owners[0]).await?, Status::Running);
        } else {
            let (parked, arms) = outcome?;
            assert_eq!(parked, keiro_journal::store::ParkOutcome::Suspended);
            assert_eq!(arms, [RemoteArmOutcome::Dispatched { deadline: None }]);
            assert_eq!(store.remote_tasks(&owners[i]).await?.len(), 1);
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_hot_remote_functions_keep_generic_index_driven_plans() -> TestResult {
    // A later `CREATE OR REPLACE` of one of these without its SET clauses would silently bring
    // back a plan made on every call (plpgsql keeps custom-planning statements over arrays) or
    // a sequential scan cached while the table was small: see migrations 0005 and 0007.
    let db = TestDb::new().await;
    let store = db.store();
    for function in [
        "keiro_remote_tasks_claim",
        "keiro_remote_tasks_claim_queued",
        "keiro_remote_tasks_complete",
        "keiro_instances_park_arms",
        "keiro_instances_park_dispatch",
    ] {
        let settings: Vec<String> = sql(&store)
            .await?
            .query_one(
                "SELECT coalesce(p.proconfig, '{}') FROM pg_proc p \
                 WHERE p.proname = $1 AND p.pronamespace = current_schema()::regnamespace",
                &[&function],
            )
            .await?
            .get(0);
        for wanted in ["enable_seqscan=off", "plan_cache_mode=force_generic_plan"] {
            assert!(
                settings.iter().any(|s| s == wanted),
                "{function} lacks {wanted}: {settings:?}"
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_cancelled_task_is_settled_and_drops_its_claim() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let owner = key("owner", "o-1");
    store.instance_start(&start(&owner, Value::Null)).await?;
    let claimed = arm(&owner, "claimed", json!(1));
    store.remote_arm(&claimed).await?;
    claim_tasks(&store, &["claimed"], 1).await?;
    store.instance_cancel(&owner, false).await?;
    assert_eq!(
        task(&store, &owner, &claimed.step_id).await?.status,
        TaskStatus::Cancelled
    );
    let row = sql(&store)
        .await?
        .query_one(
            "SELECT settled_at, claim FROM remote_tasks WHERE step_id = $1",
            &[&claimed.step_id],
        )
        .await?;
    let stored: (Option<OffsetDateTime>, Option<Uuid>) = (row.get(0), row.get(1));
    assert!(stored.0.is_some() && stored.1.is_none(), "{stored:?}");
    Ok(())
}

const ARM_SQL: &str = "SELECT outcome FROM keiro_remote_arm($1, $2, $3, $4, $5, $6, $7, $8, \
     $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)";

/// Runs `keiro_remote_arm` for `a` (unfenced) on `client`, inside whatever transaction it has
/// open.
async fn arm_on(client: &tokio_postgres::Client, a: &RemoteArm) -> Result<String, Error> {
    let none: Option<&str> = None;
    let (no_ms, no_epoch): (Option<i64>, Option<i64>) = (None, None);
    let row = client
        .query_one(
            ARM_SQL,
            &[
                &a.step_id,
                &a.key.name.as_str(),
                &a.key.id.as_str(),
                &a.generation,
                &a.step,
                &a.journal_step,
                &a.group,
                &a.input,
                &a.priority,
                &none,
                &1i32,
                &1000i64,
                &1000i64,
                &false,
                &no_ms,
                &10i32,
                &none,
                &no_epoch,
            ],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn an_arm_and_a_cancel_at_the_same_moment_leave_no_live_task() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (first, second) = (key("owner", "o-1"), key("owner", "o-2"));
    for k in [&first, &second] {
        store.instance_start(&start(k, Value::Null)).await?;
    }

    // A cancellation in progress: the arm waits for it, then sees the run cancelled.
    let holder = sql(&store).await?;
    holder.batch_execute("BEGIN").await?;
    holder
        .query(
            "SELECT outcome FROM keiro_instance_cancel($1, $2, false)",
            &[&"owner", &"o-1"],
        )
        .await?;
    let arming = tokio::spawn({
        let (store, a) = (store.clone(), arm(&first, "label", json!(1)));
        async move { store.remote_arm(&a).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!arming.is_finished(), "the arm waits for the cancellation");
    holder.batch_execute("COMMIT").await?;
    assert_eq!(arming.await??, RemoteArmOutcome::Waiting { deadline: None });
    assert!(store.remote_tasks(&first).await?.is_empty());

    // An arm in progress: the cancellation waits for it, then cancels the task it wrote.
    let a = arm(&second, "label", json!(2));
    holder.batch_execute("BEGIN").await?;
    assert_eq!(arm_on(&holder, &a).await?, "dispatched");
    let cancelling = tokio::spawn({
        let (store, k) = (store.clone(), second.clone());
        async move { store.instance_cancel(&k, false).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !cancelling.is_finished(),
        "the cancellation waits for the arm"
    );
    holder.batch_execute("COMMIT").await?;
    assert_eq!(cancelling.await??, AppendOutcome::Appended);
    assert_eq!(
        task(&store, &second, &a.step_id).await?.status,
        TaskStatus::Cancelled
    );
    assert!(claim_tasks(&store, &["label"], 10).await?.is_empty());
    Ok(())
}

/// A lone park that re-arms two remote steps, racing a report on the second step's task: the
/// report locks the task and then the owner (as every report does), and the park must not
/// hold the owner while it waits for that task, or the two deadlock (the server aborts one
/// after `deadlock_timeout`, and an aborted park leaves its run leased until the lease ends).
/// The park locks every task it arms before the owner, as the lock order and the batched park
/// do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_park_rearming_two_steps_never_deadlocks_with_a_report() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("fan", "w");
    store.instance_start(&start(&k, json!(null))).await?;
    let arms = [arm(&k, "a", json!(1)), arm(&k, "b", json!(2))];
    let park = Park {
        key: k.clone(),
        generation: 0,
        fence: None,
        awaited: arms.iter().map(|a| a.journal_step.clone()).collect(),
        wake_after: None,
    };
    let (parked, _) = store.instance_park_dispatch(&park, &arms).await?;
    assert_eq!(parked, ParkOutcome::Suspended);

    // The report on the second task: its task row first.
    let mut reporter = sql(&store).await?;
    let report = reporter.transaction().await?;
    let reporter_pid = backend_pid(&report).await?;
    report
        .execute(
            "SELECT 1 FROM remote_tasks WHERE step_id = $1 FOR UPDATE",
            &[&arms[1].step_id],
        )
        .await?;
    // The run is driven again and parks on both steps once more.
    let again = {
        let (store, park, arms) = (store.clone(), park.clone(), arms.clone());
        tokio::spawn(async move { store.instance_park_dispatch(&park, &arms).await })
    };
    blocked_by(&store, reporter_pid, "the park never met the report").await?;
    // The report's second lock: the owner, as its journal append takes it.
    report
        .execute(
            "SELECT 1 FROM workflows WHERE workflow_name = 'fan' AND workflow_id = 'w' FOR UPDATE",
            &[],
        )
        .await?;
    report.commit().await?;
    let (parked, outcomes) = again.await??;
    assert_eq!(parked, ParkOutcome::Suspended);
    assert_eq!(outcomes.len(), 2);
    Ok(())
}
