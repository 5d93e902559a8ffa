//! Sending and waiting on a signal: buffering first in first out, waiters first come first
//! served, waiters that cannot take a signal are passed over, the fence on consuming a
//! buffered signal, and the timeout timer.

use crate::contract::support::{claim, key, recorded, start, start_parked, status, TestResult};
use crate::Harness;
use keiro_journal::{
    store::SignalWait, store::SignalWaitOutcome, store::TimerArm, Append, Event, Fence,
    InstanceKey, SignalSendOutcome, Status, TimerKind,
};
use serde_json::json;
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
    Ok(())
}
