//! Remote steps across processes, on Postgres: the worker that runs a remote step, and the
//! worker that resumes the run, are other processes than the one that dispatched it; a killed
//! remote worker's task is re-dispatched after its deadline and the run completes; a handler
//! that aborts its process uses up the step's attempts and the step fails as crashed.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use keiro::{remote::RemoteStepError, remote::TaskStatus, store::Event, Keiro, Status};
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

/// The file an `abort` worker's handler appends `<pid> <attempt>` to before it aborts; removed
/// however the test ends.
struct Witness(std::path::PathBuf);

impl Witness {
    fn new(db: &TestDb) -> Self {
        Self(std::env::temp_dir().join(format!("{}-handler-starts", db.schema())))
    }

    /// Every recorded start, as `(pid, attempt)`, in order.
    fn starts(&self) -> std::io::Result<Vec<(u32, u32)>> {
        let text = match std::fs::read_to_string(&self.0) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            other => other?,
        };
        Ok(text
            .lines()
            .filter_map(|line| {
                let (pid, attempt) = line.split_once(' ')?;
                Some((pid.parse().ok()?, attempt.parse().ok()?))
            })
            .collect())
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn spawn_aborting_worker(db: &TestDb, witness: &Witness) -> std::io::Result<Child> {
    Command::new(env!("CARGO_BIN_EXE_keiro-test-remote-worker"))
        .args([db.url(), db.schema(), "abort"])
        .arg(&witness.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
}

async fn wait_for(keiro: &Keiro, ids: &[String], status: Status, within: Duration) -> TestResult {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let mut done = 0;
        for id in ids {
            if keiro.instance(("parcel", id)).await?.map(|r| r.status) == Some(status) {
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
    let keiro = Keiro::builder(db.store()).build();
    let ids: Vec<String> = (0..20).map(|i| format!("p-{i}")).collect();
    for id in &ids {
        let input = Parcel {
            order: id.clone(),
            redispatch_ms: None,
            retries: 0,
        };
        keiro.start("parcel", id, &input).await?;
    }
    // This process dispatches every remote step, and parks every run.
    let worker = keiro.worker().register("parcel", parcel).build()?;
    let summary = worker.resume_once().await?;
    assert_eq!(summary.resumed, 20, "{summary:?}");
    drop(worker);
    for id in &ids {
        let row = keiro.instance(("parcel", id)).await?.expect("row");
        assert_eq!(
            row.status,
            Status::Suspended,
            "{id} parks on its remote step"
        );
        assert_eq!(keiro.remote_tasks(("parcel", id)).await?.len(), 1);
    }

    // Another process prints the labels and resumes the runs.
    let _workers = Processes(vec![spawn_worker(&db, "ok")?]);
    wait_for(&keiro, &ids, Status::Completed, Duration::from_secs(60)).await?;
    let me = std::process::id();
    for id in &ids {
        let output = keiro.instance(("parcel", id)).await?.expect("row").output;
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
        let journal = keiro.journal(("parcel", id)).await?;
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
    let keiro = Keiro::builder(db.store()).build();
    let input = Parcel {
        order: "k-1".into(),
        redispatch_ms: Some(1_000),
        retries: 0,
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
        let tasks = keiro.remote_tasks(("parcel", "k-1")).await?;
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
    let output = keiro
        .instance(("parcel", "k-1"))
        .await?
        .expect("row")
        .output;
    let output = output
        .and_then(|o| o.as_str().map(str::to_owned))
        .unwrap_or_default();
    assert!(output.contains("on dispatch 2"), "{output}");
    let tasks = keiro.remote_tasks(("parcel", "k-1")).await?;
    assert_eq!(
        (tasks[0].status, tasks[0].dispatches),
        (TaskStatus::Completed, 2)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_aborts_its_process_uses_up_the_attempts_and_the_step_crashed() -> TestResult
{
    let db = TestDb::new().await;
    let keiro = Keiro::builder(db.store()).build();
    let input = Parcel {
        order: "a-1".into(),
        redispatch_ms: None,
        retries: 2,
    };
    keiro.start("parcel", "a-1", &input).await?;
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

    // Whenever no worker process is alive, one more starts: each claims the task, records the
    // handler's start and aborts; the next finds the claim expired.
    let witness = Witness::new(&db);
    let mut workers = Processes(Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let row = keiro.instance(("parcel", "a-1")).await?.expect("row");
        if row.status == Status::Failed {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {:?} after {} worker process(es), starts {:?}",
            row.status,
            workers.0.len(),
            witness.starts()?
        );
        let alive = match workers.0.last_mut() {
            Some(child) => child.try_wait()?.is_none(),
            None => false,
        };
        if !alive {
            assert!(
                workers.0.len() < 6,
                "the handler kept running: {:?}",
                witness.starts()?
            );
            workers.0.push(spawn_aborting_worker(&db, &witness)?);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    let _ = resume.await;

    // Three attempts in all (two retries), each started in a process of its own that died;
    // the process after them found the last claim expired and failed the step.
    let starts = witness.starts()?;
    assert_eq!(
        starts
            .iter()
            .map(|(_, attempt)| *attempt)
            .collect::<Vec<_>>(),
        [1, 2, 3],
        "{starts:?}"
    );
    let mut pids: Vec<u32> = starts.iter().map(|(pid, _)| *pid).collect();
    pids.dedup();
    assert_eq!(pids.len(), 3, "{starts:?}");
    assert_eq!(workers.0.len(), 4);
    drop(workers);

    let tasks = keiro.remote_tasks(("parcel", "a-1")).await?;
    assert_eq!(
        (tasks[0].status, tasks[0].attempts, tasks[0].dispatches),
        (TaskStatus::Failed, 3, 1)
    );
    let journal = keiro.journal(("parcel", "a-1")).await?;
    let errors: Vec<&serde_json::Value> = journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepRecorded { step, result, .. } if step == "remote:print" => {
                result.get("error")
            }
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 1, "{journal:?}");
    assert_eq!(
        (errors[0].get("code"), errors[0].get("attempts")),
        (
            Some(&serde_json::json!(RemoteStepError::CRASHED)),
            Some(&serde_json::json!(3))
        )
    );
    // `parcel` propagates the step's failure: the run failed with it.
    let row = keiro.instance(("parcel", "a-1")).await?.expect("row");
    let reason = row.last_error.unwrap_or_default();
    assert!(reason.contains("after 3 attempt(s)"), "{reason}");
    Ok(())
}
