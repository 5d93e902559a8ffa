//! Remote-step conformance: dispatch, durable retry, lost-dispatch redispatch, the operator's
//! redispatch, requeue and fix-and-replay, against the SQLite and Postgres stores. The
//! multi-process scenarios are in `remote_processes.rs`.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::{
    operate::RequeueOutcome, remote::RemoteOptions, remote::RemoteWorker,
    remote::RemoteWorkerOptions, remote::TaskContext, remote::TaskError, remote::TaskStatus,
    store::Event, worker::Registry, worker::ResumeOptions, Backoff, Ctx, Status, WorkflowError,
};
use keiro_tests::{key, on_both_stores, Harness, Ledger, TestResult};
use serde_json::json;

on_both_stores!(
    a_remote_step_runs_on_a_worker_and_the_run_resumes,
    a_dispatch_is_written_once_per_step_id,
    retryable_failures_back_off_then_succeed,
    a_not_retryable_failure_fails_at_once,
    exhausted_retries_reach_the_body_as_a_remote_step_error,
    a_silent_task_is_redispatched_and_then_lost,
    a_dead_workers_task_is_redispatched_and_completes,
    redispatch_pending_counts_the_runs_pending_steps,
    requeue_retries_a_failed_remote_step,
    requeue_parent_first_cascades_to_the_failed_child,
    requeue_child_first_then_parent_adopts_its_success,
    a_fix_and_replay_success_unblocks_the_origins_parent,
    bad_remote_step_names_are_typed_errors,
    a_requeued_run_parks_until_its_retry_reports,
    a_result_reported_while_the_run_was_failed_is_kept,
    heartbeats_keep_a_long_task_from_a_second_worker,
    shutdown_lets_a_running_handler_finish_and_report,
    a_panicking_handler_is_a_retryable_failure_and_a_bad_input_a_fatal_one,
    an_oversized_output_fails_the_step_at_once,
    a_remote_step_beside_a_local_step_is_dispatched_while_the_action_runs,
    bad_operator_input_is_a_typed_error_and_starts_nothing,
    a_worker_claims_again_after_a_full_claim_not_after_every_handler,
    a_claim_that_expires_counts_an_attempt_and_at_the_limit_the_step_crashed,
    a_claim_expired_at_the_redispatch_deadline_counts_an_attempt_too,
    a_cascading_cancel_cancels_a_pending_task_and_no_handler_runs,
    a_running_handler_learns_its_run_was_cancelled_and_its_report_is_refused,
    continuing_as_new_cancels_the_tasks_of_the_generation_left_behind,
);

fn options(h: &Harness) -> ResumeOptions {
    h.fast_options()
}

/// Runs resume passes until `name`/`id` reaches `status` (or panics after 10 s).
async fn until_status(
    h: &Harness,
    registry: &Registry,
    name: &str,
    id: &str,
    status: Status,
) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        keiro::worker::resume_once(&h.store, registry, &options(h)).await?;
        let row = h.keiro.instance((name, id)).await?.expect("instance");
        if row.status == status {
            return Ok(());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}/{id} is {:?} ({:?}), never {status:?}",
            row.status,
            row.last_error
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A remote worker running in the background until the guard drops.
struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    fn start(worker: RemoteWorker) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            worker
                .run_until(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

fn worker_options() -> RemoteWorkerOptions {
    RemoteWorkerOptions {
        poll_interval: Duration::from_millis(20),
        ..RemoteWorkerOptions::default()
    }
}

/// `shipping`: one remote step `print` with the given options, then a local step.
fn shipping(
    remote: RemoteOptions,
    ledger: Ledger,
) -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("shipping", move |ctx: Ctx, order: String| {
        let (remote, ledger) = (remote.clone(), ledger.clone());
        async move {
            let label: String = ctx.remote("print", &order, &remote).await?;
            ctx.step("after", || async {
                ledger.bump("after");
                Ok::<_, std::convert::Infallible>(())
            })
            .await?;
            Ok(label)
        }
    })?;
    Ok(registry)
}

async fn a_remote_step_runs_on_a_worker_and_the_run_resumes(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let registry = shipping(RemoteOptions::default(), ledger.clone())?;
    h.keiro.start("shipping", "s-1", &"order-1").await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    let row = h.keiro.instance(("shipping", "s-1")).await?.expect("row");
    assert_eq!(row.status, Status::Suspended, "parked on the remote step");
    let tasks = h.keiro.remote_tasks(("shipping", "s-1")).await?;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].step_id, "shipping/s-1/0/print");
    assert_eq!(tasks[0].group, "print");
    assert_eq!(tasks[0].status, TaskStatus::Pending);

    let seen = Ledger::default();
    let s = seen.clone();
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("print", move |order: String, task: TaskContext| {
            let s = s.clone();
            async move {
                s.bump(&format!("{}#{}", task.step_id, task.attempt));
                Ok::<_, TaskError>(format!("label:{order}"))
            }
        })
        .build();
    let running = Running::start(worker);
    until_status(&h, &registry, "shipping", "s-1", Status::Completed).await?;
    running.stop().await;

    let row = h.keiro.instance(("shipping", "s-1")).await?.expect("row");
    assert_eq!(row.output, Some(json!("label:order-1")));
    assert_eq!(seen.count("shipping/s-1/0/print#1"), 1);
    assert_eq!(ledger.count("after"), 1);
    let journal = h.keiro.journal(("shipping", "s-1")).await?;
    let recorded: Vec<_> = journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::StepRecorded { step, result, .. } if step.starts_with("remote:") => {
                Some((step.clone(), result.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        recorded,
        [("remote:print".to_owned(), json!({"ok": "label:order-1"}))]
    );
    let tasks = h.keiro.remote_tasks(("shipping", "s-1")).await?;
    assert_eq!(tasks[0].status, TaskStatus::Completed);
    Ok(())
}

async fn a_dispatch_is_written_once_per_step_id(h: Harness) -> TestResult {
    let registry = shipping(RemoteOptions::default(), Ledger::default())?;
    h.keiro.start("shipping", "s-2", &"order-2").await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    // A re-drive (here: a forced one, as after a crash) arms again and finds the task.
    let k = key("shipping", "s-2");
    let workflow = registry.get(&k.name).expect("registered");
    keiro_tests::run_inline(&h, &k, workflow.as_ref()).await?;
    keiro_tests::run_inline(&h, &k, workflow.as_ref()).await?;
    let tasks = h.keiro.remote_tasks(("shipping", "s-2")).await?;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].dispatches, 1);

    // Completing it twice journals once; the second report is AlreadySettled.
    let first = h
        .transport
        .task_complete(&tasks[0].step_id, &json!("a"))
        .await?;
    let second = h
        .transport
        .task_complete(&tasks[0].step_id, &json!("b"))
        .await?;
    assert_eq!(first, keiro::remote::ReportOutcome::Delivered);
    assert_eq!(second, keiro::remote::ReportOutcome::AlreadySettled);
    until_status(&h, &registry, "shipping", "s-2", Status::Completed).await?;
    let row = h.keiro.instance(("shipping", "s-2")).await?.expect("row");
    assert_eq!(row.output, Some(json!("a")));
    Ok(())
}

async fn retryable_failures_back_off_then_succeed(h: Harness) -> TestResult {
    let backoff =
        Backoff::exponential(Duration::from_millis(30), Duration::from_millis(60)).without_jitter();
    let registry = shipping(
        RemoteOptions::default().retries(3, backoff),
        Ledger::default(),
    )?;
    h.keiro.start("shipping", "s-3", &"order-3").await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let a = attempts.clone();
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("print", move |_: String, task: TaskContext| {
            let a = a.clone();
            async move {
                a.lock()
                    .unwrap()
                    .push((task.attempt, std::time::Instant::now()));
                if task.attempt < 3 {
                    Err(TaskError::retryable("printer busy"))
                } else {
                    Ok("printed".to_owned())
                }
            }
        })
        .build();
    let running = Running::start(worker);
    until_status(&h, &registry, "shipping", "s-3", Status::Completed).await?;
    running.stop().await;
    let attempts = attempts.lock().unwrap().clone();
    let numbers: Vec<u32> = attempts.iter().map(|(n, _)| *n).collect();
    assert_eq!(numbers, [1, 2, 3]);
    // The backoff held: 30 ms after the first failure, 60 ms after the second.
    assert!(
        attempts[1].1 - attempts[0].1 >= Duration::from_millis(25),
        "{attempts:?}"
    );
    assert!(
        attempts[2].1 - attempts[1].1 >= Duration::from_millis(50),
        "{attempts:?}"
    );
    let tasks = h.keiro.remote_tasks(("shipping", "s-3")).await?;
    assert_eq!(
        (tasks[0].status, tasks[0].attempts),
        (TaskStatus::Completed, 2)
    );
    Ok(())
}

async fn a_not_retryable_failure_fails_at_once(h: Harness) -> TestResult {
    let registry = shipping(
        RemoteOptions::default().retries(5, Backoff::default()),
        Ledger::default(),
    )?;
    h.keiro.start("shipping", "s-4", &"order-4").await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("print", move |_: String, _task: TaskContext| {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                Err::<String, _>(TaskError::fatal("no such address").with_code("bad_address"))
            }
        })
        .build();
    let running = Running::start(worker);
    // The body propagates the error: the run fails at once, without crash retries.
    until_status(&h, &registry, "shipping", "s-4", Status::Failed).await?;
    running.stop().await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let row = h.keiro.instance(("shipping", "s-4")).await?.expect("row");
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("no such address"), "{error}");
    let tasks = h.keiro.remote_tasks(("shipping", "s-4")).await?;
    assert_eq!(
        (tasks[0].status, tasks[0].attempts),
        (TaskStatus::Failed, 1)
    );
    assert_eq!(last_error_code(&tasks[0]), Some(json!("bad_address")));
    Ok(())
}

async fn exhausted_retries_reach_the_body_as_a_remote_step_error(h: Harness) -> TestResult {
    let backoff = Backoff::exponential(Duration::from_millis(5), Duration::from_millis(5));
    let mut registry = Registry::new();
    registry.register("fallback", move |ctx: Ctx, (): ()| {
        let backoff = backoff;
        async move {
            let options = RemoteOptions::default().retries(2, backoff);
            match ctx.remote::<_, String>("print", &(), &options).await {
                Ok(label) => Ok(label),
                Err(WorkflowError::Remote(e)) => Ok(format!(
                    "handled {} after {} attempts, code {:?}, retryable {}",
                    e.message, e.attempts, e.code, e.retryable
                )),
                Err(e) => Err(e),
            }
        }
    })?;
    h.keiro.start("fallback", "f-1", &()).await?;
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("print", |(): (), _task: TaskContext| async move {
            Err::<String, _>(TaskError::retryable("jammed").with_code("jam"))
        })
        .build();
    let running = Running::start(worker);
    until_status(&h, &registry, "fallback", "f-1", Status::Completed).await?;
    running.stop().await;
    let row = h.keiro.instance(("fallback", "f-1")).await?.expect("row");
    assert_eq!(
        row.output,
        Some(json!(
            "handled jammed after 3 attempts, code Some(\"jam\"), retryable true"
        ))
    );
    Ok(())
}

async fn a_silent_task_is_redispatched_and_then_lost(h: Harness) -> TestResult {
    let mut registry = Registry::new();
    registry.register("silent", |ctx: Ctx, (): ()| async move {
        let options = RemoteOptions::default().redispatch(Duration::from_millis(150), 2);
        match ctx.remote::<_, String>("void", &(), &options).await {
            Err(WorkflowError::Remote(e)) if e.is_lost() => Ok(format!("lost: {}", e.message)),
            other => other,
        }
    })?;
    h.keiro.start("silent", "v-1", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    let row = h.keiro.instance(("silent", "v-1")).await?.expect("row");
    assert_eq!(row.status, Status::Suspended);
    assert!(
        row.wake_after.is_some(),
        "the redispatch deadline is the wake hint"
    );
    // Nobody serves `void`: after the deadline the next pass re-dispatches, after the second
    // the step is lost and the body handles it.
    let mut dispatches = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
        let tasks = h.keiro.remote_tasks(("silent", "v-1")).await?;
        dispatches.push(tasks[0].dispatches);
        if h.keiro
            .instance(("silent", "v-1"))
            .await?
            .expect("row")
            .status
            == Status::Completed
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never lost: {dispatches:?}"
        );
    }
    assert!(dispatches.contains(&2), "{dispatches:?}");
    let row = h.keiro.instance(("silent", "v-1")).await?.expect("row");
    let output = row
        .output
        .and_then(|o| o.as_str().map(str::to_owned))
        .unwrap_or_default();
    assert!(output.starts_with("lost: "), "{output}");
    let tasks = h.keiro.remote_tasks(("silent", "v-1")).await?;
    assert_eq!(
        (tasks[0].status, tasks[0].dispatches),
        (TaskStatus::Failed, 2)
    );
    assert_eq!(
        last_error_code(&tasks[0]),
        Some(json!(keiro::remote::RemoteStepError::LOST))
    );
    Ok(())
}

async fn a_dead_workers_task_is_redispatched_and_completes(h: Harness) -> TestResult {
    let registry = shipping(
        RemoteOptions::default().redispatch(Duration::from_millis(200), 5),
        Ledger::default(),
    )?;
    h.keiro.start("shipping", "s-5", &"order-5").await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    // A worker claims the task with a long claim and dies without a word.
    let claimed = h
        .transport
        .tasks_claim(&keiro_remote::ClaimRequest {
            groups: vec!["print".into()],
            worker: "doomed".into(),
            limit: 10,
            claim_ttl: Duration::from_secs(3600),
        })
        .await?;
    assert_eq!(claimed.len(), 1);
    let dead_claim = claimed[0].claim;
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("print", |order: String, task: TaskContext| async move {
            Ok::<_, TaskError>(format!("{order} on dispatch {}", task.dispatches))
        })
        .build();
    let running = Running::start(worker);
    until_status(&h, &registry, "shipping", "s-5", Status::Completed).await?;
    running.stop().await;
    let row = h.keiro.instance(("shipping", "s-5")).await?.expect("row");
    assert_eq!(row.output, Some(json!("order-5 on dispatch 2")));
    // The dead claim's late failure is ignored.
    let late = h
        .transport
        .task_fail(
            &claimed[0].step_id,
            dead_claim,
            &keiro_remote::TaskFailure {
                message: "late".into(),
                code: None,
                retryable: true,
            },
            Duration::ZERO,
        )
        .await?;
    assert_eq!(late, keiro::remote::ReportOutcome::AlreadySettled);
    Ok(())
}

async fn redispatch_pending_counts_the_runs_pending_steps(h: Harness) -> TestResult {
    let registry = pair()?;
    h.keiro.start("pair", "p-1", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    assert_eq!(h.keiro.remote_tasks(("pair", "p-1")).await?.len(), 2);
    assert_eq!(h.keiro.redispatch_pending(("pair", "p-1")).await?, 2);
    let tasks = h.keiro.remote_tasks(("pair", "p-1")).await?;
    assert!(tasks
        .iter()
        .all(|t| t.dispatches == 2 && t.status == TaskStatus::Pending));
    assert!(matches!(
        h.keiro.redispatch_pending(("pair", "nobody")).await,
        Err(keiro::Error::Admin(
            keiro_remote::AdminError::NotFound { .. }
        ))
    ));
    // Once both complete there is nothing left to re-dispatch.
    for task in &tasks {
        let n = if task.step == "left" { 1 } else { 2 };
        h.transport
            .task_complete(&task.step_id, &json!(n * 10))
            .await?;
    }
    until_status(&h, &registry, "pair", "p-1", Status::Completed).await?;
    assert_eq!(h.keiro.redispatch_pending(("pair", "p-1")).await?, 0);
    assert_eq!(
        h.keiro
            .instance(("pair", "p-1"))
            .await?
            .expect("row")
            .output,
        Some(json!(30))
    );
    Ok(())
}

/// `pair`: two remote steps awaited together (`left` and `right`), their sum.
fn pair() -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("pair", |ctx: Ctx, (): ()| async move {
        let options = RemoteOptions::default();
        let (a, b) = tokio::join!(
            ctx.remote::<_, u32>("left", &1, &options),
            ctx.remote::<_, u32>("right", &2, &options)
        );
        Ok(a? + b?)
    })?;
    Ok(registry)
}

/// A `print` handler that fails (not retryable) while `broken` is set.
fn flaky_printer(h: &Harness, broken: Arc<AtomicBool>, calls: Ledger) -> RemoteWorker {
    RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("print", move |order: String, _task: TaskContext| {
            let (broken, calls) = (broken.clone(), calls.clone());
            async move {
                calls.bump(&order);
                if broken.load(Ordering::SeqCst) {
                    Err(TaskError::fatal("printer on fire"))
                } else {
                    Ok(format!("label:{order}"))
                }
            }
        })
        .build()
}

async fn requeue_retries_a_failed_remote_step(h: Harness) -> TestResult {
    let ledger = Ledger::default();
    let registry = shipping(RemoteOptions::default(), ledger.clone())?;
    h.keiro.start("shipping", "s-6", &"order-6").await?;
    let broken = Arc::new(AtomicBool::new(true));
    let calls = Ledger::default();
    let running = Running::start(flaky_printer(&h, broken.clone(), calls.clone()));
    until_status(&h, &registry, "shipping", "s-6", Status::Failed).await?;

    broken.store(false, Ordering::SeqCst);
    let outcome = h.keiro.requeue(("shipping", "s-6")).await?;
    assert_eq!(
        outcome,
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: vec![]
        }
    );
    let row = h.keiro.instance(("shipping", "s-6")).await?.expect("row");
    assert_eq!(
        (row.status, row.last_error.as_deref()),
        (Status::Running, None)
    );
    until_status(&h, &registry, "shipping", "s-6", Status::Completed).await?;
    running.stop().await;
    assert_eq!(calls.count("order-6"), 2);
    assert_eq!(ledger.count("after"), 1);

    // History is appended to: the failure, the reset, the retry's result all remain.
    let journal = h.keiro.journal(("shipping", "s-6")).await?;
    let names: Vec<String> = journal
        .iter()
        .map(|e| e.event.step_name().into_owned())
        .collect();
    let position = |name: &str| {
        names
            .iter()
            .position(|n| n == name)
            .unwrap_or_else(|| panic!("{name} missing from {names:?}"))
    };
    assert!(position("remote:print") < position("__workflow_step_reset__:remote:print"));
    assert!(position("__workflow_step_reset__:remote:print") < position("remote:print#1"));
    assert!(names.iter().any(|n| n.starts_with("__workflow_failed__")));
    assert!(names
        .iter()
        .any(|n| n.starts_with("__workflow_resurrected__")));
    // A run that is not failed is not requeued.
    assert_eq!(
        h.keiro.requeue(("shipping", "s-6")).await?,
        RequeueOutcome::NotFailed(Status::Completed)
    );
    Ok(())
}

/// `parent` awaits child `kid`, whose only step is the remote `print`.
fn family() -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("parent", |ctx: Ctx, id: String| async move {
        let label: String = ctx.child("kid", &id, &id).await?;
        Ok(format!("parent got {label}"))
    })?;
    registry.register("kid", |ctx: Ctx, order: String| async move {
        let label: String = ctx
            .remote("print", &order, &RemoteOptions::default())
            .await?;
        Ok(label)
    })?;
    Ok(registry)
}

async fn requeue_parent_first_cascades_to_the_failed_child(h: Harness) -> TestResult {
    let registry = family()?;
    h.keiro.start("parent", "p-2", &"k-2").await?;
    let broken = Arc::new(AtomicBool::new(true));
    let calls = Ledger::default();
    let running = Running::start(flaky_printer(&h, broken.clone(), calls.clone()));
    until_status(&h, &registry, "parent", "p-2", Status::Failed).await?;
    assert_eq!(
        h.keiro.instance(("kid", "k-2")).await?.expect("kid").status,
        Status::Failed
    );

    broken.store(false, Ordering::SeqCst);
    let outcome = h.keiro.requeue(("parent", "p-2")).await?;
    assert_eq!(
        outcome,
        RequeueOutcome::Requeued {
            reset_steps: 2,
            children: vec![key("kid", "k-2")]
        }
    );
    until_status(&h, &registry, "parent", "p-2", Status::Completed).await?;
    running.stop().await;
    assert_eq!(
        h.keiro
            .instance(("parent", "p-2"))
            .await?
            .expect("row")
            .output,
        Some(json!("parent got label:k-2"))
    );
    assert_eq!(calls.count("k-2"), 2);
    Ok(())
}

async fn requeue_child_first_then_parent_adopts_its_success(h: Harness) -> TestResult {
    let registry = family()?;
    h.keiro.start("parent", "p-3", &"k-3").await?;
    let broken = Arc::new(AtomicBool::new(true));
    let calls = Ledger::default();
    let running = Running::start(flaky_printer(&h, broken.clone(), calls.clone()));
    until_status(&h, &registry, "parent", "p-3", Status::Failed).await?;

    broken.store(false, Ordering::SeqCst);
    assert!(matches!(
        h.keiro.requeue(("kid", "k-3")).await?,
        RequeueOutcome::Requeued { reset_steps: 1, .. }
    ));
    until_status(&h, &registry, "kid", "k-3", Status::Completed).await?;
    // The parent is still failed: the child's success waits in the child's row.
    assert_eq!(
        h.keiro
            .instance(("parent", "p-3"))
            .await?
            .expect("row")
            .status,
        Status::Failed
    );
    let outcome = h.keiro.requeue(("parent", "p-3")).await?;
    assert_eq!(
        outcome,
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: vec![]
        }
    );
    until_status(&h, &registry, "parent", "p-3", Status::Completed).await?;
    running.stop().await;
    assert_eq!(
        h.keiro
            .instance(("parent", "p-3"))
            .await?
            .expect("row")
            .output,
        Some(json!("parent got label:k-3"))
    );
    assert_eq!(
        calls.count("k-3"),
        2,
        "the child's step is not run a third time"
    );
    Ok(())
}

async fn a_fix_and_replay_success_unblocks_the_origins_parent(h: Harness) -> TestResult {
    let registry = family()?;
    h.keiro.start("parent", "p-4", &"k-4").await?;
    // The printer rejects this order's input for good; a corrected input will do.
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("print", |order: String, _task: TaskContext| async move {
            if order.contains("fixed") {
                Ok(format!("label:{order}"))
            } else {
                Err(TaskError::fatal("unknown address"))
            }
        })
        .build();
    let running = Running::start(worker);
    until_status(&h, &registry, "parent", "p-4", Status::Failed).await?;

    let retry = h
        .keiro
        .retry_with_input(("kid", "k-4"), &"k-4 fixed")
        .await?;
    assert!(retry.id.as_str().starts_with("k-4~retry~"), "{retry}");
    until_status(&h, &registry, "kid", retry.id.as_str(), Status::Completed).await?;
    // The origin is untouched.
    assert_eq!(
        h.keiro.instance(("kid", "k-4")).await?.expect("row").status,
        Status::Failed
    );
    let outcome = h.keiro.requeue(("parent", "p-4")).await?;
    assert_eq!(
        outcome,
        RequeueOutcome::Requeued {
            reset_steps: 1,
            children: vec![]
        },
        "the retry's success counts as the child's: the origin is not requeued"
    );
    until_status(&h, &registry, "parent", "p-4", Status::Completed).await?;
    running.stop().await;
    assert_eq!(
        h.keiro
            .instance(("parent", "p-4"))
            .await?
            .expect("row")
            .output,
        Some(json!("parent got label:k-4 fixed"))
    );
    assert_eq!(
        h.keiro.instance(("kid", "k-4")).await?.expect("row").status,
        Status::Failed
    );
    Ok(())
}

async fn bad_remote_step_names_are_typed_errors(h: Harness) -> TestResult {
    let mut registry = Registry::new();
    registry.register("names", |ctx: Ctx, name: String| async move {
        match ctx
            .remote::<_, ()>(&name, &(), &RemoteOptions::default())
            .await
        {
            Err(WorkflowError::InvalidStep(_)) => Ok("invalid".to_owned()),
            Err(e) => Err(e),
            Ok(()) => Ok("accepted".to_owned()),
        }
    })?;
    for (i, name) in ["a#1", "a@b", "remote:x", ""].iter().enumerate() {
        let id = format!("n-{i}");
        h.keiro.start("names", &id, name).await?;
        until_status(&h, &registry, "names", &id, Status::Completed).await?;
        assert_eq!(
            h.keiro.instance(("names", &id)).await?.expect("row").output,
            Some(json!("invalid")),
            "{name:?}"
        );
    }
    assert!(h.keiro.remote_tasks(("names", "n-0")).await?.is_empty());
    Ok(())
}

async fn a_requeued_run_parks_until_its_retry_reports(h: Harness) -> TestResult {
    let registry = shipping(RemoteOptions::default(), Ledger::default())?;
    h.keiro.start("shipping", "s-7", &"order-7").await?;
    let broken = Arc::new(AtomicBool::new(true));
    let running = Running::start(flaky_printer(&h, broken, Ledger::default()));
    until_status(&h, &registry, "shipping", "s-7", Status::Failed).await?;
    running.stop().await;

    h.keiro.requeue(("shipping", "s-7")).await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    // The superseded failure does not count as the step's value: the run parks, and a pass
    // finds nothing to do until the retry reports.
    let row = h.keiro.instance(("shipping", "s-7")).await?.expect("row");
    assert_eq!(row.status, Status::Suspended);
    assert_eq!(
        keiro::worker::resume_once(&h.store, &registry, &options(&h))
            .await?
            .discovered,
        0
    );
    let tasks = h.keiro.remote_tasks(("shipping", "s-7")).await?;
    assert_eq!(
        (tasks[0].status, tasks[0].journal_step.as_str()),
        (TaskStatus::Pending, "remote:print#1")
    );
    h.transport
        .task_complete(&tasks[0].step_id, &json!("label:again"))
        .await?;
    until_status(&h, &registry, "shipping", "s-7", Status::Completed).await?;
    assert_eq!(
        h.keiro
            .instance(("shipping", "s-7"))
            .await?
            .expect("row")
            .output,
        Some(json!("label:again"))
    );
    Ok(())
}

async fn a_result_reported_while_the_run_was_failed_is_kept(h: Harness) -> TestResult {
    let registry = pair()?;
    h.keiro.start("pair", "p-2", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    let claim = |group: &str| keiro_remote::ClaimRequest {
        groups: vec![group.into()],
        worker: "test".into(),
        limit: 1,
        claim_ttl: Duration::from_secs(60),
    };
    let left = h.transport.tasks_claim(&claim("left")).await?.remove(0);
    let right = h.transport.tasks_claim(&claim("right")).await?.remove(0);
    let fatal = keiro_remote::TaskFailure {
        message: "left broke".into(),
        code: None,
        retryable: false,
    };
    h.transport
        .task_fail(&left.step_id, left.claim, &fatal, Duration::ZERO)
        .await?;
    until_status(&h, &registry, "pair", "p-2", Status::Failed).await?;
    // The sibling's result arrives while its run is failed.
    assert_eq!(
        h.transport
            .task_complete(&right.step_id, &json!(20))
            .await?,
        keiro::remote::ReportOutcome::OwnerGone
    );
    h.keiro.requeue(("pair", "p-2")).await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    let left = h.transport.tasks_claim(&claim("left")).await?.remove(0);
    h.transport.task_complete(&left.step_id, &json!(10)).await?;
    until_status(&h, &registry, "pair", "p-2", Status::Completed).await?;
    assert_eq!(
        h.keiro
            .instance(("pair", "p-2"))
            .await?
            .expect("row")
            .output,
        Some(json!(30)),
        "the kept result of `right` counts"
    );
    Ok(())
}

async fn heartbeats_keep_a_long_task_from_a_second_worker(h: Harness) -> TestResult {
    let registry = shipping(RemoteOptions::default(), Ledger::default())?;
    h.keiro.start("shipping", "s-8", &"order-8").await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    // Claims last 300 ms; the handler takes 1.2 s; heartbeats every 100 ms keep the claim.
    let runs = Ledger::default();
    let slow_worker = |name: &str| {
        let (runs, name) = (runs.clone(), name.to_owned());
        RemoteWorker::builder(h.transport.clone())
            .options(RemoteWorkerOptions {
                poll_interval: Duration::from_millis(20),
                claim_ttl: Duration::from_millis(300),
                heartbeat_every: Duration::from_millis(100),
                ..RemoteWorkerOptions::default()
            })
            .handle("print", move |order: String, _task: TaskContext| {
                let (runs, name) = (runs.clone(), name.clone());
                async move {
                    runs.bump("print");
                    runs.bump(&name);
                    tokio::time::sleep(Duration::from_millis(1200)).await;
                    Ok::<_, TaskError>(format!("slow label:{order}"))
                }
            })
            .build()
    };
    let first = Running::start(slow_worker("first"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while runs.count("print") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never claimed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = Running::start(slow_worker("second"));
    until_status(&h, &registry, "shipping", "s-8", Status::Completed).await?;
    first.stop().await;
    second.stop().await;
    assert_eq!(runs.count("print"), 1, "{:?}", runs.all());
    assert_eq!(runs.count("first"), 1);
    Ok(())
}

async fn shutdown_lets_a_running_handler_finish_and_report(h: Harness) -> TestResult {
    let registry = shipping(RemoteOptions::default(), Ledger::default())?;
    h.keiro.start("shipping", "s-9", &"order-9").await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("print", move |order: String, _task: TaskContext| {
            let s = s.clone();
            async move {
                s.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok::<_, TaskError>(format!("label:{order}"))
            }
        })
        .build();
    let running = Running::start(worker);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !started.load(Ordering::SeqCst) {
        assert!(tokio::time::Instant::now() < deadline, "never claimed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Asked to stop mid-handler: it claims nothing more, but the running handler finishes
    // and its result is reported before `run_until` returns.
    running.stop().await;
    let tasks = h.keiro.remote_tasks(("shipping", "s-9")).await?;
    assert_eq!(tasks[0].status, TaskStatus::Completed);
    until_status(&h, &registry, "shipping", "s-9", Status::Completed).await?;
    Ok(())
}

async fn a_panicking_handler_is_a_retryable_failure_and_a_bad_input_a_fatal_one(
    h: Harness,
) -> TestResult {
    let mut registry = Registry::new();
    registry.register("odd", |ctx: Ctx, input: serde_json::Value| async move {
        let options = RemoteOptions::default().retries(
            1,
            Backoff::exponential(Duration::from_millis(5), Duration::from_millis(5)),
        );
        match ctx.remote::<_, u32>("count", &input, &options).await {
            Err(WorkflowError::Remote(e)) => Ok(format!(
                "{} after {} attempt(s): {}",
                e.code.unwrap_or_default(),
                e.attempts,
                e.message
            )),
            Err(e) => Err(e),
            Ok(n) => Ok(n.to_string()),
        }
    })?;
    h.keiro.start("odd", "panics", &json!(7)).await?;
    h.keiro
        .start("odd", "bad-input", &json!("not a number"))
        .await?;
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("count", |n: u32, _task: TaskContext| async move {
            if n == 7 {
                panic!("seven is unlucky");
            }
            Ok::<_, TaskError>(n)
        })
        .build();
    let running = Running::start(worker);
    until_status(&h, &registry, "odd", "panics", Status::Completed).await?;
    until_status(&h, &registry, "odd", "bad-input", Status::Completed).await?;
    running.stop().await;
    let output = |id: &str| {
        let keiro = h.keiro.clone();
        let id = id.to_owned();
        async move {
            keiro
                .instance(("odd", &id))
                .await
                .map(|row| row.and_then(|r| r.output).unwrap_or_default())
        }
    };
    let panicked = output("panics").await?;
    let panicked = panicked.as_str().unwrap_or_default();
    assert!(
        panicked.starts_with(" after 2 attempt(s): the handler panicked: seven is unlucky"),
        "a panic is retried, then reported: {panicked}"
    );
    let bad = output("bad-input").await?;
    let bad = bad.as_str().unwrap_or_default();
    assert!(bad.starts_with("bad_input after 1 attempt(s)"), "{bad}");
    Ok(())
}

async fn an_oversized_output_fails_the_step_at_once(h: Harness) -> TestResult {
    let registry = shipping(
        RemoteOptions::default().retries(3, Backoff::default()),
        Ledger::default(),
    )?;
    h.keiro.start("shipping", "s-10", &"order-10").await?;
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(RemoteWorkerOptions {
            payload_len_max: 64,
            ..worker_options()
        })
        .handle("print", |_: String, _task: TaskContext| async move {
            Ok::<_, TaskError>("x".repeat(100))
        })
        .build();
    let running = Running::start(worker);
    until_status(&h, &registry, "shipping", "s-10", Status::Failed).await?;
    running.stop().await;
    let tasks = h.keiro.remote_tasks(("shipping", "s-10")).await?;
    assert_eq!(
        (tasks[0].status, tasks[0].attempts),
        (TaskStatus::Failed, 1)
    );
    assert_eq!(last_error_code(&tasks[0]), Some(json!("output_too_large")));
    assert_eq!(tasks[0].output, None, "the oversized output is not stored");
    Ok(())
}

async fn a_remote_step_beside_a_local_step_is_dispatched_while_the_action_runs(
    h: Harness,
) -> TestResult {
    // The dispatch waits for the park only while nothing else is to be done: a step's action
    // running beside the remote step could take long, so the task is written meanwhile.
    let seen = Arc::new(std::sync::Mutex::new(None));
    let (admin, s) = (h.admin.clone(), seen.clone());
    let mut registry = Registry::new();
    registry.register("beside", move |ctx: Ctx, (): ()| {
        let (admin, seen) = (admin.clone(), s.clone());
        async move {
            let owner = ctx.key().clone();
            let options = RemoteOptions::default();
            let (label, local) = tokio::join!(
                ctx.remote::<_, String>("print", &"b", &options),
                ctx.step("local", || async move {
                    // A long action: the remote step must not wait for it.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let tasks = admin
                        .remote_tasks(&owner)
                        .await
                        .map_err(|e| e.to_string())?;
                    *seen.lock().unwrap() = Some(tasks.len());
                    Ok::<_, String>(1u32)
                })
            );
            Ok(format!("{}+{}", label?, local?))
        }
    })?;
    h.keiro.start("beside", "b-1", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    assert_eq!(
        *seen.lock().unwrap(),
        Some(1),
        "the task was written while the action ran"
    );
    let tasks = h.keiro.remote_tasks(("beside", "b-1")).await?;
    h.transport
        .task_complete(&tasks[0].step_id, &json!("L"))
        .await?;
    until_status(&h, &registry, "beside", "b-1", Status::Completed).await?;
    assert_eq!(
        h.keiro
            .instance(("beside", "b-1"))
            .await?
            .expect("row")
            .output,
        Some(json!("L+1"))
    );
    assert_eq!(h.keiro.remote_tasks(("beside", "b-1")).await?.len(), 1);
    Ok(())
}

async fn bad_operator_input_is_a_typed_error_and_starts_nothing(h: Harness) -> TestResult {
    let keiro = h.keiro.clone().with_payload_len_max(32);
    h.keiro.start("shipping", "s-11", &"order-11").await?;
    let oversized = keiro
        .retry_with_input(("shipping", "s-11"), &"y".repeat(100))
        .await;
    assert!(
        matches!(
            oversized,
            Err(keiro::Error::Admin(keiro_remote::AdminError::Payload(_)))
        ),
        "{oversized:?}"
    );
    let unknown = keiro.retry_with_input(("shipping", "nobody"), &"z").await;
    assert!(
        matches!(
            unknown,
            Err(keiro::Error::Admin(
                keiro_remote::AdminError::NotFound { .. }
            ))
        ),
        "{unknown:?}"
    );
    assert!(matches!(
        h.keiro.requeue(("shipping", "nobody")).await,
        Err(keiro::Error::Admin(
            keiro_remote::AdminError::NotFound { .. }
        ))
    ));
    assert!(matches!(
        h.keiro.requeue(("shipping", "bad/id")).await,
        Err(keiro::Error::InvalidId(_))
    ));
    // Nothing was started beside the origin.
    let retries = h
        .keiro
        .instance(("shipping", "s-11"))
        .await?
        .map(|row| row.key.id.to_string());
    assert_eq!(retries.as_deref(), Some("s-11"));
    Ok(())
}

/// The `code` of a task's last error.
fn last_error_code(task: &keiro::remote::RemoteTask) -> Option<serde_json::Value> {
    task.last_error
        .as_ref()
        .and_then(|e| e.get("code"))
        .cloned()
}

/// A transport that counts claims, so a test can see when the worker asks for work.
#[derive(Debug)]
struct CountingClaims {
    inner: Arc<dyn keiro_remote::Transport>,
    claims: AtomicU32,
}

#[async_trait::async_trait]
impl keiro_remote::Transport for CountingClaims {
    async fn tasks_claim(
        &self,
        request: &keiro_remote::ClaimRequest,
    ) -> keiro_journal::store::Result<Vec<keiro_remote::ClaimedTask>> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.tasks_claim(request).await
    }

    async fn task_heartbeat(
        &self,
        step_id: &str,
        claim: uuid::Uuid,
        ttl: Duration,
    ) -> keiro_journal::store::Result<keiro_remote::HeartbeatOutcome> {
        self.inner.task_heartbeat(step_id, claim, ttl).await
    }

    async fn task_complete(
        &self,
        step_id: &str,
        output: &serde_json::Value,
    ) -> keiro_journal::store::Result<keiro::remote::ReportOutcome> {
        self.inner.task_complete(step_id, output).await
    }

    async fn tasks_complete(
        &self,
        reports: &[(String, serde_json::Value)],
    ) -> keiro_journal::store::Result<Vec<keiro::remote::ReportOutcome>> {
        self.inner.tasks_complete(reports).await
    }

    async fn task_fail(
        &self,
        step_id: &str,
        claim: uuid::Uuid,
        failure: &keiro_remote::TaskFailure,
        retry_delay: Duration,
    ) -> keiro_journal::store::Result<keiro::remote::ReportOutcome> {
        self.inner
            .task_fail(step_id, claim, failure, retry_delay)
            .await
    }
}

/// Waits until the remote tasks of the `shipping` runs `ids` have all completed (10 s at most).
async fn all_completed(h: &Harness, ids: &[&str]) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut done = 0;
        for id in ids {
            let tasks = h.keiro.remote_tasks(("shipping", id)).await?;
            done += tasks
                .iter()
                .filter(|t| t.status == TaskStatus::Completed)
                .count();
        }
        if done == ids.len() {
            return Ok(());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a task waited for the poll"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn a_worker_claims_again_after_a_full_claim_not_after_every_handler(
    h: Harness,
) -> TestResult {
    let registry = shipping(RemoteOptions::default(), Ledger::default())?;
    // A worker whose poll lies far beyond the test: only its own claims can move it.
    let worker = |concurrency: usize| {
        let counting = Arc::new(CountingClaims {
            inner: h.transport.clone(),
            claims: AtomicU32::new(0),
        });
        let worker = RemoteWorker::builder(counting.clone())
            .options(RemoteWorkerOptions {
                concurrency,
                poll_interval: Duration::from_secs(600),
                ..RemoteWorkerOptions::default()
            })
            .handle("print", |order: String, _task: TaskContext| async move {
                Ok::<_, TaskError>(format!("label:{order}"))
            })
            .build();
        (counting, Running::start(worker))
    };
    // Two slots, one task: the claim comes back short, so the queue was empty then, and the
    // handler finishing does not send the worker back to the store (only a wake would).
    h.keiro.start("shipping", "c-1", &"c-1").await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    let (counting, running) = worker(2);
    all_completed(&h, &["c-1"]).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let claims = counting.claims.load(Ordering::SeqCst);
    running.stop().await;
    assert_eq!(claims, 1, "one claim, none after the handler finished");

    // One slot, two tasks: the first claim fills the slot, so more may be waiting and the
    // worker claims again as soon as the slot is free, without waiting for the poll; the third
    // claim comes back empty.
    for id in ["c-2", "c-3"] {
        h.keiro.start("shipping", id, &id).await?;
    }
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    let (counting, running) = worker(1);
    all_completed(&h, &["c-2", "c-3"]).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let claims = counting.claims.load(Ordering::SeqCst);
    running.stop().await;
    assert_eq!(claims, 3, "full, full, then empty");
    Ok(())
}

/// `fragile`: one remote step `print` with `retries` (and `redispatch`, when given); the body
/// turns the step's final failure into its output, `"<code> after <attempts>"`.
fn fragile(
    retries: u32,
    redispatch: Option<Duration>,
) -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("fragile", move |ctx: Ctx, order: String| async move {
        let mut options = RemoteOptions::default().retries(retries, Backoff::default());
        if let Some(after) = redispatch {
            options = options.redispatch(after, 10);
        }
        match ctx.remote::<_, String>("print", &order, &options).await {
            Ok(label) => Ok(label),
            Err(WorkflowError::Remote(e)) => Ok(format!(
                "{} after {}",
                e.code.unwrap_or_default(),
                e.attempts
            )),
            Err(e) => Err(e),
        }
    })?;
    Ok(registry)
}

/// Claims the `print` tasks as a worker that dies at once: nothing is ever reported, the claim
/// only expires (after 50 ms).
async fn claim_and_die(
    h: &Harness,
) -> Result<Vec<keiro_remote::ClaimedTask>, keiro::store::StoreError> {
    h.transport
        .tasks_claim(&keiro_remote::ClaimRequest {
            groups: vec!["print".into()],
            worker: "doomed".into(),
            limit: 10,
            claim_ttl: Duration::from_millis(50),
        })
        .await
}

async fn a_claim_that_expires_counts_an_attempt_and_at_the_limit_the_step_crashed(
    h: Harness,
) -> TestResult {
    // Three attempts in all; every one is claimed by a worker whose process dies.
    let registry = fragile(2, None)?;
    h.keiro.start("fragile", "f-1", &"order-1").await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    for attempt in 1..=3 {
        let claimed = claim_and_die(&h).await?;
        assert_eq!(
            claimed.iter().map(|t| t.attempt).collect::<Vec<_>>(),
            [attempt],
            "the expired claims before this one each counted an attempt"
        );
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    // The third claim expired too: the next claim fails the step instead of handing it out
    // again, and the run sees the crash.
    let calls = Ledger::default();
    let c = calls.clone();
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("print", move |order: String, _task: TaskContext| {
            let c = c.clone();
            async move {
                c.bump("print");
                Ok::<_, TaskError>(format!("label:{order}"))
            }
        })
        .build();
    let running = Running::start(worker);
    until_status(&h, &registry, "fragile", "f-1", Status::Completed).await?;
    running.stop().await;
    assert_eq!(calls.count("print"), 0, "the crashed step never ran again");
    let row = h.keiro.instance(("fragile", "f-1")).await?.expect("row");
    assert_eq!(
        row.output,
        Some(json!(format!(
            "{} after 3",
            keiro::remote::RemoteStepError::CRASHED
        )))
    );
    let tasks = h.keiro.remote_tasks(("fragile", "f-1")).await?;
    assert_eq!(
        (tasks[0].status, tasks[0].attempts, tasks[0].dispatches),
        (TaskStatus::Failed, 3, 1)
    );
    assert_eq!(
        last_error_code(&tasks[0]),
        Some(json!(keiro::remote::RemoteStepError::CRASHED))
    );
    assert!(claim_and_die(&h).await?.is_empty());
    Ok(())
}

async fn a_claim_expired_at_the_redispatch_deadline_counts_an_attempt_too(
    h: Harness,
) -> TestResult {
    // Two attempts in all. No worker claims between a claim's expiry and the step's
    // redispatch deadline, so the run's re-arm is what finds the dead claim.
    let registry = fragile(1, Some(Duration::from_millis(150)))?;
    h.keiro.start("fragile", "f-2", &"order-2").await?;
    keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
    assert_eq!(claim_and_die(&h).await?.len(), 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
        let tasks = h.keiro.remote_tasks(("fragile", "f-2")).await?;
        if tasks[0].dispatches == 2 {
            assert_eq!(
                (tasks[0].status, tasks[0].attempts),
                (TaskStatus::Pending, 1),
                "the redispatch counted the expired claim"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never redispatched");
    }
    let claimed = claim_and_die(&h).await?;
    assert_eq!(claimed.iter().map(|t| t.attempt).collect::<Vec<_>>(), [2]);
    until_status(&h, &registry, "fragile", "f-2", Status::Completed).await?;
    let row = h.keiro.instance(("fragile", "f-2")).await?.expect("row");
    assert_eq!(
        row.output,
        Some(json!(format!(
            "{} after 2",
            keiro::remote::RemoteStepError::CRASHED
        )))
    );
    let tasks = h.keiro.remote_tasks(("fragile", "f-2")).await?;
    assert_eq!(
        (tasks[0].status, tasks[0].attempts, tasks[0].dispatches),
        (TaskStatus::Failed, 2, 2)
    );
    Ok(())
}

/// `checkout` awaits its child `order`, whose remote step `charge` retries three times; the
/// `charge` input is the order's id. `rotor` leaves its generation 0 with its `charge` task
/// pending: the task is dispatched while a step action runs beside it, and the body continues
/// as new without awaiting it.
fn payments() -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("checkout", |ctx: Ctx, order: String| async move {
        let receipt: String = ctx.child("order", &order, &order).await?;
        Ok(receipt)
    })?;
    registry.register("order", |ctx: Ctx, order: String| async move {
        let backoff = Backoff::exponential(Duration::from_millis(5), Duration::from_millis(5));
        let options = RemoteOptions::default().retries(3, backoff);
        let receipt: String = ctx.remote("charge", &order, &options).await?;
        Ok(receipt)
    })?;
    registry.register("rotor", |ctx: Ctx, generation: u32| async move {
        if generation > 0 {
            return Ok(format!("generation {generation}"));
        }
        let options = RemoteOptions::default();
        let (charged, slow) = tokio::join!(
            ctx.remote::<_, String>("charge", &"rotor", &options),
            ctx.step("slow", || async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, std::convert::Infallible>(())
            })
        );
        slow?;
        match charged {
            // Given up on: this generation ends with the task pending.
            Err(WorkflowError::Suspended { .. }) => Err(ctx.continue_as_new(&1u32)),
            other => other,
        }
    })?;
    Ok(registry)
}

/// Runs resume passes until `name`/`id` has a remote task (10 s at most).
async fn until_dispatched(h: &Harness, registry: &Registry, name: &str, id: &str) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while h.keiro.remote_tasks((name, id)).await?.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}/{id} never dispatched"
        );
        keiro::worker::resume_once(&h.store, registry, &options(h)).await?;
    }
    Ok(())
}

/// A `charge` worker that records every call and charges at once.
fn cashier(h: &Harness, calls: Ledger) -> RemoteWorker {
    RemoteWorker::builder(h.transport.clone())
        .options(worker_options())
        .handle("charge", move |order: String, _task: TaskContext| {
            let calls = calls.clone();
            async move {
                calls.bump(&order);
                Ok::<_, TaskError>(format!("receipt:{order}"))
            }
        })
        .build()
}

/// The remote results journaled for `name`/`id`.
async fn remote_results(h: &Harness, name: &str, id: &str) -> Result<Vec<String>, keiro::Error> {
    Ok(h.keiro
        .journal((name, id))
        .await?
        .into_iter()
        .filter_map(|e| match e.event {
            Event::StepRecorded { step, .. } if step.starts_with("remote:") => Some(step),
            _ => None,
        })
        .collect())
}

async fn a_cascading_cancel_cancels_a_pending_task_and_no_handler_runs(h: Harness) -> TestResult {
    let registry = payments()?;
    h.keiro.start("checkout", "c-1", &"o-1").await?;
    until_dispatched(&h, &registry, "order", "o-1").await?;
    h.keiro.cancel_cascade(("checkout", "c-1")).await?;
    for (name, id) in [("checkout", "c-1"), ("order", "o-1")] {
        let row = h.keiro.instance((name, id)).await?.expect("row");
        assert_eq!(row.status, Status::Cancelled, "{name}/{id}");
    }
    let tasks = h.keiro.remote_tasks(("order", "o-1")).await?;
    assert_eq!(
        (tasks.len(), tasks[0].status, tasks[0].claimed_by.as_deref()),
        (1, TaskStatus::Cancelled, None),
        "cancelled with its run, in the same transaction"
    );

    // A run dispatched later, which a worker claims together with anything else claimable: once
    // it completed, the cancelled task was passed over, not merely not reached yet.
    h.keiro.start("order", "o-2", &"o-2").await?;
    until_dispatched(&h, &registry, "order", "o-2").await?;
    let calls = Ledger::default();
    let worker = cashier(&h, calls.clone());
    let running = Running::start(worker.clone());
    until_status(&h, &registry, "order", "o-2", Status::Completed).await?;
    running.stop().await;
    assert_eq!(
        calls.all(),
        [("o-2".to_owned(), 1)].into(),
        "never charged o-1"
    );
    assert_eq!(worker.stats().claimed(), 1);
    let tasks = h.keiro.remote_tasks(("order", "o-1")).await?;
    assert_eq!(
        (tasks[0].status, tasks[0].attempts, tasks[0].output.as_ref()),
        (TaskStatus::Cancelled, 0, None)
    );
    assert!(remote_results(&h, "order", "o-1").await?.is_empty());
    assert_eq!(
        h.keiro
            .instance(("order", "o-1"))
            .await?
            .expect("row")
            .status,
        Status::Cancelled
    );
    Ok(())
}

async fn a_running_handler_learns_its_run_was_cancelled_and_its_report_is_refused(
    h: Harness,
) -> TestResult {
    const HEARTBEAT: Duration = Duration::from_millis(100);
    let registry = payments()?;
    // o-3's handler reports a success once told, o-4's a retryable failure: both are refused,
    // and the failure is not retried although the step has retries left.
    for id in ["o-3", "o-4"] {
        h.keiro.start("order", id, &id).await?;
        until_dispatched(&h, &registry, "order", id).await?;
    }
    let calls = Ledger::default();
    let told = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (c, t) = (calls.clone(), told.clone());
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(RemoteWorkerOptions {
            heartbeat_every: HEARTBEAT,
            ..worker_options()
        })
        .handle("charge", move |order: String, task: TaskContext| {
            let (calls, told) = (c.clone(), t.clone());
            async move {
                calls.bump(&order);
                assert!(!task.is_cancelled());
                tokio::select! {
                    () = task.cancelled() => {}
                    () = tokio::time::sleep(Duration::from_secs(30)) => {
                        return Ok(format!("receipt:{order}"));
                    }
                }
                assert!(task.is_cancelled());
                told.lock()
                    .unwrap()
                    .push((order.clone(), tokio::time::Instant::now()));
                if order == "o-3" {
                    Ok(format!("receipt:{order}"))
                } else {
                    Err(TaskError::retryable("stopped: the run was cancelled"))
                }
            }
        })
        .build();
    let running = Running::start(worker.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while calls.count("o-3") + calls.count("o-4") < 2 {
        assert!(tokio::time::Instant::now() < deadline, "never claimed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cancelled_at = tokio::time::Instant::now();
    h.keiro.cancel(("order", "o-3")).await?;
    h.keiro.cancel(("order", "o-4")).await?;
    while worker.stats().cancelled() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the handlers were never told, or their reports never refused: {:?}",
            told.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    running.stop().await;

    let told = told.lock().unwrap().clone();
    assert_eq!(told.len(), 2, "{told:?}");
    for (order, at) in &told {
        // One heartbeat period after the cancellation, with room for a loaded machine.
        let waited = at.duration_since(cancelled_at);
        assert!(waited < HEARTBEAT * 20, "{order} was told after {waited:?}");
    }
    let stats = worker.stats();
    assert_eq!(
        (
            stats.claimed(),
            stats.completed(),
            stats.failed(),
            stats.cancelled()
        ),
        (2, 0, 0, 2)
    );
    assert_eq!(
        calls.all(),
        [("o-3".to_owned(), 1), ("o-4".to_owned(), 1)].into()
    );
    for id in ["o-3", "o-4"] {
        let tasks = h.keiro.remote_tasks(("order", id)).await?;
        assert_eq!(
            (tasks[0].status, tasks[0].attempts, tasks[0].output.as_ref()),
            (TaskStatus::Cancelled, 0, None),
            "{id}"
        );
        assert!(remote_results(&h, "order", id).await?.is_empty(), "{id}");
        keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
        let row = h.keiro.instance(("order", id)).await?.expect("row");
        assert_eq!((row.status, row.output), (Status::Cancelled, None), "{id}");
    }
    Ok(())
}

async fn continuing_as_new_cancels_the_tasks_of_the_generation_left_behind(
    h: Harness,
) -> TestResult {
    let registry = payments()?;
    h.keiro.start("rotor", "r-1", &0u32).await?;
    until_status(&h, &registry, "rotor", "r-1", Status::Completed).await?;
    let row = h.keiro.instance(("rotor", "r-1")).await?.expect("row");
    assert_eq!(
        (row.generation, row.output),
        (1, Some(json!("generation 1")))
    );
    let tasks = h.keiro.remote_tasks(("rotor", "r-1")).await?;
    assert_eq!(
        tasks
            .iter()
            .map(|t| (t.generation, t.status))
            .collect::<Vec<_>>(),
        [(0, TaskStatus::Cancelled)],
        "dispatched in generation 0, cancelled by the continue-as-new"
    );

    h.keiro.start("order", "o-5", &"o-5").await?;
    until_dispatched(&h, &registry, "order", "o-5").await?;
    let calls = Ledger::default();
    let running = Running::start(cashier(&h, calls.clone()));
    until_status(&h, &registry, "order", "o-5", Status::Completed).await?;
    running.stop().await;
    assert_eq!(calls.count("rotor"), 0, "{:?}", calls.all());
    assert_eq!(
        h.keiro.remote_tasks(("rotor", "r-1")).await?[0].status,
        TaskStatus::Cancelled
    );
    Ok(())
}

mod handlers {
    //! One handler serves many steps of one run (issue 14, item 1): the step name is the journal
    //! key and step id, `RemoteOptions::handler` names the worker group.

    use super::*;

    on_both_stores!(
        one_handler_serves_many_steps_of_one_run,
        a_bad_handler_name_is_a_typed_error
    );

    fn labels() -> Result<Registry, keiro::worker::RegistryError> {
        let mut registry = Registry::new();
        registry.register("labels", |ctx: Ctx, order: String| async move {
            let print = RemoteOptions::default().handler("print-label");
            let (a, b) = (format!("{order}/a"), format!("{order}/b"));
            let (first, second) = tokio::join!(
                ctx.remote::<_, String>("label-1", &a, &print),
                ctx.remote::<_, String>("label-2", &b, &print),
            );
            Ok(vec![first?, second?])
        })?;
        Ok(registry)
    }

    async fn one_handler_serves_many_steps_of_one_run(h: Harness) -> TestResult {
        let registry = labels()?;
        h.keiro.start("labels", "l-1", &"o-1").await?;
        keiro::worker::resume_once(&h.store, &registry, &options(&h)).await?;
        let mut tasks = h.keiro.remote_tasks(("labels", "l-1")).await?;
        tasks.sort_by(|a, b| a.step_id.cmp(&b.step_id));
        let routed: Vec<_> = tasks
            .iter()
            .map(|t| (t.step_id.as_str(), t.group.as_str()))
            .collect();
        assert_eq!(
            routed,
            [
                ("labels/l-1/0/label-1", "print-label"),
                ("labels/l-1/0/label-2", "print-label")
            ]
        );

        let worker = RemoteWorker::builder(h.transport.clone())
            .options(worker_options())
            .handle(
                "print-label",
                |parcel: String, task: TaskContext| async move {
                    Ok::<_, TaskError>(format!("{}:{parcel}", task.step))
                },
            )
            .build();
        let running = Running::start(worker);
        until_status(&h, &registry, "labels", "l-1", Status::Completed).await?;
        running.stop().await;
        let row = h.keiro.instance(("labels", "l-1")).await?.expect("row");
        assert_eq!(row.output, Some(json!(["label-1:o-1/a", "label-2:o-1/b"])));
        let journaled: Vec<_> = h
            .keiro
            .journal(("labels", "l-1"))
            .await?
            .into_iter()
            .filter_map(|e| match e.event {
                Event::StepRecorded { step, .. } if step.starts_with("remote:") => Some(step),
                _ => None,
            })
            .collect();
        assert_eq!(journaled.len(), 2);
        assert!(journaled.contains(&"remote:label-1".to_owned()));
        assert!(journaled.contains(&"remote:label-2".to_owned()));
        Ok(())
    }

    async fn a_bad_handler_name_is_a_typed_error(h: Harness) -> TestResult {
        let mut registry = Registry::new();
        registry.register("bad-handler", |ctx: Ctx, handler: String| async move {
            let options = RemoteOptions::default().handler(handler);
            match ctx.remote::<_, String>("label", &(), &options).await {
                Err(WorkflowError::InvalidStep(_)) => Ok("invalid".to_owned()),
                Err(e) => Err(e),
                Ok(_) => Ok("accepted".to_owned()),
            }
        })?;
        for (i, handler) in ["print@eu", "print#1", "remote:x", ""].iter().enumerate() {
            let id = format!("b-{i}");
            h.keiro.start("bad-handler", &id, handler).await?;
            until_status(&h, &registry, "bad-handler", &id, Status::Completed).await?;
            assert_eq!(
                h.keiro
                    .instance(("bad-handler", &id))
                    .await?
                    .expect("row")
                    .output,
                Some(json!("invalid")),
                "{handler:?}"
            );
            assert!(h.keiro.remote_tasks(("bad-handler", &id)).await?.is_empty());
        }
        Ok(())
    }
}
