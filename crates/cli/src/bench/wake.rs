//! `wake-latency`: how long after an awakeable is completed its run takes its next step.
//!
//! N workflows park on an awakeable each (drained to parked before anything is measured). Then
//! the bench completes them one at a time: it takes `t0` just before
//! [`Keiro::complete_awakeable`], and the run's next step takes `t1` when its action starts
//! (both `Instant`s of this process; the worker runs in it). Between one run's wake and the
//! next completion it pauses, so every completion finds the worker idle: the figure is the
//! latency of a wake, not of a queue.
//!
//! Two workers take turns on fresh sets of runs: the push-aware one (`Keiro::builder(store).build()`,
//! default options: LISTEN/NOTIFY, 1 s fallback poll) and a fixed-poll one (`.push(None)`,
//! poll 1 s). The poll worker's samples are spread over its poll cycle by a random pause of up
//! to one interval before each completion; without it, completing right after each wake would
//! line every completion up just after a poll and measure the worst case every time.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use keiro::{workflow::AwakeableOutcome, Ctx, Keiro, WorkflowError};
use serde::Serialize;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::{instance_id, start_all, BenchArgs, Percentiles, Setup};
use crate::common::{failure, ms, Global, Outcome, Result, ResultExt};

/// The registered workflow name.
const WORKFLOW: &str = "bench-wake";

/// The poll interval of the fixed-poll worker (and the push worker's fallback, its default).
const POLL: Duration = Duration::from_secs(1);

/// How long a run may take to wake before its sample counts as lost.
const WAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The pause after the worker starts and before the first completion: its LISTEN connection
/// comes up and its first passes (which find nothing) are over.
const SETTLE: Duration = Duration::from_millis(500);

/// The push targets: p50 and p99 of completion-to-next-step, in milliseconds.
const TARGET_PUSH_P50_MS: f64 = 10.0;
const TARGET_PUSH_P99_MS: f64 = 50.0;

/// Shared between the bench and the workflow bodies of its in-process worker.
#[derive(Default)]
struct Wakes {
    /// Each run's awakeable id, announced by its first step.
    announced: Mutex<HashMap<String, Uuid>>,
    /// Where the run completed next reports its `t1`.
    waiting: Mutex<HashMap<String, oneshot::Sender<Instant>>>,
}

impl Wakes {
    /// Records run `id`'s awakeable (its first step does).
    fn announce(&self, id: &str, awakeable: Uuid) {
        // The maps hold plain values, valid whatever a panicking holder did.
        self.announced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), awakeable);
    }

    /// The awakeable run `id` announced.
    fn awakeable(&self, id: &str) -> Option<Uuid> {
        self.announced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .copied()
    }

    /// Arms the receiver of run `id`'s `t1`; call it before completing the awakeable.
    fn expect(&self, id: &str) -> oneshot::Receiver<Instant> {
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), tx);
        rx
    }

    /// Reports run `id`'s `t1` to whoever expects it.
    fn woke(&self, id: &str, at: Instant) {
        let waiting = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        if let Some(tx) = waiting {
            // The bench gave up on this sample if the receiver is gone; nothing to report to.
            let _ = tx.send(at);
        }
    }
}

/// The measured workflow: announce an awakeable, park on it, and note when it woke.
async fn parked(ctx: Ctx, _input: (), wakes: Arc<Wakes>) -> Result<u64, WorkflowError> {
    let id = ctx.key().id.as_str().to_owned();
    let wake = ctx.awakeable::<u64>("wake").await?;
    let awakeable = wake.id();
    ctx.step("announce", || {
        wakes.announce(&id, awakeable);
        async { Ok::<_, Infallible>(()) }
    })
    .await?;
    let value = wake.value().await?;
    ctx.step("woke", || {
        // Taken when the action starts: the run is claimed, replayed and past its await.
        wakes.woke(&id, Instant::now());
        async { Ok::<_, Infallible>(()) }
    })
    .await?;
    Ok(value)
}

/// One worker's turn.
struct Phase {
    /// The report's name for it.
    label: &'static str,
    /// Whether the worker is push-aware (otherwise: `.push(None)`, poll [`POLL`]).
    push: bool,
    /// Runs parked and woken.
    samples: u64,
}

/// What one phase measured.
struct Measured {
    /// `t1 - t0` per completion.
    latencies: Vec<Duration>,
    /// The duration of each `complete_awakeable` call alone.
    calls: Vec<Duration>,
}

/// The wake-latency figures; serialized as the last line, keys in this order.
#[derive(Debug, Serialize)]
struct WakeReport {
    mode: &'static str,
    /// The pause before each push completion, in milliseconds.
    gap_ms: u64,
    push: Percentiles,
    /// The fixed-poll worker's interval.
    poll_interval_ms: u64,
    poll: Percentiles,
    /// The completing call alone (its transaction commits the wake), push phase.
    complete_call: Percentiles,
    target_push_p50_ms: f64,
    target_push_p99_ms: f64,
    push_p50_met: bool,
    push_p99_met: bool,
}

/// The wake-latency mode.
pub(super) async fn run(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let setup = Setup::new(global, args, 8).await?;
    let keiro = Keiro::builder(setup.store.clone()).build();
    let wakes = Arc::new(Wakes::default());
    println!(
        "bench: wake-latency: {} awakeables completed one at a time ({} ms apart) with the \
         push-aware worker, {} with a fixed {} ms poll worker; schema {}",
        args.workflows(),
        args.gap_ms,
        args.poll_samples,
        POLL.as_millis(),
        args.bench_schema
    );
    let phases = [
        Phase {
            label: "push",
            push: true,
            samples: args.workflows(),
        },
        Phase {
            label: "poll",
            push: false,
            samples: args.poll_samples,
        },
    ];
    let mut measured = Vec::new();
    for phase in &phases {
        measured.push(measure(&keiro, &wakes, phase, args).await?);
    }
    let [push, poll] = [&measured[0], &measured[1]];
    let (push_p, poll_p) = (
        Percentiles::of(&push.latencies),
        Percentiles::of(&poll.latencies),
    );
    let complete_call = Percentiles::of(&push.calls);
    for (phase, p) in phases.iter().zip([push_p, poll_p]) {
        println!(
            "bench: {}: {} samples, completion to next step p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, \
             mean {:.2} ms",
            phase.label, p.samples, p.p50_ms, p.p99_ms, p.max_ms, p.mean_ms
        );
    }
    println!(
        "bench: the completing call alone (push phase): p50 {:.2} ms, p99 {:.2} ms",
        complete_call.p50_ms, complete_call.p99_ms
    );
    let (p50_met, p99_met) = (
        push_p.p50_ms < TARGET_PUSH_P50_MS,
        push_p.p99_ms < TARGET_PUSH_P99_MS,
    );
    println!(
        "bench: targets: push p50 < {TARGET_PUSH_P50_MS} ms {}, push p99 < {TARGET_PUSH_P99_MS} ms {}",
        met(p50_met),
        met(p99_met)
    );
    let report = WakeReport {
        mode: "wake-latency",
        gap_ms: args.gap_ms,
        push: push_p,
        poll_interval_ms: u64::try_from(POLL.as_millis()).unwrap_or(u64::MAX),
        poll: poll_p,
        complete_call,
        target_push_p50_ms: TARGET_PUSH_P50_MS,
        target_push_p99_ms: TARGET_PUSH_P99_MS,
        push_p50_met: p50_met,
        push_p99_met: p99_met,
    };
    super::emit(&report)?;
    drop(setup);
    Ok(Outcome::Success)
}

/// How a target reads in the human lines.
fn met(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// Parks `phase.samples` fresh runs, then completes them one at a time under a worker of the
/// phase's kind.
async fn measure(
    keiro: &Keiro,
    wakes: &Arc<Wakes>,
    phase: &Phase,
    args: &BenchArgs,
) -> Result<Measured> {
    let prefix = phase.label;
    start_all(keiro, WORKFLOW, prefix, phase.samples, 4, ()).await?;
    let body_wakes = wakes.clone();
    let mut builder = keiro.worker().register(WORKFLOW, move |ctx, input| {
        parked(ctx, input, body_wakes.clone())
    });
    if !phase.push {
        builder = builder.push(None).poll_interval(POLL);
    }
    let worker = builder
        .build()
        .context("building the wake-latency worker")?;
    // Parked before the clock starts: a pass would otherwise be starting and parking runs
    // while others are being woken.
    let drained = worker
        .drain()
        .await
        .context("parking the wake-latency runs")?;
    if drained.completed != 0 || drained.failed != 0 {
        return Err(failure(format!(
            "{}: parking the runs completed {} and failed {} of them",
            phase.label, drained.completed, drained.failed
        )));
    }
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stop_rx.await;
            })
            .await
    });
    tokio::time::sleep(SETTLE).await;

    let mut measured = Measured {
        latencies: Vec::new(),
        calls: Vec::new(),
    };
    let mut lost = 0;
    for i in 0..phase.samples {
        let id = instance_id(prefix, i);
        let awakeable = wakes
            .awakeable(&id)
            .ok_or_else(|| failure(format!("{id} never announced its awakeable")))?;
        tokio::time::sleep(pause(phase, args)).await;
        let woke = wakes.expect(&id);
        let t0 = Instant::now();
        let outcome = keiro
            .complete_awakeable(awakeable, &i)
            .await
            .context(format!("completing the awakeable of {id}"))?;
        measured.calls.push(t0.elapsed());
        if outcome != AwakeableOutcome::Delivered {
            return Err(failure(format!(
                "completing the awakeable of {id} gave {outcome:?}"
            )));
        }
        match tokio::time::timeout(WAKE_TIMEOUT, woke).await {
            Ok(Ok(t1)) => measured.latencies.push(t1.saturating_duration_since(t0)),
            _ => lost += 1,
        }
    }
    let _ = stop_tx.send(());
    running
        .await
        .context("the wake-latency worker task failed")?;
    if lost > 0 {
        return Err(failure(format!(
            "{}: {lost} of {} runs did not wake within {WAKE_TIMEOUT:?} of their completion",
            phase.label, phase.samples
        )));
    }
    let slowest = measured.latencies.iter().max().copied().unwrap_or_default();
    println!(
        "bench: {}: {} runs parked and woken one at a time, slowest {:.1} ms",
        phase.label,
        phase.samples,
        ms(slowest)
    );
    Ok(measured)
}

/// The pause before a completion: `--gap-ms`, plus for the poll worker a uniform random share
/// of its interval, so completions land anywhere in its poll cycle.
fn pause(phase: &Phase, args: &BenchArgs) -> Duration {
    let gap = Duration::from_millis(args.gap_ms);
    if phase.push {
        return gap;
    }
    let interval_ms = u64::try_from(POLL.as_millis()).unwrap_or(u64::MAX).max(1);
    let random = fastrand::u64(..interval_ms);
    gap + Duration::from_millis(random)
}
