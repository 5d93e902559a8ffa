//! The store's LISTEN listener: notifications reach subscriptions within milliseconds,
//! filtered by kind; a killed connection is re-established and reported as `Reconnected`; and
//! the listener ends with the last handle of its store.

use std::time::{Duration, Instant};

use crate::common::{key, sql, start, TestResult};
use keiro_journal::{store::TimerArm, JournalStore, TimerKind};
use keiro_postgres::PgStore;
use keiro_resume::{Notifier, WakeFilter, WakeReason, WakeSource};
use keiro_tests::pg::TestDb;
use serde_json::json;
use time::macros::datetime;

/// Long enough for anything that should arrive; only reached when a test fails.
const PATIENCE: Duration = Duration::from_secs(10);
/// How long a subscription is given to show that nothing arrives for it.
const QUIET: Duration = Duration::from_millis(300);
/// The latency a notification must beat: a local round trip takes well under this.
const PROMPT: Duration = Duration::from_millis(250);

/// Waits for the listener's first `LISTEN`: every subscription made before it hears
/// `Reconnected`, since anything sent earlier was missed.
async fn listening(wakes: &mut Box<dyn WakeSource>) -> TestResult {
    assert_eq!(wakes.wait(PATIENCE).await, WakeReason::Reconnected);
    Ok(())
}

/// How many backends listen on `channel`, as seen through `observer`'s connection.
async fn listeners(
    channel: &str,
    observer: &PgStore,
) -> Result<i64, Box<dyn std::error::Error + Send + Sync>> {
    let statement = format!("LISTEN \"{channel}\"");
    Ok(sql(observer)
        .await?
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE query = $1 AND pid <> pg_backend_pid()",
            &[&statement],
        )
        .await?
        .get(0))
}

#[tokio::test]
async fn a_wake_is_notified_within_milliseconds_and_only_to_its_filter() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let mut instances = store.subscribe(WakeFilter::Instances);
    let mut timers = store.subscribe(WakeFilter::Timers);
    listening(&mut instances).await?;
    listening(&mut timers).await?;

    let mut slowest = Duration::ZERO;
    for n in 0..10 {
        let k = key("order", &format!("o-{n}"));
        store.instance_start(&start(&k, json!(null))).await?;
        let committed = Instant::now();
        assert_eq!(instances.wait(PATIENCE).await, WakeReason::Notified);
        slowest = slowest.max(committed.elapsed());
    }
    eprintln!("slowest notification after commit: {slowest:?}");
    assert!(slowest < PROMPT, "slowest notification took {slowest:?}");
    assert_eq!(
        timers.wait(QUIET).await,
        WakeReason::Timeout,
        "starts are not timer arms"
    );

    let arm = TimerArm {
        key: key("order", "o-0"),
        generation: 0,
        step: "sleep:nap".into(),
        due: keiro_journal::store::TimerDue::At(datetime!(2030-01-01 0:00 UTC)),
        kind: TimerKind::Sleep,
    };
    store.timer_arm(&arm).await?;
    let armed = Instant::now();
    assert_eq!(timers.wait(PATIENCE).await, WakeReason::Notified);
    assert!(armed.elapsed() < PROMPT, "{:?}", armed.elapsed());
    assert_eq!(
        instances.wait(QUIET).await,
        WakeReason::Timeout,
        "an arm wakes no resume loop"
    );
    Ok(())
}

#[tokio::test]
async fn a_burst_costs_one_wake() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let mut instances = store.subscribe(WakeFilter::Instances);
    listening(&mut instances).await?;
    for n in 0..20 {
        store
            .instance_start(&start(&key("order", &format!("o-{n}")), json!(null)))
            .await?;
    }
    // Let the whole burst reach the subscription's queue.
    tokio::time::sleep(QUIET).await;
    assert_eq!(instances.wait(PATIENCE).await, WakeReason::Notified);
    assert_eq!(
        instances.wait(QUIET).await,
        WakeReason::Timeout,
        "drained by the first wait"
    );
    Ok(())
}

#[tokio::test]
async fn a_killed_listener_reconnects_and_says_so() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let mut instances = store.subscribe(WakeFilter::Instances);
    let mut timers = store.subscribe(WakeFilter::Timers);
    listening(&mut instances).await?;
    listening(&mut timers).await?;
    assert_eq!(
        listeners(store.wake_channel(), &store).await?,
        1,
        "one listener for all subscriptions"
    );

    let statement = format!("LISTEN \"{}\"", store.wake_channel());
    let killed = sql(&store)
        .await?
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE query = $1 AND pid <> pg_backend_pid()",
            &[&statement],
        )
        .await?;
    assert_eq!(killed.len(), 1);

    let lost = Instant::now();
    assert_eq!(instances.wait(PATIENCE).await, WakeReason::Reconnected);
    assert_eq!(
        timers.wait(PATIENCE).await,
        WakeReason::Reconnected,
        "every subscription hears it"
    );
    eprintln!("reconnected after {:?}", lost.elapsed());
    assert_eq!(listeners(store.wake_channel(), &store).await?, 1);

    // And it listens again.
    store
        .instance_start(&start(&key("order", "o-1"), json!(null)))
        .await?;
    assert_eq!(instances.wait(PATIENCE).await, WakeReason::Notified);
    Ok(())
}

#[tokio::test]
async fn the_listener_ends_with_the_last_store_handle() -> TestResult {
    let db = TestDb::new().await;
    let observer = db.store();
    let store = PgStore::connect(db.config()).await?;
    let clone = store.clone();
    let mut wakes = clone.subscribe(WakeFilter::Instances);
    listening(&mut wakes).await?;
    let channel = store.wake_channel().to_owned();
    assert_eq!(listeners(&channel, &observer).await?, 1);

    drop(clone);
    assert_eq!(listeners(&channel, &observer).await?, 1, "a clone keeps it");
    drop(store);
    let deadline = Instant::now() + PATIENCE;
    while listeners(&channel, &observer).await? > 0 {
        assert!(Instant::now() < deadline, "the listener outlived its store");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The subscription outlives the store as a plain fallback poll.
    assert_eq!(wakes.wait(QUIET).await, WakeReason::Timeout);
    Ok(())
}
