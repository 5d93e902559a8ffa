//! Signals (signal.sql): the buffer and its order, waiters first come first served, the fence
//! on consuming a buffered signal, the TTL and the sweep, the timeout timer, the withdraw and
//! the return of a race's signals. The assertions of the memory store's tests
//! (crates/memory/src/sources.rs), of crates/postgres/tests/signals.rs and signal_race.rs, and
//! of the suite's wake_edges.rs and race.rs scenarios on the store operations under them.

mod common;

use std::time::Duration;

use common::{claim, pinned, start, T0};
use keiro_journal::store::{Append, AppendOutcome, Park};
use keiro_journal::{
    store::ReturnedSignal, store::SignalWait, store::SignalWaitOutcome, store::TimerArm,
    store::TimerDue, Event, Fence, InstanceKey, SignalOptions, SignalSendOutcome, Status, StepKind,
    TimerKind,
};
use keiro_sqlite::SqliteStore;
use rusqlite::Connection;
use serde_json::{json, Value};

fn wait(k: &InstanceKey, step: &str, token: &str) -> SignalWait {
    SignalWait {
        key: k.clone(),
        generation: 0,
        step: step.into(),
        token: token.into(),
        fence: None,
    }
}

/// The values journaled under `step` of `key`.
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

async fn status(store: &SqliteStore, key: &InstanceKey) -> Status {
    store.instance_get(key).await.unwrap().unwrap().status
}

/// Starts `wf/<id>` and parks it with no lease on `signal:go`, as a run that found nothing.
async fn start_parked(store: &SqliteStore, id: &str) -> InstanceKey {
    let key = start(store, id).await;
    store
        .instance_park(&Park {
            key: key.clone(),
            generation: 0,
            fence: None,
            awaited: vec!["signal:go".into()],
            wake_after: None,
        })
        .await
        .unwrap();
    key
}

fn count(store: &SqliteStore, sql: &str) -> i64 {
    let conn = Connection::open(store.path()).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

fn execute(store: &SqliteStore, sql: &str) {
    let conn = Connection::open(store.path()).unwrap();
    conn.execute_batch(sql).unwrap();
}

#[tokio::test]
async fn buffered_signals_are_consumed_first_in_first_out() {
    let (_dir, store) = pinned("s-fifo");
    let k = start_parked(&store, "w-1").await;
    for n in 1..=2 {
        assert_eq!(
            store.signal_send("t", &json!(n)).await.unwrap(),
            SignalSendOutcome::Buffered
        );
    }
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:a", "t")).await.unwrap(),
        SignalWaitOutcome::Delivered(json!({"ok": 1}))
    );
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:b", "t")).await.unwrap(),
        SignalWaitOutcome::Delivered(json!({"ok": 2}))
    );
    // Journaled, so a re-arm answers from the journal; the buffer is empty now.
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:a", "t")).await.unwrap(),
        SignalWaitOutcome::Delivered(json!({"ok": 1}))
    );
    let entries = store.journal_history(&k).await.unwrap();
    assert!(matches!(
        &entries[0].event,
        Event::StepRecorded {
            kind: StepKind::Signal,
            ..
        }
    ));
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:c", "t")).await.unwrap(),
        SignalWaitOutcome::Waiting
    );
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:c", "t")).await.unwrap(),
        SignalWaitOutcome::Waiting,
        "re-arming a registered wait registers nothing more"
    );
    assert_eq!(
        store.signal_send("t", &json!(3)).await.unwrap(),
        SignalSendOutcome::Delivered { to: k.clone() }
    );
    assert_eq!(
        store.signal_send("t", &json!(4)).await.unwrap(),
        SignalSendOutcome::Buffered,
        "the one waiter was served once"
    );
    assert_eq!(
        recorded(&store, &k, "signal:c").await,
        vec![json!({"ok": 3})]
    );
    let missing = InstanceKey::parse("wf", "nope").unwrap();
    assert!(store
        .signal_wait(&wait(&missing, "signal:a", "t"))
        .await
        .unwrap_err()
        .is_not_found());
}

#[tokio::test]
async fn waiters_are_served_in_arrival_order_and_dead_ones_are_passed_over() {
    let (_dir, store) = pinned("s-order");
    let mut keys = Vec::new();
    for n in 1..=3 {
        let k = start_parked(&store, &format!("w-{n}")).await;
        assert_eq!(
            store
                .signal_wait(&wait(&k, "signal:go", "t"))
                .await
                .unwrap(),
            SignalWaitOutcome::Waiting
        );
        keys.push(k);
    }
    assert_eq!(status(&store, &keys[0]).await, Status::Suspended);
    assert_eq!(
        store.signal_send("t", &json!("first")).await.unwrap(),
        SignalSendOutcome::Delivered {
            to: keys[0].clone()
        }
    );
    assert_eq!(status(&store, &keys[0]).await, Status::Running, "woken");

    // The second waiter finished meanwhile: the signal goes to the third.
    store
        .journal_append(&Append::external(keys[1].clone(), Event::WorkflowCancelled))
        .await
        .unwrap();
    assert_eq!(
        store.signal_send("t", &json!("second")).await.unwrap(),
        SignalSendOutcome::Delivered {
            to: keys[2].clone()
        }
    );
    assert!(recorded(&store, &keys[1], "signal:go").await.is_empty());
    assert_eq!(
        recorded(&store, &keys[2], "signal:go").await,
        vec![json!({"ok": "second"})]
    );
    // The dead waiter was dropped, not kept: the next signal is buffered.
    assert_eq!(
        store.signal_send("t", &json!("third")).await.unwrap(),
        SignalSendOutcome::Buffered
    );
    assert_eq!(
        store.signal_send("other", &json!(9)).await.unwrap(),
        SignalSendOutcome::Buffered
    );
}

#[tokio::test]
async fn consuming_a_buffered_signal_is_fenced_and_a_terminal_waiter_leaves_it_alone() {
    let (_dir, store) = pinned("s-fence");
    let k = start(&store, "w-1").await;
    let fence = claim(&store, &k, "w1").await;
    store.signal_send("t", &json!("hi")).await.unwrap();
    let stale = SignalWait {
        fence: Some(Fence {
            owner: "w0".into(),
            ..fence.clone()
        }),
        ..wait(&k, "signal:go", "t")
    };
    assert!(store.signal_wait(&stale).await.unwrap_err().is_lease_lost());

    // A terminal waiter cannot take it either: the signal stays for someone who can.
    let gone = start(&store, "gone").await;
    store.instance_cancel(&gone, false).await.unwrap();
    assert_eq!(
        store
            .signal_wait(&wait(&gone, "signal:go", "t"))
            .await
            .unwrap(),
        SignalWaitOutcome::Waiting
    );
    let current = SignalWait {
        fence: Some(fence),
        ..wait(&k, "signal:go", "t")
    };
    assert_eq!(
        store.signal_wait(&current).await.unwrap(),
        SignalWaitOutcome::Delivered(json!({"ok": "hi"})),
        "the refused waits left the signal buffered"
    );
    // A lease released under it: the stale fence of a force release cannot consume.
    let b = start(&store, "b").await;
    let fence = claim(&store, &b, "w").await;
    store.instance_lease_force_release(&b).await.unwrap();
    store.signal_send("t", &json!("two")).await.unwrap();
    let fenced = SignalWait {
        fence: Some(fence),
        ..wait(&b, "signal:x", "t")
    };
    assert!(store
        .signal_wait(&fenced)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(
        store.signal_wait(&wait(&b, "signal:x", "t")).await.unwrap(),
        SignalWaitOutcome::Delivered(json!({"ok": "two"}))
    );
}

#[tokio::test]
async fn a_registered_wait_takes_a_signal_buffered_beside_it() {
    let (_dir, store) = pinned("s-beside");
    let k = start_parked(&store, "w-1").await;
    assert_eq!(
        store
            .signal_wait(&wait(&k, "signal:go", "t"))
            .await
            .unwrap(),
        SignalWaitOutcome::Waiting
    );
    // The state a send whose snapshot predated the waiter leaves on PostgreSQL, by hand.
    let expires = common::T0.unix_timestamp() * 1_000_000 + 3_600_000_000;
    execute(
        &store,
        &format!(
            "INSERT INTO signal_buffer (token, payload, created_at, expires_at) \
             VALUES ('t', '1', 0, {expires})"
        ),
    );
    assert_eq!(
        store
            .signal_wait(&wait(&k, "signal:go", "t"))
            .await
            .unwrap(),
        SignalWaitOutcome::Delivered(json!({"ok": 1})),
        "the re-driven wait must consult the buffer"
    );
    assert_eq!(
        count(
            &store,
            "SELECT (SELECT count(*) FROM signal_buffer) + (SELECT count(*) FROM signal_waiters)"
        ),
        0,
        "the signal and the waiter are both gone"
    );
    assert_eq!(
        recorded(&store, &k, "signal:go").await,
        vec![json!({"ok": 1})]
    );
    assert_eq!(
        store.signal_send("t", &json!(2)).await.unwrap(),
        SignalSendOutcome::Buffered
    );
}

#[tokio::test]
async fn a_pending_wait_times_out_and_a_satisfied_one_does_not() {
    let (_dir, store) = pinned("s-timeout");
    let timeout = |k: &InstanceKey| TimerArm {
        key: k.clone(),
        generation: 0,
        step: "signal:go".into(),
        due: TimerDue::At(T0 + time::Duration::minutes(1)),
        kind: TimerKind::SignalTimeout { token: "t".into() },
    };
    let timed_out = start_parked(&store, "timed-out").await;
    let answered = start_parked(&store, "answered").await;
    for k in [&timed_out, &answered] {
        store.signal_wait(&wait(k, "signal:go", "t")).await.unwrap();
        store.timer_arm(&timeout(k)).await.unwrap();
    }
    // Both are due together and fire in key order, so `answered` times out while the older
    // waiter, `timed_out`, is still there to take the next send.
    store.pin_clock(Some(T0 + time::Duration::minutes(1)));
    let first = store.timers_fire_due(None, 1).await.unwrap();
    assert_eq!(first.fired[0].key, answered);
    assert!(first.fired[0].delivered);
    assert_eq!(
        recorded(&store, &answered, "signal:go").await,
        vec![json!({"timeout": true})]
    );
    assert_eq!(status(&store, &answered).await, Status::Running, "woken");
    assert_eq!(
        store.signal_send("t", &json!("late")).await.unwrap(),
        SignalSendOutcome::Delivered {
            to: timed_out.clone()
        }
    );
    let second = store.timers_fire_due(None, 1).await.unwrap();
    assert_eq!(second.fired[0].key, timed_out);
    assert!(!second.fired[0].delivered);
    assert_eq!(
        recorded(&store, &timed_out, "signal:go").await,
        vec![json!({"ok": "late"})]
    );
    // With the waiter gone, the next signal is buffered rather than lost.
    assert_eq!(
        store.signal_send("t", &json!("next")).await.unwrap(),
        SignalSendOutcome::Buffered
    );
}

#[tokio::test]
async fn an_expired_buffered_signal_is_never_delivered_and_is_deleted() {
    let (_dir, store) = pinned("s-ttl");
    let brief = SignalOptions::default().ttl(Duration::from_millis(100));
    assert_eq!(
        store
            .signal_send_with("fleeting", &json!(1), &brief)
            .await
            .unwrap(),
        SignalSendOutcome::Buffered
    );
    assert_eq!(
        store.signal_send("fleeting", &json!(2)).await.unwrap(),
        SignalSendOutcome::Buffered
    );
    store.advance_clock(Duration::from_millis(250));
    // The older signal expired, so the first wait takes the younger one.
    let k = start_parked(&store, "l-ttl").await;
    assert_eq!(
        store
            .signal_wait(&wait(&k, "signal:fleeting:1", "fleeting"))
            .await
            .unwrap(),
        SignalWaitOutcome::Delivered(json!({"ok": 2}))
    );
    // A zero TTL: a signal for the runs waiting now, or for nobody.
    let now_or_never = SignalOptions::default().ttl(Duration::ZERO);
    assert_eq!(
        store
            .signal_send_with("fleeting", &json!(4), &now_or_never)
            .await
            .unwrap(),
        SignalSendOutcome::Buffered
    );
    assert_eq!(
        store
            .signal_wait(&wait(&k, "signal:fleeting:2", "fleeting"))
            .await
            .unwrap(),
        SignalWaitOutcome::Waiting
    );
}

#[tokio::test]
async fn a_buffered_signal_lives_seven_days_by_default_and_sends_sweep_other_tokens() {
    let (_dir, store) = pinned("s-week");
    store.signal_send("weekly", &json!(1)).await.unwrap();
    store.advance_clock(Duration::from_secs(7 * 24 * 3600 - 1));
    store.signal_send("weekly", &json!(2)).await.unwrap();
    store.advance_clock(Duration::from_secs(1));
    assert_eq!(
        count(
            &store,
            &format!(
                "SELECT count(*) FROM signal_buffer WHERE expires_at = {}",
                (T0.unix_timestamp() + 7 * 24 * 3600) * 1_000_000
            )
        ),
        1,
        "a week out on the store's clock"
    );
    let k = start_parked(&store, "l-week").await;
    assert_eq!(
        store
            .signal_wait(&wait(&k, "signal:weekly:1", "weekly"))
            .await
            .unwrap(),
        SignalWaitOutcome::Delivered(json!({"ok": 2}))
    );
    assert_eq!(
        count(&store, "SELECT count(*) FROM signal_buffer"),
        0,
        "the wait deleted its token's expired signal"
    );

    // A send deletes expired signals of other tokens too.
    for token in ["kept", "swept"] {
        store.signal_send(token, &json!(1)).await.unwrap();
    }
    execute(
        &store,
        "UPDATE signal_buffer SET expires_at = 0 WHERE token = 'swept'",
    );
    store.signal_send("other", &json!(2)).await.unwrap();
    assert_eq!(
        count(
            &store,
            "SELECT count(*) FROM signal_buffer WHERE token = 'swept'"
        ),
        0,
        "the send on another token swept it"
    );
    assert_eq!(
        count(
            &store,
            "SELECT count(*) FROM signal_buffer WHERE token = 'kept'"
        ),
        1
    );
}

#[tokio::test]
async fn tokens_and_values_postgresql_refuses_are_refused_before_anything_is_written() {
    let (_dir, store) = pinned("s-refused");
    let k = start(&store, "w-1").await;
    for token in ["", "a\nb", "a\u{0}b"] {
        let err = store.signal_send(token, &json!(1)).await.unwrap_err();
        assert!(err.is_value_refused(), "{token:?}: {err}");
        let err = store
            .signal_wait(&wait(&k, "signal:go", token))
            .await
            .unwrap_err();
        assert!(err.is_value_refused(), "{token:?}: {err}");
    }
    let err = store.signal_send("t", &json!("a\u{0}")).await.unwrap_err();
    assert!(err.is_value_refused(), "{err}");
    assert_eq!(
        count(
            &store,
            "SELECT (SELECT count(*) FROM signal_buffer) + (SELECT count(*) FROM signal_waiters)"
        ),
        0
    );
}

#[tokio::test]
async fn a_send_skips_a_withdrawn_wait() {
    let (_dir, store) = pinned("s-withdraw");
    let (x, y) = (
        start_parked(&store, "x").await,
        start_parked(&store, "y").await,
    );
    for k in [&x, &y] {
        assert_eq!(
            store
                .signal_wait(&wait(k, "signal:tok:1", "tok"))
                .await
                .unwrap(),
            SignalWaitOutcome::Waiting
        );
    }
    assert!(store.signal_withdraw(&x, 0, "signal:tok:1").await.unwrap());
    assert!(
        !store.signal_withdraw(&x, 0, "signal:tok:1").await.unwrap(),
        "withdrawn once"
    );
    assert_eq!(
        store.signal_send("tok", &json!("paid")).await.unwrap(),
        SignalSendOutcome::Delivered { to: y.clone() }
    );
    assert!(recorded(&store, &x, "signal:tok:1").await.is_empty());
    assert_eq!(
        recorded(&store, &y, "signal:tok:1").await,
        vec![json!({"ok": "paid"})]
    );
    // A delivered wait has no waiter left to withdraw; its signal stays journaled.
    assert!(!store.signal_withdraw(&y, 0, "signal:tok:1").await.unwrap());
    assert_eq!(recorded(&store, &y, "signal:tok:1").await.len(), 1);
}

#[tokio::test]
async fn signal_return_gives_signals_back_only_with_the_decision() {
    let (_dir, store) = pinned("s-return");
    let racer = start(&store, "r-1").await;
    let waiter = start(&store, "w-1").await;
    let decision = |race: &str| Append {
        key: racer.clone(),
        generation: Some(0),
        event: Event::StepRecorded {
            step: format!("race:{race}"),
            kind: StepKind::Race,
            result: json!({ "winner": 0 }),
        },
        fence: None,
        renew: None,
    };
    let returned = |token: &str, n: u32| ReturnedSignal {
        token: token.into(),
        payload: json!(n),
    };
    let wait = |step: &str, token: &str| wait(&waiter, step, token);
    let delivered = |n: u32| SignalWaitOutcome::Delivered(json!({ "ok": n }));

    // Ahead of a signal buffered since, in the order given, on each token.
    assert_eq!(
        store.signal_send("t", &json!(10)).await.unwrap(),
        SignalSendOutcome::Buffered
    );
    assert_eq!(
        store
            .signal_return(
                &decision("a"),
                &[returned("t", 1), returned("u", 7), returned("t", 2)]
            )
            .await
            .unwrap(),
        AppendOutcome::Appended
    );
    for (step, token, n) in [
        ("signal:t:1", "t", 1),
        ("signal:t:2", "t", 2),
        ("signal:t:3", "t", 10),
        ("signal:u:1", "u", 7),
    ] {
        assert_eq!(
            store.signal_wait(&wait(step, token)).await.unwrap(),
            delivered(n),
            "{step}"
        );
    }
    // Recorded before: nothing goes back.
    assert!(matches!(
        store
            .signal_return(&decision("a"), &[returned("t", 3)])
            .await
            .unwrap(),
        AppendOutcome::AlreadyPresent(_)
    ));
    assert_eq!(
        store.signal_wait(&wait("signal:t:4", "t")).await.unwrap(),
        SignalWaitOutcome::Waiting
    );
    // A waiter takes a returned signal, as it would a sent one.
    assert_eq!(
        store
            .signal_return(&decision("b"), &[returned("t", 4)])
            .await
            .unwrap(),
        AppendOutcome::Appended
    );
    assert_eq!(
        store.signal_wait(&wait("signal:t:4", "t")).await.unwrap(),
        delivered(4)
    );
    // A bad token is refused before the decision lands.
    let refused = store
        .signal_return(&decision("c"), &[returned("", 5)])
        .await;
    assert!(
        matches!(&refused, Err(e) if e.is_value_refused()),
        "{refused:?}"
    );
    // A terminal instance takes no decision, and nothing goes back.
    store.instance_cancel(&racer, false).await.unwrap();
    assert!(matches!(
        store
            .signal_return(&decision("c"), &[returned("t", 5)])
            .await
            .unwrap(),
        AppendOutcome::RefusedTerminal(_)
    ));
    assert_eq!(
        store.signal_wait(&wait("signal:t:5", "t")).await.unwrap(),
        SignalWaitOutcome::Waiting
    );
}

#[tokio::test]
async fn concurrent_waits_and_sends_on_one_token_deliver_each_signal_exactly_once() {
    let (_dir, store) = pinned("s-race");
    let mut keys = Vec::new();
    for n in 0..16 {
        keys.push(start_parked(&store, &format!("r-{n}")).await);
    }
    let waits = keys.iter().map(|k| {
        let store = store.clone();
        let k = k.clone();
        tokio::spawn(async move { store.signal_wait(&wait(&k, "signal:go", "t")).await })
    });
    let sends = (0..16).map(|n| {
        let store = store.clone();
        tokio::spawn(async move { store.signal_send("t", &json!(n)).await })
    });
    let waits: Vec<_> = waits.collect();
    let sends: Vec<_> = sends.collect();
    for handle in waits {
        handle.await.unwrap().unwrap();
    }
    for handle in sends {
        handle.await.unwrap().unwrap();
    }
    // Every signal is journaled into one waiter or still buffered, never both, never twice.
    let mut received = Vec::new();
    for k in &keys {
        received.extend(recorded(&store, k, "signal:go").await);
    }
    let buffered = count(&store, "SELECT count(*) FROM signal_buffer");
    let waiting = count(&store, "SELECT count(*) FROM signal_waiters");
    assert_eq!(
        i64::try_from(received.len()).unwrap() + buffered,
        16,
        "every signal once"
    );
    assert_eq!(
        i64::try_from(received.len()).unwrap() + waiting,
        16,
        "every wait answered or registered"
    );
    assert!(buffered == 0 || waiting == 0, "no signal beside a waiter");
    let mut values: Vec<i64> = received.iter().map(|v| v["ok"].as_i64().unwrap()).collect();
    values.sort_unstable();
    values.dedup();
    assert_eq!(values.len(), received.len(), "no signal delivered twice");
}
