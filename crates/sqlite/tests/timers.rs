//! Durable timers (timer.sql), with the assertions of crates/postgres/tests/timer_fire.rs,
//! timer_first_arm.rs and timer_requeue_stuck.rs, minus their notifications.

mod common;

use std::time::Duration;

use common::{append, pinned, start, T0};
use keiro_journal::store::{Append, Park};
use keiro_journal::{
    store::TimerArm, store::TimerDue, Event, InstanceKey, Status, StepKind, TimerKind,
};
use keiro_sqlite::SqliteStore;
use rusqlite::Connection;
use serde_json::{json, Value};
use time::macros::datetime;
use time::OffsetDateTime;

fn sleep_arm(k: &InstanceKey, step: &str, fire_at: OffsetDateTime) -> TimerArm {
    TimerArm {
        key: k.clone(),
        generation: 0,
        step: step.into(),
        due: TimerDue::At(fire_at),
        kind: TimerKind::Sleep,
    }
}

async fn recorded(store: &SqliteStore, key: &InstanceKey, step: &str) -> Vec<Value> {
    store
        .journal_history(key)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event.step_name() == step)
        .filter_map(|e| match e.event {
            Event::StepRecorded { result, .. } => Some(result),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_due_sleep_journals_its_step_wakes_the_owner_and_clears_its_deadline() {
    let (_dir, store) = pinned("t-sleep");
    let k = start(&store, "s-1").await;
    store
        .timer_arm(&sleep_arm(&k, "sleep:nap", T0))
        .await
        .unwrap();
    store
        .instance_park(&Park {
            key: k.clone(),
            generation: 0,
            fence: None,
            awaited: vec!["sleep:nap".into()],
            wake_after: Some(T0),
        })
        .await
        .unwrap();

    let early = store
        .timers_fire_due(Some(T0 - time::Duration::SECOND), 10)
        .await
        .unwrap();
    assert!(early.fired.is_empty());
    assert_eq!(early.next_due, Some(T0));
    assert_eq!(store.timers_due_count(Some(T0)).await.unwrap(), 1);

    let now = T0 + time::Duration::SECOND;
    let firing = store.timers_fire_due(Some(now), 10).await.unwrap();
    assert_eq!(firing.fired.len(), 1);
    let fired = &firing.fired[0];
    assert_eq!(
        (
            &fired.key,
            fired.step.as_str(),
            fired.fire_at,
            fired.fired_at,
            fired.delivered
        ),
        (&k, "sleep:nap", T0, now, true)
    );
    assert_eq!(firing.next_due, None);
    assert_eq!(store.timers_due_count(Some(now)).await.unwrap(), 0);
    assert_eq!(recorded(&store, &k, "sleep:nap").await, vec![json!(null)]);
    let row = store.instance_get(&k).await.unwrap().unwrap();
    assert_eq!((row.status, row.wake_after), (Status::Running, None));
}

#[tokio::test]
async fn fires_oldest_first_up_to_the_limit_and_reports_the_next_due() {
    let (_dir, store) = pinned("t-order");
    let k = start(&store, "s-2").await;
    for minutes in [3, 1, 2, 60] {
        let at = T0 + time::Duration::minutes(minutes);
        store
            .timer_arm(&sleep_arm(&k, &format!("sleep:{minutes}"), at))
            .await
            .unwrap();
    }
    let now = T0 + time::Duration::minutes(10);
    assert_eq!(store.timers_due_count(Some(now)).await.unwrap(), 3);
    assert!(store
        .timers_fire_due(Some(now), -1)
        .await
        .unwrap()
        .fired
        .is_empty());

    let first = store.timers_fire_due(Some(now), 2).await.unwrap();
    let steps: Vec<_> = first.fired.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(steps, ["sleep:1", "sleep:2"]);
    assert_eq!(first.next_due, Some(T0 + time::Duration::minutes(3)));

    let second = store.timers_fire_due(Some(now), 2).await.unwrap();
    let steps: Vec<_> = second.fired.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(steps, ["sleep:3"]);
    assert_eq!(second.next_due, Some(T0 + time::Duration::minutes(60)));
    assert_eq!(store.timers_due_count(Some(now)).await.unwrap(), 0);
}

#[tokio::test]
async fn a_fire_that_cannot_journal_is_marked_fired_undelivered() {
    let (_dir, store) = pinned("t-undelivered");
    let journaled = start(&store, "journaled").await;
    store
        .journal_append(&Append::external(
            journaled.clone(),
            Event::StepRecorded {
                step: "sleep:nap".into(),
                kind: StepKind::Sleep,
                result: json!(null),
            },
        ))
        .await
        .unwrap();
    store
        .timer_arm(&sleep_arm(&journaled, "sleep:nap", T0))
        .await
        .unwrap();
    let finished = start(&store, "finished").await;
    store
        .timer_arm(&sleep_arm(&finished, "sleep:nap", T0))
        .await
        .unwrap();
    append(&store, &finished, None, Event::WorkflowCancelled, None)
        .await
        .unwrap();
    let moved = start(&store, "moved").await;
    store
        .timer_arm(&sleep_arm(&moved, "sleep:nap", T0))
        .await
        .unwrap();
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!(null),
    };
    append(&store, &moved, None, rotate, None).await.unwrap();

    let firing = store.timers_fire_due(Some(T0), 10).await.unwrap();
    assert_eq!(firing.fired.len(), 3);
    assert!(firing.fired.iter().all(|t| !t.delivered), "{firing:?}");
    assert_eq!(firing.next_due, None);
    assert_eq!(store.timers_due_count(Some(T0)).await.unwrap(), 0);
    assert_eq!(recorded(&store, &finished, "sleep:nap").await.len(), 0);
    assert_eq!(recorded(&store, &moved, "sleep:nap").await.len(), 0);
    assert_eq!(recorded(&store, &journaled, "sleep:nap").await.len(), 1);
    assert_eq!(
        store.instance_get(&finished).await.unwrap().unwrap().status,
        Status::Cancelled
    );
}

#[tokio::test]
async fn the_first_arm_wins() {
    let (dir, store) = pinned("t-first");
    let k = start(&store, "s-1").await;
    let first = datetime!(2030-01-01 0:00 UTC);
    let later = datetime!(2030-06-01 0:00 UTC);
    assert_eq!(
        store
            .timer_arm(&sleep_arm(&k, "sleep:nap", first))
            .await
            .unwrap(),
        first
    );
    // A re-arm, earlier or later, of either kind, never moves the deadline.
    assert_eq!(
        store
            .timer_arm(&sleep_arm(&k, "sleep:nap", later))
            .await
            .unwrap(),
        first
    );
    let earlier = TimerArm {
        kind: TimerKind::SignalTimeout { token: "t".into() },
        ..sleep_arm(&k, "sleep:nap", datetime!(2029-01-01 0:00 UTC))
    };
    assert_eq!(store.timer_arm(&earlier).await.unwrap(), first);
    // Another generation's step is another timer.
    let next_generation = TimerArm {
        generation: 1,
        ..sleep_arm(&k, "sleep:nap", later)
    };
    assert_eq!(store.timer_arm(&next_generation).await.unwrap(), later);
    // Even after it fired, the first timer still answers a re-arm.
    let fired = store
        .timers_fire_due(Some(datetime!(2030-01-02 0:00 UTC)), 10)
        .await
        .unwrap();
    assert_eq!(fired.fired.len(), 1);
    assert_eq!(
        store
            .timer_arm(&sleep_arm(&k, "sleep:nap", later))
            .await
            .unwrap(),
        first
    );
    let raw = Connection::open(dir.file("keiro.db")).unwrap();
    let rows: i64 = raw
        .query_row("SELECT count(*) FROM timers", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 2);
}

#[tokio::test]
async fn an_arm_after_a_span_is_due_on_the_stores_clock_and_needs_the_instance() {
    let (_dir, store) = pinned("t-after");
    let k = start(&store, "a").await;
    let arm = TimerArm {
        due: TimerDue::After(Duration::from_secs(90)),
        ..sleep_arm(&k, "sleep:span", T0)
    };
    assert_eq!(
        store.timer_arm(&arm).await.unwrap(),
        T0 + time::Duration::seconds(90)
    );
    let forever = TimerArm {
        step: "sleep:forever".into(),
        due: TimerDue::After(Duration::MAX),
        ..arm.clone()
    };
    assert_eq!(
        store.timer_arm(&forever).await.unwrap(),
        T0 + time::Duration::try_from(TimerDue::AFTER_MAX).unwrap()
    );
    let missing = TimerArm {
        key: InstanceKey::parse("wf", "missing").unwrap(),
        ..arm
    };
    assert!(store.timer_arm(&missing).await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn a_signal_timeout_lands_only_while_its_waiter_is_registered() {
    let (dir, store) = pinned("t-signal");
    let k = start(&store, "a").await;
    for step in ["signal:waiting", "signal:answered"] {
        let arm = TimerArm {
            kind: TimerKind::SignalTimeout {
                token: "tok".into(),
            },
            ..sleep_arm(&k, step, T0)
        };
        store.timer_arm(&arm).await.unwrap();
    }
    // The waiter a signal wait registers (signal_wait is not in this store yet); the other
    // wait's waiter was taken by a signal.
    let raw = Connection::open(dir.file("keiro.db")).unwrap();
    raw.execute(
        "INSERT INTO signal_waiters (token, workflow_name, workflow_id, generation, step, \
         created_at) VALUES ('tok', 'wf', 'a', 0, 'signal:waiting', 0)",
        [],
    )
    .unwrap();
    let firing = store.timers_fire_due(Some(T0), 10).await.unwrap();
    let delivered: Vec<_> = firing
        .fired
        .iter()
        .map(|t| (t.step.as_str(), t.delivered))
        .collect();
    assert_eq!(
        delivered,
        [("signal:answered", false), ("signal:waiting", true)]
    );
    assert_eq!(
        recorded(&store, &k, "signal:waiting").await,
        vec![json!({"timeout": true})]
    );
    let waiters: i64 = raw
        .query_row("SELECT count(*) FROM signal_waiters", [], |r| r.get(0))
        .unwrap();
    assert_eq!(waiters, 0);
}

#[tokio::test]
async fn only_timers_stuck_longer_than_the_threshold_are_requeued() {
    let (dir, store) = pinned("t-stuck");
    let k = start(&store, "a").await;
    for step in ["sleep:stuck", "sleep:recent"] {
        store.timer_arm(&sleep_arm(&k, step, T0)).await.unwrap();
    }
    let raw = Connection::open(dir.file("keiro.db")).unwrap();
    let minutes_ago = |m: i64| (T0 - time::Duration::minutes(m)).unix_timestamp() * 1_000_000;
    raw.execute(
        "UPDATE timers SET status = 'firing', updated_at = ?1 WHERE step = 'sleep:stuck'",
        [minutes_ago(10)],
    )
    .unwrap();
    raw.execute(
        "UPDATE timers SET status = 'firing', updated_at = ?1 WHERE step = 'sleep:recent'",
        [minutes_ago(1)],
    )
    .unwrap();
    assert_eq!(store.timers_due_count(None).await.unwrap(), 0);
    assert_eq!(
        store
            .timers_requeue_stuck(Duration::from_secs(5 * 60))
            .await
            .unwrap(),
        1
    );
    let firing = store.timers_fire_due(None, 10).await.unwrap();
    let steps: Vec<_> = firing
        .fired
        .iter()
        .map(|t| (t.step.as_str(), t.delivered))
        .collect();
    assert_eq!(steps, [("sleep:stuck", true)]);
}
