//! Retention on the file: after a batch no table of the file keeps a row of a deleted instance
//! (read with SQL, as the Postgres store's check reads its schema), a second batch of the same
//! store is locked out at once, and two stores on one file take turns. What a batch deletes
//! and keeps is the contract suite's (`keiro_tests::contract::retention`).

use std::time::Duration;

use crate::common::{pinned, step, T0};
use keiro_journal::store::{StartRequest, TimerArm, TimerDue};
use keiro_journal::{GcRequest, InstanceKey, RetentionStore, TimerKind};
use keiro_sqlite::{Config, SqliteStore};
use serde_json::{json, Value};

const HOUR: Duration = Duration::from_secs(3600);

fn k(id: &str) -> InstanceKey {
    InstanceKey::parse("wf", id).expect("a valid key")
}

async fn start(store: &SqliteStore, id: &str, parent: Option<&str>) -> InstanceKey {
    store
        .instance_start(&StartRequest {
            attributes: Default::default(),
            key: k(id),
            input: Value::Null,
            parent: parent.map(k),
            priority: 0,
            queue: None,
        })
        .await
        .expect("starts");
    k(id)
}

async fn end(store: &SqliteStore, id: &str) {
    store.instance_cancel(&k(id), false).await.expect("cancels");
}

async fn exists(store: &SqliteStore, id: &str) -> bool {
    store.instance_get(&k(id)).await.expect("reads").is_some()
}

/// Rows of `table` naming `wf/<id>`, read from the file.
fn rows(path: &std::path::Path, table: &str, id: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).expect("opens");
    conn.query_row(
        &format!("SELECT count(*) FROM {table} WHERE workflow_name = 'wf' AND workflow_id = ?1"),
        [id],
        |r| r.get(0),
    )
    .expect("counts")
}

/// A request as if `hours` had passed since T0, for instances terminal over an hour.
fn later(hours: i64, batch: u32) -> GcRequest {
    GcRequest {
        now: Some(T0 + time::Duration::hours(hours)),
        batch,
        ..GcRequest::new(HOUR)
    }
}

#[tokio::test]
async fn an_expired_instance_goes_with_everything_it_owns_and_the_rest_stays() {
    let (dir, store) = pinned("gc-owned");
    let path = dir.file("keiro.db");
    let rich = start(&store, "rich", None).await;
    store
        .journal_append(&step(&rich, "a", json!(1), None))
        .await
        .expect("appends");
    store
        .timer_arm(&TimerArm {
            key: rich.clone(),
            generation: 0,
            step: "sleep:nap".into(),
            due: TimerDue::After(Duration::from_secs(60)),
            kind: TimerKind::Sleep,
        })
        .await
        .expect("arms");
    store
        .signal_wait(&keiro_journal::store::SignalWait {
            key: rich.clone(),
            generation: 0,
            step: "sig:go".into(),
            token: "tok".into(),
            fence: None,
        })
        .await
        .expect("waits");
    let conn = rusqlite::Connection::open(&path).expect("opens");
    conn.execute(
        "INSERT INTO awakeables (id, workflow_name, workflow_id, generation, created_at) \
         VALUES ('00000000-0000-0000-0000-000000000001', 'wf', 'rich', 0, 0)",
        [],
    )
    .expect("inserts");
    conn.execute(
        "INSERT INTO remote_tasks (step_id, workflow_name, workflow_id, generation, step, \
             journal_step, grp, input, status, max_attempts, backoff_initial_ms, \
             backoff_max_ms, backoff_jitter, redispatch_max, available_at, created_at, \
             updated_at) \
         VALUES ('t-1', 'wf', 'rich', 0, 'print', 'print', 'g', 'null', 'failed', 1, 1, 1, 0, \
             1, 0, 0, 0)",
        [],
    )
    .expect("inserts");
    end(&store, "rich").await; // its signal wait stays registered: a cancel leaves it
    start(&store, "live", None).await;
    store.advance_clock(Duration::from_secs(1800));
    start(&store, "recent", None).await;
    end(&store, "recent").await;

    // Whatever the cancel left of the signal wait is the instance's to delete.
    let waiters = u64::try_from(rows(&path, "signal_waiters", "rich")).expect("a count");
    let gc: &dyn RetentionStore = &store;
    assert_eq!(
        gc.instances_gc_eligible(&later(1, 10))
            .await
            .expect("counts"),
        0
    );
    assert_eq!(
        gc.instances_gc(&later(1, 10))
            .await
            .expect("collects")
            .rows(),
        0
    );
    // An hour and a quarter on: `rich` is past the hour, `recent` is not.
    let request = GcRequest {
        now: Some(T0 + time::Duration::minutes(75)),
        ..GcRequest::new(HOUR)
    };
    assert_eq!(gc.instances_gc_eligible(&request).await.expect("counts"), 1);
    let deleted = gc.instances_gc(&request).await.expect("collects");
    assert_eq!(
        (
            deleted.instances,
            deleted.timers,
            deleted.awakeables,
            deleted.remote_tasks,
            deleted.locked_out
        ),
        (1, 1, 1, 1, false),
        "{deleted:?}"
    );
    assert!(
        deleted.journal >= 2,
        "the step and the cancel marker: {deleted:?}"
    );
    assert_eq!(deleted.signal_waiters, waiters, "{deleted:?}");
    for table in [
        "workflows",
        "journal",
        "timers",
        "awakeables",
        "signal_waiters",
        "remote_tasks",
    ] {
        assert_eq!(rows(&path, table, "rich"), 0, "{table}");
    }
    assert!(exists(&store, "live").await && exists(&store, "recent").await);
    // The store's clock when no instant is given.
    store.advance_clock(HOUR + Duration::from_secs(1));
    assert_eq!(
        gc.instances_gc(&GcRequest::new(HOUR))
            .await
            .expect("collects")
            .instances,
        1
    );
    assert!(!exists(&store, "recent").await && exists(&store, "live").await);
}

#[tokio::test]
async fn a_second_batch_of_the_same_store_is_locked_out_at_once() {
    let (_dir, store) = pinned("gc-locked");
    for n in 0..3 {
        start(&store, &format!("f-{n}"), None).await;
        end(&store, &format!("f-{n}")).await;
    }
    let clone = store.clone();
    let request = later(2, 10);
    // Both are polled before either is answered: the second finds the first under way.
    let (first, second) = tokio::join!(
        RetentionStore::instances_gc(&store, &request),
        RetentionStore::instances_gc(&clone, &request),
    );
    let (first, second) = (first.expect("collects"), second.expect("answers"));
    assert_eq!((first.instances, first.locked_out), (3, false));
    assert_eq!((second.rows(), second.locked_out), (0, true));
    // The flag goes with the batch: the next one runs.
    let next = RetentionStore::instances_gc(&store, &later(2, 10))
        .await
        .expect("collects");
    assert!(!next.locked_out);
}

#[tokio::test]
async fn batches_of_two_stores_on_one_file_take_turns_and_delete_each_instance_once() {
    let (dir, store) = pinned("gc-two-stores");
    for n in 0..40 {
        start(&store, &format!("f-{n}"), None).await;
        end(&store, &format!("f-{n}")).await;
    }
    let other = SqliteStore::open(dir.file("keiro.db"), Config::default()).expect("opens");
    let collect = |store: SqliteStore| async move {
        let mut total = 0;
        for _ in 0..10 {
            let batch = RetentionStore::instances_gc(&store, &later(2, 3))
                .await
                .expect("collects");
            assert!(
                !batch.locked_out,
                "another store's batch waits for the write lock"
            );
            total += batch.instances;
        }
        total
    };
    let (a, b) = tokio::join!(
        tokio::spawn(collect(store.clone())),
        tokio::spawn(collect(other))
    );
    assert_eq!(a.expect("joins") + b.expect("joins"), 40);
    assert_eq!(
        RetentionStore::instances_gc_eligible(&store, &later(2, 3))
            .await
            .expect("counts"),
        0
    );
}
