//! `stream`: stream appends per second, and the latency from an append to its reader.
//!
//! C runs (`-c`) each write N / C items (`-n`, 20,000 by default) to a stream, each item the
//! wall-clock instant of its write, while one reader per run follows it (`Keiro::read_stream`,
//! woken by the store's push). Each append is one journaled step; on PostgreSQL the appends of
//! concurrent runs share transactions (the message lane's group commit). The report gives appends per second over the whole run, and the reader's
//! latency percentiles: the reader's clock when it got an item minus the item's.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use keiro::{Ctx, WorkflowError};
use serde::Serialize;
use time::OffsetDateTime;

use super::{instance_id, BenchArgs, Percentiles, Setup};
use crate::common::{failure, round, Global, Outcome, Result, ResultExt};

/// The workflow: writes `items` items, each the instant of its write, then closes the stream.
async fn streamer(ctx: Ctx, items: u64) -> Result<u64, WorkflowError> {
    for _ in 0..items {
        let now = OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000;
        ctx.write_stream("bench", &i64::try_from(now).unwrap_or(i64::MAX))
            .await?;
    }
    ctx.close_stream("bench").await?;
    Ok(items)
}

#[derive(Debug, Serialize)]
struct StreamReport {
    mode: &'static str,
    runs: u64,
    items: u64,
    seconds: f64,
    appends_per_s: f64,
    reader_p50_ms: f64,
    reader_p99_ms: f64,
    reader_max_ms: f64,
    /// Writes a transaction of the message lane carried on average (its group commit).
    message_batch_mean: Option<f64>,
}

pub(crate) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let runs = args.concurrency;
    let per_run = (args.workflows() / runs).max(1);
    let pool = usize::try_from(runs).unwrap_or(16) + 8;
    let setup = Setup::new(global, args, pool).await?;
    let keiro = keiro::Keiro::builder(setup.store.clone()).build();
    let mut budget = keiro::workflow::StreamBudget::default();
    budget.generation_items = budget.generation_items.max(per_run + 1);
    let worker = keiro
        .worker()
        .register("bench-stream", streamer)
        .concurrency(usize::try_from(runs).unwrap_or(16))
        .poll_interval(Duration::from_millis(args.poll_interval_ms))
        .tuning(keiro::worker::Tuning {
            stream_budget: budget,
            journal_budget: keiro::workflow::JournalBudget {
                steps: usize::MAX,
                bytes: usize::MAX,
            },
            ..keiro::worker::Tuning::default()
        })
        .build()
        .context("building the worker")?;
    let mut readers = tokio::task::JoinSet::new();
    for i in 0..runs {
        let id = instance_id("stream", i);
        keiro
            .start("bench-stream", &id, &per_run)
            .await
            .context("starting")?;
        let keiro = keiro.clone();
        readers.spawn(async move {
            let mut items = keiro.read_stream::<i64>(("bench-stream", id.as_str()), "bench", 0)?;
            let mut latencies = Vec::new();
            while let Some(item) = items.next().await {
                let (_, written) = item?;
                let now = OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000;
                let lag = u64::try_from(now - i128::from(written)).unwrap_or(0);
                latencies.push(Duration::from_micros(lag));
            }
            Ok::<_, keiro::Error>(latencies)
        });
    }
    let batches_before = setup.store.batch_stats();
    let started = Instant::now();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    let mut latencies = Vec::new();
    let deadline = Duration::from_secs(args.timeout_s);
    while let Some(joined) = tokio::time::timeout(deadline, readers.join_next())
        .await
        .map_err(|_| failure("the readers did not finish in time"))?
    {
        latencies.extend(joined.context("a reader task failed")?.context("reading")?);
    }
    let seconds = started.elapsed().as_secs_f64();
    let batches = setup.store.batch_stats().since(&batches_before);
    let _ = stop.send(());
    running.await.context("the worker task failed")?;
    let items = runs * per_run;
    if u64::try_from(latencies.len()).unwrap_or(0) != items {
        return Err(failure(format!(
            "the readers got {} items of {items}",
            latencies.len()
        )));
    }
    let p = Percentiles::of(&latencies);
    #[allow(clippy::cast_precision_loss)] // item counts are far below 2^52
    let appends_per_s = items as f64 / seconds;
    let report = StreamReport {
        mode: "stream",
        runs,
        items,
        seconds: round(seconds, 2),
        appends_per_s: round(appends_per_s, 0),
        reader_p50_ms: round(p.p50_ms, 2),
        reader_p99_ms: round(p.p99_ms, 2),
        reader_max_ms: round(p.max_ms, 2),
        message_batch_mean: batches.messages.mean_len().map(|len| round(len, 2)),
    };
    println!(
        "bench: {items} stream items by {runs} runs in {seconds:.2} s: {appends_per_s:.0} appends/s; \
         append to reader p50 {:.2} ms, p99 {:.2} ms",
        p.p50_ms, p.p99_ms
    );
    super::emit(&report)?;
    Ok(Outcome::Success)
}
