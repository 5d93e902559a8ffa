//! Remote steps in telemetry: `keiro.remote.dispatched`, `.redispatched` and `.lost` after a
//! dispatch that no worker answers, and a remote handler's span joining the dispatching
//! workflow's trace through the task's W3C trace context.

use std::time::Duration;

use keiro::{
    remote::RemoteOptions, remote::RemoteWorker, remote::RemoteWorkerOptions, remote::TaskContext,
    remote::TaskError, worker::Registry, worker::ResumeOptions, Ctx, Status, Tracing,
    WorkflowError,
};
use keiro_telemetry::names;
use keiro_telemetry::testing::Recorder;
use keiro_tests::{on_both_stores, Harness, TestResult};
use opentelemetry::trace::SpanKind;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

on_both_stores!(
    redispatch_and_loss_are_counted_per_group,
    a_remote_handlers_span_joins_the_workflows_trace,
);

async fn until(
    h: &Harness,
    registry: &Registry,
    options: &ResumeOptions,
    id: &str,
    status: Status,
) -> TestResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        keiro::worker::resume_once(&h.store, registry, options).await?;
        if h.keiro.instance(("traced", id)).await?.map(|r| r.status) == Some(status) {
            return Ok(());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{id} never {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn traced(redispatch: Option<(Duration, u32)>) -> Result<Registry, keiro::worker::RegistryError> {
    let mut registry = Registry::new();
    registry.register("traced", move |ctx: Ctx, (): ()| async move {
        let mut options = RemoteOptions::default();
        if let Some((after, max)) = redispatch {
            options = options.redispatch(after, max);
        }
        match ctx.remote::<_, String>("print", &(), &options).await {
            Err(WorkflowError::Remote(e)) if e.is_lost() => Ok("lost".to_owned()),
            other => other,
        }
    })?;
    Ok(registry)
}

async fn redispatch_and_loss_are_counted_per_group(h: Harness) -> TestResult {
    let recorder = Recorder::new();
    let options = ResumeOptions {
        metrics: Some(recorder.metrics.clone()),
        ..h.fast_options()
    };
    let registry = traced(Some((Duration::from_millis(100), 3)))?;
    h.keiro.start("traced", "r-1", &()).await?;
    until(&h, &registry, &options, "r-1", Status::Completed).await?;
    assert_eq!(recorder.total(names::REMOTE_DISPATCHED)?, 1.0);
    assert_eq!(recorder.total(names::REMOTE_REDISPATCHED)?, 2.0);
    assert_eq!(recorder.total(names::REMOTE_LOST)?, 1.0);
    let points = recorder.points(names::REMOTE_REDISPATCHED)?;
    assert!(
        points.iter().all(|(attributes, _)| *attributes
            == keiro_telemetry::testing::attrs(&[(names::REMOTE_GROUP, "print")])),
        "{points:?}"
    );
    Ok(())
}

async fn a_remote_handlers_span_joins_the_workflows_trace(h: Harness) -> TestResult {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let tracing = Tracing::from_provider(&provider);
    let options = ResumeOptions {
        tracing: Some(tracing.clone()),
        ..h.fast_options()
    };
    let registry = traced(None)?;
    h.keiro.start("traced", "t-1", &()).await?;
    keiro::worker::resume_once(&h.store, &registry, &options).await?;
    let tasks = h.keiro.remote_tasks(("traced", "t-1")).await?;
    let traceparent = tasks[0]
        .traceparent
        .clone()
        .expect("the task carries the trace context");

    let worker = RemoteWorker::builder(h.transport.clone())
        .options(RemoteWorkerOptions {
            poll_interval: Duration::from_millis(20),
            ..RemoteWorkerOptions::default()
        })
        .tracing(Some(tracing))
        .handle("print", |(): (), task: TaskContext| async move {
            Ok::<_, TaskError>(task.traceparent.unwrap_or_default())
        })
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let w = worker.clone();
    let running = tokio::spawn(async move {
        w.run_until(async {
            let _ = stopped.await;
        })
        .await;
    });
    until(&h, &registry, &options, "t-1", Status::Completed).await?;
    let _ = stop.send(());
    let _ = running.await;
    provider.force_flush()?;

    let spans = exporter.get_finished_spans()?;
    let first_drive = spans
        .iter()
        .find(|s| s.name == "workflow traced")
        .expect("a workflow span");
    let remote = spans
        .iter()
        .find(|s| s.name == "remote print")
        .expect("a remote span");
    assert_eq!(remote.span_kind, SpanKind::Consumer);
    assert_eq!(
        remote.span_context.trace_id(),
        first_drive.span_context.trace_id(),
        "the handler's span is in the workflow's trace"
    );
    assert_eq!(remote.parent_span_id, first_drive.span_context.span_id());
    assert_eq!(
        traceparent,
        format!(
            "00-{}-{}-01",
            first_drive.span_context.trace_id(),
            first_drive.span_context.span_id()
        )
    );
    let row = h.keiro.instance(("traced", "t-1")).await?.expect("row");
    assert_eq!(
        row.output,
        Some(serde_json::json!(traceparent)),
        "the handler saw it too"
    );
    Ok(())
}
