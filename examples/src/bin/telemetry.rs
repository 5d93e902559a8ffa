//! keiro's OpenTelemetry metrics printed to stdout: a few workflows (one crashing once) run
//! through a worker with a `Metrics` handle, then the meter provider exports on shutdown.
//! Spans (`workflow <name>` and per-step `step`) go to stderr through `tracing`.
//!
//! Swap the stdout exporter for `opentelemetry-otlp`'s to ship the same instruments to a
//! collector; keiro only depends on the OpenTelemetry API.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::worker::Tuning;
use keiro::{Ctx, Keiro, Metrics, Status};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "keiro=debug,keiro_resume=debug,keiro_journal=debug",
        ))
        .with_writer(std::io::stderr)
        .init();
    let exporter = opentelemetry_stdout::MetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter).build())
        .build();
    let metrics = Metrics::from_provider(&provider);

    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut config = keiro::postgres::Config::new(url);
    config.schema = "keiro_telemetry_example".into();
    let keiro = Keiro::connect(config).await?;

    let crash_once = Arc::new(AtomicBool::new(true));
    let worker = keiro
        .worker()
        .register("greet", move |ctx: Ctx, name: String| {
            let crash_once = crash_once.clone();
            async move {
                let line: String = ctx
                    .step("compose", || async {
                        Ok::<_, Infallible>(format!("hello {name}"))
                    })
                    .await?;
                if crash_once.swap(false, Ordering::SeqCst) {
                    // A panic is a crash: the run is retried and resumes after `compose`.
                    panic!("simulated crash after compose");
                }
                ctx.step("print", || async { Ok::<_, Infallible>(line.len()) })
                    .await?;
                Ok(line)
            }
        })
        .metrics(metrics)
        .tuning(Tuning {
            backoff: keiro::Backoff::exponential(
                Duration::from_millis(100),
                Duration::from_millis(200),
            )
            .without_jitter(),
            ..Tuning::default()
        })
        .poll_interval(Duration::from_millis(100))
        .build()?;
    let names = ["ada", "grace", "edsger"];
    for name in names {
        keiro.start("greet", &format!("greet-{name}"), name).await?;
    }
    let watcher = keiro.clone();
    worker
        .run_until(async move {
            loop {
                let mut done = 0;
                for name in names {
                    if let Ok(Some(row)) =
                        watcher.instance(("greet", &format!("greet-{name}"))).await
                    {
                        done += usize::from(row.status == Status::Completed);
                    }
                }
                if done == names.len() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
    provider.shutdown()?; // exports the metrics to stdout
    Ok(())
}
