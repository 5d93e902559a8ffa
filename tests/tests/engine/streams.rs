//! Events and streams end to end: a run streams 10,000 items while two readers follow it and
//! its worker is killed mid-stream, a second worker finishing it; events wake a waiting caller
//! by push. Both stores.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::StreamExt;
use keiro::{Ctx, Keiro, Status, WorkflowError};
use keiro_tests::{on_both_stores, spawn_worker, FastWorker, Harness, TestResult};

on_both_stores!(
    two_readers_get_every_offset_once_in_order_across_a_worker_killed_mid_stream,
    a_caller_waiting_on_an_event_is_woken_when_the_run_sets_it,
    a_typed_handle_reads_its_instances_events_and_streams,
);

/// Counts down from its input on stream `ticks`, then sets event `done`.
#[derive(Default)]
struct Countdown;

impl keiro::WorkflowDef for Countdown {
    const NAME: &'static str = "countdown";
    type Input = u32;
    type Output = ();

    async fn run(&self, ctx: Ctx, from: u32) -> Result<(), WorkflowError> {
        for n in (0..=from).rev() {
            ctx.write_stream("ticks", &n).await?;
        }
        ctx.set_event("done", &true).await
    }
}

async fn a_typed_handle_reads_its_instances_events_and_streams(h: Harness) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .fast()
        .register_workflow::<Countdown>()
        .build()?;
    let handle = h.keiro.start_workflow::<Countdown>("c-1", &3).await?;
    worker.drain().await?;
    let ticks: Vec<(u64, u32)> = handle
        .read_stream::<u32>("ticks", 1)?
        .map(|item| item.expect("an item"))
        .collect()
        .await;
    assert_eq!(
        ticks,
        [(1, 2), (2, 1), (3, 0)],
        "from offset 1, to the run's end"
    );
    let done: Option<bool> = handle.get_event("done", Duration::ZERO).await?;
    assert_eq!(done, Some(true));
    Ok(())
}

const ITEMS: u64 = 10_000;

/// Streams `ITEMS` items `i * 3` to `progress`, then closes it.
async fn progress(ctx: Ctx, (): ()) -> Result<(), WorkflowError> {
    for i in 0..ITEMS {
        ctx.write_stream("progress", &(i * 3)).await?;
    }
    ctx.close_stream("progress").await?;
    Ok(())
}

/// Follows `progress` from `from`, stopping (as a reader that disconnects) after `stop_at`
/// if given; every `(offset, value)` read.
async fn follow(
    keiro: Keiro,
    from: u64,
    stop_at: Option<u64>,
) -> Result<Vec<(u64, u64)>, keiro::Error> {
    let mut items = keiro.read_stream::<u64>(("progress", "p-1"), "progress", from)?;
    let mut read = Vec::new();
    while let Some(item) = items.next().await {
        let (offset, value) = item?;
        read.push((offset, value));
        if Some(offset) == stop_at {
            break;
        }
    }
    Ok(read)
}

async fn two_readers_get_every_offset_once_in_order_across_a_worker_killed_mid_stream(
    h: Harness,
) -> TestResult {
    h.keiro.start("progress", "p-1", &()).await?;
    // One reader follows from the start to the end; the other disconnects at 4,999 and
    // reconnects from 5,000, as a caller that saw offset n resumes at n + 1.
    let whole = tokio::spawn(follow(h.keiro.clone(), 0, None));
    let first_half = tokio::spawn(follow(h.keiro.clone(), 0, Some(4_999)));

    let first = spawn_worker(
        h.keiro
            .worker()
            .fast()
            .register("progress", progress)
            .build()?,
    );
    // Kill the worker mid-stream, then let a second worker take the run over.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let written = h
            .keiro
            .messages(("progress", "p-1"))
            .await?
            .streams
            .first()
            .map_or(0, |s| s.items);
        if written >= ITEMS / 3 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream stalled at {written}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    h.keiro.force_release(("progress", "p-1")).await?;
    let second = spawn_worker(
        h.keiro
            .worker()
            .fast()
            .register("progress", progress)
            .build()?,
    );

    let whole = tokio::time::timeout(Duration::from_secs(600), whole).await???;
    let mut halves = tokio::time::timeout(Duration::from_secs(600), first_half).await???;
    assert_eq!(halves.last().map(|(o, _)| *o), Some(4_999));
    halves.extend(follow(h.keiro.clone(), 5_000, None).await?);
    let expected: Vec<(u64, u64)> = (0..ITEMS).map(|i| (i, i * 3)).collect();
    for read in [&whole, &halves] {
        assert_eq!(read.len(), expected.len(), "every offset once");
        assert!(read == &expected, "in order, with its value");
    }
    second.stop().await?;
    let row = h
        .keiro
        .instance(("progress", "p-1"))
        .await?
        .expect("the row");
    assert_eq!(row.status, Status::Completed, "{:?}", row.last_error);
    // The journal holds each append once: the takeover replayed what the first worker wrote.
    let journal = h.keiro.journal(("progress", "p-1")).await?;
    let appends: BTreeSet<String> = journal
        .iter()
        .filter_map(|entry| match &entry.event {
            keiro::store::Event::StepRecorded { step, .. } if step.starts_with("stream:") => {
                Some(step.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        appends.len(),
        usize::try_from(ITEMS)? + 1,
        "each append and the close"
    );
    Ok(())
}

async fn a_caller_waiting_on_an_event_is_woken_when_the_run_sets_it(h: Harness) -> TestResult {
    // The run waits for an approval, then sets its answer; the caller waits on the event.
    let worker = spawn_worker(
        h.keiro
            .worker()
            .fast()
            .register("approve", |ctx: Ctx, (): ()| async move {
                let approved: bool = ctx.await_step("decision").await?;
                ctx.set_event("answer", &if approved { "accepted" } else { "rejected" })
                    .await?;
                Ok::<_, WorkflowError>(())
            })
            .build()?,
    );
    h.keiro.start("approve", "a-1", &()).await?;
    let keiro = h.keiro.clone();
    let caller = tokio::spawn(async move {
        keiro
            .get_event::<String>(("approve", "a-1"), "answer", Duration::from_secs(120))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!caller.is_finished(), "nothing set yet");
    h.keiro
        .deliver(("approve", "a-1"), "decision", &true)
        .await?;
    let answer = tokio::time::timeout(Duration::from_secs(60), caller).await???;
    assert_eq!(answer.as_deref(), Some("accepted"));
    worker.stop().await?;
    Ok(())
}

/// A stream item written inside a transaction step commits with it: the attempt that rolls
/// back leaves no item, and a reader following the stream sees only the committed attempt's,
/// at offset 0. Transaction steps are the Postgres store's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_item_written_in_a_transaction_step_that_rolls_back_is_never_seen() -> TestResult {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use keiro::postgres::{write_stream_in, TransactionStep};

    let h = Harness::postgres().await;
    let attempts = Arc::new(AtomicU32::new(0));
    let a = attempts.clone();
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("settle", move |ctx: Ctx, (): ()| {
            let a = a.clone();
            async move {
                let policy = keiro::StepOptions::new(3).initial_interval(Duration::from_millis(1));
                ctx.write_stream("log", &"before").await?;
                ctx.transaction_with("settle", &policy, |tx| {
                    let (ctx, a) = (ctx.clone(), a.clone());
                    Box::pin(async move {
                        let attempt = a.fetch_add(1, Ordering::SeqCst) + 1;
                        write_stream_in(&ctx, tx, "log", &format!("attempt {attempt}"))
                            .await
                            .map_err(|e| e.to_string())?;
                        if attempt == 1 {
                            return Err("declined, rolled back".to_owned());
                        }
                        Ok::<_, String>(attempt)
                    })
                })
                .await?;
                ctx.write_stream("log", &"after").await?;
                ctx.close_stream("log").await?;
                Ok::<_, WorkflowError>(())
            }
        })
        .build()?;
    h.keiro.start("settle", "s-1", &()).await?;
    let reader = tokio::spawn(follow_log(h.keiro.clone()));
    for _ in 0..100 {
        worker.drain().await?;
        let status = h.keiro.instance(("settle", "s-1")).await?.map(|r| r.status);
        if status == Some(Status::Completed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "one attempt rolled back"
    );
    let read = tokio::time::timeout(Duration::from_secs(60), reader).await???;
    assert_eq!(
        read,
        [
            (0, "before".to_owned()),
            (1, "attempt 2".to_owned()),
            (2, "after".to_owned())
        ],
        "the rolled-back attempt's item was never seen"
    );
    Ok(())
}

async fn follow_log(keiro: Keiro) -> Result<Vec<(u64, String)>, keiro::Error> {
    let mut items = keiro.read_stream::<String>(("settle", "s-1"), "log", 0)?;
    let mut read = Vec::new();
    while let Some(item) = items.next().await {
        read.push(item?);
    }
    Ok(read)
}
