//! Durable timers keep the database's time: a worker whose clock is skewed against the store's
//! neither fires a sleep early nor late, nor polls the store in a loop while it waits; and an
//! idle timer worker does not spin while another worker holds due timers in an open batch.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keiro::{store::LeaseStore, worker::Registry, Ctx, Status};
use keiro_resume::{FixedPoll, TimerOptions};
use keiro_sqlite::SqliteStore;
use keiro_tests::counting::CountingStore;
use keiro_tests::pg::TestDb;
use keiro_tests::{key, TestResult};

/// The sleep the scenarios time.
const NAP: Duration = Duration::from_millis(1_500);
/// How late a fire may be: the loop's minimum wait, a round trip, a loaded machine.
const LATE_BY_AT_MOST: Duration = Duration::from_millis(600);
/// How early a fire may look from the test's side: the instants are taken around store
/// calls, so a fire can be measured a few milliseconds before the nap's full length.
const EARLY_BY_AT_MOST: Duration = Duration::from_millis(50);
/// Store calls the timer loop may make while it waits for one sleep: one batch at the start,
/// one at the due time, a few when a wait ends a little before it (a fire read of the clock
/// is older than the wait it computes), none in a loop.
const CALLS_AT_MOST: u64 = 8;

fn napper() -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("napper", |ctx: Ctx, (): ()| async move {
        ctx.sleep("nap", NAP).await?;
        ctx.step("woke", || async { Ok::<_, Infallible>(()) })
            .await?;
        Ok(())
    })?;
    Ok(registry)
}

/// Parks a `napper` on its sleep through `worker` (whose clock may be skewed against the
/// store's), runs a timer loop through `worker`, and checks when the sleep fired and how often
/// the loop asked the store meanwhile. `direct` is the same store without the wrapper.
async fn a_sleep_fires_on_the_stores_time(
    direct: Arc<dyn LeaseStore>,
    worker: CountingStore,
) -> TestResult {
    let store: Arc<dyn LeaseStore> = Arc::new(worker.clone());
    let k = key("napper", "n-1");
    keiro_journal::start(
        direct.as_ref(),
        &k,
        &(),
        keiro_journal::PAYLOAD_LEN_MAX_DEFAULT,
    )
    .await?;
    let registry = napper()?;
    let options = keiro::worker::ResumeOptions {
        poll_interval: Duration::from_millis(20),
        ..keiro::worker::ResumeOptions::default()
    };
    let armed = Instant::now();
    keiro::worker::resume_once(&store, &registry, &options).await?;
    let parked = direct.instance_get(&k).await?.expect("row");
    assert_eq!(parked.status, Status::Suspended);

    worker.reset();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let timers = tokio::spawn(keiro_resume::run_timer_loop(
        store.clone(),
        TimerOptions {
            idle_fallback: Duration::from_secs(30),
            ..TimerOptions::default()
        },
        FixedPoll,
        async {
            let _ = stopped.await;
        },
    ));
    let fired = loop {
        let row = direct.instance_get(&k).await?.expect("row");
        if row.status != Status::Suspended {
            break armed.elapsed();
        }
        if armed.elapsed() > NAP * 4 {
            let _ = stop.send(());
            timers.await?;
            return Err(format!("the sleep did not fire ({:?})", worker.all()).into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let _ = stop.send(());
    let summary = timers.await?;
    eprintln!("fired after {fired:?}; calls {:?}", worker.all());
    assert_eq!(summary.delivered, 1);
    assert!(
        fired + EARLY_BY_AT_MOST >= NAP,
        "fired early: {fired:?} < {NAP:?}"
    );
    assert!(
        fired <= NAP + LATE_BY_AT_MOST,
        "fired late: {fired:?} > {NAP:?} + {LATE_BY_AT_MOST:?}"
    );
    assert!(
        worker.calls("timers_fire_due") <= CALLS_AT_MOST,
        "the timer loop polled in a loop: {:?}",
        worker.all()
    );
    Ok(())
}

/// The worker's clock a minute behind the store's: `sleep` must not come due at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_worker_behind_the_store_sleeps_the_full_span() -> TestResult {
    let store = SqliteStore::temporary()?;
    store.set_clock_offset(time::Duration::minutes(1));
    let direct: Arc<dyn LeaseStore> = Arc::new(store);
    a_sleep_fires_on_the_stores_time(direct.clone(), CountingStore::new(direct)).await
}

/// The worker's clock two seconds ahead of the store's: `sleep` must not come due late, and
/// the loop must not poll the store until the store's clock catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_worker_ahead_of_the_store_neither_waits_long_nor_spins() -> TestResult {
    let store = SqliteStore::temporary()?;
    store.set_clock_offset(time::Duration::seconds(-2));
    let direct: Arc<dyn LeaseStore> = Arc::new(store);
    a_sleep_fires_on_the_stores_time(direct.clone(), CountingStore::new(direct)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_worker_behind_the_store_sleeps_the_full_span() -> TestResult {
    let db = TestDb::new().await;
    let direct: Arc<dyn LeaseStore> = Arc::new(db.store());
    let worker = CountingStore::new(direct.clone()).with_clock_offset(time::Duration::minutes(1));
    a_sleep_fires_on_the_stores_time(direct, worker).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_worker_ahead_of_the_store_neither_waits_long_nor_spins() -> TestResult {
    let db = TestDb::new().await;
    let direct: Arc<dyn LeaseStore> = Arc::new(db.store());
    let worker = CountingStore::new(direct.clone()).with_clock_offset(time::Duration::seconds(-2));
    a_sleep_fires_on_the_stores_time(direct, worker).await
}

/// Another worker's open batch holds a due timer (`FOR UPDATE`, as `timers_fire_due` does):
/// this worker cannot fire it and must not poll in a loop until that batch ends; once it ends
/// without firing it (rolled back), this worker fires it within its minimum wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_idle_timer_worker_does_not_spin_on_a_timer_another_holds() -> TestResult {
    let db = TestDb::new().await;
    let direct: Arc<dyn LeaseStore> = Arc::new(db.store());
    let k = key("napper", "n-1");
    keiro_journal::start(
        direct.as_ref(),
        &k,
        &(),
        keiro_journal::PAYLOAD_LEN_MAX_DEFAULT,
    )
    .await?;
    direct
        .timer_arm(&keiro_journal::store::TimerArm {
            key: k.clone(),
            generation: 0,
            step: "sleep:nap".to_owned(),
            due: keiro_journal::store::TimerDue::After(Duration::ZERO),
            kind: keiro_journal::TimerKind::Sleep,
        })
        .await?;

    let mut holder = db.store().pool().get().await?;
    let batch = holder.transaction().await?;
    let held = batch
        .query(
            "SELECT step FROM timers WHERE workflow_name = $1 AND workflow_id = $2 FOR UPDATE",
            &[&k.name.as_str(), &k.id.as_str()],
        )
        .await?;
    assert_eq!(held.len(), 1);

    let worker = CountingStore::new(direct.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let timers = tokio::spawn(keiro_resume::run_timer_loop(
        Arc::new(worker.clone()),
        TimerOptions {
            idle_fallback: Duration::from_secs(30),
            ..TimerOptions::default()
        },
        FixedPoll,
        async {
            let _ = stopped.await;
        },
    ));
    let held_for = Duration::from_secs(1);
    tokio::time::sleep(held_for).await;
    let polls = worker.calls("timers_fire_due");
    eprintln!("{polls} batches while the timer was held");
    batch.rollback().await?;
    let released = Instant::now();
    // The instance is running all along (never driven): the fire shows as its journaled sleep.
    let fired = loop {
        let journaled = !direct.journal_load(&k, 0).await?.is_empty();
        if journaled || released.elapsed() > Duration::from_secs(5) {
            break released.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let _ = stop.send(());
    let summary = timers.await?;
    assert_eq!(summary.fired, 1, "fired once released, after {fired:?}");
    assert!(
        fired < Duration::from_millis(500),
        "fired {fired:?} after release"
    );
    // The default minimum wait is 50 ms: about 20 batches a second, not thousands.
    assert!(polls <= 30, "{polls} batches in {held_for:?}");
    Ok(())
}
