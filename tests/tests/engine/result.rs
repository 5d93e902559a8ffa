//! Awaiting a result (issue 13, item 2): `Keiro::result` resolves when the instance is
//! terminal, with the output or a typed error, woken by the store's push with a poll fallback;
//! many waiters share the store's one listener and none reads faster than its fallback. Both
//! stores.

use std::sync::Arc;
use std::time::Duration;

use keiro::{worker::Notifier, Ctx, Keiro, ResultError, ResultOptions, WorkflowError};
use keiro_tests::counting::CountingStore;
use keiro_tests::{FastWorker, Harness, TestResult};

/// A scenario's store with its push notifier, which the harness's facade does not use.
struct Pushed {
    h: Harness,
    notifier: Arc<dyn Notifier>,
}

impl Pushed {
    fn sqlite() -> Self {
        let h = Harness::sqlite();
        let store = h.sqlite.clone().expect("a sqlite harness has its store");
        Self {
            h,
            notifier: Arc::new(store),
        }
    }

    async fn postgres() -> Self {
        let h = Harness::postgres().await;
        let store =
            h.db.as_ref()
                .expect("a postgres harness has a schema")
                .store();
        Self {
            h,
            notifier: Arc::new(store),
        }
    }

    /// A facade with push over `store` (the harness's store, or a wrapper of it).
    fn keiro(&self, store: Arc<dyn keiro::store::LeaseStore>) -> Keiro {
        keiro::KeiroBuilder::lease_only(store)
            .push(self.notifier.clone())
            .build()
    }
}

macro_rules! on_both_pushing_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> keiro_tests::TestResult {
                    super::$name(super::Pushed::sqlite()).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> keiro_tests::TestResult {
                    super::$name(super::Pushed::postgres().await).await
                }
            )*
        }
    };
}

on_both_pushing_stores!(
    a_waiter_is_woken_by_push_when_the_run_completes,
    failed_and_cancelled_runs_give_typed_errors,
    unknown_instances_timeouts_and_wrong_types_give_typed_errors,
    without_push_a_waiter_polls_at_its_fallback,
    two_hundred_waiters_share_one_listener_and_none_polls_faster_than_its_fallback,
);

/// Waits for `go`, then answers with it doubled; fails on a negative one.
async fn doubler(ctx: Ctx, (): ()) -> Result<i64, WorkflowError> {
    let go: i64 = ctx.await_step("go").await?;
    if go < 0 {
        return Err(WorkflowError::app("negative"));
    }
    Ok(go * 2)
}

/// A fallback no test waits out: only a push can resolve a waiter with it in time.
const NEVER: Duration = Duration::from_secs(3600);

fn push_only(timeout: Duration) -> ResultOptions {
    ResultOptions {
        timeout: Some(timeout),
        poll_interval: NEVER,
    }
}

async fn a_waiter_is_woken_by_push_when_the_run_completes(p: Pushed) -> TestResult {
    let keiro = p.keiro(p.h.store.clone());
    let worker = keiro.worker().fast().register("doubler", doubler).build()?;
    keiro.start("doubler", "d-1", &()).await?;
    worker.drain().await?; // parked on `go`

    let waiter = tokio::spawn({
        let keiro = keiro.clone();
        async move {
            keiro
                .result_with::<i64>(("doubler", "d-1"), &push_only(Duration::from_secs(20)))
                .await
        }
    });
    // The waiter has read the parked row and waits on push alone.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    keiro.deliver(("doubler", "d-1"), "go", &21).await?;
    worker.drain().await?;
    let output = tokio::time::timeout(Duration::from_secs(10), waiter).await???;
    assert_eq!(output, 42);

    // A waiter on a run that is already terminal answers from its first read.
    let again: i64 = keiro.result(("doubler", "d-1"), Duration::ZERO).await?;
    assert_eq!(again, 42);
    Ok(())
}

async fn failed_and_cancelled_runs_give_typed_errors(p: Pushed) -> TestResult {
    let keiro = p.keiro(p.h.store.clone());
    let worker = keiro.worker().fast().register("doubler", doubler).build()?;
    keiro.start("doubler", "fails", &()).await?;
    keiro.start("doubler", "cancelled", &()).await?;
    worker.drain().await?;

    let failing = tokio::spawn({
        let keiro = keiro.clone();
        async move {
            keiro
                .result_with::<i64>(("doubler", "fails"), &push_only(Duration::from_secs(20)))
                .await
        }
    });
    let cancelled = tokio::spawn({
        let keiro = keiro.clone();
        async move {
            keiro
                .result_with::<i64>(
                    ("doubler", "cancelled"),
                    &push_only(Duration::from_secs(20)),
                )
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    keiro.deliver(("doubler", "fails"), "go", &-1).await?;
    keiro.cancel(("doubler", "cancelled")).await?; // parked: closed by the cancel itself
    worker.drain().await?;

    let failed = tokio::time::timeout(Duration::from_secs(10), failing).await??;
    match failed {
        Err(ResultError::Failed { key, reason }) => {
            assert_eq!(key.to_string(), "doubler/fails");
            assert!(reason.contains("negative"), "{reason}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    let cancelled = tokio::time::timeout(Duration::from_secs(10), cancelled).await??;
    assert!(
        matches!(&cancelled, Err(ResultError::Cancelled { key }) if key.to_string() == "doubler/cancelled"),
        "{cancelled:?}"
    );
    assert!(cancelled.unwrap_err().is_final());
    Ok(())
}

async fn unknown_instances_timeouts_and_wrong_types_give_typed_errors(p: Pushed) -> TestResult {
    let keiro = p.keiro(p.h.store.clone());
    let unknown = keiro
        .result::<i64>(("doubler", "nobody"), Duration::from_secs(5))
        .await;
    assert!(
        matches!(unknown, Err(ResultError::NotFound { .. })),
        "{unknown:?}"
    );
    let invalid = keiro
        .result::<i64>(("doubler", "no/slash"), Duration::from_secs(5))
        .await;
    assert!(
        matches!(invalid, Err(ResultError::InvalidId(_))),
        "{invalid:?}"
    );

    let worker = keiro.worker().fast().register("doubler", doubler).build()?;
    keiro.start("doubler", "slow", &()).await?;
    worker.drain().await?;
    let timed_out = keiro
        .result::<i64>(("doubler", "slow"), Duration::from_millis(300))
        .await;
    assert!(
        matches!(timed_out, Err(ResultError::Timeout { waited, .. }) if waited == Duration::from_millis(300)),
        "{timed_out:?}"
    );

    keiro.deliver(("doubler", "slow"), "go", &4).await?;
    worker.drain().await?;
    let wrong = keiro
        .result::<String>(("doubler", "slow"), Duration::from_secs(5))
        .await;
    assert!(
        matches!(wrong, Err(ResultError::Decode { .. })),
        "{wrong:?}"
    );
    Ok(())
}

async fn without_push_a_waiter_polls_at_its_fallback(p: Pushed) -> TestResult {
    // The harness's facade has no notifier: only the fallback poll can see the close.
    let counting = CountingStore::new(p.h.store.clone());
    let keiro = keiro::KeiroBuilder::lease_only(Arc::new(counting.clone()))
        .without_push()
        .build();
    let worker =
        p.h.keiro
            .worker()
            .fast()
            .register("doubler", doubler)
            .build()?;
    p.h.keiro.start("doubler", "polled", &()).await?;
    worker.drain().await?;
    let poll = Duration::from_millis(200);
    let waiter = tokio::spawn({
        let keiro = keiro.clone();
        async move {
            let options = ResultOptions {
                timeout: Some(Duration::from_secs(20)),
                poll_interval: poll,
            };
            keiro
                .result_with::<i64>(("doubler", "polled"), &options)
                .await
        }
    });
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(700)).await;
    p.h.keiro.deliver(("doubler", "polled"), "go", &1).await?;
    worker.drain().await?;
    assert_eq!(waiter.await??, 2);
    let elapsed = started.elapsed();
    let reads = counting.calls("instance_get");
    // One read up front, then at most one per fallback interval.
    let bound = 1 + u64::try_from(elapsed.as_millis() / poll.as_millis())?;
    assert!((2..=bound).contains(&reads), "{reads} reads in {elapsed:?}");
    Ok(())
}

const WAITERS: usize = 200;

async fn two_hundred_waiters_share_one_listener_and_none_polls_faster_than_its_fallback(
    p: Pushed,
) -> TestResult {
    let counting = CountingStore::new(p.h.store.clone());
    let waiting = p.keiro(Arc::new(counting.clone()));
    let keiro = p.keiro(p.h.store.clone());
    let worker = keiro
        .worker()
        .fast()
        .concurrency(8)
        .register("doubler", doubler)
        .build()?;
    for n in 0..WAITERS {
        keiro.start("doubler", &format!("d-{n}"), &()).await?;
    }
    worker.drain().await?;

    let mut waiters = tokio::task::JoinSet::new();
    for n in 0..WAITERS {
        let waiting = waiting.clone();
        waiters.spawn(async move {
            let id = format!("d-{n}");
            let options = push_only(Duration::from_secs(60));
            let output = waiting.result_with::<i64>(("doubler", &id), &options).await;
            (n, output)
        });
    }
    // Every waiter has made its first read and waits on push alone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while counting.calls("instance_get") < u64::try_from(WAITERS)? {
        assert!(tokio::time::Instant::now() < deadline, "waiters never read");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    if let Some(db) = &p.h.db {
        // One listener serves them all (and the worker's loops, had they run).
        let listeners = listening_connections(db).await?;
        assert_eq!(listeners, 1, "listening connections of {}", db.schema());
    }

    for n in 0..WAITERS {
        keiro
            .deliver(("doubler", &format!("d-{n}")), "go", &i64::try_from(n)?)
            .await?;
    }
    worker.drain().await?;
    let mut resolved = 0;
    let all = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(joined) = waiters.join_next().await {
            let (n, output) = joined?;
            assert_eq!(output?, i64::try_from(n)? * 2);
            resolved += 1;
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .await;
    all??;
    assert_eq!(resolved, WAITERS);

    // With a fallback of an hour, every read came from a push: the first read, one per close,
    // and at most one per listener (re)connection (the first included, as notifications sent
    // before it were missed). Waking on other instances' closes would read 200 times more.
    let reads = counting.calls("instance_get");
    assert!(
        reads <= u64::try_from(3 * WAITERS)?,
        "{reads} reads by {WAITERS} waiters"
    );
    Ok(())
}

/// Drives the 200 runs a few at a time.
/// The connections listening on the schema's wake channel: their last statement is the
/// `LISTEN` (health checks come every 30 s, after this scenario is over).
async fn listening_connections(
    db: &keiro_tests::pg::TestDb,
) -> Result<i64, Box<dyn std::error::Error + Send + Sync>> {
    let store = db.store();
    let statement = format!("LISTEN \"{}\"", store.wake_channel());
    let client = store.pool().get().await?;
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE query = $1",
            &[&statement],
        )
        .await?;
    Ok(row.get(0))
}
