//! Sending and waiting on a signal: buffering first in first out, waiters first come first
//! served, waiters that cannot take a signal are passed over, the fence on consuming a
//! buffered signal, and the timeout timer.

#[allow(clippy::wildcard_imports)] // the shared tools, some of them per scenario
use crate::contract::support::*;
use crate::Harness;
use keiro_journal::store::TimerDue;
use keiro_journal::StepKind;
use keiro_journal::{
    store::SignalWait, store::SignalWaitOutcome, store::TimerArm, Append, Event, Fence,
    InstanceKey, SignalSendOutcome, Status, TimerKind,
};
use serde_json::json;
use time::Duration as Span;
use time::OffsetDateTime;

fn wait(k: &InstanceKey, step: &str, token: &str) -> SignalWait {
    SignalWait {
        key: k.clone(),
        generation: 0,
        step: step.into(),
        token: token.into(),
        fence: None,
    }
}

pub async fn buffered_signals_are_consumed_first_in_first_out(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("waiter", "w-1");
    start_parked(store, &k).await?;
    for n in 1..=2 {
        assert_eq!(
            store.signal_send("t", &json!(n)).await?,
            SignalSendOutcome::Buffered
        );
    }
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:a", "t")).await?,
        SignalWaitOutcome::Delivered(json!({"ok": 1}))
    );
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:b", "t")).await?,
        SignalWaitOutcome::Delivered(json!({"ok": 2}))
    );
    // Journaled, so a re-arm answers from the journal; the buffer is empty now.
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:a", "t")).await?,
        SignalWaitOutcome::Delivered(json!({"ok": 1}))
    );
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:c", "t")).await?,
        SignalWaitOutcome::Waiting
    );
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:c", "t")).await?,
        SignalWaitOutcome::Waiting,
        "re-arming a registered wait registers nothing more"
    );
    assert_eq!(
        store.signal_send("t", &json!(3)).await?,
        SignalSendOutcome::Delivered { to: k.clone() }
    );
    assert_eq!(
        store.signal_send("t", &json!(4)).await?,
        SignalSendOutcome::Buffered,
        "the one waiter was served once"
    );
    assert_eq!(
        recorded(store, &k, "signal:c").await?,
        vec![json!({"ok": 3})]
    );
    assert!(store
        .signal_wait(&wait(&key("waiter", "nope"), "signal:a", "t"))
        .await
        .unwrap_err()
        .is_not_found());
    Ok(())
}

pub async fn waiters_are_served_in_arrival_order_and_dead_ones_are_passed_over(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let keys: Vec<_> = (1..=3).map(|n| key("waiter", &format!("w-{n}"))).collect();
    for k in &keys {
        start_parked(store, k).await?;
        assert_eq!(
            store.signal_wait(&wait(k, "signal:go", "t")).await?,
            SignalWaitOutcome::Waiting
        );
    }
    assert_eq!(status(store, &keys[0]).await?, Status::Suspended);
    assert_eq!(
        store.signal_send("t", &json!("first")).await?,
        SignalSendOutcome::Delivered {
            to: keys[0].clone()
        }
    );
    assert_eq!(status(store, &keys[0]).await?, Status::Running, "woken");

    // The second waiter finished meanwhile: the signal goes to the third.
    store
        .journal_append(&Append::external(keys[1].clone(), Event::WorkflowCancelled))
        .await?;
    assert_eq!(
        store.signal_send("t", &json!("second")).await?,
        SignalSendOutcome::Delivered {
            to: keys[2].clone()
        }
    );
    assert!(recorded(store, &keys[1], "signal:go").await?.is_empty());
    assert_eq!(
        recorded(store, &keys[2], "signal:go").await?,
        vec![json!({"ok": "second"})]
    );
    // The dead waiter was dropped, not kept: the next signal is buffered.
    assert_eq!(
        store.signal_send("t", &json!("third")).await?,
        SignalSendOutcome::Buffered
    );
    Ok(())
}

pub async fn consuming_a_buffered_signal_is_fenced(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("waiter", "w-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let fence = claim(store, &k, "w1").await?;
    store.signal_send("t", &json!("hi")).await?;

    let stale = SignalWait {
        fence: Some(Fence {
            owner: "w0".into(),
            ..fence.clone()
        }),
        ..wait(&k, "signal:go", "t")
    };
    assert!(store.signal_wait(&stale).await.unwrap_err().is_lease_lost());
    let current = SignalWait {
        fence: Some(fence),
        ..wait(&k, "signal:go", "t")
    };
    assert_eq!(
        store.signal_wait(&current).await?,
        SignalWaitOutcome::Delivered(json!({"ok": "hi"})),
        "the refused wait left the signal buffered"
    );
    Ok(())
}

pub async fn a_terminal_waiter_leaves_the_buffer_alone(h: Harness) -> TestResult {
    let store = &*h.store;
    let gone = key("waiter", "gone");
    let alive = key("waiter", "alive");
    store.instance_start(&start(&gone, json!(null))).await?;
    start_parked(store, &alive).await?;
    store
        .journal_append(&Append::external(gone.clone(), Event::WorkflowCancelled))
        .await?;
    store.signal_send("t", &json!(1)).await?;
    assert_eq!(
        store.signal_wait(&wait(&gone, "signal:go", "t")).await?,
        SignalWaitOutcome::Waiting
    );
    assert_eq!(
        store.signal_wait(&wait(&alive, "signal:go", "t")).await?,
        SignalWaitOutcome::Delivered(json!({"ok": 1}))
    );
    Ok(())
}

pub async fn a_pending_wait_times_out_and_a_satisfied_one_does_not(h: Harness) -> TestResult {
    let store = &*h.store;
    let now = OffsetDateTime::now_utc();
    let timeout = |k: &InstanceKey, seconds_ago: i64| TimerArm {
        key: k.clone(),
        generation: 0,
        step: "signal:go".into(),
        due: keiro_journal::store::TimerDue::At(now - time::Duration::seconds(seconds_ago)),
        kind: TimerKind::SignalTimeout { token: "t".into() },
    };
    let lonely = key("waiter", "lonely");
    let answered = key("waiter", "answered");
    for (k, seconds_ago) in [(&lonely, 2), (&answered, 1)] {
        start_parked(store, k).await?;
        store.signal_wait(&wait(k, "signal:go", "t")).await?;
        store.timer_arm(&timeout(k, seconds_ago)).await?;
    }
    // Only the older timeout fires: it drops its waiter and journals the timeout.
    let firing = store.timers_fire_due(None, 1).await?;
    assert_eq!(firing.fired.len(), 1);
    assert_eq!(
        (&firing.fired[0].key, firing.fired[0].delivered),
        (&lonely, true)
    );
    assert_eq!(
        recorded(store, &lonely, "signal:go").await?,
        vec![json!({"timeout": true})]
    );
    assert_eq!(
        status(store, &lonely).await?,
        Status::Running,
        "woken by the timeout"
    );

    // The timed-out waiter is gone, so the signal reaches the other one ...
    assert_eq!(
        store.signal_send("t", &json!("hi")).await?,
        SignalSendOutcome::Delivered {
            to: answered.clone()
        }
    );
    // ... whose timeout then finds nothing to time out.
    let firing = store.timers_fire_due(None, 10).await?;
    assert_eq!(firing.fired.len(), 1);
    assert_eq!(
        (&firing.fired[0].key, firing.fired[0].delivered),
        (&answered, false)
    );
    assert_eq!(
        recorded(store, &answered, "signal:go").await?,
        vec![json!({"ok": "hi"})]
    );
    Ok(())
}

pub async fn a_withdrawn_wait_is_passed_over_by_the_next_send(h: Harness) -> TestResult {
    let store = &*h.store;
    let (x, y) = (key("pay", "x"), key("pay", "y"));
    for k in [&x, &y] {
        start_parked(store, k).await?;
        assert_eq!(
            store.signal_wait(&wait(k, "signal:tok:1", "tok")).await?,
            SignalWaitOutcome::Waiting
        );
    }
    assert!(store.signal_withdraw(&x, 0, "signal:tok:1").await?);
    assert!(
        !store.signal_withdraw(&x, 0, "signal:tok:1").await?,
        "a withdrawn wait is gone"
    );
    assert_eq!(
        store.signal_send("tok", &json!("paid")).await?,
        SignalSendOutcome::Delivered { to: y.clone() }
    );
    assert!(recorded(store, &x, "signal:tok:1").await?.is_empty());
    assert_eq!(
        recorded(store, &y, "signal:tok:1").await?,
        vec![json!({"ok": "paid"})]
    );
    // A delivered wait has no waiter left to withdraw; its signal stays journaled.
    assert!(!store.signal_withdraw(&y, 0, "signal:tok:1").await?);
    assert_eq!(recorded(store, &y, "signal:tok:1").await?.len(), 1);
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

fn wait_on(key: &InstanceKey, step: &str, token: &str) -> SignalWait {
    SignalWait {
        key: key.clone(),
        generation: 0,
        step: step.to_owned(),
        token: token.to_owned(),
        fence: None,
    }
}

pub async fn buffered_signals_are_consumed_oldest_first_by_later_waits(h: Harness) -> TestResult {
    let store = &*h.store;
    let a = started(store, "a").await?;
    let b = started(store, "b").await?;
    let c = started(store, "c").await?;
    for payload in ["one", "two"] {
        assert_eq!(
            store.signal_send("t", &json!(payload)).await?,
            SignalSendOutcome::Buffered
        );
    }
    assert_eq!(
        store.signal_wait(&wait_on(&a, "signal:x", "t")).await?,
        SignalWaitOutcome::Delivered(json!({"ok": "one"}))
    );
    // A repeated wait reads the journal; it consumes nothing more.
    assert_eq!(
        store.signal_wait(&wait_on(&a, "signal:x", "t")).await?,
        SignalWaitOutcome::Delivered(json!({"ok": "one"}))
    );
    let entries = store.journal_history(&a).await?;
    assert!(matches!(
        &entries[0].event,
        Event::StepRecorded {
            kind: StepKind::Signal,
            ..
        }
    ));

    // A stale fence cannot consume the buffered signal.
    let fence = claim(store, &b, "w").await?;
    store.instance_lease_force_release(&b).await?;
    let fenced = SignalWait {
        fence: Some(fence),
        ..wait_on(&b, "signal:x", "t")
    };
    assert!(store
        .signal_wait(&fenced)
        .await
        .unwrap_err()
        .is_lease_lost());
    // Nor can a terminal waiter: the signal stays for someone who can take it.
    store.instance_cancel(&c, false).await?;
    assert_eq!(
        store.signal_wait(&wait_on(&c, "signal:x", "t")).await?,
        SignalWaitOutcome::Waiting
    );
    assert_eq!(
        store.signal_wait(&wait_on(&b, "signal:x", "t")).await?,
        SignalWaitOutcome::Delivered(json!({"ok": "two"}))
    );
    let d = started(store, "d").await?;
    assert_eq!(
        store.signal_wait(&wait_on(&d, "signal:x", "t")).await?,
        SignalWaitOutcome::Waiting
    );
    assert_eq!(
        store.signal_wait(&wait_on(&d, "signal:x", "t")).await?,
        SignalWaitOutcome::Waiting
    );
    assert_eq!(
        store.signal_send("t", &json!("three")).await?,
        SignalSendOutcome::Delivered { to: d }
    );
    let missing = key("wf", "missing");
    assert!(store
        .signal_wait(&wait_on(&missing, "signal:x", "t"))
        .await
        .unwrap_err()
        .is_not_found());
    Ok(())
}

pub async fn a_send_goes_to_the_oldest_live_waiter_and_wakes_it(h: Harness) -> TestResult {
    let store = &*h.store;
    let gone = started(store, "gone").await?;
    let live = started(store, "live").await?;
    let last = started(store, "last").await?;
    for key in [&gone, &live, &last] {
        assert_eq!(
            store.signal_wait(&wait(key, "signal:x", "t")).await?,
            SignalWaitOutcome::Waiting
        );
    }
    park_on(store, &live, "signal:x").await?;
    store.instance_cancel(&gone, false).await?;
    let mut notifications = h.notifications().await?;

    assert_eq!(
        store.signal_send("t", &json!(7)).await?,
        SignalSendOutcome::Delivered { to: live.clone() }
    );
    assert_eq!(
        journal_rows(store, &live).await?,
        [("signal:x".into(), json!({"ok": 7}))]
    );
    assert_eq!(status(store, &live).await?, Status::Running);
    assert_eq!(notifications.drain(QUIET).await, [payload(&live)]);
    assert_eq!(journal_rows(store, &gone).await?.len(), 1);
    // The refused waiter was dropped, not kept for the next signal.
    assert_eq!(
        store.signal_send("t", &json!(8)).await?,
        SignalSendOutcome::Delivered { to: last }
    );
    assert_eq!(
        store.signal_send("t", &json!(9)).await?,
        SignalSendOutcome::Buffered
    );
    assert_eq!(
        store.signal_send("other", &json!(9)).await?,
        SignalSendOutcome::Buffered
    );
    Ok(())
}

pub async fn a_signal_timeout_fires_only_while_the_wait_is_pending(h: Harness) -> TestResult {
    let store = &*h.store;
    let timed_out = started(store, "timed-out").await?;
    let answered = started(store, "answered").await?;
    for key in [&timed_out, &answered] {
        store.signal_wait(&wait(key, "signal:x", "t")).await?;
        let timeout = TimerArm {
            kind: TimerKind::SignalTimeout { token: "t".into() },
            ..sleep_at(key, "signal:x", 1)
        };
        store.timer_arm(&timeout).await?;
    }
    // Both are due together and fire in key order, so `answered` times out while the
    // older waiter, `timed_out`, is still there to take the next send.
    let at = Some(T0 + Span::minutes(1));
    let first = store.timers_fire_due(at, 1).await?;
    assert_eq!(first.fired[0].key, answered);
    assert!(first.fired[0].delivered);
    assert_eq!(
        journal_rows(store, &answered).await?,
        [("signal:x".into(), json!({"timeout": true}))]
    );
    assert_eq!(status(store, &answered).await?, Status::Running, "woken");
    assert_eq!(
        store.signal_send("t", &json!("late")).await?,
        SignalSendOutcome::Delivered {
            to: timed_out.clone()
        }
    );
    let second = store.timers_fire_due(at, 1).await?;
    assert_eq!(second.fired[0].key, timed_out);
    assert!(!second.fired[0].delivered);
    assert_eq!(
        journal_rows(store, &timed_out).await?,
        [("signal:x".into(), json!({"ok": "late"}))]
    );
    // With the waiter gone, the next signal is buffered rather than lost.
    assert_eq!(
        store.signal_send("t", &json!("next")).await?,
        SignalSendOutcome::Buffered
    );
    Ok(())
}

pub async fn a_wait_on_a_token_no_send_could_use_is_refused(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("waiter", "w-1");
    start_parked(store, &k).await?;
    for token in ["", "a\nb", "a\u{0}b"] {
        let refused = store.signal_wait(&wait(&k, "signal:go", token)).await;
        assert!(
            matches!(&refused, Err(e) if e.is_value_refused()),
            "{token:?}: {refused:?}"
        );
    }
    assert!(store.journal_history(&k).await?.is_empty());
    assert_eq!(status(store, &k).await?, Status::Suspended);
    // Nothing was registered: a good token's first send is buffered for the next wait.
    assert_eq!(
        store.signal_send("go", &json!(1)).await?,
        SignalSendOutcome::Buffered
    );
    Ok(())
}
