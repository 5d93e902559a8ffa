//! Two stores on one file, as two processes would open it: the file's write lock makes a lease
//! theirs once. What a claim answers is the contract suite's (`keiro_tests::contract::lease`).

use crate::common::{start, TempDir, TTL};
use keiro_lease::ClaimOutcome;
use keiro_sqlite::SqliteStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_never_grant_one_lease_twice() {
    let dir = TempDir::new("l-two-stores");
    let path = dir.file("keiro.db");
    let stores = [
        SqliteStore::open(&path, keiro_sqlite::Config::default()).unwrap(),
        SqliteStore::open(&path, keiro_sqlite::Config::default()).unwrap(),
    ];
    for i in 0..20 {
        start(&stores[0], &format!("i{i}")).await;
    }
    let mut tasks = Vec::new();
    for (n, store) in stores.iter().enumerate() {
        for i in 0..20 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let key = crate::common::key(&format!("i{i}"));
                store
                    .instance_claim(&key, &format!("w{n}"), TTL, None)
                    .await
            }));
        }
    }
    let mut granted = 0;
    for task in tasks {
        if let ClaimOutcome::Acquired(_) = task.await.unwrap().unwrap() {
            granted += 1;
        }
    }
    assert_eq!(granted, 20, "each instance claimed exactly once");
}
