//! Timers left `firing` (by an interrupted operator action, say) go back to `scheduled` once
//! older than the threshold, a state written here with SQL. The timer rules every store keeps
//! are the contract suite's (`keiro_tests::contract::timer`).

use std::time::Duration;

use crate::common::{pinned, start, T0};
use keiro_journal::{store::TimerArm, store::TimerDue, InstanceKey, TimerKind};
use rusqlite::Connection;
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
