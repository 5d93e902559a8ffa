//! A wait and a send on one token race in either order and the signal is delivered exactly
//! once: journaled once into the waiter, never both buffered and delivered, never lost. The
//! same holds for sends racing the waits' timeouts.

use crate::contract::support::{key, recorded, start_parked, TestResult};
use crate::Harness;
use keiro_journal::{store::SignalWait, store::SignalWaitOutcome, InstanceKey, SignalSendOutcome};
use keiro_lease::LeaseStore;
use serde_json::json;

const ITERATIONS: usize = 100;

/// A wait on `token` under the step `signal:go`.
fn wait(k: &InstanceKey, token: &str) -> SignalWait {
    SignalWait {
        key: k.clone(),
        generation: 0,
        step: "signal:go".into(),
        token: token.into(),
        fence: None,
    }
}

/// Checks one race's outcomes and what it left behind.
async fn exactly_once(
    store: &dyn LeaseStore,
    k: &InstanceKey,
    token: &str,
    waited: SignalWaitOutcome,
    sent: SignalSendOutcome,
) -> TestResult {
    let envelope = json!({"ok": token});
    match (&waited, &sent) {
        // The send came first: buffered, then consumed by the wait.
        (SignalWaitOutcome::Delivered(value), SignalSendOutcome::Buffered) => {
            assert_eq!(value, &envelope);
        }
        // The wait came first: registered, then the send delivered to it.
        (SignalWaitOutcome::Waiting, SignalSendOutcome::Delivered { to }) => {
            assert_eq!(to, k);
        }
        other => panic!("{token}: not exactly once: {other:?}"),
    }
    assert_eq!(
        recorded(store, k, "signal:go").await?,
        vec![envelope],
        "{token}"
    );
    // Nothing is left over either way: a later wait finds no signal buffered, and the next
    // send reaches that wait, not a waiter the race left behind.
    let probe = key("probe", token);
    start_parked(store, &probe).await?;
    assert_eq!(
        store.signal_wait(&wait(&probe, token)).await?,
        SignalWaitOutcome::Waiting,
        "{token}: a signal was left in the buffer"
    );
    assert_eq!(
        store.signal_send(token, &json!("probe")).await?,
        SignalSendOutcome::Delivered { to: probe },
        "{token}: a waiter was left behind"
    );
    // The step now answers a re-arm of the wait.
    assert_eq!(
        store.signal_wait(&wait(k, token)).await?,
        SignalWaitOutcome::Delivered(json!({"ok": token}))
    );
    Ok(())
}

pub async fn wait_then_send_races_deliver_exactly_once(h: Harness) -> TestResult {
    let store = &*h.store;
    for n in 0..ITERATIONS {
        let k = key("waiter", &format!("w-{n}"));
        let token = format!("token-{n}");
        start_parked(store, &k).await?;
        let (w, payload) = (wait(&k, &token), json!(token));
        let (waited, sent) =
            tokio::join!(store.signal_wait(&w), store.signal_send(&token, &payload));
        exactly_once(store, &k, &token, waited?, sent?).await?;
    }
    Ok(())
}

pub async fn send_then_wait_races_deliver_exactly_once(h: Harness) -> TestResult {
    let store = &*h.store;
    for n in 0..ITERATIONS {
        let k = key("waiter", &format!("w-{n}"));
        let token = format!("token-{n}");
        start_parked(store, &k).await?;
        let (w, payload) = (wait(&k, &token), json!(token));
        let (sent, waited) =
            tokio::join!(store.signal_send(&token, &payload), store.signal_wait(&w));
        exactly_once(store, &k, &token, waited?, sent?).await?;
    }
    Ok(())
}

pub async fn spawned_racers_on_separate_tasks_deliver_exactly_once(h: Harness) -> TestResult {
    let store = &*h.store;
    for n in 0..ITERATIONS {
        let k = key("waiter", &format!("w-{n}"));
        let token = format!("token-{n}");
        start_parked(store, &k).await?;
        let (waiting, sending) = (h.store.clone(), h.store.clone());
        let (w, t) = (wait(&k, &token), token.clone());
        // Alternate which one is spawned first.
        let (waited, sent) = if n % 2 == 0 {
            let waited = tokio::spawn(async move { waiting.signal_wait(&w).await });
            let sent = tokio::spawn(async move { sending.signal_send(&t, &json!(t)).await });
            (waited.await??, sent.await??)
        } else {
            let sent = tokio::spawn(async move { sending.signal_send(&t, &json!(t)).await });
            let waited = tokio::spawn(async move { waiting.signal_wait(&w).await });
            (waited.await??, sent.await??)
        };
        exactly_once(store, &k, &token, waited, sent).await?;
    }
    Ok(())
}

pub async fn timeouts_and_sends_racing_on_one_token_lose_nothing(h: Harness) -> TestResult {
    const WAITERS: usize = 30;
    let store = &*h.store;
    let due = time::OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let keys: Vec<_> = (0..WAITERS)
        .map(|n| key("waiter", &format!("w-{n}")))
        .collect();
    for k in &keys {
        start_parked(store, k).await?;
        assert_eq!(
            store.signal_wait(&wait(k, "shared")).await?,
            SignalWaitOutcome::Waiting
        );
        store
            .timer_arm(&keiro_journal::store::TimerArm {
                key: k.clone(),
                generation: 0,
                step: "signal:go".into(),
                due: keiro_journal::store::TimerDue::At(due),
                kind: keiro_journal::TimerKind::SignalTimeout {
                    token: "shared".into(),
                },
            })
            .await?;
    }
    let (firing, sending) = (h.store.clone(), h.store.clone());
    let timers = tokio::spawn(async move {
        let mut fired = 0;
        loop {
            let batch = firing.timers_fire_due(None, 4).await?;
            if batch.fired.is_empty() {
                return Ok::<_, keiro_journal::StoreError>(fired);
            }
            fired += batch.fired.len();
        }
    });
    let signals = tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for n in 0..WAITERS {
            outcomes.push(sending.signal_send("shared", &json!(n)).await?);
        }
        Ok::<_, keiro_journal::StoreError>(outcomes)
    });
    assert_eq!(timers.await??, WAITERS);
    let sent = signals.await??;

    // Every waiter got exactly one answer, and every signal went to one waiter or the buffer.
    let mut received = Vec::new();
    let mut timed_out = 0;
    for k in &keys {
        let answers = recorded(store, k, "signal:go").await?;
        assert_eq!(answers.len(), 1, "{k}: {answers:?}");
        match answers[0].get("ok") {
            Some(value) => received.push(value.clone()),
            None => {
                assert_eq!(answers[0], json!({"timeout": true}));
                timed_out += 1;
            }
        }
    }
    let delivered = sent
        .iter()
        .filter(|o| matches!(o, SignalSendOutcome::Delivered { .. }))
        .count();
    assert_eq!(delivered, received.len());
    assert_eq!(delivered + timed_out, WAITERS);
    // What no waiter took is buffered: later waits take it, one signal each, until none is
    // left.
    let mut buffered = 0usize;
    loop {
        let probe = key("probe", &format!("p-{buffered}"));
        start_parked(store, &probe).await?;
        match store.signal_wait(&wait(&probe, "shared")).await? {
            SignalWaitOutcome::Delivered(_) => buffered += 1,
            SignalWaitOutcome::Waiting => break,
        }
    }
    assert_eq!(buffered + delivered, WAITERS);
    received.sort_by_key(|v| v.as_u64());
    received.dedup();
    assert_eq!(received.len(), delivered, "no signal delivered twice");
    Ok(())
}

pub async fn many_waits_and_sends_on_one_token_deliver_each_signal_once(h: Harness) -> TestResult {
    const RACERS: usize = 16;
    let store = &*h.store;
    let mut keys = Vec::new();
    for n in 0..RACERS {
        let k = key("waiter", &format!("r-{n}"));
        start_parked(store, &k).await?;
        keys.push(k);
    }
    let waits: Vec<_> = keys
        .iter()
        .map(|k| {
            let (store, w) = (h.store.clone(), wait(k, "shared"));
            tokio::spawn(async move { store.signal_wait(&w).await })
        })
        .collect();
    let sends: Vec<_> = (0..RACERS)
        .map(|n| {
            let store = h.store.clone();
            tokio::spawn(async move { store.signal_send("shared", &json!(n)).await })
        })
        .collect();
    for handle in waits {
        handle.await??;
    }
    for handle in sends {
        handle.await??;
    }
    // Every signal is journaled into one waiter or still buffered, never both, never twice.
    let mut received = Vec::new();
    let mut waiting = 0;
    for k in &keys {
        let answers = recorded(store, k, "signal:go").await?;
        assert!(answers.len() <= 1, "{k}: {answers:?}");
        match answers.first() {
            Some(answer) => received.push(answer["ok"].as_u64().ok_or("a payload")?),
            None => waiting += 1,
        }
    }
    // What is buffered, later waits take, one signal each, until none is left.
    let mut buffered = 0;
    loop {
        let probe = key("probe", &format!("p-{buffered}"));
        start_parked(store, &probe).await?;
        match store.signal_wait(&wait(&probe, "shared")).await? {
            SignalWaitOutcome::Delivered(_) => buffered += 1,
            SignalWaitOutcome::Waiting => break,
        }
    }
    assert_eq!(received.len() + buffered, RACERS, "every signal once");
    assert_eq!(
        received.len() + waiting,
        RACERS,
        "every wait answered or registered"
    );
    assert!(
        buffered == 0 || waiting == 0,
        "no signal buffered beside a waiter"
    );
    received.sort_unstable();
    received.dedup();
    assert_eq!(
        received.len() + waiting,
        RACERS,
        "no signal delivered twice"
    );
    Ok(())
}
