//! A run started through a handle whose worker runs beside it (`Keiro::worker`, running) is
//! started leased to that worker's loop and handed to it in memory: the loop runs it with no
//! notification and no claim. Only when the loop has a free slot and nothing else was
//! claimable, only for a workflow and a version it serves, and only while it runs; otherwise
//! the start is the ordinary one. Both stores.
//!
//! The loops here wake on a fixed poll of a minute, so a run they did not get by hand-off
//! would wait that long: each test's run ends within seconds only when it was handed off.

use std::sync::Arc;
use std::time::Duration;

use keiro::versions::Versions;
use keiro::worker::FixedPoll;
use keiro::{Ctx, Keiro, Status, Worker};
use keiro_tests::{on_both_stores, spawn_worker, FastWorker, Harness, TestResult};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;

on_both_stores!(
    a_run_started_beside_its_running_worker_runs_without_a_claim,
    a_worker_without_a_free_slot_takes_no_hand_off,
    a_stopped_worker_takes_no_hand_off,
    a_run_of_a_version_the_worker_does_not_serve_is_left_unleased,
    a_handed_off_run_of_a_killed_loop_is_claimed_once_its_lease_expires,
    an_existing_run_of_another_version_is_given_back_at_once,
);

const TIMEOUT: Duration = Duration::from_secs(10);

/// Long enough that no test here sees the loop's poll.
const POLL: Duration = Duration::from_secs(60);

/// How long a loop that is expected to take no hand-off is given to be ready before a start.
const SETTLE: Duration = Duration::from_millis(300);

/// A worker loop on a fixed poll of [`POLL`], stopped through its sender.
struct Loop {
    stop: oneshot::Sender<()>,
    task: JoinHandle<keiro::worker::ResumeSummary>,
}

impl Loop {
    async fn spawn(worker: Worker) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            worker
                .run_with(FixedPoll, async {
                    let _ = stopped.await;
                })
                .await
        });
        tokio::time::sleep(SETTLE).await;
        Self { stop, task }
    }

    /// [`spawn`](Self::spawn), then waits until the loop takes hand-offs (its first claim came
    /// back empty): until a `double` run it is given is handed to it, and every such run ended.
    async fn ready(
        worker: Worker,
        keiro: &Keiro,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let running = Self::spawn(worker).await;
        let mut warm = Vec::new();
        loop {
            let id = format!("warm-{}", warm.len());
            let started = keiro.start("double", &id, &0_u64).await?;
            warm.push(id);
            if started.instance.lease_owner.is_some() {
                break;
            }
            if warm.len() > 100 {
                return Err("the loop took no hand-off".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for id in &warm {
            ended(keiro, ("double", id)).await?;
        }
        Ok(running)
    }

    /// Ends the loop as a crash would: its task and the runs it drives are dropped.
    async fn kill(self) {
        self.task.abort();
        // Once the aborted task is gone, so is the loop and every run it drove.
        let _ = self.task.await;
    }

    async fn stop(self) -> TestResult {
        let _ = self.stop.send(());
        tokio::time::timeout(TIMEOUT, self.task).await??;
        Ok(())
    }
}

/// `double`: one step doubling its input; `gate`: one step that waits for a permit of `gate`.
fn worker(keiro: &Keiro, gate: &Arc<Semaphore>) -> keiro::WorkerBuilder {
    let gate = gate.clone();
    keiro
        .worker()
        .fast()
        .poll_interval(POLL)
        .register("double", |ctx: Ctx, n: u64| async move {
            ctx.step("double", || async move { Ok::<_, std::io::Error>(n * 2) })
                .await
        })
        .register("gate", move |ctx: Ctx, n: u64| {
            let gate = gate.clone();
            async move {
                ctx.step("wait", || async move {
                    let permit = gate.acquire().await.expect("the gate stays open");
                    permit.forget();
                    Ok::<_, std::io::Error>(n)
                })
                .await
            }
        })
}

/// Waits until `key` has ended, failing after [`TIMEOUT`].
async fn ended(
    keiro: &Keiro,
    key: (&str, &str),
) -> Result<keiro::store::Instance, Box<dyn std::error::Error + Send + Sync>> {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let row = keiro.instance(key).await?.expect("started");
        if row.status.is_terminal() {
            return Ok(row);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{key:?} still {:?} after {TIMEOUT:?}", row.status).into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn a_run_started_beside_its_running_worker_runs_without_a_claim(h: Harness) -> TestResult {
    let gate = Arc::new(Semaphore::new(0));
    let running = Loop::ready(worker(&h.keiro, &gate).build()?, &h.keiro).await?;
    let started = h.keiro.start("double", "d-1", &21_u64).await?;
    assert!(started.created);
    assert!(
        started.instance.lease_owner.is_some(),
        "started leased to the loop: {:?}",
        started.instance
    );
    let row = ended(&h.keiro, ("double", "d-1")).await?;
    assert_eq!(row.status, Status::Completed);
    assert_eq!(row.output, Some(serde_json::json!(42)));
    // One lease in all: the one it was started under.
    assert_eq!(row.lease_epoch, 1);
    // A second start of the same id is the ordinary answer: not created, its input stands.
    let again = h.keiro.start("double", "d-1", &5_u64).await?;
    assert!(!again.created);
    assert_eq!(again.instance.input, serde_json::json!(21));
    running.stop().await
}

async fn a_worker_without_a_free_slot_takes_no_hand_off(h: Harness) -> TestResult {
    let gate = Arc::new(Semaphore::new(0));
    let running = Loop::ready(worker(&h.keiro, &gate).concurrency(1).build()?, &h.keiro).await?;
    // The first run takes the loop's one slot, and holds it at its gate.
    let first = h.keiro.start("gate", "g-1", &1_u64).await?;
    assert!(
        first.instance.lease_owner.is_some(),
        "the first is handed off"
    );
    // The second finds no room: an ordinary start, left for a claim.
    let second = h.keiro.start("gate", "g-2", &2_u64).await?;
    assert!(second.created);
    assert_eq!(second.instance.lease_owner, None, "{:?}", second.instance);
    assert_eq!(second.instance.lease_epoch, 0);
    gate.add_permits(2);
    assert_eq!(
        ended(&h.keiro, ("gate", "g-1")).await?.status,
        Status::Completed
    );
    // The loop's next pass claims it, as any run started elsewhere.
    let second = ended(&h.keiro, ("gate", "g-2")).await?;
    assert_eq!(second.status, Status::Completed);
    assert_eq!(second.lease_epoch, 1, "claimed once: {second:?}");
    running.stop().await
}

async fn a_stopped_worker_takes_no_hand_off(h: Harness) -> TestResult {
    let gate = Arc::new(Semaphore::new(0));
    let running = Loop::spawn(worker(&h.keiro, &gate).build()?).await;
    running.stop().await?;
    let started = h.keiro.start("double", "d-1", &21_u64).await?;
    assert!(started.created);
    assert_eq!(started.instance.lease_owner, None, "{:?}", started.instance);
    // Any worker claims it at once.
    worker(&h.keiro, &gate).build()?.drain().await?;
    let row = ended(&h.keiro, ("double", "d-1")).await?;
    assert_eq!(row.output, Some(serde_json::json!(42)));
    Ok(())
}

async fn a_run_of_a_version_the_worker_does_not_serve_is_left_unleased(h: Harness) -> TestResult {
    let gate = Arc::new(Semaphore::new(0));
    let v1 = h.versioned("v1").await;
    let running = Loop::spawn(
        worker(&v1.keiro, &gate)
            .serve(Versions::only(["v2"]))
            .build()?,
    )
    .await;
    let started = v1.keiro.start("double", "d-1", &21_u64).await?;
    assert!(started.created);
    assert_eq!(started.instance.lease_owner, None, "{:?}", started.instance);
    assert_eq!(started.instance.app_version.as_deref(), Some("v1"));
    running.stop().await?;
    // A worker serving v1 runs it.
    worker(&v1.keiro, &gate).build()?.drain().await?;
    assert_eq!(
        ended(&v1.keiro, ("double", "d-1")).await?.status,
        Status::Completed
    );
    Ok(())
}

async fn a_handed_off_run_of_a_killed_loop_is_claimed_once_its_lease_expires(
    h: Harness,
) -> TestResult {
    let gate = Arc::new(Semaphore::new(0));
    let ttl = Duration::from_secs(2);
    let running = Loop::ready(worker(&h.keiro, &gate).lease_ttl(ttl).build()?, &h.keiro).await?;
    let started = h.keiro.start("gate", "g-1", &7_u64).await?;
    let owner = started.instance.lease_owner.clone().expect("handed off");
    // The run is in its step when its process dies.
    tokio::time::sleep(Duration::from_millis(100)).await;
    running.kill().await;
    gate.add_permits(1);
    // Another worker (taking no hand-offs) claims it once the lease has expired.
    let other = spawn_worker(
        worker(&h.keiro, &gate)
            .poll_interval(Duration::from_millis(20))
            .hand_offs(None)
            .build()?,
    );
    let row = ended(&h.keiro, ("gate", "g-1")).await?;
    assert_eq!(row.status, Status::Completed);
    assert_eq!(row.output, Some(serde_json::json!(7)));
    assert_eq!(
        row.lease_epoch, 2,
        "claimed again after the first lease: {row:?}"
    );
    assert_ne!(row.lease_owner.as_deref(), Some(owner.as_str()));
    other.stop().await?;
    Ok(())
}

async fn an_existing_run_of_another_version_is_given_back_at_once(h: Harness) -> TestResult {
    let gate = Arc::new(Semaphore::new(0));
    let (v0, v1) = (h.versioned("v0").await, h.versioned("v1").await);
    // Started by v0 while nothing runs: runnable, unleased.
    assert!(v0.keiro.start("double", "d-1", &21_u64).await?.created);
    let running = Loop::ready(worker(&v1.keiro, &gate).build()?, &v1.keiro).await?;
    // v1's start of the same id takes a slot of v1's loop and claims the existing run in its
    // statement; the loop does not serve v0, so the lease goes back before the call returns.
    let again = v1.keiro.start("double", "d-1", &5_u64).await?;
    assert!(!again.created);
    let row = v1
        .keiro
        .instance(("double", "d-1"))
        .await?
        .expect("started");
    assert_eq!(row.status, Status::Running);
    assert_eq!(row.lease_owner, None, "{row:?}");
    assert_eq!(row.app_version.as_deref(), Some("v0"));
    assert_eq!(row.input, serde_json::json!(21));
    running.stop().await?;
    // A worker serving v0 runs it at once.
    worker(&v0.keiro, &gate).build()?.drain().await?;
    assert_eq!(
        ended(&v0.keiro, ("double", "d-1")).await?.output,
        Some(serde_json::json!(42))
    );
    Ok(())
}
