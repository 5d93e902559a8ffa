//! Remote steps on a queue, end to end (issue 36): a workflow arms remote steps of two
//! handlers on a queue of concurrency 2, three remote workers with room for many serve them,
//! and the handlers, which count how many of them run at once, never see more than two; every
//! step completes and the run with it. A key without a queue is a typed error in the body.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::queue::{QueueError, QueueSpec};
use keiro::{
    remote::RemoteOptions, remote::RemoteWorker, remote::RemoteWorkerOptions, remote::TaskContext,
    remote::TaskError, worker::Registry, Ctx, Status, WorkflowError,
};
use keiro_tests::{on_both_stores, Harness, TestResult};
use serde_json::json;

on_both_stores!(
    steps_on_a_queue_never_run_more_at_once_than_its_concurrency,
    a_key_without_a_queue_is_a_typed_error_in_the_body,
);

/// Runs resume passes until `name`/`id` reaches `status` (or panics after 20 s).
async fn until_status(
    h: &Harness,
    registry: &Registry,
    name: &str,
    id: &str,
    status: Status,
) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        keiro::worker::resume_once(&h.store, registry, &h.fast_options()).await?;
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

/// How many handlers run now, and the most that ever ran at once.
#[derive(Default)]
struct Witness {
    now: AtomicUsize,
    most: AtomicUsize,
    done: AtomicUsize,
}

async fn steps_on_a_queue_never_run_more_at_once_than_its_concurrency(h: Harness) -> TestResult {
    h.keiro
        .declare_queue(&QueueSpec::new("payments")?.concurrency(2))
        .await?;
    let mut registry = Registry::new();
    registry.register("settle", |ctx: Ctx, merchant: String| async move {
        let charge = RemoteOptions::default()
            .handler("charge")
            .queue("payments")
            .key(merchant.clone());
        let refund = RemoteOptions::default()
            .handler("refund")
            .queue("payments")
            .key(merchant);
        let (a, b, c, d, e, f) = tokio::join!(
            ctx.remote::<_, u32>("c-1", &1, &charge),
            ctx.remote::<_, u32>("c-2", &2, &charge),
            ctx.remote::<_, u32>("c-3", &3, &charge),
            ctx.remote::<_, u32>("r-1", &4, &refund),
            ctx.remote::<_, u32>("r-2", &5, &refund),
            ctx.remote::<_, u32>("r-3", &6, &refund),
        );
        Ok(a? + b? + c? + d? + e? + f?)
    })?;
    for id in ["s-1", "s-2"] {
        h.keiro
            .start("settle", id, &format!("merchant-{id}"))
            .await?;
    }

    let witness = Arc::new(Witness::default());
    let handler = |witness: Arc<Witness>| {
        move |n: u32, _task: TaskContext| {
            let witness = witness.clone();
            async move {
                let now = witness.now.fetch_add(1, Ordering::SeqCst) + 1;
                witness.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(40)).await;
                witness.now.fetch_sub(1, Ordering::SeqCst);
                witness.done.fetch_add(1, Ordering::SeqCst);
                Ok::<_, TaskError>(n * 10)
            }
        }
    };
    let mut workers = Vec::new();
    for n in 0..3 {
        let worker = RemoteWorker::builder(h.transport.clone())
            .options(RemoteWorkerOptions {
                worker_id: format!("remote-{n}"),
                concurrency: 8,
                poll_interval: Duration::from_millis(20),
                ..RemoteWorkerOptions::default()
            })
            .handle("charge", handler(witness.clone()))
            .handle("refund", handler(witness.clone()))
            .build();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            worker
                .run_until(async {
                    let _ = stopped.await;
                })
                .await;
        });
        workers.push((stop, task));
    }

    for id in ["s-1", "s-2"] {
        until_status(&h, &registry, "settle", id, Status::Completed).await?;
        let row = h.keiro.instance(("settle", id)).await?.expect("row");
        assert_eq!(row.output, Some(json!(210)));
    }
    for (stop, task) in workers {
        let _ = stop.send(());
        task.await?;
    }
    assert_eq!(
        witness.done.load(Ordering::SeqCst),
        12,
        "every step ran once"
    );
    let most = witness.most.load(Ordering::SeqCst);
    assert!(
        most <= 2,
        "{most} steps ran at once on a queue of concurrency 2"
    );
    Ok(())
}

async fn a_key_without_a_queue_is_a_typed_error_in_the_body(h: Harness) -> TestResult {
    let mut registry = Registry::new();
    registry.register("keyed", |ctx: Ctx, (): ()| async move {
        let options = RemoteOptions::default().key("merchant-1");
        match ctx.remote::<_, u32>("charge", &1, &options).await {
            Err(WorkflowError::InvalidQueue(QueueError::NoQueue { option })) => {
                Ok(format!("refused {option}"))
            }
            Err(e) => Err(e),
            Ok(_) => Ok("accepted".to_owned()),
        }
    })?;
    h.keiro.start("keyed", "k-1", &()).await?;
    until_status(&h, &registry, "keyed", "k-1", Status::Completed).await?;
    let row = h.keiro.instance(("keyed", "k-1")).await?.expect("row");
    assert_eq!(row.output, Some(json!("refused key")));
    assert!(h.keiro.remote_tasks(("keyed", "k-1")).await?.is_empty());
    Ok(())
}
