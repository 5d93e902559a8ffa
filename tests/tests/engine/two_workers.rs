//! Two worker processes on one database never advance the same instance at once, and between
//! them complete every workflow with each step journaled once.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use keiro::Status;
use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;

/// Kills the worker processes however the test ends.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_never_advance_the_same_instance_at_once() -> TestResult {
    let db = TestDb::new().await;
    let (client, connection) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let schema = db.schema();
    client
        .batch_execute(&format!(
            "CREATE TABLE {schema}.overlap_ledger (workflow_id text, step text, pid int, overlapped bool, at timestamptz DEFAULT clock_timestamp())"
        ))
        .await?;
    let keiro = keiro::KeiroBuilder::lease_only(std::sync::Arc::new(db.store()))
        .without_push()
        .build();
    let (count, steps) = (60, 4u32);
    for i in 0..count {
        keiro.start("overlap", &format!("o-{i}"), &steps).await?;
    }
    let exe = env!("CARGO_BIN_EXE_keiro-test-worker");
    let spawn = || {
        Command::new(exe)
            .args([db.url(), schema])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
    };
    let _workers = Workers(vec![spawn()?, spawn()?]);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut done = 0;
        for i in 0..count {
            if keiro
                .instance(("overlap", &format!("o-{i}")))
                .await?
                .map(|r| r.status)
                == Some(Status::Completed)
            {
                done += 1;
            }
        }
        if done == count {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {done}/{count} completed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let row = client
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE overlapped), count(*), count(DISTINCT pid) FROM {schema}.overlap_ledger"
            ),
            &[],
        )
        .await?;
    let (overlaps, executions, pids): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        overlaps, 0,
        "two processes were inside a step of the same instance at once"
    );
    assert_eq!(
        executions,
        i64::from(steps) * count,
        "each step ran once: no crash, so no re-run"
    );
    assert_eq!(pids, 2, "both worker processes took part");
    for i in 0..count {
        let journal = keiro.journal(("overlap", &format!("o-{i}"))).await?;
        assert_eq!(
            journal.len(),
            usize::try_from(steps)? + 1,
            "each step journaled once, plus completion"
        );
    }
    Ok(())
}
