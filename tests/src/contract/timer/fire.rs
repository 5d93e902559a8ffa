//! Firing due timers: what a fire journals, when it delivers, and what it reports back.

#[allow(clippy::wildcard_imports)] // the shared tools, some of them per scenario
use crate::contract::support::*;
use crate::Harness;
use keiro_journal::store::{FiredTimer, TimerDue};
use keiro_journal::TimerFiring;
use keiro_journal::{
    store::Park, store::TimerArm, Append, Event, InstanceKey, Status, StepKind, TimerKind,
};
use serde_json::json;
use serde_json::Value;
use time::macros::datetime;
use time::Duration as Span;
use time::OffsetDateTime;

const T0: OffsetDateTime = datetime!(2030-01-01 0:00 UTC);

fn sleep_arm(k: &InstanceKey, step: &str, fire_at: OffsetDateTime) -> TimerArm {
    TimerArm {
        key: k.clone(),
        generation: 0,
        step: step.into(),
        due: keiro_journal::store::TimerDue::At(fire_at),
        kind: TimerKind::Sleep,
    }
}

pub async fn a_due_sleep_journals_its_step_wakes_the_owner_and_clears_its_deadline(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let k = key("sleeper", "s-1");
    store.instance_start(&start(&k, json!(null))).await?;
    store.timer_arm(&sleep_arm(&k, "sleep:nap", T0)).await?;
    store
        .instance_park(&Park {
            key: k.clone(),
            generation: 0,
            fence: None,
            awaited: vec!["sleep:nap".into()],
            wake_after: Some(T0),
        })
        .await?;

    let early = store
        .timers_fire_due(Some(T0 - time::Duration::SECOND), 10)
        .await?;
    assert!(early.fired.is_empty());
    assert_eq!(early.next_due, Some(T0));
    assert_eq!(store.timers_due_count(Some(T0)).await?, 1);

    let now = T0 + time::Duration::SECOND;
    let firing = store.timers_fire_due(Some(now), 10).await?;
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
    assert_eq!(store.timers_due_count(Some(now)).await?, 0);
    assert_eq!(recorded(store, &k, "sleep:nap").await?, vec![json!(null)]);
    let row = store.instance_get(&k).await?.expect("row");
    assert_eq!((row.status, row.wake_after), (Status::Running, None));
    Ok(())
}

pub async fn fires_oldest_first_up_to_the_limit_and_reports_the_next_due(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("sleeper", "s-2");
    store.instance_start(&start(&k, json!(null))).await?;
    for minutes in [3, 1, 2, 60] {
        let at = T0 + time::Duration::minutes(minutes);
        store
            .timer_arm(&sleep_arm(&k, &format!("sleep:{minutes}"), at))
            .await?;
    }
    let now = T0 + time::Duration::minutes(10);
    assert_eq!(store.timers_due_count(Some(now)).await?, 3);
    assert!(store.timers_fire_due(Some(now), -1).await?.fired.is_empty());

    let first = store.timers_fire_due(Some(now), 2).await?;
    let steps: Vec<_> = first.fired.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(steps, ["sleep:1", "sleep:2"]);
    assert_eq!(
        first.next_due,
        Some(T0 + time::Duration::minutes(3)),
        "still due: fire again now"
    );

    let second = store.timers_fire_due(Some(now), 2).await?;
    let steps: Vec<_> = second.fired.iter().map(|t| t.step.as_str()).collect();
    assert_eq!(steps, ["sleep:3"]);
    assert_eq!(second.next_due, Some(T0 + time::Duration::minutes(60)));
    assert_eq!(store.timers_due_count(Some(now)).await?, 0);
    Ok(())
}

pub async fn a_fire_that_cannot_journal_is_marked_fired_undelivered(h: Harness) -> TestResult {
    let store = &*h.store;

    // The step is journaled already (a re-fire, or the run recorded it another way).
    let journaled = key("sleeper", "journaled");
    start_parked(store, &journaled).await?;
    store
        .journal_append(&step(&journaled, "sleep:nap", StepKind::Sleep, json!(null)))
        .await?;
    store
        .timer_arm(&sleep_arm(&journaled, "sleep:nap", T0))
        .await?;

    // The owner finished.
    let finished = key("sleeper", "finished");
    store.instance_start(&start(&finished, json!(null))).await?;
    store
        .timer_arm(&sleep_arm(&finished, "sleep:nap", T0))
        .await?;
    store
        .journal_append(&Append::external(
            finished.clone(),
            Event::WorkflowCancelled,
        ))
        .await?;

    // The owner moved on to another generation.
    let moved = key("sleeper", "moved");
    store.instance_start(&start(&moved, json!(null))).await?;
    store.timer_arm(&sleep_arm(&moved, "sleep:nap", T0)).await?;
    store
        .journal_append(&Append::external(
            moved.clone(),
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!(null),
            },
        ))
        .await?;

    let firing = store.timers_fire_due(Some(T0), 10).await?;
    assert_eq!(firing.fired.len(), 3);
    assert!(firing.fired.iter().all(|t| !t.delivered), "{firing:?}");
    assert_eq!(firing.next_due, None);
    assert_eq!(store.timers_due_count(Some(T0)).await?, 0);
    assert_eq!(recorded(store, &finished, "sleep:nap").await?.len(), 0);
    assert_eq!(recorded(store, &moved, "sleep:nap").await?.len(), 0);
    assert_eq!(recorded(store, &journaled, "sleep:nap").await?.len(), 1);
    assert_eq!(status(store, &finished).await?, Status::Cancelled);
    Ok(())
}

fn sleep_at(key: &InstanceKey, step: &str, minutes: i64) -> TimerArm {
    TimerArm {
        key: key.clone(),
        generation: 0,
        step: step.to_owned(),
        due: TimerDue::At(T0 + Span::minutes(minutes)),
        kind: TimerKind::Sleep,
    }
}

pub async fn timers_arm_once_and_fire_by_the_callers_clock_in_due_order(h: Harness) -> TestResult {
    let store = &*h.store;
    let a = started(store, "a").await?;
    let b = started(store, "b").await?;
    let missing = key("wf", "missing");
    assert!(store
        .timer_arm(&sleep_at(&missing, "sleep:x", 1))
        .await
        .unwrap_err()
        .is_not_found());
    assert_eq!(
        store.timer_arm(&sleep_at(&b, "sleep:nap", 10)).await?,
        T0 + Span::minutes(10)
    );
    assert_eq!(
        store.timer_arm(&sleep_at(&a, "sleep:nap", 5)).await?,
        T0 + Span::minutes(5)
    );
    // A re-arm never moves fire_at, earlier or later.
    assert_eq!(
        store.timer_arm(&sleep_at(&a, "sleep:nap", 1)).await?,
        T0 + Span::minutes(5)
    );
    park_on(store, &a, "sleep:nap").await?;

    let idle = store.timers_fire_due(Some(T0), 10).await?;
    assert_eq!(
        idle,
        TimerFiring {
            fired: vec![],
            next_due: Some(T0 + Span::minutes(5)),
            clock: T0,
        }
    );
    assert_eq!(store.timers_due_count(Some(T0)).await?, 0);
    let later = Some(T0 + Span::minutes(10));
    assert_eq!(store.timers_due_count(later).await?, 2);
    assert!(store.timers_fire_due(later, 0).await?.fired.is_empty());

    let mut notifications = h.notifications().await?;
    let firing = store
        .timers_fire_due(Some(T0 + Span::minutes(7)), 10)
        .await?;
    assert_eq!(
        firing,
        TimerFiring {
            fired: vec![FiredTimer {
                key: a.clone(),
                step: "sleep:nap".into(),
                fire_at: T0 + Span::minutes(5),
                fired_at: T0 + Span::minutes(7),
                delivered: true,
            }],
            next_due: Some(T0 + Span::minutes(10)),
            clock: T0 + Span::minutes(7),
        }
    );
    assert_eq!(
        journal_rows(store, &a).await?,
        [("sleep:nap".into(), Value::Null)]
    );
    let row = store.instance_get(&a).await?.unwrap();
    assert_eq!((row.status, row.wake_after), (Status::Running, None));
    assert_eq!(notifications.drain(QUIET).await, [payload(&a)]);

    let firing = store.timers_fire_due(later, 10).await?;
    assert_eq!(firing.fired.len(), 1);
    assert_eq!(firing.next_due, None);
    assert_eq!(store.timers_due_count(later).await?, 0);
    assert_eq!(store.timers_requeue_stuck(TTL).await?, 0);
    Ok(())
}

pub async fn a_fire_journals_nothing_for_a_terminal_owner_or_a_journaled_step(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let closed = started(store, "closed").await?;
    let journaled = started(store, "journaled").await?;
    let rotated = started(store, "rotated").await?;
    for key in [&closed, &journaled, &rotated] {
        store.timer_arm(&sleep_at(key, "sleep:nap", 1)).await?;
    }
    store.instance_cancel(&closed, false).await?;
    let early = Event::StepRecorded {
        step: "sleep:nap".into(),
        kind: StepKind::Sleep,
        result: Value::Null,
    };
    append(store, &journaled, None, early, None).await?;
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!(null),
    };
    append(store, &rotated, None, rotate, None).await?;
    let parked = Park {
        key: journaled.clone(),
        generation: 0,
        fence: None,
        awaited: vec!["awk:x".into()],
        wake_after: Some(T0 + Span::hours(1)),
    };
    store.instance_park(&parked).await?;
    let mut before = Vec::new();
    for key in [&closed, &journaled, &rotated] {
        before.push(store.instance_get(key).await?);
    }

    let at = Some(T0 + Span::minutes(1));
    let firing = store.timers_fire_due(at, 10).await?;
    let delivered: Vec<_> = firing
        .fired
        .iter()
        .map(|fired| (fired.key.id.to_string(), fired.delivered))
        .collect();
    assert_eq!(
        delivered,
        [
            ("closed".to_owned(), false),
            ("journaled".to_owned(), false),
            ("rotated".to_owned(), false)
        ]
    );
    let mut after = Vec::new();
    for key in [&closed, &journaled, &rotated] {
        after.push(store.instance_get(key).await?);
    }
    assert_eq!(after, before, "an undelivered fire leaves the rows alone");
    assert_eq!(journal_rows(store, &closed).await?.len(), 1);
    assert_eq!(journal_rows(store, &journaled).await?.len(), 1);
    // Fired is fired: nothing is due again and a re-arm finds the first timer.
    assert!(store.timers_fire_due(at, 10).await?.fired.is_empty());
    assert_eq!(
        store.timer_arm(&sleep_at(&closed, "sleep:nap", 9)).await?,
        T0 + Span::minutes(1)
    );
    Ok(())
}
