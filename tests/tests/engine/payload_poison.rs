//! A run whose payload a worker cannot open (sealed with a key it does not hold) is not claimed
//! again at every poll: each refused claim is recorded as the run's last error, naming the key,
//! and pushes the next claim back on a growing backoff. The refusals are not crashes: they
//! spend none of the run's crash budget. A worker that holds the key then runs it to its end,
//! replaying what was recorded. Both stores.

use std::sync::Arc;
use std::time::Duration;

use keiro::codec::{AesGcmCodec, Codec};
use keiro::{Ctx, Keiro, Status, WorkflowError};
use keiro_tests::{on_both_stores, spawn_worker, FastWorker, Harness, Ledger, TestResult};

on_both_stores!(
    a_run_a_worker_cannot_open_backs_off_and_runs_where_the_key_is,
    refusals_do_not_spend_the_crash_budget
);

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
    assert_eq!(
        (refused.open_refusals, refused.attempts),
        (i32::try_from(claims)?, before.attempts),
        "each claim counted as a refusal, none as a crash"
    );
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
    assert_eq!(done.open_refusals, 0, "and its count");
    Ok(())
}

/// How many times the keyless worker must refuse the run in
/// [`refusals_do_not_spend_the_crash_budget`]: more than the keyed worker's `max_attempts`.
const REFUSALS: i64 = 3;

/// The keyed worker's crash ceiling in [`refusals_do_not_spend_the_crash_budget`].
const MAX_ATTEMPTS: i32 = 2;

/// Registers `flaky`: one step whose first execution crashes the run (a plain step's error),
/// and whose second returns.
fn flaky(worker: keiro::WorkerBuilder, ledger: &Ledger) -> keiro::WorkerBuilder {
    let ledger = ledger.clone();
    worker.register("flaky", move |ctx: Ctx, input: String| {
        let ledger = ledger.clone();
        async move {
            let out: String = ctx
                .step("once", || async move {
                    ledger.bump("once");
                    if ledger.count("once") == 1 {
                        Err(std::io::Error::other("the first execution crashes"))
                    } else {
                        Ok("once".to_owned())
                    }
                })
                .await?;
            Ok::<_, WorkflowError>(format!("{input}|{out}"))
        }
    })
}

async fn refusals_do_not_spend_the_crash_budget(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let keyed = sealed(&h, codec("k2", 2));
    let key = ("flaky", "f-1");
    keyed.start("flaky", "f-1", &"input".to_owned()).await?;
    let before = h.keiro.instance(key).await?.expect("started");

    // A worker without the key refuses the run more times than the keyed worker's ceiling.
    let keyless = sealed(&h, codec("k1", 1));
    let worker = spawn_worker(flaky(keyless.worker().fast(), &ledger).build()?);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let row = h.keiro.instance(key).await?.expect("started");
        if row.lease_epoch - before.lease_epoch >= REFUSALS && row.lease_owner.is_none() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the keyless worker claimed the run {} times",
            row.lease_epoch - before.lease_epoch
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    worker.stop().await?;
    let refused = h.keiro.instance(key).await?.expect("started");
    assert_eq!(refused.status, Status::Running);
    assert_eq!(
        (refused.attempts, i64::from(refused.open_refusals)),
        (0, refused.lease_epoch - before.lease_epoch),
        "a refusal is not a crash"
    );
    assert_eq!(ledger.count("once"), 0);

    // A worker that holds the key, whose step crashes once, completes the run: its crash
    // budget is whole.
    let tuning = keiro::worker::Tuning {
        max_attempts: MAX_ATTEMPTS,
        ..h.fast_tuning()
    };
    let worker = spawn_worker(flaky(keyed.worker().fast().tuning(tuning), &ledger).build()?);
    let output = keyed.result::<String>(key, TIMEOUT).await;
    worker.stop().await?;
    let done = h.keiro.instance(key).await?.expect("started");
    assert_eq!(
        (done.status, output?.as_str()),
        (Status::Completed, "input|once"),
        "{done:?}"
    );
    assert_eq!(ledger.count("once"), 2, "{:?}", ledger.all());
    assert_eq!(
        (done.attempts, done.open_refusals, done.last_error),
        (0, 0, None)
    );
    Ok(())
}
