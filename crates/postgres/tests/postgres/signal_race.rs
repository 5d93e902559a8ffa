//! A wait and a send on one token race in either order and the signal is delivered exactly
//! once: journaled once into the waiter, never both buffered and delivered, never lost. The
//! same holds for sends racing the waits' timeouts.

use crate::common::{backend_pid, blocked_by, key, recorded, sql, start_parked, TestResult};
use keiro_journal::{
    store::SignalWait, store::SignalWaitOutcome, InstanceKey, JournalStore, SignalSendOutcome,
};
use keiro_postgres::PgStore;
use keiro_tests::pg::TestDb;
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
    store: &PgStore,
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
    // Nothing is left over either way; the step now answers a re-arm of the wait.
    let client = sql(store).await?;
    let left: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM signal_buffer WHERE token = $1) \
                  + (SELECT count(*) FROM signal_waiters WHERE token = $1)",
            &[&token],
        )
        .await?
        .get(0);
    assert_eq!(left, 0, "{token}");
    assert_eq!(
        store.signal_wait(&wait(k, token)).await?,
        SignalWaitOutcome::Delivered(json!({"ok": token}))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_then_send_races_deliver_exactly_once() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    for n in 0..ITERATIONS {
        let k = key("waiter", &format!("w-{n}"));
        let token = format!("token-{n}");
        start_parked(&store, &k).await?;
        let (w, payload) = (wait(&k, &token), json!(token));
        let (waited, sent) =
            tokio::join!(store.signal_wait(&w), store.signal_send(&token, &payload));
        exactly_once(&store, &k, &token, waited?, sent?).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn send_then_wait_races_deliver_exactly_once() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    for n in 0..ITERATIONS {
        let k = key("waiter", &format!("w-{n}"));
        let token = format!("token-{n}");
        start_parked(&store, &k).await?;
        let (w, payload) = (wait(&k, &token), json!(token));
        let (sent, waited) =
            tokio::join!(store.signal_send(&token, &payload), store.signal_wait(&w));
        exactly_once(&store, &k, &token, waited?, sent?).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spawned_racers_on_separate_tasks_deliver_exactly_once() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    for n in 0..ITERATIONS {
        let k = key("waiter", &format!("w-{n}"));
        let token = format!("token-{n}");
        start_parked(&store, &k).await?;
        let (waiting, sending) = (store.clone(), store.clone());
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
        exactly_once(&store, &k, &token, waited, sent).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timeouts_and_sends_racing_on_one_token_lose_nothing() -> TestResult {
    const WAITERS: usize = 30;
    let db = TestDb::new().await;
    let store = db.store();
    let due = time::OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let keys: Vec<_> = (0..WAITERS)
        .map(|n| key("waiter", &format!("w-{n}")))
        .collect();
    for k in &keys {
        start_parked(&store, k).await?;
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
    let (firing, sending) = (store.clone(), store.clone());
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
        let answers = recorded(&store, k, "signal:go").await?;
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
    let buffered: i64 = sql(&store)
        .await?
        .query_one(
            "SELECT count(*) FROM signal_buffer WHERE token = 'shared'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(usize::try_from(buffered)? + delivered, WAITERS);
    received.sort_by_key(|v| v.as_u64());
    received.dedup();
    assert_eq!(received.len(), delivered, "no signal delivered twice");
    Ok(())
}

/// A wait withdrawn (a `select` race's loser) while a send is already going through the
/// token's waiters is skipped by that send: the signal goes to the next live waiter, never
/// into the withdrawn wait, which the body no longer makes. The send is held on an earlier
/// waiter's instance row (any append in flight there) while the withdraw commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_send_skips_a_wait_withdrawn_while_it_runs() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (z, x, y) = (key("pay", "z"), key("pay", "x"), key("pay", "y"));
    for k in [&z, &x, &y] {
        start_parked(&store, k).await?;
        let waited = store
            .signal_wait(&SignalWait {
                step: "signal:tok:1".into(),
                ..wait(k, "tok")
            })
            .await?;
        assert_eq!(waited, SignalWaitOutcome::Waiting);
    }
    // The oldest waiter's run has ended: a send passes over it.
    sql(&store)
        .await?
        .execute(
            "UPDATE workflows SET status = 'completed', completed_at = now() \
             WHERE workflow_name = 'pay' AND workflow_id = 'z'",
            &[],
        )
        .await?;

    let mut holder = sql(&store).await?;
    let held = holder.transaction().await?;
    let holder_pid = backend_pid(&held).await?;
    held.execute(
        "SELECT 1 FROM workflows WHERE workflow_name = 'pay' AND workflow_id = 'z' FOR UPDATE",
        &[],
    )
    .await?;
    let send = {
        let store = store.clone();
        tokio::spawn(async move { store.signal_send("tok", &json!("paid")).await })
    };
    // The send has read the waiters and waits for z's row.
    blocked_by(&store, holder_pid, "the send never reached z").await?;
    assert!(store.signal_withdraw(&x, 0, "signal:tok:1").await?);
    held.commit().await?;

    let sent = send.await??;
    assert_eq!(sent, SignalSendOutcome::Delivered { to: y.clone() });
    assert!(recorded(&store, &x, "signal:tok:1").await?.is_empty());
    assert_eq!(
        recorded(&store, &y, "signal:tok:1").await?,
        vec![json!({"ok": "paid"})]
    );
    Ok(())
}
