//! Every wake-source operation is one statement, so one round trip once prepared, however many
//! rows it touches.

use crate::common::{key, start, start_parked, step, TestResult};
use keiro_journal::{
    store::child_result_step, store::ChildSpawn, store::SignalWait, store::TimerArm, JournalStore,
    StepKind, TimerKind,
};
use keiro_postgres::PgStore;
use keiro_tests::pg::TestDb;
use serde_json::json;
use time::macros::datetime;
use uuid::Uuid;

/// Runs `operation` twice (the first prepares its statement) and returns the round trips of
/// the second run.
async fn second_run_round_trips<F, Fut>(
    store: &PgStore,
    operation: F,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>>
where
    F: Fn(u32) -> Fut,
    Fut: std::future::Future<Output = Result<(), keiro_journal::StoreError>>,
{
    operation(0).await?;
    let before = store.round_trips();
    operation(1).await?;
    Ok(store.round_trips() - before)
}

#[tokio::test]
async fn each_wake_source_operation_is_one_round_trip() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("owner", "o-1");
    start_parked(&store, &k).await?;
    let s = &store;
    let k = &k;

    let arm = |n: u32| async move {
        s.timer_arm(&TimerArm {
            key: k.clone(),
            generation: 0,
            step: format!("sleep:{n}"),
            due: keiro_journal::store::TimerDue::At(datetime!(2030-01-01 0:00 UTC)),
            kind: TimerKind::Sleep,
        })
        .await
        .map(drop)
    };
    assert_eq!(second_run_round_trips(s, arm).await?, 1, "timer_arm");
    let fire = |_| async move { s.timers_fire_due(None, 10).await.map(drop) };
    assert_eq!(second_run_round_trips(s, fire).await?, 1, "timers_fire_due");
    let requeue = |_| async move {
        s.timers_requeue_stuck(std::time::Duration::from_secs(60))
            .await
            .map(drop)
    };
    assert_eq!(
        second_run_round_trips(s, requeue).await?,
        1,
        "timers_requeue_stuck"
    );
    let due = |_| async move { s.timers_due_count(None).await.map(drop) };
    assert_eq!(second_run_round_trips(s, due).await?, 1, "timers_due_count");

    let create = |n: u32| async move {
        let id = Uuid::new_v4();
        let append = step(
            k,
            &format!("awkid:{n}"),
            StepKind::Awakeable,
            json!(id.to_string()),
        );
        s.awakeable_create(&append, id).await?;
        Ok(())
    };
    assert_eq!(
        second_run_round_trips(s, create).await?,
        1,
        "awakeable_create"
    );
    let complete = |_| async move {
        s.awakeable_complete(Uuid::new_v4(), &json!(1))
            .await
            .map(drop)
    };
    assert_eq!(
        second_run_round_trips(s, complete).await?,
        1,
        "awakeable_complete"
    );
    let cancel = |_| async move { s.awakeable_cancel(Uuid::new_v4()).await.map(drop) };
    assert_eq!(
        second_run_round_trips(s, cancel).await?,
        1,
        "awakeable_cancel"
    );
    let pending = |_| async move { s.awakeables_pending().await.map(drop) };
    assert_eq!(
        second_run_round_trips(s, pending).await?,
        1,
        "awakeables_pending"
    );

    let wait = |n: u32| async move {
        s.signal_wait(&SignalWait {
            key: k.clone(),
            generation: 0,
            step: format!("signal:{n}"),
            token: "t".into(),
            fence: None,
        })
        .await
        .map(drop)
    };
    assert_eq!(second_run_round_trips(s, wait).await?, 1, "signal_wait");
    let send = |_| async move { s.signal_send("t", &json!(1)).await.map(drop) };
    assert_eq!(second_run_round_trips(s, send).await?, 1, "signal_send");

    let spawn = |n: u32| async move {
        let child = key("child", &format!("c-{n}"));
        let append = step(k, &format!("child:{child}"), StepKind::Child, json!({}));
        let spawn = ChildSpawn {
            child: child.clone(),
            input: json!(null),
            await_step: child_result_step(&child),
        };
        s.child_spawn(&append, &spawn).await.map(drop)
    };
    assert_eq!(second_run_round_trips(s, spawn).await?, 1, "child_spawn");
    for id in ["r-0", "r-1"] {
        store
            .instance_start(&start(&key("root", id), json!(null)))
            .await?;
    }
    let cancel_instance = |n: u32| async move {
        s.instance_cancel(&key("root", &format!("r-{n}")), true)
            .await
            .map(drop)
    };
    assert_eq!(
        second_run_round_trips(s, cancel_instance).await?,
        1,
        "instance_cancel"
    );
    Ok(())
}
