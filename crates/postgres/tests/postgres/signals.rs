//! A signal left in the buffer beside a registered waiter, a state only a send whose snapshot
//! predated the waiter leaves behind, written here with SQL. The signal rules every store
//! keeps are the contract suite's (`keiro_tests::contract::signal`).

use crate::common::{key, recorded, sql, start_parked, TestResult};
use keiro_journal::{
    store::SignalWait, store::SignalWaitOutcome, InstanceKey, JournalStore, SignalSendOutcome,
};
use keiro_tests::pg::TestDb;
use serde_json::json;

fn wait(k: &InstanceKey, step: &str, token: &str) -> SignalWait {
    SignalWait {
        key: k.clone(),
        generation: 0,
        step: step.into(),
        token: token.into(),
        fence: None,
    }
}

/// A registered wait that meets a signal buffered beside it (what a send whose snapshot
/// predated the waiter left behind) takes it when the run is re-driven, instead of answering
/// `waiting` from its own waiter row and never looking at the buffer.
#[tokio::test]
async fn a_registered_wait_takes_a_signal_buffered_beside_it() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("waiter", "w-1");
    start_parked(&store, &k).await?;
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:go", "t")).await?,
        SignalWaitOutcome::Waiting
    );
    sql(&store)
        .await?
        .execute(
            "INSERT INTO signal_buffer (token, payload, expires_at) \
             VALUES ('t', '1', now() + interval '1 hour')",
            &[],
        )
        .await?;
    assert_eq!(
        store.signal_wait(&wait(&k, "signal:go", "t")).await?,
        SignalWaitOutcome::Delivered(json!({"ok": 1})),
        "the re-driven wait must consult the buffer"
    );
    let left: i64 = sql(&store)
        .await?
        .query_one(
            "SELECT (SELECT count(*) FROM signal_buffer) + (SELECT count(*) FROM signal_waiters)",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(left, 0, "the signal and the waiter are both gone");
    assert_eq!(
        recorded(&store, &k, "signal:go").await?,
        vec![json!({"ok": 1})]
    );
    // With no waiter left, the next signal waits in the buffer for the next wait.
    assert_eq!(
        store.signal_send("t", &json!(2)).await?,
        SignalSendOutcome::Buffered
    );
    Ok(())
}
