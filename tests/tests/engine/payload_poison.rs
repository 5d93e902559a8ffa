//! A run whose payload a worker cannot open (sealed with a key it does not hold) is not claimed
//! again at every poll: each refused claim is recorded as the run's last error, naming the key,
//! and pushes the next claim back on a growing backoff. A worker that holds the key then runs
//! it to its end, replaying what was recorded. Both stores.

use std::sync::Arc;
use std::time::Duration;

use keiro::codec::{AesGcmCodec, Codec};
use keiro::{Ctx, Keiro, Status, WorkflowError};
use keiro_tests::{on_both_stores, spawn_worker, FastWorker, Harness, Ledger, TestResult};

on_both_stores!(a_run_a_worker_cannot_open_backs_off_and_runs_where_the_key_is);

const TIMEOUT: Duration = Duration::from_secs(30);

/// How long the keyless worker polls: with the 20 ms poll of a fast worker, some seventy polls.
const KEYLESS_FOR: Duration = Duration::from_millis(1500);

/// The most claims the keyless worker may make in [`KEYLESS_FOR`]: one at once, one after the
/// first backoff (half a second to a second, jittered) and one after the second (one to two
/// seconds). Without a backoff it would be one at every poll.
const KEYLESS_CLAIMS_MAX: i64 = 3;

fn codec(kid: &str, key: u8) -> Arc<dyn Codec> {
    Arc::new(AesGcmCodec::new(kid, [key; 32]).expect("a valid key id"))
}

/// A handle over the harness's store (its schema or file) that seals with `codec`.
fn sealed(h: &Harness, codec: Arc<dyn Codec>) -> Keiro {
    match (&h.db, &h.sqlite) {
        (Some(db), _) => Keiro::builder(db.store())
            .codec(codec)
            .without_push()
            .build(),
        (None, Some(store)) => Keiro::builder(store.clone())
            .codec(codec)
            .without_push()
            .build(),
        (None, None) => unreachable!("a harness has a schema or a file"),
    }
}

/// Registers `guarded`: a step, a delivery awaited, a second step; each step's executions
/// counted in `ledger`.
fn guarded(worker: keiro::WorkerBuilder, ledger: &Ledger) -> keiro::WorkerBuilder {
    let ledger = ledger.clone();
    worker.register("guarded", move |ctx: Ctx, input: String| {
        let ledger = ledger.clone();
        async move {
            let l = ledger.clone();
            let first: String = ctx
                .step("first", || async move {
                    l.bump("first");
                    Ok::<_, std::io::Error>("first".to_owned())
                })
                .await?;
            let delivered: String = ctx.await_step("d").await?;
            let l = ledger.clone();
            let second: String = ctx
                .step("second", || async move {
                    l.bump("second");
                    Ok::<_, std::io::Error>("second".to_owned())
                })
                .await?;
            Ok::<_, WorkflowError>([input, first, delivered, second].join("|"))
        }
    })
}

async fn a_run_a_worker_cannot_open_backs_off_and_runs_where_the_key_is(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let keyed = sealed(&h, codec("k2", 2));
    let key = ("guarded", "g-1");
    keyed.start("guarded", "g-1", &"input".to_owned()).await?;
    // The keyed worker runs the first step and parks on the delivery; the delivery (sealed
    // with k2 too) makes the run runnable again.
    guarded(keyed.worker().fast(), &ledger)
        .build()?
        .drain()
        .await?;
    assert_eq!(ledger.count("first"), 1);
    keyed.deliver(key, "d", &"delivered".to_owned()).await?;
    let before = h.keiro.instance(key).await?.expect("started");
    assert_eq!(before.status, Status::Running, "the delivery woke the run");

    // A worker that holds another key polls for a while: it claims the run a bounded number
    // of times, not at every poll, and never runs a step.
    let keyless = sealed(&h, codec("k1", 1));
    let worker = spawn_worker(guarded(keyless.worker().fast(), &ledger).build()?);
    tokio::time::sleep(KEYLESS_FOR).await;
    worker.stop().await?;
    let refused = h.keiro.instance(key).await?.expect("started");
    let claims = refused.lease_epoch - before.lease_epoch;
    assert!(
        (1..=KEYLESS_CLAIMS_MAX).contains(&claims),
        "the keyless worker claimed the run {claims} times in {KEYLESS_FOR:?}"
    );
    assert_eq!(refused.status, Status::Running);
    assert_eq!(refused.lease_owner, None, "a refused claim is released");
    assert_eq!(ledger.count("first"), 1);
    assert_eq!(ledger.count("second"), 0);
    // Why the run does not progress is on the row, as `keiro show` prints it, and in the list.
    let error = refused.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("\"k2\""),
        "the last error names the key: {error:?}"
    );
    let next = refused.next_attempt_at.expect("a backoff gate");
    assert!(
        next > refused.updated_at,
        "the next claim waits: {next} <= {}",
        refused.updated_at
    );
    let page = h
        .keiro
        .list(&keiro::operate::ListRequest::from_pairs([(
            "name", "guarded",
        )])?)
        .await?;
    let listed = page.instances.first().expect("listed");
    assert_eq!(listed.last_error.as_deref(), Some(error.as_str()));

    // A worker that holds the key runs it to its end once the backoff has passed: nothing was
    // lost, and the first step is replayed, not run again.
    let worker = spawn_worker(guarded(keyed.worker().fast(), &ledger).build()?);
    let output: String = keyed.result(key, TIMEOUT).await?;
    worker.stop().await?;
    assert_eq!(output, "input|first|delivered|second");
    assert_eq!(ledger.count("first"), 1, "{:?}", ledger.all());
    assert_eq!(ledger.count("second"), 1, "{:?}", ledger.all());
    let done = h.keiro.instance(key).await?.expect("started");
    assert_eq!(done.status, Status::Completed);
    assert_eq!(done.last_error, None, "a completion clears the refusal");
    Ok(())
}
