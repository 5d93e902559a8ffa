//! Signal rows only SQL can make or show: a signal left in the buffer beside a registered
//! waiter (what a send whose snapshot predated the waiter leaves on PostgreSQL), and a buffered
//! signal's expiry on the store's clock with the sweeps that delete expired ones. The signal
//! rules every store keeps are the contract suite's (`keiro_tests::contract::signal`).

use std::time::Duration;

use crate::common::{pinned, start, T0};
use keiro_journal::store::Park;
use keiro_journal::{
    store::SignalWait, store::SignalWaitOutcome, Event, InstanceKey, SignalSendOutcome,
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
    let expires = T0.unix_timestamp() * 1_000_000 + 3_600_000_000;
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
