//! A workflow streams its progress to a caller that prints it live: the run writes a line to
//! stream `progress` after each stage (`ctx.write_stream`) and sets event `report` at the end
//! (`ctx.set_event`); the caller follows the stream (`Keiro::read_stream`) as it is written,
//! from another task here, from any process in general, then reads the event
//! (`Keiro::get_event`). Run it again: the run is journaled, so nothing is written twice and
//! the caller prints the same lines from offset 0.

use std::convert::Infallible;
use std::time::Duration;

use futures_util::StreamExt;
use keiro::{Ctx, Keiro, WorkflowError};

/// Four stages, each a step; after each, a line on the stream.
async fn report(ctx: Ctx, pages: u32) -> Result<u32, WorkflowError> {
    let mut words = 0;
    for (i, stage) in ["fetch", "parse", "summarise", "render"]
        .into_iter()
        .enumerate()
    {
        let done: u32 = ctx
            .step(stage, || async move {
                tokio::time::sleep(Duration::from_millis(150)).await; // the work
                Ok::<_, Infallible>(pages * 100)
            })
            .await?;
        words += done;
        let pct = (i + 1) * 25;
        ctx.write_stream("progress", &format!("{pct:>3}% {stage}: {done} words"))
            .await?;
    }
    ctx.close_stream("progress").await?; // the readers end
    ctx.set_event("report", &format!("{words} words over {pages} pages"))
        .await?;
    Ok(words)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut config = keiro::postgres::Config::new(url);
    config.schema = "keiro_progress".into();
    let keiro = Keiro::connect(config).await?; // migrates

    keiro.start("report", "report-1", &12u32).await?; // idempotent by id
                                                      // The caller follows the stream from offset 0, printing each line as the run writes it.
    let caller = {
        let keiro = keiro.clone();
        tokio::spawn(async move {
            let mut lines = keiro.read_stream::<String>(("report", "report-1"), "progress", 0)?;
            while let Some(line) = lines.next().await {
                let (offset, line) = line?;
                println!("[{offset}] {line}");
            }
            Ok::<_, keiro::Error>(())
        })
    };

    let worker = keiro.worker().register("report", report).build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    caller.await??; // the stream ended: the run closed it
    let summary: Option<String> = keiro
        .get_event(("report", "report-1"), "report", Duration::from_secs(30))
        .await?;
    println!("event report = {summary:?}");
    let _ = stop.send(());
    running.await?;
    Ok(())
}
