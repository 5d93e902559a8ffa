//! Schedules on both stores: ticks while the schedulers were down under each catch-up policy,
//! each overlap policy, two schedulers racing (exactly one start per tick), pause and resume,
//! trigger, daylight-saving days, a workflow the leader does not register, a fleet of two
//! services on one schema, schedules that cannot start, and bad definitions.
//!
//! Time is passed in (`now`) on both stores, never slept for: the scheduler plans with the
//! instant its store reports, which is the one given.

use std::sync::Arc;
use std::time::Duration;

use crate::{FastWorker, Harness, TestResult};
use keiro::{
    schedule::CatchUp, schedule::Overlap, schedule::ScheduleError, schedule::SchedulerOptions,
    store::ScheduleStore, Ctx, Error, Keiro, Status, Worker, WorkflowError,
};
use keiro_resume::{FireOutcome, ScheduleFire};
use time::macros::datetime;
use time::OffsetDateTime;

pub const MINUTE: Duration = Duration::from_secs(60);

pub async fn job(_ctx: Ctx, _input: serde_json::Value) -> Result<(), WorkflowError> {
    Ok(())
}

fn store(h: &Harness) -> Arc<dyn ScheduleStore> {
    h.keiro
        .schedule_store()
        .expect("both test stores have schedules")
        .clone()
}

pub fn options(owner: &str) -> SchedulerOptions {
    SchedulerOptions {
        owner: owner.into(),
        ..SchedulerOptions::default()
    }
}

pub fn worker(h: &Harness, owner: &str) -> Result<Worker, Error> {
    h.keiro
        .worker()
        .fast()
        .register("job", job)
        .scheduler(Some(options(owner)))
        .build()
}

/// Creates (or updates) `name`: every minute, starting `job`, as of `now`.
pub async fn every_minute(
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
    crate::status(&h.keiro, workflow, id).await
}

/// The instance ids a schedule started, among `ticks`.
pub async fn started(
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

pub async fn ticks_while_down_follow_each_catch_up_policy(h: Harness) -> TestResult {
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

pub async fn skip_overlap_drops_ticks_while_the_previous_run_is_live(h: Harness) -> TestResult {
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

pub async fn buffer_one_starts_the_kept_tick_when_the_previous_run_ends(h: Harness) -> TestResult {
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

pub async fn allow_all_overlap_starts_every_tick(h: Harness) -> TestResult {
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

pub async fn two_schedulers_racing_start_each_tick_exactly_once(h: Harness) -> TestResult {
    every_minute(
        &h,
        "r",
        Overlap::AllowAll,
        CatchUp::None,
        datetime!(2026-01-01 10:00:30 UTC),
    )
    .await?;
    let (a, b) = (worker(&h, "a")?, worker(&h, "b")?);
    let mut total = keiro::schedule::SchedulerSummary::default();
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
    let stale_fence = keiro::store::Fence {
        owner: "a".into(),
        epoch: lead_b.epoch - 1,
    };
    let fire = |leader: keiro::store::Fence, revision: i64| ScheduleFire {
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

pub async fn a_dead_leaders_successor_starts_the_ticks_it_missed_once(h: Harness) -> TestResult {
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

pub async fn pause_skips_ticks_and_resume_does_not_catch_them_up(h: Harness) -> TestResult {
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

pub async fn trigger_starts_one_run_now_whatever_the_policy(h: Harness) -> TestResult {
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

pub async fn a_daily_0230_in_berlin_on_both_daylight_saving_days(h: Harness) -> TestResult {
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

pub async fn an_unregistered_workflow_starts_and_waits_for_a_worker_that_has_it(
    h: Harness,
) -> TestResult {
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
    // The leader registers only `job`; the tick starts `ghost` all the same.
    let w = worker(&h, "a")?;
    let pass = w
        .schedule_once(Some(datetime!(2026-01-01 10:01:01 UTC)))
        .await?;
    assert_eq!((pass.started, pass.failed), (1, 0));
    let row = s.schedule_get("ghostly").await?.expect("exists");
    assert_eq!(row.last_error, None);
    assert_eq!(row.next_tick, Some(datetime!(2026-01-01 10:02 UTC)));
    let first = "ghostly@20260101T100100Z";
    w.drain().await?;
    assert_eq!(
        status(&h, "ghost", first).await?,
        Some(Status::Running),
        "no worker that lacks `ghost` runs it"
    );
    // A worker that has it runs it, whoever leads.
    let ghost = h
        .keiro
        .worker()
        .fast()
        .register("ghost", job)
        .scheduler(None)
        .build()?;
    ghost.drain().await?;
    assert_eq!(status(&h, "ghost", first).await?, Some(Status::Completed));
    Ok(())
}

pub async fn bad_definitions_are_typed_errors(h: Harness) -> TestResult {
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

/// The instances `workflow` runs that schedule `schedule` started, among `ticks`.
async fn started_as(
    h: &Harness,
    workflow: &str,
    schedule: &str,
    ticks: &[OffsetDateTime],
) -> Result<Vec<OffsetDateTime>, Error> {
    let mut found = Vec::new();
    for tick in ticks {
        if status(h, workflow, &id(schedule, *tick)).await?.is_some() {
            found.push(*tick);
        }
    }
    Ok(found)
}

/// What a scheduler pass wrote: a start, a known start, a dropped or a buffered tick.
fn wrote(s: &keiro::schedule::SchedulerSummary) -> u64 {
    s.started + s.already_started + s.dropped + s.buffered
}

/// Passes at `now` until one writes nothing, as the worker's loop passes again at once after
/// a full batch; the sum of them.
async fn passes_at(
    w: &Worker,
    now: OffsetDateTime,
) -> Result<keiro::schedule::SchedulerSummary, Error> {
    let mut total = keiro::schedule::SchedulerSummary::default();
    for _ in 0..5 {
        let pass = w.schedule_once(Some(now)).await?;
        total += pass;
        if wrote(&pass) == 0 {
            break;
        }
    }
    Ok(total)
}

/// Another service on the same schema: a second pool on Postgres (another process would have
/// its own), a second store on the same file on SQLite (as another process opens it).
async fn second_service(h: &Harness) -> Result<Keiro, Box<dyn std::error::Error + Send + Sync>> {
    Ok(match (&h.db, &h.sqlite_dir) {
        (Some(db), _) => {
            let store = keiro_postgres::PgStore::connect(db.config()).await?;
            Keiro::builder(store).without_push().build()
        }
        (None, Some(dir)) => {
            let store =
                keiro_sqlite::SqliteStore::open(dir.file(), keiro_sqlite::Config::default())?;
            Keiro::builder(store).without_push().build()
        }
        (None, None) => h.keiro.clone(),
    })
}

pub async fn a_fleet_of_two_services_starts_every_schedule_whoever_leads(h: Harness) -> TestResult {
    let t0 = datetime!(2026-01-01 10:00:30 UTC);
    for (schedule, workflow) in [("billing-run", "invoice"), ("shipping-run", "ship")] {
        let spec = h
            .keiro
            .schedule(schedule, workflow)
            .every(MINUTE)
            .overlap(Overlap::AllowAll)
            .spec()?;
        store(&h).schedule_upsert(&spec, Some(t0)).await?;
    }
    let shipping = h
        .keiro
        .worker()
        .fast()
        .register("ship", job)
        .scheduler(Some(options("shipping")))
        .build()?;
    let billing_keiro = second_service(&h).await?;
    let billing = billing_keiro
        .worker()
        .fast()
        .register("invoice", job)
        .scheduler(Some(options("billing")))
        .build()?;
    for minute in 1..=5 {
        let now = datetime!(2026-01-01 10:00:01 UTC) + time::Duration::minutes(minute);
        // Shipping passes first every minute, so it takes the leadership and keeps it.
        assert_eq!(shipping.schedule_once(Some(now)).await?.led, 1);
        assert_eq!(billing.schedule_once(Some(now)).await?.led, 0);
    }
    let ticks = minutes(datetime!(2026-01-01 10:01 UTC), 5);
    assert_eq!(
        started_as(&h, "invoice", "billing-run", &ticks).await?,
        ticks,
        "every billing tick starts, though the leader does not register invoice"
    );
    assert_eq!(started_as(&h, "ship", "shipping-run", &ticks).await?, ticks);
    // Each run waits for a service that registers its workflow.
    shipping.drain().await?;
    for tick in &ticks {
        let invoice = id("billing-run", *tick);
        assert_eq!(
            status(&h, "invoice", &invoice).await?,
            Some(Status::Running)
        );
        let ship = id("shipping-run", *tick);
        assert_eq!(status(&h, "ship", &ship).await?, Some(Status::Completed));
    }
    billing.drain().await?;
    for tick in &ticks {
        let invoice = id("billing-run", *tick);
        assert_eq!(
            status(&h, "invoice", &invoice).await?,
            Some(Status::Completed)
        );
    }
    Ok(())
}

/// The same fleet with both workers running their loops on the store's clock: `shipping`
/// leads (it takes the lease first), and `billing`'s every-second schedule still has its runs
/// started and completed by `billing`.
pub async fn a_running_fleet_runs_each_services_schedules(h: Harness) -> TestResult {
    h.keiro
        .schedule("billing-run", "invoice")
        .every(Duration::from_secs(1))
        .overlap(Overlap::AllowAll)
        .save()
        .await?;
    let scheduler = |owner: &str| SchedulerOptions {
        poll_interval: Duration::from_millis(50),
        lease_ttl: Duration::from_secs(10),
        ..options(owner)
    };
    let shipping = h
        .keiro
        .worker()
        .fast()
        .register("ship", job)
        .scheduler(Some(scheduler("shipping")))
        .build()?;
    assert_eq!(shipping.schedule_once(None).await?.led, 1);
    let billing_keiro = second_service(&h).await?;
    let billing = billing_keiro
        .worker()
        .fast()
        .register("invoice", job)
        .scheduler(Some(scheduler("billing")))
        .build()?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let run = |w: Worker| {
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            w.run_until(async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await
        })
    };
    let runners = [run(shipping), run(billing)];
    let completed =
        keiro::operate::ListRequest::from_pairs([("name", "invoice"), ("status", "completed")])?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let done = loop {
        let page = h.keiro.list(&completed).await?;
        if page.instances.len() >= 3 {
            break page.instances.len();
        }
        if tokio::time::Instant::now() > deadline {
            break page.instances.len();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Still shipping's: billing never led, and never needed to.
    let lead = store(&h)
        .scheduler_lease("billing", Duration::from_secs(10), None)
        .await?;
    let _ = stop.send(true);
    for runner in runners {
        runner.await?;
    }
    assert!(done >= 3, "{done} invoice runs completed");
    assert_eq!(lead, None, "shipping led throughout");
    let row = store(&h)
        .schedule_get("billing-run")
        .await?
        .expect("exists");
    assert_eq!(row.last_error, None);
    Ok(())
}

pub async fn schedules_no_worker_registers_never_hold_up_one_it_does(h: Harness) -> TestResult {
    let s = store(&h);
    for n in 0..100 {
        let spec = h
            .keiro
            .schedule(&format!("orphan-{n:03}"), "orphan")
            .every(MINUTE)
            .spec()?;
        s.schedule_upsert(&spec, Some(datetime!(2026-01-01 10:00:30 UTC)))
            .await?;
    }
    every_minute(
        &h,
        "mine",
        Overlap::AllowAll,
        CatchUp::None,
        datetime!(2026-01-01 10:01:30 UTC),
    )
    .await?;
    let w = worker(&h, "a")?;
    for minute in 1..=5 {
        let now = datetime!(2026-01-01 10:00:01 UTC) + time::Duration::minutes(minute);
        passes_at(&w, now).await?;
    }
    let ticks = minutes(datetime!(2026-01-01 10:02 UTC), 4);
    assert_eq!(
        started(&h, "mine", &ticks).await?,
        ticks,
        "the registered schedule starts all its ticks"
    );
    // An orphan starts its first run, which waits for a worker that registers `orphan`;
    // under Skip its later ticks are dropped while that run waits.
    let first = id("orphan-042", datetime!(2026-01-01 10:01 UTC));
    assert_eq!(status(&h, "orphan", &first).await?, Some(Status::Running));
    let later = id("orphan-042", datetime!(2026-01-01 10:02 UTC));
    assert_eq!(status(&h, "orphan", &later).await?, None);
    let row = s.schedule_get("orphan-042").await?.expect("exists");
    assert_eq!(row.last_error, None);
    assert_eq!(row.next_tick, Some(datetime!(2026-01-01 10:06 UTC)));
    Ok(())
}

/// A schedule store that refuses every fire of one schedule while `refusing` is set, as a
/// store refuses a value it cannot hold; everything else goes to the store underneath.
#[derive(Debug)]
struct Refusing {
    inner: Arc<dyn ScheduleStore>,
    name: String,
    refusing: std::sync::atomic::AtomicBool,
}

impl Refusing {
    fn refuses(&self) -> bool {
        self.refusing.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl ScheduleStore for Refusing {
    async fn schedule_upsert(
        &self,
        spec: &keiro::schedule::ScheduleSpec,
        now: Option<OffsetDateTime>,
    ) -> keiro::store::Result<keiro::schedule::Schedule> {
        self.inner.schedule_upsert(spec, now).await
    }
    async fn schedule_get(
        &self,
        name: &str,
    ) -> keiro::store::Result<Option<keiro::schedule::Schedule>> {
        self.inner.schedule_get(name).await
    }
    async fn schedules_list(&self) -> keiro::store::Result<Vec<keiro::schedule::Schedule>> {
        self.inner.schedules_list().await
    }
    async fn schedule_delete(&self, name: &str) -> keiro::store::Result<bool> {
        self.inner.schedule_delete(name).await
    }
    async fn schedule_set_paused(
        &self,
        name: &str,
        paused: bool,
        now: Option<OffsetDateTime>,
    ) -> keiro::store::Result<Option<keiro::schedule::Schedule>> {
        self.inner.schedule_set_paused(name, paused, now).await
    }
    async fn schedule_trigger(
        &self,
        name: &str,
        now: Option<OffsetDateTime>,
    ) -> keiro::store::Result<Option<keiro::store::Started>> {
        self.inner.schedule_trigger(name, now).await
    }
    async fn scheduler_lease(
        &self,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> keiro::store::Result<Option<keiro::store::Fence>> {
        self.inner.scheduler_lease(owner, ttl, now).await
    }
    async fn scheduler_release(&self, owner: &str) -> keiro::store::Result<bool> {
        self.inner.scheduler_release(owner).await
    }
    async fn schedules_due(
        &self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> keiro::store::Result<keiro_resume::SchedulesDue> {
        self.inner.schedules_due(now, limit).await
    }
    async fn schedule_fire(&self, fire: &ScheduleFire) -> keiro::store::Result<FireOutcome> {
        if fire.name == self.name && self.refuses() {
            return Err(keiro::store::Error::ValueRefused {
                operation: "firing a schedule",
                reason: "a value the store cannot hold".into(),
            });
        }
        self.inner.schedule_fire(fire).await
    }
    async fn schedule_record_error(
        &self,
        name: &str,
        revision: i64,
        error: &str,
        retry_at: OffsetDateTime,
    ) -> keiro::store::Result<bool> {
        self.inner
            .schedule_record_error(name, revision, error, retry_at)
            .await
    }
}

pub async fn a_schedule_that_cannot_start_records_its_error_and_backs_off(
    h: Harness,
) -> TestResult {
    let s = store(&h);
    // Written through the store, past the facade's checks (another build, a hand-written
    // row): a name no instance id may carry, so no tick of it can start.
    let bad = keiro::schedule::ScheduleSpec {
        name: "bad:name".into(),
        workflow: keiro::workflow::WorkflowName::new("job")?,
        cadence: keiro::schedule::Cadence::Every(MINUTE),
        input: serde_json::Value::Null,
        overlap: Overlap::AllowAll,
        catch_up: CatchUp::None,
    };
    s.schedule_upsert(&bad, Some(datetime!(2026-01-01 10:00:30 UTC)))
        .await?;
    every_minute(
        &h,
        "good",
        Overlap::AllowAll,
        CatchUp::None,
        datetime!(2026-01-01 10:01:30 UTC),
    )
    .await?;
    let w = worker(&h, "a")?;
    let now = datetime!(2026-01-01 10:02:01 UTC);
    let pass = w.schedule_once(Some(now)).await?;
    assert_eq!(pass.started, 1, "the other schedule starts");
    assert_eq!(
        started(&h, "good", &[datetime!(2026-01-01 10:02 UTC)])
            .await?
            .len(),
        1
    );
    assert_eq!(pass.failed, 1);
    let row = s.schedule_get("bad:name").await?.expect("exists");
    let error = row.last_error.clone().expect("the reason is recorded");
    assert!(
        error.contains("bad:name") && error.contains("forbidden character"),
        "{error}"
    );
    assert_eq!(row.failures, 1);
    let retry_at = row.retry_at.expect("backed off");
    assert!(
        retry_at > now && retry_at <= now + Duration::from_secs(1),
        "{retry_at}"
    );
    assert_eq!(
        row.next_tick,
        Some(datetime!(2026-01-01 10:01 UTC)),
        "its ticks stay due"
    );
    // The same pass again writes nothing for it: it waits out its back-off.
    let again = w.schedule_once(Some(now)).await?;
    assert_eq!((wrote(&again), again.failed), (0, 0));
    assert_eq!(s.schedule_get("bad:name").await?, Some(row));
    // Every later tick of the good one starts while the bad one keeps failing.
    for minute in 3..=5 {
        let now = datetime!(2026-01-01 10:00:01 UTC) + time::Duration::minutes(minute);
        w.schedule_once(Some(now)).await?;
    }
    assert_eq!(
        started(&h, "good", &minutes(datetime!(2026-01-01 10:02 UTC), 4)).await?,
        minutes(datetime!(2026-01-01 10:02 UTC), 4)
    );
    let row = s.schedule_get("bad:name").await?.expect("exists");
    assert_eq!(
        row.failures, 4,
        "one failure per retry, each after its back-off"
    );
    // A resume is the operator's retry: the back-off is cleared, the error stays until a
    // fire clears it.
    s.schedule_set_paused("bad:name", true, Some(datetime!(2026-01-01 10:05:10 UTC)))
        .await?;
    let resumed = s
        .schedule_set_paused("bad:name", false, Some(datetime!(2026-01-01 10:05:20 UTC)))
        .await?
        .expect("exists");
    assert_eq!((resumed.failures, resumed.retry_at), (0, None));
    assert!(resumed.last_error.is_some());
    Ok(())
}

pub async fn a_refused_start_is_recorded_and_retried_without_blocking_the_others(
    h: Harness,
) -> TestResult {
    let refusing = Refusing {
        inner: store(&h),
        name: "refused".into(),
        refusing: true.into(),
    };
    let t0 = datetime!(2026-01-01 10:00:30 UTC);
    // The refused one is due first, so a pass meets it before the other.
    every_minute(
        &h,
        "refused",
        Overlap::AllowAll,
        CatchUp::All { max: 10 },
        t0,
    )
    .await?;
    every_minute(
        &h,
        "fine",
        Overlap::AllowAll,
        CatchUp::None,
        datetime!(2026-01-01 10:01:30 UTC),
    )
    .await?;
    let options = options("a");
    let pass = |now| keiro_resume::schedule_once(&refusing, &options, Some(now));
    pass(datetime!(2026-01-01 10:02:01 UTC)).await?;
    assert_eq!(
        started(&h, "fine", &[datetime!(2026-01-01 10:02 UTC)])
            .await?
            .len(),
        1,
        "the refusal of one schedule does not stop the pass"
    );
    let row = refusing.schedule_get("refused").await?.expect("exists");
    let error = row.last_error.clone().expect("the refusal is recorded");
    assert!(error.contains("cannot hold"), "{error}");
    assert_eq!(
        row.next_tick,
        Some(datetime!(2026-01-01 10:01 UTC)),
        "its ticks stay due"
    );
    // Once the store takes it again, the ticks it could not start follow the catch-up policy
    // and the error is cleared.
    refusing
        .refusing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    pass(datetime!(2026-01-01 10:03:01 UTC)).await?;
    let ticks = minutes(datetime!(2026-01-01 10:01 UTC), 3);
    assert_eq!(started(&h, "refused", &ticks).await?, ticks);
    let row = refusing.schedule_get("refused").await?.expect("exists");
    assert_eq!(row.last_error, None);
    assert_eq!(row.next_tick, Some(datetime!(2026-01-01 10:04 UTC)));
    Ok(())
}
