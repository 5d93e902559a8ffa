//! A send that meets a wait withdrawn while it runs, the withdraw landing while the send is
//! held on an earlier waiter's row by a test transaction. The races every store wins (a wait
//! and a send in either order, sends against timeouts) are the contract suite's
//! (`keiro_tests::contract::signal::race`).

use crate::common::{backend_pid, blocked_by, key, recorded, sql, start_parked, TestResult};
use keiro_journal::{
    store::SignalWait, store::SignalWaitOutcome, InstanceKey, JournalStore, SignalSendOutcome,
};
use keiro_tests::pg::TestDb;
use serde_json::json;

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
