//! Arming a timer: one timer per (instance, generation, step), whose first deadline stands;
//! only a new timer tells the timer loops.

use std::time::Duration;

use crate::contract::support::{key, start, TestResult};
use crate::Harness;
use keiro_journal::{store::TimerArm, InstanceKey, TimerKind};
use serde_json::json;
use time::macros::datetime;
use time::OffsetDateTime;

/// How long a notification may take to arrive, and how long silence means none comes.
const QUIET: Duration = Duration::from_millis(150);

fn sleep_arm(k: &InstanceKey, step: &str, fire_at: OffsetDateTime) -> TimerArm {
    TimerArm {
        key: k.clone(),
        generation: 0,
        step: step.into(),
        due: keiro_journal::store::TimerDue::At(fire_at),
        kind: TimerKind::Sleep,
    }
}

pub async fn the_first_arm_wins_and_alone_notifies(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("sleeper", "s-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let mut notifications = h.notifications().await?;
    notifications.drain(QUIET).await;

    let first = datetime!(2030-01-01 0:00 UTC);
    let later = datetime!(2030-06-01 0:00 UTC);
    assert_eq!(
        store.timer_arm(&sleep_arm(&k, "sleep:nap", first)).await?,
        first
    );
    assert_eq!(
        notifications.drain(QUIET).await,
        ["timer"],
        "a new timer tells the timer loops"
    );

    // A re-arm, earlier or later, of either kind, never moves the deadline nor notifies.
    assert_eq!(
        store.timer_arm(&sleep_arm(&k, "sleep:nap", later)).await?,
        first
    );
    let earlier = TimerArm {
        kind: TimerKind::SignalTimeout { token: "t".into() },
        ..sleep_arm(&k, "sleep:nap", datetime!(2029-01-01 0:00 UTC))
    };
    assert_eq!(store.timer_arm(&earlier).await?, first);
    assert!(
        notifications.drain(QUIET).await.is_empty(),
        "re-arms notify nobody"
    );

    // Another generation's step is another timer.
    let next_generation = TimerArm {
        generation: 1,
        ..sleep_arm(&k, "sleep:nap", later)
    };
    assert_eq!(store.timer_arm(&next_generation).await?, later);

    // Even after it fired, the first timer still answers a re-arm, and writes no new timer:
    // past both deadlines, only the other generation's fires.
    let fired = store
        .timers_fire_due(Some(datetime!(2030-01-02 0:00 UTC)), 10)
        .await?;
    assert_eq!(fired.fired.len(), 1);
    assert_eq!(
        store.timer_arm(&sleep_arm(&k, "sleep:nap", later)).await?,
        first
    );
    let fired = store
        .timers_fire_due(Some(datetime!(2031-01-01 0:00 UTC)), 10)
        .await?;
    assert_eq!(fired.fired.len(), 1, "{fired:?}");
    assert_eq!(fired.fired[0].fire_at, later, "{fired:?}");
    Ok(())
}

pub async fn arming_needs_the_instance(h: Harness) -> TestResult {
    let missing = sleep_arm(
        &key("sleeper", "nope"),
        "sleep:nap",
        datetime!(2030-01-01 0:00 UTC),
    );
    assert!(h
        .store
        .timer_arm(&missing)
        .await
        .unwrap_err()
        .is_not_found());
    Ok(())
}

pub async fn racing_arms_agree_on_one_deadline(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("sleeper", "s-2");
    store.instance_start(&start(&k, json!(null))).await?;
    for n in 0..20 {
        let step = format!("sleep:{n}");
        let a = sleep_arm(&k, &step, datetime!(2030-01-01 0:00 UTC));
        let b = sleep_arm(&k, &step, datetime!(2031-01-01 0:00 UTC));
        let (a, b) = tokio::join!(store.timer_arm(&a), store.timer_arm(&b));
        assert_eq!(a?, b?, "both arms of {step} return the stored deadline");
    }
    Ok(())
}

pub async fn a_span_is_due_from_the_stores_clock_and_cut_to_the_longest_span(
    h: Harness,
) -> TestResult {
    use crate::contract::support::SLACK;
    use keiro_journal::store::TimerDue;
    let store = &*h.store;
    let k = key("sleeper", "s-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let span = Duration::from_secs(90);
    let arm = TimerArm {
        due: TimerDue::After(span),
        ..sleep_arm(&k, "sleep:span", datetime!(2030-01-01 0:00 UTC))
    };
    let before = OffsetDateTime::now_utc();
    let due = store.timer_arm(&arm).await?;
    let after = OffsetDateTime::now_utc();
    assert!(
        due >= before + span - SLACK && due <= after + span + SLACK,
        "{due} not {span:?} after the arm ({before} .. {after})"
    );
    // A re-arm answers the stored deadline, not a new span from now.
    assert_eq!(store.timer_arm(&arm).await?, due);

    let longest = time::Duration::try_from(TimerDue::AFTER_MAX)?;
    let forever = TimerArm {
        step: "sleep:forever".into(),
        due: TimerDue::After(Duration::MAX),
        ..arm
    };
    let before = OffsetDateTime::now_utc();
    let due = store.timer_arm(&forever).await?;
    let after = OffsetDateTime::now_utc();
    assert!(
        due >= before + longest - SLACK && due <= after + longest + SLACK,
        "{due} not the longest span after the arm ({before} .. {after})"
    );
    Ok(())
}
