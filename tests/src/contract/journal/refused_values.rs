//! Values PostgreSQL refuses (a NUL character in a jsonb string or a text column) are refused
//! by both stores the same way: every write of user data answers `ValueRefused` and writes
//! nothing, and a remote worker whose handler returns such an output fails that step at once
//! while the rest of its report batch lands.

use std::sync::Arc;
use std::time::Duration;

use crate::{key, Harness, Ledger, TestResult};
use keiro::{
    remote::RemoteOptions, remote::RemoteWorker, remote::RemoteWorkerOptions, remote::TaskContext,
    remote::TaskError, remote::TaskStatus, worker::Registry, worker::ResumeOptions, Ctx, Status,
    WorkflowError,
};
use keiro_journal::{
    store::remote_step_id, store::ChildSpawn, store::RemoteArm, store::SignalWait,
    store::SignalWaitOutcome, store::StartRequest, Append, Backoff, Event, Instance, InstanceKey,
    JournalEntry, SignalSendOutcome, StepKind, StoreError, REDISPATCH_MAX_DEFAULT,
};
use keiro_lease::{ClaimOutcome, Crash};
use keiro_remote::{ClaimRequest, ReportOutcome, TaskFailure};
use serde_json::{json, Value};
use uuid::Uuid;

/// A poisoned string: PostgreSQL refuses it in jsonb (22P05) and in text (22021).
const NUL: &str = "a\u{0}b";

/// Asserts that `result` is a value refusal.
fn assert_refused<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    match result {
        Err(error) if error.is_value_refused() => {
            assert!(!error.is_retryable(), "{what}: a refusal is final");
        }
        other => panic!("{what}: expected ValueRefused, got {other:?}"),
    }
}

/// The instance row and its whole journal: what a refused write must leave unchanged.
async fn snapshot(
    h: &Harness,
    k: &InstanceKey,
) -> Result<(Option<Instance>, Vec<JournalEntry>), StoreError> {
    Ok((
        h.store.instance_get(k).await?,
        h.store.journal_history(k).await?,
    ))
}

async fn started(h: &Harness, name: &str, id: &str) -> Result<InstanceKey, StoreError> {
    let k = key(name, id);
    h.store
        .instance_start(&StartRequest {
            attributes: Default::default(),
            key: k.clone(),
            input: json!("in"),
            parent: None,
            priority: 0,
            queue: None,
        })
        .await?;
    Ok(k)
}

fn step(name: &str, kind: StepKind, result: Value) -> Event {
    Event::StepRecorded {
        step: name.to_owned(),
        kind,
        result,
    }
}

pub async fn a_start_with_a_refused_input_creates_nothing(h: Harness) -> TestResult {
    let k = key("refused", "start");
    let request = StartRequest {
        attributes: Default::default(),
        key: k.clone(),
        input: json!({"name": NUL}),
        parent: None,
        priority: 0,
        queue: None,
    };
    assert_refused(h.store.instance_start(&request).await, "start");
    assert_eq!(snapshot(&h, &k).await?, (None, Vec::new()));
    Ok(())
}

pub async fn a_refused_step_result_is_not_journaled(h: Harness) -> TestResult {
    let k = started(&h, "refused", "step").await?;
    let before = snapshot(&h, &k).await?;
    let poisoned = step("s", StepKind::Step, json!(["ok", {"deep": NUL}]));
    assert_refused(
        h.store
            .journal_append(&Append::external(k.clone(), poisoned))
            .await,
        "a step's result",
    );
    assert_eq!(snapshot(&h, &k).await?, before);
    let poisoned_name = step(NUL, StepKind::Step, json!("ok"));
    assert_refused(
        h.store
            .journal_append(&Append::external(k.clone(), poisoned_name))
            .await,
        "a step's name",
    );
    assert_eq!(snapshot(&h, &k).await?, before);
    // Refused before anything is decided: even for an instance that does not exist.
    let missing = key("refused", "missing");
    assert_refused(
        h.store
            .journal_append(&Append::external(
                missing,
                step("s", StepKind::Step, json!(NUL)),
            ))
            .await,
        "a step of a missing instance",
    );
    Ok(())
}

pub async fn a_refused_output_or_failure_reason_leaves_the_run_open(h: Harness) -> TestResult {
    let k = started(&h, "refused", "markers").await?;
    let before = snapshot(&h, &k).await?;
    let markers = [
        (
            "a completed marker's output",
            Event::WorkflowCompleted {
                output: json!({"label": NUL}),
            },
        ),
        (
            "a failed marker's reason",
            Event::WorkflowFailed {
                reason: NUL.to_owned(),
            },
        ),
        (
            "a continue-as-new input",
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!(NUL),
            },
        ),
    ];
    for (what, marker) in markers {
        let append = Append::external(k.clone(), marker);
        assert_refused(h.store.journal_append(&append).await, what);
        assert_eq!(snapshot(&h, &k).await?, before, "{what}");
    }
    assert_refused(
        h.store.instance_fail_diverged(&k, None, NUL).await,
        "a diverged run's reason",
    );
    assert_eq!(snapshot(&h, &k).await?, before);
    let row = h.store.instance_get(&k).await?.expect("row");
    assert_eq!((row.status, row.last_error), (Status::Running, None));
    Ok(())
}

pub async fn a_refused_delivery_is_not_journaled(h: Harness) -> TestResult {
    let k = started(&h, "refused", "deliver").await?;
    let before = snapshot(&h, &k).await?;
    // What `deliver` appends for a run waiting in `ctx.await_step("approval")`.
    let delivery = step("approval", StepKind::Await, json!({"by": NUL}));
    assert_refused(
        h.store
            .journal_append(&Append::external(k.clone(), delivery))
            .await,
        "a delivery",
    );
    assert_eq!(snapshot(&h, &k).await?, before);
    Ok(())
}

pub async fn a_refused_signal_is_neither_delivered_nor_buffered(h: Harness) -> TestResult {
    let k = started(&h, "refused", "signal").await?;
    let wait = |step: &str| SignalWait {
        key: k.clone(),
        generation: 0,
        step: step.to_owned(),
        token: "tok".to_owned(),
        fence: None,
    };
    // A waiter is registered: a refused send must not take it.
    assert_eq!(
        h.store.signal_wait(&wait("sig:first")).await?,
        SignalWaitOutcome::Waiting
    );
    let before = snapshot(&h, &k).await?;
    assert_refused(
        h.store.signal_send("tok", &json!({"v": NUL})).await,
        "a signal's payload",
    );
    assert_refused(
        h.store.signal_send(NUL, &json!(1)).await,
        "a signal's token",
    );
    assert_eq!(snapshot(&h, &k).await?, before);
    // The waiter is still there, and nothing was buffered for the next wait.
    assert_eq!(
        h.store.signal_send("tok", &json!(1)).await?,
        SignalSendOutcome::Delivered { to: k.clone() }
    );
    assert_eq!(
        h.store.signal_wait(&wait("sig:second")).await?,
        SignalWaitOutcome::Waiting
    );
    let mut refused_wait = wait("sig:third");
    refused_wait.token = NUL.to_owned();
    assert_refused(h.store.signal_wait(&refused_wait).await, "a wait's token");
    Ok(())
}

pub async fn a_refused_awakeable_payload_leaves_it_pending(h: Harness) -> TestResult {
    let k = started(&h, "refused", "awakeable").await?;
    let id = Uuid::new_v4();
    let allocation = step("awkid:a", StepKind::Awakeable, json!(id.to_string()));
    h.store
        .awakeable_create(&Append::external(k.clone(), allocation), id)
        .await?;
    let before = snapshot(&h, &k).await?;
    assert_refused(
        h.store.awakeable_complete(id, &json!([NUL])).await,
        "an awakeable's payload",
    );
    assert_eq!(snapshot(&h, &k).await?, before);
    assert_eq!(h.store.awakeables_pending().await?, 1);
    // Refused before the id is looked up: even for an awakeable that does not exist.
    assert_refused(
        h.store
            .awakeable_complete(Uuid::new_v4(), &json!(NUL))
            .await,
        "an unknown awakeable's payload",
    );
    assert_eq!(
        h.store.awakeable_complete(id, &json!("fine")).await?,
        keiro::workflow::AwakeableOutcome::Delivered
    );
    Ok(())
}

pub async fn a_crash_with_a_refused_error_text_is_not_recorded(h: Harness) -> TestResult {
    let k = started(&h, "refused", "crash").await?;
    let ttl = Duration::from_secs(30);
    let ClaimOutcome::Acquired(claim) = h.store.instance_claim(&k, "w", ttl, None).await? else {
        panic!("a fresh instance is free");
    };
    let before = snapshot(&h, &k).await?;
    // At the ceiling: a recorded crash would fail the run and journal a marker.
    let crash = Crash {
        error: format!("step failed: {NUL}"),
        retry_delay: Duration::from_millis(1),
        max_attempts: 1,
    };
    assert_refused(
        h.store
            .instance_record_crash(&k, &claim.fence, &crash)
            .await,
        "a crash's error",
    );
    assert_eq!(snapshot(&h, &k).await?, before);
    Ok(())
}

fn arm(k: &InstanceKey, step: &str, input: Value) -> RemoteArm {
    RemoteArm {
        step_id: remote_step_id(k, 0, step),
        key: k.clone(),
        generation: 0,
        step: step.to_owned(),
        journal_step: format!("remote:{step}"),
        group: step.to_owned(),
        input,
        priority: 0,
        traceparent: None,
        max_attempts: 3,
        backoff: Backoff::default(),
        redispatch_after: None,
        redispatch_max: REDISPATCH_MAX_DEFAULT,
        queue: None,
        queue_key: None,
        fence: None,
    }
}

pub async fn a_refused_remote_report_leaves_the_task_unsettled(h: Harness) -> TestResult {
    let k = started(&h, "refused", "remote").await?;
    for step in ["one", "two"] {
        h.store.remote_arm(&arm(&k, step, json!(step))).await?;
    }
    let request = ClaimRequest {
        groups: vec!["one".into(), "two".into()],
        worker: "w".into(),
        limit: 2,
        claim_ttl: Duration::from_secs(30),
    };
    let claimed = h.transport.tasks_claim(&request).await?;
    assert_eq!(claimed.len(), 2);
    let (one, two) = (remote_step_id(&k, 0, "one"), remote_step_id(&k, 0, "two"));
    let before = (snapshot(&h, &k).await?, h.admin.remote_tasks(&k).await?);

    assert_refused(
        h.transport
            .task_complete(&one, &json!({"label": NUL}))
            .await,
        "a report's output",
    );
    // A batch is refused as a whole: its other report does not land either.
    let batch = [(one.clone(), json!("fine")), (two.clone(), json!([NUL]))];
    assert_refused(h.transport.tasks_complete(&batch).await, "a report batch");
    let failure = |message: &str, code: Option<&str>| TaskFailure {
        message: message.to_owned(),
        code: code.map(str::to_owned),
        retryable: false,
    };
    let claim = claimed[0].claim;
    let step_id = &claimed[0].step_id;
    let zero = Duration::ZERO;
    assert_refused(
        h.transport
            .task_fail(step_id, claim, &failure(NUL, None), zero)
            .await,
        "a failure's message",
    );
    assert_refused(
        h.transport
            .task_fail(step_id, claim, &failure("m", Some(NUL)), zero)
            .await,
        "a failure's code",
    );
    let after = (snapshot(&h, &k).await?, h.admin.remote_tasks(&k).await?);
    assert_eq!(after, before);
    assert!(after.1.iter().all(|t| t.status == TaskStatus::Running));

    assert_eq!(
        h.transport.task_complete(&one, &json!("fine")).await?,
        ReportOutcome::Delivered
    );
    Ok(())
}

pub async fn refused_child_and_remote_inputs_write_nothing(h: Harness) -> TestResult {
    let parent = started(&h, "refused", "parent").await?;
    let before = snapshot(&h, &parent).await?;
    let child = key("kid", "k-1");
    let spawn = ChildSpawn {
        child: child.clone(),
        input: json!({"x": NUL}),
        await_step: "child:k-1:result".to_owned(),
    };
    let spawn_step = step(
        "child:k-1",
        StepKind::Child,
        json!({"name": "kid", "id": "k-1"}),
    );
    assert_refused(
        h.store
            .child_spawn(&Append::external(parent.clone(), spawn_step), &spawn)
            .await,
        "a child's input",
    );
    assert_eq!(snapshot(&h, &child).await?, (None, Vec::new()));

    assert_refused(
        h.store.remote_arm(&arm(&parent, "print", json!(NUL))).await,
        "a remote step's input",
    );
    assert!(h.admin.remote_tasks(&parent).await?.is_empty());
    assert_eq!(snapshot(&h, &parent).await?, before);

    let retry = key("refused", "parent~retry~0000abcd");
    assert_refused(
        h.admin
            .instance_retry_with_input(&parent, &retry, &json!(NUL))
            .await,
        "a fix-and-replay input",
    );
    assert_eq!(snapshot(&h, &retry).await?, (None, Vec::new()));
    Ok(())
}

/// How many runs share the worker's report batch.
const RUNS: usize = 6;

/// The order whose label the store refuses.
const POISON: &str = "o-3";

/// `labels`: one remote step `label`; a remote failure becomes the run's output, so the test
/// sees exactly what the body saw.
fn labels() -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("labels", |ctx: Ctx, order: String| async move {
        match ctx
            .remote::<_, String>("label", &order, &RemoteOptions::default())
            .await
        {
            Ok(label) => Ok(label),
            Err(WorkflowError::Remote(e)) => Ok(format!(
                "remote error {}: {}",
                e.code.unwrap_or_default(),
                e.message
            )),
            Err(e) => Err(e),
        }
    })?;
    Ok(registry)
}

pub async fn a_refused_output_fails_its_step_and_the_rest_of_its_batch_lands(
    h: Harness,
) -> TestResult {
    let registry = labels()?;
    let options = h.fast_options();
    for i in 0..RUNS {
        h.keiro
            .start("labels", &format!("l-{i}"), &format!("o-{i}"))
            .await?;
    }
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    for i in 0..RUNS {
        let row = h
            .keiro
            .instance(("labels", &format!("l-{i}")))
            .await?
            .expect("row");
        assert_eq!(
            row.status,
            Status::Suspended,
            "l-{i} parked on its remote step"
        );
    }

    // Every handler finishes at the same moment, so their outputs share a report batch.
    let together = Arc::new(tokio::sync::Barrier::new(RUNS));
    let ran = Ledger::default();
    let (t, r) = (together.clone(), ran.clone());
    let worker = RemoteWorker::builder(h.transport.clone())
        .options(RemoteWorkerOptions {
            poll_interval: Duration::from_millis(20),
            ..RemoteWorkerOptions::default()
        })
        .handle("label", move |order: String, task: TaskContext| {
            let (t, r) = (t.clone(), r.clone());
            async move {
                r.bump(&task.step_id);
                let _ = tokio::time::timeout(Duration::from_secs(2), t.wait()).await;
                if order == POISON {
                    return Ok::<_, TaskError>(format!("label {NUL}"));
                }
                Ok(format!("label:{order}"))
            }
        })
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await;
    });

    let finished = until_all_completed(&h, &registry, &options).await;
    let _ = stop.send(());
    let _ = running.await;
    finished?;

    for i in 0..RUNS {
        let (id, order) = (format!("l-{i}"), format!("o-{i}"));
        let row = h.keiro.instance(("labels", &id)).await?.expect("row");
        let output = row.output.and_then(|o| o.as_str().map(str::to_owned));
        let output = output.unwrap_or_default();
        if order == POISON {
            assert!(
                output.starts_with("remote error output_refused: "),
                "{id}: {output}"
            );
            let tasks = h.keiro.remote_tasks(("labels", &id)).await?;
            assert_eq!(
                (tasks[0].status, tasks[0].attempts),
                (TaskStatus::Failed, 1)
            );
        } else {
            assert_eq!(output, format!("label:{order}"), "{id}");
        }
        let step_id = remote_step_id(&key("labels", &id), 0, "label");
        assert_eq!(ran.count(&step_id), 1, "{id}'s handler ran once");
    }
    Ok(())
}

/// Runs resume passes until every `labels` run is completed (or gives up after 10 s, well
/// before a lost report's claim would expire and its task run again).
async fn until_all_completed(
    h: &Harness,
    registry: &Registry,
    options: &ResumeOptions,
) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        keiro::worker::resume_once(&h.store, registry, options).await?;
        let mut open = Vec::new();
        for i in 0..RUNS {
            let id = format!("l-{i}");
            let row = h.keiro.instance(("labels", &id)).await?.expect("row");
            if row.status != Status::Completed {
                open.push((id, row.status, row.last_error));
            }
        }
        if open.is_empty() {
            return Ok(());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "runs still open: {open:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
