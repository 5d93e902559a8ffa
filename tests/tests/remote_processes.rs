//! Remote steps across processes, on Postgres: the worker that runs a remote step, and the
//! worker that resumes the run, are other processes than the one that dispatched it; a killed
//! remote worker's task is re-dispatched after its deadline and the run completes.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use keiro::{Event, Keiro, Status, TaskStatus};
use keiro_tests::pg::TestDb;
use keiro_tests::remote_fixtures::{parcel, Parcel};
use keiro_tests::TestResult;

/// Kills the worker processes however the test ends.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn_worker(db: &TestDb, mode: &str) -> std::io::Result<Child> {
    Command::new(env!("CARGO_BIN_EXE_keiro-test-remote-worker"))
        .args([db.url(), db.schema(), mode])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
}

async fn wait_for(keiro: &Keiro, ids: &[String], status: Status, within: Duration) -> TestResult {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let mut done = 0;
        for id in ids {
            if keiro.instance("parcel", id).await?.map(|r| r.status) == Some(status) {
                done += 1;
            }
        }
        if done == ids.len() {
            return Ok(());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {done}/{} reached {status:?}",
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_step_runs_and_resumes_in_another_process() -> TestResult {
    let db = TestDb::new().await;
    let keiro = Keiro::with_push(db.store());
    let ids: Vec<String> = (0..20).map(|i| format!("p-{i}")).collect();
    for id in &ids {
        let input = Parcel {
            order: id.clone(),
            redispatch_ms: None,
        };
        keiro.start("parcel", id, &input).await?;
    }
    // This process dispatches every remote step, and parks every run.
    let worker = keiro.worker().register("parcel", parcel).build()?;
    let summary = worker.resume_once().await?;
    assert_eq!(summary.resumed, 20, "{summary:?}");
    drop(worker);
    for id in &ids {
        let row = keiro.instance("parcel", id).await?.expect("row");
        assert_eq!(
            row.status,
            Status::Suspended,
            "{id} parks on its remote step"
        );
        assert_eq!(keiro.remote_tasks("parcel", id).await?.len(), 1);
    }

    // Another process prints the labels and resumes the runs.
    let _workers = Processes(vec![spawn_worker(&db, "ok")?]);
    wait_for(&keiro, &ids, Status::Completed, Duration::from_secs(60)).await?;
    let me = std::process::id();
    for id in &ids {
        let output = keiro.instance("parcel", id).await?.expect("row").output;
        let output = output
            .and_then(|o| o.as_str().map(str::to_owned))
            .unwrap_or_default();
        let pids: Vec<u32> = output
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect();
        assert!(
            output.starts_with(&format!("label {id} printed by ")),
            "{output}"
        );
        assert!(
            !pids.contains(&me),
            "{output} mentions the dispatching process {me}"
        );
        let journal = keiro.journal("parcel", id).await?;
        let remote_records = journal
            .iter()
            .filter(
                |e| matches!(&e.event, Event::StepRecorded { step, .. } if step == "remote:print"),
            )
            .count();
        assert_eq!(remote_records, 1);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_remote_workers_task_is_redispatched_and_the_run_completes() -> TestResult {
    let db = TestDb::new().await;
    let keiro = Keiro::with_push(db.store());
    let input = Parcel {
        order: "k-1".into(),
        redispatch_ms: Some(1_000),
    };
    keiro.start("parcel", "k-1", &input).await?;
    let worker = keiro
        .worker()
        .register("parcel", parcel)
        .poll_interval(Duration::from_millis(50))
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let resume = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await;
    });

    // A remote worker claims the task and hangs; then it is killed.
    let mut hanging = Processes(vec![spawn_worker(&db, "hang")?]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let tasks = keiro.remote_tasks("parcel", "k-1").await?;
        if tasks.first().map(|t| t.status) == Some(TaskStatus::Running) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never claimed: {tasks:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if let Some(mut child) = hanging.0.pop() {
        child.kill()?;
        child.wait()?;
    }

    // A healthy worker gets the task once the redispatch deadline passes.
    let _healthy = Processes(vec![spawn_worker(&db, "ok")?]);
    wait_for(
        &keiro,
        &["k-1".to_owned()],
        Status::Completed,
        Duration::from_secs(60),
    )
    .await?;
    let _ = stop.send(());
    let _ = resume.await;
    let output = keiro.instance("parcel", "k-1").await?.expect("row").output;
    let output = output
        .and_then(|o| o.as_str().map(str::to_owned))
        .unwrap_or_default();
    assert!(output.contains("on dispatch 2"), "{output}");
    let tasks = keiro.remote_tasks("parcel", "k-1").await?;
    assert_eq!(
        (tasks[0].status, tasks[0].dispatches),
        (TaskStatus::Completed, 2)
    );
    Ok(())
}
