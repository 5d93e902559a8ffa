//! The writer: concurrent operations share one commit, each with the answer it would have had
//! alone; a failing operation leaves nothing and does not affect the others; several stores on
//! one file (as several processes) see each other's writes and lose nothing.

use std::time::Duration;

use crate::common::{key, start_request, step, TempDir};
use keiro_journal::store::AppendOutcome;
use keiro_journal::Fence;
use keiro_sqlite::{Config, SqliteStore};
use rusqlite::Connection;
use serde_json::json;

/// Holds the file's write lock from a connection of its own, as another process would, until
/// dropped: operations queued meanwhile wait for it, then run as one batch.
struct Lock(Connection);

impl Lock {
    fn take(path: &std::path::Path) -> Self {
        let conn = Connection::open(path).expect("opens");
        conn.execute_batch("BEGIN IMMEDIATE")
            .expect("takes the write lock");
        Self(conn)
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = self.0.execute_batch("COMMIT");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_a_commit_and_each_gets_its_own_answer(
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir::new("gc-share");
    let path = dir.file("keiro.db");
    let config = Config {
        value_len_max: keiro_sqlite::VALUE_LEN_MIN,
        ..Config::default()
    };
    let store = SqliteStore::open(&path, config)?;
    let k = key("a");
    store
        .instance_start(&start_request("a", json!(null)))
        .await?;
    store
        .journal_append(&step(&k, "recorded", json!("first"), None))
        .await?;
    let claim = match store
        .instance_claim(&k, "w1", Duration::from_secs(60), None)
        .await?
    {
        keiro_lease::ClaimOutcome::Acquired(claim) => claim,
        other => panic!("claimable: {other:?}"),
    };
    let stale = Fence {
        owner: "w1".into(),
        epoch: claim.fence.epoch - 1,
    };
    let before = store.commits();

    let lock = Lock::take(&path);
    let mut tasks = Vec::new();
    // 32 fresh steps, each appended.
    for i in 0..32 {
        let store = store.clone();
        let append = step(&k, &format!("s{i}"), json!(i), Some(&claim.fence));
        tasks.push(tokio::spawn(
            async move { store.journal_append(&append).await },
        ));
    }
    // A step already recorded: adopts the first value.
    let again = step(&k, "recorded", json!("second"), None);
    let s = store.clone();
    let recorded = tokio::spawn(async move { s.journal_append(&again).await });
    // A stale fence: LeaseLost, nothing written.
    let s = store.clone();
    let fenced = step(&k, "stale", json!(0), Some(&stale));
    let lost = tokio::spawn(async move { s.journal_append(&fenced).await });
    // A missing instance.
    let s = store.clone();
    let missing = step(&key("nobody"), "s", json!(0), None);
    let absent = tokio::spawn(async move { s.journal_append(&missing).await });
    // A value SQLite refuses inside the transaction (past the length limit).
    let s = store.clone();
    let huge = step(
        &k,
        "huge",
        json!("x".repeat(2 * keiro_sqlite::VALUE_LEN_MIN)),
        None,
    );
    let refused = tokio::spawn(async move { s.journal_append(&huge).await });
    // Let every operation reach the writer's queue while the lock is held.
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(lock);

    for task in tasks {
        assert_eq!(task.await??, AppendOutcome::Appended);
    }
    assert_eq!(
        recorded.await??,
        AppendOutcome::AlreadyPresent(json!("first"))
    );
    assert!(lost.await?.unwrap_err().is_lease_lost());
    assert!(absent.await?.unwrap_err().is_not_found());
    assert!(refused.await?.unwrap_err().is_value_refused());

    // The writer had taken the first operation before the lock was seen; everything queued
    // behind it went into one transaction.
    let commits = store.commits() - before;
    assert!(commits <= 2, "{commits} commits for 36 operations");
    let journal = store.journal_load(&k, 0).await?;
    let names: Vec<String> = journal
        .iter()
        .map(|e| e.event.step_name().into_owned())
        .collect();
    assert_eq!(names.len(), 33, "{names:?}");
    assert!(!names.iter().any(|n| n == "stale" || n == "huge"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_store_on_the_file_sees_the_writes() -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir::new("gc-second");
    let path = dir.file("keiro.db");
    let first = SqliteStore::open(&path, Config::default())?;
    let second = SqliteStore::open(&path, Config::default())?;
    first
        .instance_start(&start_request("a", json!("in")))
        .await?;
    first
        .journal_append(&step(&key("a"), "s", json!(1), None))
        .await?;
    let seen = second.instance_get(&key("a")).await?.expect("visible");
    assert_eq!(seen.input, json!("in"));
    assert_eq!(second.journal_load(&key("a"), 0).await?.len(), 1);
    // And the other way round.
    let again = second
        .journal_append(&step(&key("a"), "s", json!(2), None))
        .await?;
    assert_eq!(again, AppendOutcome::AlreadyPresent(json!(1)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_on_one_file_lose_no_operation() -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir::new("gc-two");
    let path = dir.file("keiro.db");
    let stores = [
        SqliteStore::open(&path, Config::default())?,
        SqliteStore::open(&path, Config::default())?,
    ];
    stores[0]
        .instance_start(&start_request("a", json!(null)))
        .await?;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let store = stores[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            // Both stores start the same instances and append to one, racing for the lock.
            store
                .instance_start(&start_request(&format!("i{}", i / 2), json!(i)))
                .await?;
            store
                .journal_append(&step(&key("a"), &format!("s{i}"), json!(i), None))
                .await
        }));
    }
    for task in tasks {
        assert_eq!(task.await??, AppendOutcome::Appended);
    }
    let journal = stores[1].journal_load(&key("a"), 0).await?;
    assert_eq!(journal.len(), 200);
    let raw = Connection::open(&path)?;
    let instances: i64 = raw.query_row("SELECT count(*) FROM workflows", [], |r| r.get(0))?;
    assert_eq!(instances, 101);
    let check: String = raw.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
    assert_eq!(check, "ok");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_past_the_busy_timeout_fails_retryably_and_writes_nothing(
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir::new("gc-busy");
    let path = dir.file("keiro.db");
    let config = Config {
        busy_timeout: Duration::from_millis(100),
        ..Config::default()
    };
    let store = SqliteStore::open(&path, config)?;
    store
        .instance_start(&start_request("a", json!(null)))
        .await?;
    let lock = Lock::take(&path);
    let err = store
        .journal_append(&step(&key("a"), "s", json!(1), None))
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    drop(lock);
    assert!(store.journal_load(&key("a"), 0).await?.is_empty());
    assert_eq!(
        store
            .journal_append(&step(&key("a"), "s", json!(2), None))
            .await?,
        AppendOutcome::Appended,
        "the retry goes through"
    );
    Ok(())
}
