//! Push wake-ups (`Notifier`): what each operation publishes in its own store once committed
//! (queues' wakes among them), what a second store on the same file (a second process) hears
//! through its poller, that a rolled-back operation publishes nothing, and that the poller
//! stops with its store.

use std::time::Duration;

use crate::common::{key, remote_arm, start, start_request, step, TempDir, TTL};
use keiro_journal::queue::{QueueSpec, QueueStart};
use keiro_journal::store::{
    Append, AppendOutcome, Park, RemoteArm, RemoteArmOutcome, StartRequest, TimerArm, TimerDue,
};
use keiro_journal::{Event, InstanceKey, TimerKind, WorkflowName};
use keiro_resume::{Notifier, WakeFilter, WakeReason, WakeSource};
use keiro_sqlite::{Config, SqliteStore};
use serde_json::json;

/// Long enough for anything published to arrive: a wait that should be woken is woken well
/// before, and one that ends at it was not woken.
const SOON: Duration = Duration::from_secs(5);
/// How long a wait that must not be woken lasts: several poll intervals of the default 50 ms.
const QUIET: Duration = Duration::from_millis(400);

fn open(dir: &TempDir) -> SqliteStore {
    SqliteStore::open(dir.file("keiro.db"), Config::default()).expect("opens")
}

/// A poll interval no test waits out: a store so configured hears only its own writer.
const NEVER: Duration = Duration::from_secs(3600);

/// A store whose poller never polls during the test, so what wakes its subscriptions is its
/// writer's publishing alone.
fn open_unpolled(dir: &TempDir, config: Config) -> SqliteStore {
    let config = Config {
        notify_poll_interval: NEVER,
        ..config
    };
    SqliteStore::open(dir.file("keiro.db"), config).expect("opens")
}

struct Subscriptions {
    instances: Box<dyn WakeSource>,
    timers: Box<dyn WakeSource>,
    remote: Box<dyn WakeSource>,
}

impl Subscriptions {
    fn of(store: &SqliteStore) -> Self {
        Self {
            instances: store.subscribe(WakeFilter::Instances),
            timers: store.subscribe(WakeFilter::Timers),
            remote: store.subscribe(WakeFilter::RemoteTasks),
        }
    }

    /// Asserts which filters were woken (`Notified`) since the last call; the others wait
    /// [`QUIET`] out.
    async fn woken(&mut self, instances: bool, timers: bool, remote: bool) {
        for (wakes, expected, filter) in [
            (&mut self.instances, instances, "instances"),
            (&mut self.timers, timers, "timers"),
            (&mut self.remote, remote, "remote"),
        ] {
            let fallback = if expected { SOON } else { QUIET };
            let want = if expected {
                WakeReason::Notified
            } else {
                WakeReason::Timeout
            };
            assert_eq!(wakes.wait(fallback).await, want, "{filter}");
        }
    }
}

fn sleep_arm(key: &InstanceKey, step: &str) -> TimerArm {
    TimerArm {
        key: key.clone(),
        generation: 0,
        step: step.to_owned(),
        due: TimerDue::At(time::OffsetDateTime::now_utc() + time::Duration::hours(1)),
        kind: TimerKind::Sleep,
    }
}

fn park(key: &InstanceKey, awaited: &str) -> Park {
    Park {
        key: key.clone(),
        generation: 0,
        fence: None,
        awaited: vec![awaited.to_owned()],
        wake_after: None,
    }
}

async fn complete(
    store: &SqliteStore,
    key: &InstanceKey,
    output: serde_json::Value,
) -> keiro_journal::store::Result<AppendOutcome> {
    store
        .journal_append(&Append::external(
            key.clone(),
            Event::WorkflowCompleted { output },
        ))
        .await
}

#[tokio::test]
async fn each_operation_wakes_its_own_filter_in_the_same_store() {
    let dir = TempDir::new("notify-same");
    let store = open_unpolled(&dir, Config::default());
    let mut subs = Subscriptions::of(&store);

    let k = start(&store, "a").await;
    subs.woken(true, false, false).await;
    // A second start of the same key creates nothing and announces nothing.
    start(&store, "a").await;
    subs.woken(false, false, false).await;

    store.timer_arm(&sleep_arm(&k, "sleep:nap")).await.unwrap();
    subs.woken(false, true, false).await;
    // A re-arm moves nothing.
    store.timer_arm(&sleep_arm(&k, "sleep:nap")).await.unwrap();
    subs.woken(false, false, false).await;

    assert_eq!(
        store.remote_arm(&remote_arm(&k, "label")).await.unwrap(),
        RemoteArmOutcome::Dispatched { deadline: None }
    );
    subs.woken(false, false, true).await;

    // A step landing on a parked instance wakes it; one on a running instance does not.
    store
        .instance_park(&park(&k, "await:signal"))
        .await
        .unwrap();
    subs.woken(false, false, false).await;
    store
        .journal_append(&step(&k, "await:signal", json!(1), None))
        .await
        .unwrap();
    subs.woken(true, false, false).await;
    store
        .journal_append(&step(&k, "other", json!(2), None))
        .await
        .unwrap();
    subs.woken(false, false, false).await;
}

/// The twin of queue.sql's `workflows_queue_slot_freed` (migration 0003's trigger) and of
/// `keiro_queue_set_paused`'s wake: a slot given back on park, a slot freed by a run's end and
/// a resumed queue each wake the instance filter, where PostgreSQL sends `queue/<queue>`.
/// Admission, a pause, and a park that keeps its slot announce nothing.
#[tokio::test]
async fn a_freed_queue_slot_and_a_resumed_queue_wake_the_workers() {
    let dir = TempDir::new("notify-queue");
    let store = open_unpolled(&dir, Config::default());
    let mut subs = Subscriptions::of(&store);
    let names = [WorkflowName::new("wf").unwrap()];
    let admit = |queue: &str| {
        let queues = [queue.to_owned()];
        let store = store.clone();
        let names = names.clone();
        async move {
            store
                .queue_admit(&queues, &names, "w", TTL, 10, None)
                .await
                .unwrap()
                .len()
        }
    };
    for spec in [
        QueueSpec::new("q").unwrap().concurrency(1),
        // Counts slots, so its run holds one to keep (a queue that counts nothing starts its
        // runs free, holding nothing).
        QueueSpec::new("kept")
            .unwrap()
            .concurrency(5)
            .release_on_park(false),
    ] {
        store.queue_declare(&spec).await.unwrap();
    }
    subs.woken(false, false, false).await;
    let on_queue = |id: &str, queue: &str| StartRequest {
        attributes: Default::default(),
        queue: Some(QueueStart::new(queue)),
        ..start_request(id, json!(null))
    };
    store.instance_start(&on_queue("a", "q")).await.unwrap();
    store.instance_start(&on_queue("b", "kept")).await.unwrap();
    subs.woken(true, false, false).await;
    assert_eq!((admit("q").await, admit("kept").await), (1, 1));
    subs.woken(false, false, false).await;

    // Given back on park.
    store
        .instance_park(&park(&key("a"), "await:signal"))
        .await
        .unwrap();
    subs.woken(true, false, false).await;
    // Kept on park.
    store
        .instance_park(&park(&key("b"), "await:signal"))
        .await
        .unwrap();
    subs.woken(false, false, false).await;

    assert!(store.queue_set_paused("q", true).await.unwrap());
    subs.woken(false, false, false).await;
    assert!(store.queue_set_paused("q", false).await.unwrap());
    subs.woken(true, false, false).await;

    // Woken (the step's own wake), admitted again, then ended: its slot is freed.
    store
        .journal_append(&step(&key("a"), "await:signal", json!(1), None))
        .await
        .unwrap();
    assert_eq!(admit("q").await, 1);
    subs.woken(true, false, false).await;
    complete(&store, &key("a"), json!("done")).await.unwrap();
    subs.woken(true, false, false).await;
}

#[tokio::test]
async fn a_terminal_transition_wakes_only_the_waiters_of_its_instance() {
    let dir = TempDir::new("notify-closed");
    let store = open_unpolled(&dir, Config::default());
    let a = start(&store, "a").await;
    let b = start(&store, "b").await;
    let c = start(&store, "c").await;
    let mut on_a = store.subscribe_closed(&a);
    let mut on_b = store.subscribe_closed(&b);
    let mut on_c = store.subscribe_closed(&c);

    complete(&store, &a, json!("done")).await.unwrap();
    assert_eq!(on_a.wait(SOON).await, WakeReason::Notified);
    assert_eq!(on_b.wait(QUIET).await, WakeReason::Timeout);

    // Every way to close: a cancellation, a failure.
    store.instance_cancel(&b, false).await.unwrap();
    assert_eq!(on_b.wait(SOON).await, WakeReason::Notified);
    store
        .journal_append(&Append::external(
            c.clone(),
            Event::WorkflowFailed {
                reason: "boom".into(),
            },
        ))
        .await
        .unwrap();
    assert_eq!(on_c.wait(SOON).await, WakeReason::Notified);
    // One close, one wake: nothing more for any of them.
    for waiter in [&mut on_a, &mut on_b, &mut on_c] {
        assert_eq!(waiter.wait(QUIET).await, WakeReason::Timeout);
    }
}

#[tokio::test]
async fn a_second_store_on_the_file_hears_the_first_within_the_poll_interval() {
    let dir = TempDir::new("notify-across");
    let web = open(&dir);
    let worker = open(&dir);
    let mut subs = Subscriptions::of(&worker);
    let k = key("a");
    let mut result = web.subscribe_closed(&k);

    let before = std::time::Instant::now();
    start(&web, "a").await;
    subs.woken(true, false, false).await;
    assert!(
        before.elapsed() < Duration::from_secs(2),
        "heard after {:?}",
        before.elapsed()
    );

    worker.timer_arm(&sleep_arm(&k, "sleep:nap")).await.unwrap();
    worker.remote_arm(&remote_arm(&k, "label")).await.unwrap();
    // The worker's own rows reach its subscriptions once, from its writer: its poller skips
    // them.
    subs.woken(false, true, true).await;
    subs.woken(false, false, false).await;

    complete(&worker, &k, json!("done")).await.unwrap();
    assert_eq!(result.wait(SOON).await, WakeReason::Notified);
}

#[tokio::test]
async fn a_rolled_back_operation_publishes_nothing() {
    let dir = TempDir::new("notify-rollback");
    // A value past the limit is refused by SQLite itself, while the operation runs.
    let config = Config {
        value_len_max: keiro_sqlite::VALUE_LEN_MIN,
        ..Config::default()
    };
    let store = open_unpolled(&dir, config.clone());
    let other = SqliteStore::open(dir.file("keiro.db"), config).unwrap();
    let k = start(&store, "a").await;
    // The other store's poller publishes the start before anyone there subscribes.
    tokio::time::sleep(QUIET).await;

    let mut here = Subscriptions::of(&store);
    let mut there = Subscriptions::of(&other);
    let mut closed_here = store.subscribe_closed(&k);
    let mut closed_there = other.subscribe_closed(&k);

    // The first dispatch is written (its task, its `remote` notification), then the second's
    // input is refused: the whole park rolls back, the first notification with it.
    let too_big = RemoteArm {
        input: json!("x".repeat(2 * keiro_sqlite::VALUE_LEN_MIN)),
        ..remote_arm(&k, "big")
    };
    let arms = [remote_arm(&k, "small"), too_big];
    let refused = store
        .instance_park_dispatch(&park(&k, "remote:small"), &arms)
        .await
        .unwrap_err();
    assert!(refused.is_value_refused(), "{refused}");
    here.woken(false, false, false).await;
    there.woken(false, false, false).await;
    let row = store.instance_get(&k).await.unwrap().unwrap();
    assert_eq!(row.status, keiro_journal::Status::Running);

    // A close refused for its value (its journal row is past the limit) closes nothing.
    let refused = complete(
        &store,
        &k,
        json!("x".repeat(2 * keiro_sqlite::VALUE_LEN_MIN)),
    )
    .await
    .unwrap_err();
    assert!(refused.is_value_refused(), "{refused}");
    assert_eq!(closed_here.wait(QUIET).await, WakeReason::Timeout);
    assert_eq!(closed_there.wait(QUIET).await, WakeReason::Timeout);

    // The same operations that fit are published, here and there.
    store
        .instance_park_dispatch(&park(&k, "remote:small"), &arms[..1])
        .await
        .unwrap();
    here.woken(false, false, true).await;
    there.woken(false, false, true).await;
    complete(&store, &k, json!("small")).await.unwrap();
    assert_eq!(closed_here.wait(SOON).await, WakeReason::Notified);
    assert_eq!(closed_there.wait(SOON).await, WakeReason::Notified);
}

#[tokio::test]
async fn a_poller_that_fell_behind_tells_every_subscription_to_poll() {
    let dir = TempDir::new("notify-behind");
    let config = Config {
        notify_poll_interval: Duration::from_millis(20),
        ..Config::default()
    };
    let store = SqliteStore::open(dir.file("keiro.db"), config).unwrap();
    let mut timers = store.subscribe(WakeFilter::Timers);
    let mut closed = store.subscribe_closed(&key("x"));

    // Another process commits more instance wakes at once than the table keeps: the oldest
    // are pruned before this store's poller can read them.
    let mut conn = rusqlite::Connection::open(dir.file("keiro.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let tx = conn.transaction().unwrap();
    for n in 0..5_000 {
        tx.execute(
            "INSERT INTO keiro_notifications (kind, workflow_name, workflow_id) \
             VALUES ('wake', 'wf', ?1)",
            [format!("i-{n}")],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    let kept: i64 = conn
        .query_row("SELECT count(*) FROM keiro_notifications", [], |r| r.get(0))
        .unwrap();
    assert!(kept <= 4096 + 256, "{kept} rows kept");

    assert_eq!(timers.wait(SOON).await, WakeReason::Reconnected);
    assert_eq!(closed.wait(SOON).await, WakeReason::Notified);
}

#[tokio::test]
async fn dropping_the_store_stops_its_poller() {
    let dir = TempDir::new("notify-drop");
    let first = open(&dir);
    let second = open(&dir);
    let mut wakes = first.subscribe(WakeFilter::Instances);
    drop(first);
    // Give the threads a moment to see the store is gone.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A poller left running would still publish the other store's start.
    start(&second, "a").await;
    let before = tokio::time::Instant::now();
    assert_eq!(wakes.wait(QUIET).await, WakeReason::Timeout);
    assert!(before.elapsed() >= QUIET);
}

#[test]
fn a_zero_poll_interval_is_refused() {
    let dir = TempDir::new("notify-config");
    let config = Config {
        notify_poll_interval: Duration::ZERO,
        ..Config::default()
    };
    let err = SqliteStore::open(dir.file("keiro.db"), config).unwrap_err();
    assert!(err.to_string().contains("notify_poll_interval"), "{err}");
}
