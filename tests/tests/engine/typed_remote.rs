//! Typed remote handlers (issue 14, item 1): a `RemoteHandlerDef` fixes a handler's name,
//! input and output; a typed workflow calls it with `ctx.remote_typed::<H>(step, ..)` and a
//! remote worker serves it with `handle_typed::<H>(..)`, both checked against the same types
//! at compile time (the `compile_fail` doc tests of both methods). Typed and stringly sides
//! share the wire format, a partition routes as with the stringly API, and a bad name is a
//! typed error. Both stores.

use std::future::Future;
use std::time::Duration;

use keiro::{
    remote::RemoteHandlerDef, remote::RemoteOptions, remote::RemoteWorker,
    remote::RemoteWorkerOptions, remote::TaskContext, remote::TaskError, Ctx, Status, Worker,
    WorkflowDef, WorkflowError,
};
use keiro_tests::{on_both_stores, FastWorker, Harness, TestResult};
use serde::{Deserialize, Serialize};
use serde_json::json;

on_both_stores!(
    a_typed_workflow_calls_a_typed_handler_on_a_remote_worker,
    typed_and_stringly_sides_share_the_wire_format,
    a_typed_handler_serves_a_partition,
    a_handler_with_an_invalid_name_is_a_typed_error,
);

/// The contract both sides share: what the workflow sends and what the worker answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Parcel {
    order: String,
    grams: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Label {
    tracking: String,
    step: String,
}

struct PrintLabel;

impl RemoteHandlerDef for PrintLabel {
    const NAME: &'static str = "print-label";
    type Input = Parcel;
    type Output = Label;
}

/// A handler whose name the remote API refuses (`@` separates a partition).
struct Misnamed;

impl RemoteHandlerDef for Misnamed {
    const NAME: &'static str = "print@label";
    type Input = Parcel;
    type Output = Label;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: String,
    parcels: Vec<u32>,
    partition: Option<String>,
}

/// Prints one label per parcel, each its own step served by the one `print-label` handler.
#[derive(Default)]
struct Ship;

impl WorkflowDef for Ship {
    const NAME: &'static str = "ship";
    type Input = Order;
    type Output = Vec<Label>;

    async fn run(&self, ctx: Ctx, order: Order) -> Result<Vec<Label>, WorkflowError> {
        // A handler named in the options is overridden by the definition's.
        let mut options = RemoteOptions::default().handler("not-this-one");
        if let Some(partition) = &order.partition {
            options = options.partition(partition.as_str());
        }
        let mut labels = Vec::new();
        for (n, grams) in order.parcels.iter().enumerate() {
            let parcel = Parcel {
                order: order.id.clone(),
                grams: *grams,
            };
            let label = ctx
                .remote_typed::<PrintLabel>(&format!("label-{n}"), &parcel, &options)
                .await?;
            labels.push(label);
        }
        Ok(labels)
    }
}

/// Calls the handler with the stringly API.
async fn ship_stringly(ctx: Ctx, order: String) -> Result<Label, WorkflowError> {
    let parcel = Parcel { order, grams: 7 };
    let options = RemoteOptions::default().handler(PrintLabel::NAME);
    ctx.remote::<_, Label>("label", &parcel, &options).await
}

/// Calls the misnamed handler and answers what the body saw.
async fn misnamed(ctx: Ctx, (): ()) -> Result<String, WorkflowError> {
    let parcel = Parcel {
        order: "m".into(),
        grams: 1,
    };
    match ctx
        .remote_typed::<Misnamed>("label", &parcel, &RemoteOptions::default())
        .await
    {
        Err(WorkflowError::InvalidStep(e)) => Ok(format!("refused: {e}")),
        other => Err(WorkflowError::app(format!("not refused: {other:?}"))),
    }
}

fn resume_worker(h: &Harness) -> Result<Worker, keiro::Error> {
    h.keiro
        .worker()
        .fast()
        .register_workflow::<Ship>()
        .register("ship-stringly", ship_stringly)
        .register("misnamed", misnamed)
        .build()
}

/// The typed body: a label naming the parcel, the step and `tag`.
fn print(
    tag: &'static str,
) -> impl Fn(Parcel, TaskContext) -> std::future::Ready<Result<Label, TaskError>> + Send + Sync + 'static
{
    move |parcel: Parcel, task: TaskContext| {
        std::future::ready(Ok(Label {
            tracking: format!("{tag}:{}-{}g", parcel.order, parcel.grams),
            step: task.step,
        }))
    }
}

fn remote_options() -> RemoteWorkerOptions {
    RemoteWorkerOptions {
        poll_interval: Duration::from_millis(20),
        ..RemoteWorkerOptions::default()
    }
}

/// Runs the resume worker and `remote` until `until` resolves.
async fn with_workers<T>(
    worker: Worker,
    remote: RemoteWorker,
    until: impl Future<Output = T>,
) -> Result<T, Box<dyn std::error::Error + Send + Sync>> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut resume_stopped = stopped.clone();
    let mut remote_stopped = stopped;
    let resume = tokio::spawn(async move {
        worker
            .run_until(async move {
                let _ = resume_stopped.wait_for(|stop| *stop).await;
            })
            .await;
    });
    let serving = tokio::spawn(async move {
        remote
            .run_until(async move {
                let _ = remote_stopped.wait_for(|stop| *stop).await;
            })
            .await;
    });
    let value = tokio::time::timeout(Duration::from_secs(20), until).await;
    let _ = stop.send(true);
    resume.await?;
    serving.await?;
    Ok(value?)
}

async fn a_typed_workflow_calls_a_typed_handler_on_a_remote_worker(h: Harness) -> TestResult {
    let order = Order {
        id: "o-1".into(),
        parcels: vec![500, 1200],
        partition: None,
    };
    let handle = h.keiro.start_workflow::<Ship>("s-1", &order).await?;
    let remote = h
        .keiro
        .remote_worker()?
        .options(remote_options())
        .handle_typed::<PrintLabel>(print("typed"))
        .build();
    let labels = with_workers(resume_worker(&h)?, remote, handle.result()).await??;
    assert_eq!(
        labels,
        [
            Label {
                tracking: "typed:o-1-500g".into(),
                step: "label-0".into()
            },
            Label {
                tracking: "typed:o-1-1200g".into(),
                step: "label-1".into()
            },
        ]
    );

    // Two steps with their own journal keys and step ids, one handler's group.
    let tasks = h.keiro.remote_tasks(("ship", "s-1")).await?;
    let mut routed: Vec<(&str, &str, &str)> = tasks
        .iter()
        .map(|t| {
            (
                t.step_id.as_str(),
                t.journal_step.as_str(),
                t.group.as_str(),
            )
        })
        .collect();
    routed.sort_unstable();
    assert_eq!(
        routed,
        [
            ("ship/s-1/0/label-0", "remote:label-0", "print-label"),
            ("ship/s-1/0/label-1", "remote:label-1", "print-label"),
        ]
    );
    let journal = h.keiro.journal(("ship", "s-1")).await?;
    let recorded: Vec<(String, serde_json::Value)> = journal
        .iter()
        .map(|entry| entry.event.encode())
        .filter(|row| row.step_name.starts_with("remote:"))
        .map(|row| (row.step_name.to_string(), row.payload.clone()))
        .collect();
    assert_eq!(
        recorded,
        [
            (
                "remote:label-0".to_owned(),
                json!({"ok": {"tracking": "typed:o-1-500g", "step": "label-0"}})
            ),
            (
                "remote:label-1".to_owned(),
                json!({"ok": {"tracking": "typed:o-1-1200g", "step": "label-1"}})
            ),
        ]
    );
    Ok(())
}

async fn typed_and_stringly_sides_share_the_wire_format(h: Harness) -> TestResult {
    // A typed caller served by a stringly handler, and a stringly caller served by a typed
    // one: the same JSON either way.
    let order = Order {
        id: "o-2".into(),
        parcels: vec![3],
        partition: None,
    };
    let typed = h.keiro.start_workflow::<Ship>("s-2", &order).await?;
    let remote = h
        .keiro
        .remote_worker()?
        .options(remote_options())
        .handle(
            PrintLabel::NAME,
            |parcel: Parcel, task: TaskContext| async move {
                Ok::<_, TaskError>(Label {
                    tracking: format!("stringly:{}-{}g", parcel.order, parcel.grams),
                    step: task.step,
                })
            },
        )
        .build();
    let labels = with_workers(resume_worker(&h)?, remote, typed.result()).await??;
    assert_eq!(labels[0].tracking, "stringly:o-2-3g");

    h.keiro.start("ship-stringly", "s-3", &"o-3").await?;
    let remote = h
        .keiro
        .remote_worker()?
        .options(remote_options())
        .handle_typed::<PrintLabel>(print("typed"))
        .build();
    let label = with_workers(
        resume_worker(&h)?,
        remote,
        h.keiro
            .result::<Label>(("ship-stringly", "s-3"), Duration::from_secs(15)),
    )
    .await??;
    assert_eq!(
        label,
        Label {
            tracking: "typed:o-3-7g".into(),
            step: "label".into()
        }
    );
    Ok(())
}

async fn a_typed_handler_serves_a_partition(h: Harness) -> TestResult {
    let order = Order {
        id: "o-4".into(),
        parcels: vec![9],
        partition: Some("eu".into()),
    };
    let handle = h.keiro.start_workflow::<Ship>("s-4", &order).await?;
    let remote = h
        .keiro
        .remote_worker()?
        .options(remote_options())
        .handle_typed_partition::<PrintLabel>("eu", print("eu"))
        .build();
    let labels = with_workers(resume_worker(&h)?, remote, handle.result()).await??;
    assert_eq!(labels[0].tracking, "eu:o-4-9g");
    let tasks = h.keiro.remote_tasks(("ship", "s-4")).await?;
    assert_eq!(tasks[0].group, "print-label@eu");
    Ok(())
}

async fn a_handler_with_an_invalid_name_is_a_typed_error(h: Harness) -> TestResult {
    h.keiro.start("misnamed", "m-1", &()).await?;
    let worker = resume_worker(&h)?;
    worker.drain().await?;
    let row = h.keiro.instance(("misnamed", "m-1")).await?.expect("row");
    assert_eq!(row.status, Status::Completed, "{row:?}");
    let answer = row.output.as_ref().and_then(|v| v.as_str()).unwrap_or("");
    assert!(
        answer.starts_with("refused:") && answer.contains("print@label"),
        "{answer}"
    );
    // Nothing was dispatched.
    assert!(h.keiro.remote_tasks(("misnamed", "m-1")).await?.is_empty());
    Ok(())
}
