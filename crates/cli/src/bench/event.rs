//! `event`: how long after a run sets an event a caller waiting for it gets the value.
//!
//! N runs (`-n`, 200 by default), C at a time (`-c`): each is started, its caller waits for its
//! event `ready` at once (`Keiro::get_event`), and the run, after a pause of 100 to 300 ms (a
//! step: the work before the news), sets the event to the wall-clock instant of the write.
//! The latency is the caller's clock when it has the value minus the value. Half the callers
//! read through the worker's own store (woken in this process at the commit); the other half
//! through a second store on the same database or file, with its own connections and listener,
//! as a caller in another process would (on PostgreSQL woken by the `msg:` NOTIFY once its
//! wait marked the instance watched, 50 ms in; on SQLite by the file's change polling). A
//! figure is read per kind of caller.

use std::time::Duration;

use keiro::{Ctx, Keiro, WorkflowError};
use serde::Serialize;
use time::OffsetDateTime;

use super::{instance_id, BenchArgs, Percentiles, Setup};
use crate::common::{connect_store, failure, round, Global, Outcome, Result, ResultExt};

/// The registered workflow name.
const WORKFLOW: &str = "bench-event";

/// The push target: p50 of set-to-caller, in milliseconds, for a caller elsewhere.
const TARGET_P50_MS: f64 = 10.0;

/// The wall-clock instant, in microseconds since the epoch.
fn now_us() -> i64 {
    i64::try_from(OffsetDateTime::now_utc().unix_timestamp_nanos() / 1000).unwrap_or(i64::MAX)
}

/// The workflow: waits `pause_ms` in a step, then sets `ready` to the instant of the write.
async fn announcer(ctx: Ctx, pause_ms: u64) -> Result<(), WorkflowError> {
    ctx.step("work", || async move {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        Ok::<_, std::convert::Infallible>(())
    })
    .await?;
    ctx.set_event("ready", &now_us()).await?;
    Ok(())
}

#[derive(Debug, Serialize)]
struct EventReport {
    mode: &'static str,
    store: &'static str,
    runs: u64,
    here_p50_ms: f64,
    here_p99_ms: f64,
    here_max_ms: f64,
    elsewhere_p50_ms: f64,
    elsewhere_p99_ms: f64,
    elsewhere_max_ms: f64,
    target_elsewhere_p50_ms: f64,
}

/// On PostgreSQL: the bench schema's store, and a second store on that schema.
pub(crate) async fn run_postgres(global: &Global, args: &BenchArgs) -> Result<Outcome> {
    let pool = usize::try_from(args.concurrency).unwrap_or(16) + 8;
    let setup = Setup::new(global, args, pool).await?;
    let other = connect_store(args.store_config(global, pool)?).await?;
    let here = Keiro::builder(setup.store.clone()).build();
    let elsewhere = Keiro::builder(other).build();
    measure(args, "postgres", here, elsewhere).await
}

/// On SQLite: a fresh bench file at `path`, and a second store opened on it.
pub(crate) async fn run_sqlite(args: &BenchArgs, path: &std::path::Path) -> Result<Outcome> {
    let config = super::sqlite::config(args);
    let store = super::sqlite::open_fresh(path, config.clone()).await?;
    let owned = path.to_owned();
    let other = tokio::task::spawn_blocking(move || {
        keiro::store::sqlite::SqliteStore::open(&owned, config)
            .context(format!("opening {} again", owned.display()))
    })
    .await
    .context("opening the bench file again")??;
    let here = Keiro::builder(store).build();
    let elsewhere = Keiro::builder(other).build();
    measure(args, "sqlite", here, elsewhere).await
}

/// Runs the experiment with a worker on `here`'s store and callers on `here` and `elsewhere`.
pub(super) async fn measure(
    args: &BenchArgs,
    store: &'static str,
    here: Keiro,
    elsewhere: Keiro,
) -> Result<Outcome> {
    let runs = args.workflows();
    let concurrency = args.concurrency.max(1);
    let worker = here
        .worker()
        .register(WORKFLOW, announcer)
        .concurrency(usize::try_from(concurrency).unwrap_or(16))
        .build()
        .context("building the worker")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..concurrency {
        let (here, elsewhere) = (here.clone(), elsewhere.clone());
        callers.spawn(async move {
            let mut samples = (Vec::new(), Vec::new());
            let mut i = caller;
            while i < runs {
                let id = instance_id("event", i);
                let pause_ms = 100 + fastrand::u64(0..200);
                here.start(WORKFLOW, &id, &pause_ms)
                    .await
                    .context("starting")?;
                let reader = if i % 2 == 0 { &here } else { &elsewhere };
                let written: Option<i64> = reader
                    .get_event((WORKFLOW, id.as_str()), "ready", Duration::from_secs(30))
                    .await
                    .context("waiting for an event")?;
                let got = now_us();
                let written = written
                    .ok_or_else(|| failure(format!("run {id}'s event never came (30 s)")))?;
                let lag = Duration::from_micros(u64::try_from(got - written).unwrap_or(0));
                if i % 2 == 0 {
                    samples.0.push(lag);
                } else {
                    samples.1.push(lag);
                }
                i += concurrency;
            }
            Ok::<_, crate::common::Error>(samples)
        });
    }
    let (mut local, mut remote) = (Vec::new(), Vec::new());
    while let Some(joined) = callers.join_next().await {
        let (l, r) = joined.context("a caller task failed")??;
        local.extend(l);
        remote.extend(r);
    }
    let _ = stop.send(());
    running.await.context("the worker task failed")?;
    if u64::try_from(local.len() + remote.len()).unwrap_or(0) != runs {
        return Err(failure("a caller lost a sample"));
    }
    let (l, r) = (Percentiles::of(&local), Percentiles::of(&remote));
    let report = EventReport {
        mode: "event",
        store,
        runs,
        here_p50_ms: round(l.p50_ms, 2),
        here_p99_ms: round(l.p99_ms, 2),
        here_max_ms: round(l.max_ms, 2),
        elsewhere_p50_ms: round(r.p50_ms, 2),
        elsewhere_p99_ms: round(r.p99_ms, 2),
        elsewhere_max_ms: round(r.max_ms, 2),
        target_elsewhere_p50_ms: TARGET_P50_MS,
    };
    println!(
        "bench: {runs} events on {store}: set to caller in this process p50 {:.2} ms, p99 {:.2} ms; \
         in another store p50 {:.2} ms, p99 {:.2} ms (target p50 < {TARGET_P50_MS} ms)",
        l.p50_ms, l.p99_ms, r.p50_ms, r.p99_ms
    );
    super::emit(&report)?;
    Ok(Outcome::Success)
}
