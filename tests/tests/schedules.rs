//! Schedules on both stores: ticks while the schedulers were down under each catch-up policy,
//! each overlap policy, two schedulers racing (exactly one start per tick), pause and resume,
//! trigger, daylight-saving days, an unregistered workflow and bad definitions.
//!
//! Time is passed in (`now`) on both stores, never slept for: the scheduler plans with the
//! instant its store reports, which is the one given.

use std::sync::Arc;
use std::time::Duration;

use keiro::{
    CatchUp, Ctx, Error, InstanceKey, Keiro, Overlap, ScheduleError, ScheduleStore,
    SchedulerOptions, Status, Worker, WorkflowError,
};
use keiro_resume::{FireOutcome, ScheduleFire};
use keiro_tests::{on_both_stores, until_status, Harness, TestResult};
use time::macros::datetime;
use time::OffsetDateTime;

const MINUTE: Duration = Duration::from_secs(60);

async fn job(_ctx: Ctx, _input: serde_json::Value) -> Result<(), WorkflowError> {
    Ok(())
}

fn store(h: &Harness) -> Arc<dyn ScheduleStore> {
    h.keiro
        .schedule_store()
        .expect("both test stores have schedules")
        .clone()
}

fn options(owner: &str) -> SchedulerOptions {
    SchedulerOptions {
        owner: owner.into(),
        ..SchedulerOptions::default()
    }
}

fn worker(h: &Harness, owner: &str) -> Result<Worker, Error> {
    h.keiro
        .worker()
        .options(h.fast_options())
        .register("job", job)
        .scheduler(Some(options(owner)))
        .build()
}

/// Creates (or updates) `name`: every minute, starting `job`, as of `now`.
async fn every_minute(
    h: &Harness,
    name: &str,
    overlap: Overlap,
    catch_up: CatchUp,
    now: OffsetDateTime,
) -> TestResult {
    let spec = h
        .keiro
        .schedule(name, "job")
        .every(MINUTE)
        .input(&name)
        .overlap(overlap)
        .catch_up(catch_up)
        .spec()?;
    store(h).schedule_upsert(&spec, Some(now)).await?;
    Ok(())
}

fn id(schedule: &str, tick: OffsetDateTime) -> String {
    keiro_resume::tick_instance_id(schedule, tick)
        .expect("valid")
        .as_str()
        .to_owned()
}

async fn status(h: &Harness, workflow: &str, id: &str) -> Result<Option<Status>, Error> {
    keiro_tests::status(&h.keiro, workflow, id).await
}

/// The instance ids a schedule started, among `ticks`.
async fn started(
    h: &Harness,
    schedule: &str,
    ticks: &[OffsetDateTime],
) -> Result<Vec<OffsetDateTime>, Error> {
    let mut found = Vec::new();
    for tick in ticks {
        if status(h, "job", &id(schedule, *tick)).await?.is_some() {
            found.push(*tick);
        }
    }
    Ok(found)
}

fn minutes(from: OffsetDateTime, n: i64) -> Vec<OffsetDateTime> {
    (0..n).map(|i| from + time::Duration::minutes(i)).collect()
}

async fn ticks_while_down_follow_each_catch_up_policy(h: Harness) -> TestResult {
    let t0 = datetime!(2026-01-01 10:00:30 UTC);
    every_minute(&h, "none", Overlap::AllowAll, CatchUp::None, t0).await?;
    every_minute(&h, "last", Overlap::AllowAll, CatchUp::Last, t0).await?;
    every_minute(&h, "all", Overlap::AllowAll, CatchUp::All { max: 3 }, t0).await?;
    let w = worker(&h, "a")?;
    // Down from 10:00:30 until 10:05:30: 10:01..10:04 were missed, 10:05 is on time.
    let summary = w
        .schedule_once(Some(datetime!(2026-01-01 10:05:30 UTC)))
        .await?;
    let all = minutes(datetime!(2026-01-01 10:00 UTC), 7);
    assert_eq!(
        started(&h, "none", &all).await?,
        vec![datetime!(2026-01-01 10:05 UTC)]
    );
    assert_eq!(
        started(&h, "last", &all).await?,
        minutes(datetime!(2026-01-01 10:04 UTC), 2)
    );
    assert_eq!(
        started(&h, "all", &all).await?,
        minutes(datetime!(2026-01-01 10:02 UTC), 4),
        "the latest three missed ticks, and the on-time one"
    );
    assert_eq!(summary.started, 1 + 2 + 4);
    for name in ["none", "last", "all"] {
        let row = store(&h).schedule_get(name).await?.expect("exists");
        assert_eq!(
            row.next_tick,
            Some(datetime!(2026-01-01 10:06 UTC)),
            "{name}"
        );
        assert_eq!(
            row.last_tick,
            Some(datetime!(2026-01-01 10:05 UTC)),
            "{name}"
        );
        assert_eq!(
            row.last_instance.map(|i| i.as_str().to_owned()),
            Some(id(name, datetime!(2026-01-01 10:05 UTC)))
        );
    }
    // The runs carry the schedule's input.
    let run = h
        .keiro
        .instance(("job", &id("all", datetime!(2026-01-01 10:03 UTC))))
        .await?
        .expect("started");
    assert_eq!(run.input, serde_json::json!("all"));
    // A second pass at the same instant starts nothing more.
    let again = w
        .schedule_once(Some(datetime!(2026-01-01 10:05:30 UTC)))
        .await?;
    assert_eq!(again.started + again.already_started, 0);
    Ok(())
}

async fn skip_overlap_drops_ticks_while_the_previous_run_is_live(h: Harness) -> TestResult {
    every_minute(
        &h,
        "s",
        Overlap::Skip,
        CatchUp::None,
        datetime!(2026-01-01 10:00:30 UTC),
    )
    .await?;
    let w = worker(&h, "a")?;
    w.schedule_once(Some(datetime!(2026-01-01 10:01:01 UTC)))
        .await?;
    let first = id("s", datetime!(2026-01-01 10:01 UTC));
    assert_eq!(status(&h, "job", &first).await?, Some(Status::Running));
    let skipped = w
        .schedule_once(Some(datetime!(2026-01-01 10:02:01 UTC)))
        .await?;
    assert_eq!((skipped.started, skipped.dropped), (0, 1));
    w.drain().await?;
    assert_eq!(status(&h, "job", &first).await?, Some(Status::Completed));
    let next = w
        .schedule_once(Some(datetime!(2026-01-01 10:03:01 UTC)))
        .await?;
    assert_eq!(next.started, 1);
    assert_eq!(
        started(&h, "s", &minutes(datetime!(2026-01-01 10:01 UTC), 3)).await?,
        vec![
            datetime!(2026-01-01 10:01 UTC),
            datetime!(2026-01-01 10:03 UTC)
        ]
    );
    Ok(())
}

async fn buffer_one_starts_the_kept_tick_when_the_previous_run_ends(h: Harness) -> TestResult {
    every_minute(
        &h,
        "b",
        Overlap::BufferOne,
        CatchUp::None,
        datetime!(2026-01-01 10:00:30 UTC),
    )
    .await?;
    let w = worker(&h, "a")?;
    w.schedule_once(Some(datetime!(2026-01-01 10:01:01 UTC)))
        .await?;
    let kept = w
        .schedule_once(Some(datetime!(2026-01-01 10:02:01 UTC)))
        .await?;
    assert_eq!((kept.started, kept.buffered), (0, 1));
    let full = w
        .schedule_once(Some(datetime!(2026-01-01 10:03:01 UTC)))
        .await?;
    assert_eq!(
        (full.started, full.dropped),
        (0, 1),
        "the buffer holds one tick"
    );
    let row = store(&h).schedule_get("b").await?.expect("exists");
    assert_eq!(row.buffered_tick, Some(datetime!(2026-01-01 10:02 UTC)));
    w.drain().await?;
    let resumed = w
        .schedule_once(Some(datetime!(2026-01-01 10:03:30 UTC)))
        .await?;
    assert_eq!(
        resumed.started, 1,
        "the kept 10:02 tick starts once 10:01 has ended"
    );
    assert_eq!(
        started(&h, "b", &minutes(datetime!(2026-01-01 10:01 UTC), 3)).await?,
        minutes(datetime!(2026-01-01 10:01 UTC), 2)
    );
    let row = store(&h).schedule_get("b").await?.expect("exists");
    assert_eq!(row.buffered_tick, None);
    Ok(())
}

async fn allow_all_overlap_starts_every_tick(h: Harness) -> TestResult {
    every_minute(
        &h,
        "a",
        Overlap::AllowAll,
        CatchUp::None,
        datetime!(2026-01-01 10:00:30 UTC),
    )
    .await?;
    let w = worker(&h, "a")?;
    w.schedule_once(Some(datetime!(2026-01-01 10:01:01 UTC)))
        .await?;
    w.schedule_once(Some(datetime!(2026-01-01 10:02:01 UTC)))
        .await?;
    let ticks = minutes(datetime!(2026-01-01 10:01 UTC), 2);
    assert_eq!(started(&h, "a", &ticks).await?, ticks);
    for tick in ticks {
        assert_eq!(
            status(&h, "job", &id("a", tick)).await?,
            Some(Status::Running)
        );
    }
    Ok(())
}

async fn two_schedulers_racing_start_each_tick_exactly_once(h: Harness) -> TestResult {
    every_minute(
        &h,
        "r",
        Overlap::AllowAll,
        CatchUp::None,
        datetime!(2026-01-01 10:00:30 UTC),
    )
    .await?;
    let (a, b) = (worker(&h, "a")?, worker(&h, "b")?);
    let mut total = keiro::SchedulerSummary::default();
    for minute in 1..=5 {
        let now = datetime!(2026-01-01 10:00:01 UTC) + time::Duration::minutes(minute);
        let (x, y) = tokio::join!(a.schedule_once(Some(now)), b.schedule_once(Some(now)));
        let (x, y) = (x?, y?);
        assert_eq!(x.led + y.led, 1, "exactly one leader per pass");
        total += x;
        total += y;
    }
    assert_eq!(total.started, 5);
    assert_eq!(total.already_started, 0);
    let ticks = minutes(datetime!(2026-01-01 10:01 UTC), 5);
    assert_eq!(started(&h, "r", &ticks).await?, ticks);

    // The leader stops renewing; after its lease expires the other takes over and the
    // former leader's write is refused.
    let s = store(&h);
    let later = datetime!(2026-01-01 10:30 UTC);
    let lead_b = s
        .scheduler_lease("b", MINUTE, Some(later))
        .await?
        .expect("expired: free");
    let lead_a = s.scheduler_lease("a", MINUTE, Some(later)).await?;
    assert_eq!(lead_a, None, "b holds it now");
    let row = s.schedule_get("r").await?.expect("exists");
    let stale_fence = keiro::Fence {
        owner: "a".into(),
        epoch: lead_b.epoch - 1,
    };
    let fire = |leader: keiro::Fence, revision: i64| ScheduleFire {
        name: "r".into(),
        leader,
        revision,
        starts: Vec::new(),
        next_tick: row.next_tick,
        last_tick: row.last_tick,
        buffered_tick: None,
    };
    assert_eq!(
        s.schedule_fire(&fire(stale_fence, row.revision)).await?,
        FireOutcome::NotLeader
    );
    assert_eq!(
        s.schedule_fire(&fire(lead_b.clone(), row.revision - 1))
            .await?,
        FireOutcome::Stale,
        "a plan from an older revision writes nothing"
    );
    assert!(matches!(
        s.schedule_fire(&fire(lead_b, row.revision)).await?,
        FireOutcome::Fired(_)
    ));
    Ok(())
}

async fn a_dead_leaders_successor_starts_the_ticks_it_missed_once(h: Harness) -> TestResult {
    every_minute(
        &h,
        "d",
        Overlap::AllowAll,
        CatchUp::None,
        datetime!(2026-01-01 10:00:30 UTC),
    )
    .await?;
    let (a, b) = (worker(&h, "a")?, worker(&h, "b")?);
    a.schedule_once(Some(datetime!(2026-01-01 10:01:01 UTC)))
        .await?;
    // `a` dies; within its lease `b` only follows; after it, `b` leads and starts 10:02 late
    // but within the catch-up window, so on time.
    let follows = b
        .schedule_once(Some(datetime!(2026-01-01 10:01:10 UTC)))
        .await?;
    assert_eq!((follows.led, follows.started), (0, 0));
    let leads = b
        .schedule_once(Some(datetime!(2026-01-01 10:02:20 UTC)))
        .await?;
    assert_eq!((leads.led, leads.started), (1, 1));
    let ticks = minutes(datetime!(2026-01-01 10:01 UTC), 2);
    assert_eq!(started(&h, "d", &ticks).await?, ticks);
    Ok(())
}

async fn pause_skips_ticks_and_resume_does_not_catch_them_up(h: Harness) -> TestResult {
    every_minute(
        &h,
        "p",
        Overlap::AllowAll,
        CatchUp::All { max: 10 },
        datetime!(2026-01-01 10:00:30 UTC),
    )
    .await?;
    let s = store(&h);
    let w = worker(&h, "a")?;
    let paused = s
        .schedule_set_paused("p", true, Some(datetime!(2026-01-01 10:00:40 UTC)))
        .await?
        .expect("exists");
    assert!(paused.paused);
    let none = w
        .schedule_once(Some(datetime!(2026-01-01 10:03:01 UTC)))
        .await?;
    assert_eq!(none.started, 0);
    let resumed = s
        .schedule_set_paused("p", false, Some(datetime!(2026-01-01 10:03:30 UTC)))
        .await?
        .expect("exists");
    assert_eq!(resumed.next_tick, Some(datetime!(2026-01-01 10:04 UTC)));
    w.schedule_once(Some(datetime!(2026-01-01 10:04:01 UTC)))
        .await?;
    assert_eq!(
        started(&h, "p", &minutes(datetime!(2026-01-01 10:01 UTC), 4)).await?,
        vec![datetime!(2026-01-01 10:04 UTC)]
    );
    // The facade's operations, and an unknown name.
    assert!(h.keiro.schedules().pause("p").await?.paused);
    assert!(!h.keiro.schedules().resume("p").await?.paused);
    assert!(matches!(
        h.keiro.schedules().pause("nope").await,
        Err(Error::NoSchedule { .. })
    ));
    Ok(())
}

async fn trigger_starts_one_run_now_whatever_the_policy(h: Harness) -> TestResult {
    every_minute(
        &h,
        "t",
        Overlap::Skip,
        CatchUp::None,
        datetime!(2026-01-01 10:00:30 UTC),
    )
    .await?;
    let s = store(&h);
    s.schedule_set_paused("t", true, None).await?;
    let at = datetime!(2026-01-01 10:00:40.123 UTC);
    let run = s.schedule_trigger("t", Some(at)).await?.expect("exists");
    assert!(run.created, "a paused schedule can still be triggered");
    assert_eq!(run.instance.key.id.as_str(), "t@20260101T100040.123Z");
    let row = s.schedule_get("t").await?.expect("exists");
    assert_eq!(row.last_instance, Some(run.instance.key.id.clone()));
    // Resumed, the next tick finds the triggered run live and, under Skip, starts nothing.
    s.schedule_set_paused("t", false, Some(datetime!(2026-01-01 10:00:50 UTC)))
        .await?;
    let w = worker(&h, "a")?;
    let skipped = w
        .schedule_once(Some(datetime!(2026-01-01 10:01:01 UTC)))
        .await?;
    assert_eq!((skipped.started, skipped.dropped), (0, 1));
    // Through the facade, on the store's clock.
    let now = h.keiro.schedules().trigger("t").await?;
    assert!(now.instance.key.id.as_str().starts_with("t@"));
    assert!(matches!(
        h.keiro.schedules().trigger("nope").await,
        Err(Error::NoSchedule { .. })
    ));
    Ok(())
}

async fn a_daily_0230_in_berlin_on_both_daylight_saving_days(h: Harness) -> TestResult {
    let spec = h
        .keiro
        .schedule("berlin", "job")
        .cron("30 2 * * *")
        .time_zone("Europe/Berlin")
        .overlap(Overlap::AllowAll) // the March run is still live in October
        .spec()?;
    let s = store(&h);
    let w = worker(&h, "a")?;
    // Spring forward, 2026-03-29: 02:30 does not exist; the tick is at 03:00 CEST.
    let row = s
        .schedule_upsert(&spec, Some(datetime!(2026-03-28 12:00 UTC)))
        .await?;
    assert_eq!(row.next_tick, Some(datetime!(2026-03-29 01:00 UTC)));
    w.schedule_once(Some(datetime!(2026-03-29 01:00:05 UTC)))
        .await?;
    assert_eq!(
        status(&h, "job", "berlin@20260329T010000Z").await?,
        Some(Status::Running)
    );
    let row = s.schedule_get("berlin").await?.expect("exists");
    assert_eq!(row.next_tick, Some(datetime!(2026-03-30 00:30 UTC)));
    // Fall back, 2026-10-25: 02:30 happens twice; the tick is the first, 02:30 CEST, only.
    let row = s
        .schedule_upsert(&spec, Some(datetime!(2026-10-24 12:00 UTC)))
        .await?;
    assert_eq!(row.next_tick, Some(datetime!(2026-10-25 00:30 UTC)));
    w.schedule_once(Some(datetime!(2026-10-25 00:30:05 UTC)))
        .await?;
    let again = w
        .schedule_once(Some(datetime!(2026-10-25 01:30:05 UTC)))
        .await?;
    assert_eq!(again.started, 0, "02:30 CET is not a second tick");
    assert_eq!(
        status(&h, "job", "berlin@20261025T003000Z").await?,
        Some(Status::Running)
    );
    assert_eq!(status(&h, "job", "berlin@20261025T013000Z").await?, None);
    let row = s.schedule_get("berlin").await?.expect("exists");
    assert_eq!(row.next_tick, Some(datetime!(2026-10-26 01:30 UTC)));
    Ok(())
}

async fn an_unregistered_workflow_is_refused_and_recorded(h: Harness) -> TestResult {
    let spec = h
        .keiro
        .schedule("ghostly", "ghost")
        .every(MINUTE)
        .overlap(Overlap::AllowAll)
        .catch_up(CatchUp::Last)
        .spec()?;
    let s = store(&h);
    s.schedule_upsert(&spec, Some(datetime!(2026-01-01 10:00:30 UTC)))
        .await?;
    let w = worker(&h, "a")?;
    let refused = w
        .schedule_once(Some(datetime!(2026-01-01 10:01:01 UTC)))
        .await?;
    assert_eq!((refused.unregistered, refused.started), (1, 0));
    let row = s.schedule_get("ghostly").await?.expect("exists");
    let error = row.last_error.expect("the reason is recorded");
    assert!(
        error.contains("ghost") && error.contains("not registered"),
        "{error}"
    );
    assert_eq!(
        row.next_tick,
        Some(datetime!(2026-01-01 10:01 UTC)),
        "its ticks stay due"
    );
    assert_eq!(status(&h, "ghost", "ghostly@20260101T100100Z").await?, None);
    // A worker that has it takes over once the first one's leadership ends: the missed ticks
    // follow the catch-up policy (the last one), the on-time one starts.
    s.scheduler_release("a").await?;
    let ghost = h
        .keiro
        .worker()
        .register("ghost", job)
        .scheduler(Some(options("g")))
        .build()?;
    let caught_up = ghost
        .schedule_once(Some(datetime!(2026-01-01 10:05:30 UTC)))
        .await?;
    assert_eq!(caught_up.started, 2);
    assert!(status(&h, "ghost", "ghostly@20260101T100400Z")
        .await?
        .is_some());
    assert!(status(&h, "ghost", "ghostly@20260101T100500Z")
        .await?
        .is_some());
    assert_eq!(
        s.schedule_get("ghostly").await?.expect("exists").last_error,
        None
    );
    Ok(())
}

async fn bad_definitions_are_typed_errors(h: Harness) -> TestResult {
    let k = &h.keiro;
    let cron = k.schedule("x", "job").cron("61 * * * *").save().await;
    assert!(
        matches!(cron, Err(Error::Schedule(ScheduleError::Cron { .. }))),
        "{cron:?}"
    );
    let garbage = k.schedule("x", "job").cron("every tuesday").save().await;
    assert!(matches!(
        garbage,
        Err(Error::Schedule(ScheduleError::Cron { .. }))
    ));
    let zone = k
        .schedule("x", "job")
        .cron("0 * * * *")
        .time_zone("Europe/Atlantis")
        .save()
        .await;
    assert!(matches!(
        zone,
        Err(Error::Schedule(ScheduleError::TimeZone { .. }))
    ));
    let none = k.schedule("x", "job").save().await;
    assert!(matches!(
        none,
        Err(Error::Schedule(ScheduleError::NoCadence { .. }))
    ));
    let short = k
        .schedule("x", "job")
        .every(Duration::from_millis(10))
        .save()
        .await;
    assert!(matches!(
        short,
        Err(Error::Schedule(ScheduleError::Interval { .. }))
    ));
    let name = k.schedule("a/b", "job").every(MINUTE).save().await;
    assert!(matches!(
        name,
        Err(Error::Schedule(ScheduleError::InvalidName(_)))
    ));
    let bound = k
        .schedule("x", "job")
        .every(MINUTE)
        .catch_up(CatchUp::All { max: 0 })
        .save()
        .await;
    assert!(matches!(
        bound,
        Err(Error::Schedule(ScheduleError::CatchUpBound { .. }))
    ));
    assert!(
        k.schedules().list().await?.is_empty(),
        "nothing was written"
    );
    // A good one, through the facade on the store's clock, then updated and deleted.
    let saved = k.schedule("x", "job").cron("*/5 * * * *").save().await?;
    assert_eq!(saved.revision, 1);
    let updated = k.schedule("x", "job").every(MINUTE).save().await?;
    assert_eq!(updated.revision, 2);
    assert_eq!(updated.created_at, saved.created_at);
    assert_eq!(k.schedules().list().await?.len(), 1);
    assert!(k.schedules().delete("x").await?);
    assert!(!k.schedules().delete("x").await?);
    Ok(())
}

on_both_stores!(
    ticks_while_down_follow_each_catch_up_policy,
    skip_overlap_drops_ticks_while_the_previous_run_is_live,
    buffer_one_starts_the_kept_tick_when_the_previous_run_ends,
    allow_all_overlap_starts_every_tick,
    two_schedulers_racing_start_each_tick_exactly_once,
    a_dead_leaders_successor_starts_the_ticks_it_missed_once,
    pause_skips_ticks_and_resume_does_not_catch_them_up,
    trigger_starts_one_run_now_whatever_the_policy,
    a_daily_0230_in_berlin_on_both_daylight_saving_days,
    an_unregistered_workflow_is_refused_and_recorded,
    bad_definitions_are_typed_errors,
);

/// The memory store's pinned clock drives the scheduler when no `now` is passed: a test moves
/// it past a tick instead of sleeping.
#[tokio::test]
async fn the_memory_stores_pinned_clock_drives_the_scheduler() -> TestResult {
    let memory = keiro::memory::MemoryStore::new();
    memory.set_now(Some(datetime!(2026-01-01 10:00:30 UTC)));
    let keiro = Keiro::builder(memory.clone()).without_push().build();
    keiro.schedule("m", "job").every(MINUTE).save().await?;
    let w = keiro
        .worker()
        .register("job", job)
        .scheduler(Some(options("m")))
        .build()?;
    assert_eq!(w.schedule_once(None).await?.started, 0);
    memory.set_now(Some(datetime!(2026-01-01 10:01:00 UTC)));
    assert_eq!(w.schedule_once(None).await?.started, 1);
    let key = InstanceKey::parse("job", "m@20260101T100100Z")?;
    assert!(keiro.instance(&key).await?.is_some());
    Ok(())
}

/// The loop a worker runs: started by `run_until`, it starts a due tick on its own.
#[tokio::test]
async fn a_running_worker_schedules_on_its_own() -> TestResult {
    let memory = keiro::memory::MemoryStore::new();
    memory.set_now(Some(datetime!(2026-01-01 10:00:59 UTC)));
    let keiro = Keiro::builder(memory.clone()).build();
    keiro.schedule("loop", "job").every(MINUTE).save().await?;
    memory.set_now(Some(datetime!(2026-01-01 10:01:00 UTC)));
    let w = keiro
        .worker()
        .register("job", job)
        .scheduler(Some(SchedulerOptions {
            poll_interval: Duration::from_millis(20),
            ..options("loop")
        }))
        .build()?;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn({
        let w = w.clone();
        async move {
            w.run_until(async {
                let _ = done_rx.await;
            })
            .await
        }
    });
    // The worker runs the tick; the test only looks.
    until_status(
        &keiro,
        "job",
        "loop@20260101T100100Z",
        Status::Completed,
        || async { Ok(()) },
    )
    .await?;
    let _ = done_tx.send(());
    runner.await?;
    // Shutdown gave the leadership up.
    assert!(
        !keiro
            .schedule_store()
            .expect("memory")
            .scheduler_release("loop")
            .await?
    );
    Ok(())
}
