//! The schedule rows at the store (`ScheduleStore`), each call given its instant: definitions
//! and their revision, the scheduler's lease and fencing epoch, fires (`NotLeader`, `Stale`,
//! starts made with the row or not at all), the due query (order, limit, pause, buffered ticks,
//! back-off, the previous run's liveness), pause and resume, trigger, and recorded errors.

use std::sync::Arc;
use std::time::Duration;

use crate::contract::support::{Result, TestResult, SLACK, T0};
use crate::Harness;
use keiro_journal::store::StartRequest;
use keiro_journal::{Fence, InstanceKey, WorkflowName};
use keiro_resume::{
    Cadence, CatchUp, FireOutcome, Overlap, ScheduleFire, ScheduleSpec, ScheduleStore,
};
use serde_json::{json, Value};
use time::OffsetDateTime;

const MINUTE: Duration = Duration::from_secs(60);

fn schedules(h: &Harness) -> Result<Arc<dyn ScheduleStore>> {
    Ok(h.keiro
        .schedule_store()
        .ok_or("every test store keeps schedules")?
        .clone())
}

fn spec(name: &str, every: Duration) -> ScheduleSpec {
    ScheduleSpec {
        name: name.into(),
        workflow: WorkflowName::new("job").expect("valid"),
        cadence: Cadence::Every(every),
        input: json!({"from": name}),
        overlap: Overlap::Skip,
        catch_up: CatchUp::None,
    }
}

/// `secs` after [`T0`], the instant each call is given.
fn at(secs: i64) -> OffsetDateTime {
    T0 + time::Duration::seconds(secs)
}

fn start(id: &str, input: Value) -> StartRequest {
    StartRequest {
        attributes: Default::default(),
        key: InstanceKey::parse("job", id).expect("valid"),
        input,
        parent: None,
        priority: 0,
        queue: None,
    }
}

fn fire(name: &str, leader: &Fence, revision: i64, starts: Vec<StartRequest>) -> ScheduleFire {
    ScheduleFire {
        name: name.into(),
        leader: leader.clone(),
        revision,
        starts,
        next_tick: Some(at(120)),
        last_tick: Some(at(60)),
        buffered_tick: None,
    }
}

/// The scheduler's leadership for `owner`, as of [`T0`].
async fn lead(s: &dyn ScheduleStore, owner: &str) -> Result<Fence> {
    Ok(s.scheduler_lease(owner, MINUTE, Some(T0))
        .await?
        .ok_or("the leadership is free")?)
}

pub async fn upsert_get_list_and_delete_keep_the_revision_rules(h: Harness) -> TestResult {
    let s = &*schedules(&h)?;
    let created = s
        .schedule_upsert(&spec("b-every", MINUTE), Some(T0))
        .await?;
    assert_eq!(created.revision, 1);
    assert_eq!(
        created.next_tick,
        Some(at(60)),
        "the first tick after the instant"
    );
    assert_eq!(created.spec, spec("b-every", MINUTE));
    let cron = ScheduleSpec {
        cadence: Cadence::Cron {
            expression: "30 2 * * *".into(),
            time_zone: "Europe/Berlin".into(),
        },
        catch_up: CatchUp::All { max: 5 },
        overlap: Overlap::BufferOne,
        ..spec("a-cron", MINUTE)
    };
    s.schedule_upsert(&cron, Some(T0)).await?;
    assert_eq!(
        s.schedule_get("a-cron").await?.map(|r| r.spec),
        Some(cron.clone())
    );

    // State the scheduler and operators wrote: an update keeps some, clears the rest.
    s.schedule_set_paused("b-every", true, Some(T0)).await?;
    let leader = lead(s, "me").await?;
    let revision = s.schedule_get("b-every").await?.ok_or("row")?.revision;
    assert!(
        s.schedule_record_error("b-every", revision, "boom", at(600))
            .await?
    );
    let updated = s
        .schedule_upsert(&spec("b-every", MINUTE * 2), Some(at(30)))
        .await?;
    assert_eq!(updated.revision, revision + 1);
    assert!(updated.paused, "the paused flag is kept");
    assert_eq!(
        updated.next_tick,
        Some(at(120)),
        "the new cadence after the new instant"
    );
    assert_eq!(
        (updated.last_error, updated.failures, updated.retry_at),
        (None, 0, None)
    );
    assert_eq!(updated.created_at, created.created_at);
    // A fire planned from the old revision is stale.
    assert_eq!(
        s.schedule_fire(&fire("b-every", &leader, revision, Vec::new()))
            .await?,
        FireOutcome::Stale
    );

    let names: Vec<String> = s
        .schedules_list()
        .await?
        .into_iter()
        .map(|r| r.spec.name)
        .collect();
    assert_eq!(names, ["a-cron", "b-every"]);
    assert!(s.schedule_delete("a-cron").await?);
    assert!(!s.schedule_delete("a-cron").await?);
    assert_eq!(s.schedule_get("a-cron").await?, None);
    // A cadence that does not compile, or an input PostgreSQL refuses: nothing written.
    let bad = ScheduleSpec {
        cadence: Cadence::Cron {
            expression: "not cron".into(),
            time_zone: "UTC".into(),
        },
        ..spec("bad", MINUTE)
    };
    let err = s.schedule_upsert(&bad, Some(T0)).await.unwrap_err();
    assert!(err.is_value_refused(), "{err}");
    let nul = ScheduleSpec {
        input: json!("a\u{0}"),
        ..spec("nul", MINUTE)
    };
    let err = s.schedule_upsert(&nul, Some(T0)).await.unwrap_err();
    assert!(err.is_value_refused(), "{err}");
    assert_eq!(s.schedules_list().await?.len(), 1);
    Ok(())
}

pub async fn the_scheduler_lease_is_one_owners_and_its_epoch_moves_only_with_the_holder(
    h: Harness,
) -> TestResult {
    let s = &*schedules(&h)?;
    let first = lead(s, "a").await?;
    assert_eq!(first.owner, "a");
    assert_eq!(
        s.scheduler_lease("b", MINUTE, Some(T0)).await?,
        None,
        "held by a"
    );
    let renewed = s
        .scheduler_lease("a", MINUTE, Some(at(30)))
        .await?
        .ok_or("a holds it")?;
    assert_eq!(renewed, first, "a renewal keeps the epoch");
    // Past the renewed expiry, b takes over with a new epoch; a's fence is refused.
    let taken = s
        .scheduler_lease("b", MINUTE, Some(at(30 + 60)))
        .await?
        .ok_or("a's lease expired")?;
    assert_eq!(taken.epoch, first.epoch + 1);
    s.schedule_upsert(&spec("s", MINUTE), Some(T0)).await?;
    assert_eq!(
        s.schedule_fire(&fire("s", &first, 1, Vec::new())).await?,
        FireOutcome::NotLeader
    );
    assert!(!s.scheduler_release("a").await?);
    assert!(s.scheduler_release("b").await?);
    assert_eq!(
        s.schedule_fire(&fire("s", &taken, 1, Vec::new())).await?,
        FireOutcome::NotLeader,
        "released"
    );
    // Free again: anyone takes it at once, and the epoch is new even for the last holder.
    let again = s
        .scheduler_lease("b", MINUTE, Some(at(100)))
        .await?
        .ok_or("released")?;
    assert_eq!(again.epoch, taken.epoch + 1);
    Ok(())
}

pub async fn a_fire_starts_its_runs_with_the_row_or_writes_nothing(h: Harness) -> TestResult {
    let s = &*schedules(&h)?;
    let row = s.schedule_upsert(&spec("s", MINUTE), Some(T0)).await?;
    let leader = lead(s, "me").await?;
    let revision = row.revision;
    assert!(
        s.schedule_record_error("s", revision, "earlier", at(30))
            .await?
    );

    // A start the store refuses undoes the whole fire.
    let refused = s
        .schedule_fire(&fire(
            "s",
            &leader,
            revision,
            vec![start("s@1", json!(1)), start("s@2", json!("\u{0}"))],
        ))
        .await;
    assert!(refused.is_err_and(|e| e.is_value_refused()));
    assert_eq!(s.schedule_get("s").await?.ok_or("row")?.revision, revision);
    assert_eq!(
        h.store
            .instance_get(&InstanceKey::parse("job", "s@1")?)
            .await?,
        None
    );

    let outcome = s
        .schedule_fire(&ScheduleFire {
            buffered_tick: Some(at(90)),
            ..fire(
                "s",
                &leader,
                revision,
                vec![start("s@1", json!(1)), start("s@2", json!(2))],
            )
        })
        .await?;
    let FireOutcome::Fired(started) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(started.iter().all(|s| s.created));
    assert_eq!(started[1].instance.input, json!(2));
    let row = s.schedule_get("s").await?.ok_or("row")?;
    assert_eq!(row.revision, revision + 1);
    assert_eq!(
        (row.next_tick, row.last_tick, row.buffered_tick),
        (Some(at(120)), Some(at(60)), Some(at(90)))
    );
    assert_eq!(row.last_instance.as_ref().map(|i| i.as_str()), Some("s@2"));
    assert_eq!(
        (row.last_error, row.failures, row.retry_at),
        (None, 0, None)
    );
    // The same revision again: stale. A paused row: stale.
    assert_eq!(
        s.schedule_fire(&fire("s", &leader, revision, Vec::new()))
            .await?,
        FireOutcome::Stale
    );
    let paused = s
        .schedule_set_paused("s", true, Some(T0))
        .await?
        .ok_or("row")?;
    assert_eq!(
        s.schedule_fire(&fire("s", &leader, paused.revision, Vec::new()))
            .await?,
        FireOutcome::Stale
    );
    // Starts are idempotent by id; a fire without starts keeps the last instance.
    let resumed = s
        .schedule_set_paused("s", false, Some(T0))
        .await?
        .ok_or("row")?;
    let again = s
        .schedule_fire(&fire(
            "s",
            &leader,
            resumed.revision,
            vec![start("s@2", json!(9))],
        ))
        .await?;
    let FireOutcome::Fired(again) = again else {
        panic!("{again:?}");
    };
    assert!(!again[0].created);
    assert_eq!(again[0].instance.input, json!(2));
    let row = s.schedule_get("s").await?.ok_or("row")?;
    s.schedule_fire(&fire("s", &leader, row.revision, Vec::new()))
        .await?;
    assert_eq!(
        s.schedule_get("s")
            .await?
            .ok_or("row")?
            .last_instance
            .map(|i| i.to_string()),
        Some("s@2".into())
    );
    assert_eq!(
        s.schedule_fire(&fire("gone", &leader, 1, Vec::new()))
            .await?,
        FireOutcome::Stale
    );
    Ok(())
}

pub async fn due_schedules_come_earliest_first_without_the_paused_or_backed_off(
    h: Harness,
) -> TestResult {
    let s = &*schedules(&h)?;
    for (name, every) in [
        ("late", MINUTE * 3),
        ("soon", MINUTE),
        ("mid", MINUTE * 2),
        ("paused", MINUTE),
    ] {
        s.schedule_upsert(&spec(name, every), Some(T0)).await?;
    }
    s.schedule_set_paused("paused", true, Some(T0)).await?;
    // On the store's clock, years before the first tick: nothing due yet.
    let before = OffsetDateTime::now_utc();
    let none = s.schedules_due(None, 10).await?;
    let after = OffsetDateTime::now_utc();
    assert!(
        none.clock >= before - SLACK && none.clock <= after + SLACK,
        "{}",
        none.clock
    );
    assert!(none.due.is_empty() && none.unreadable.is_empty());
    assert_eq!(none.next_due, Some(at(60)));

    let due = s.schedules_due(Some(at(180)), 10).await?;
    assert_eq!(due.clock, at(180));
    let names: Vec<&str> = due
        .due
        .iter()
        .map(|d| d.schedule.spec.name.as_str())
        .collect();
    assert_eq!(names, ["soon", "mid", "late"]);
    assert!(due.due.iter().all(|d| !d.previous_live));
    assert_eq!(s.schedules_due(Some(at(180)), 2).await?.due.len(), 2);
    assert!(s.schedules_due(Some(at(180)), -1).await?.due.is_empty());

    // Backed off until 600: left out until then, and due no earlier than that.
    let soon = s.schedule_get("soon").await?.ok_or("row")?;
    assert!(
        s.schedule_record_error("soon", soon.revision, "no worker", at(600))
            .await?
    );
    assert!(
        !s.schedule_record_error("soon", soon.revision + 1, "stale", at(600))
            .await?
    );
    let row = s.schedule_get("soon").await?.ok_or("row")?;
    assert_eq!(row.revision, soon.revision, "not bumped");
    assert_eq!(
        (row.last_error.as_deref(), row.failures),
        (Some("no worker"), 1)
    );
    let due = s.schedules_due(Some(at(180)), 10).await?;
    let names: Vec<&str> = due
        .due
        .iter()
        .map(|d| d.schedule.spec.name.as_str())
        .collect();
    assert_eq!(names, ["mid", "late"]);
    assert_eq!(s.schedules_due(Some(at(600)), 10).await?.due.len(), 3);

    // A buffered tick is due whatever the next tick; a live last instance is reported.
    let leader = lead(s, "me").await?;
    let late = s.schedule_get("late").await?.ok_or("row")?;
    s.schedule_fire(&ScheduleFire {
        next_tick: Some(at(10_000)),
        buffered_tick: Some(at(180)),
        ..fire(
            "late",
            &leader,
            late.revision,
            vec![start("late@1", Value::Null)],
        )
    })
    .await?;
    let due = s.schedules_due(Some(at(200)), 10).await?;
    let late = due
        .due
        .iter()
        .find(|d| d.schedule.spec.name == "late")
        .ok_or("buffered, so due")?;
    assert!(late.previous_live, "late@1 is running");
    assert_eq!(due.next_due, Some(at(120)), "mid's next tick");
    Ok(())
}

pub async fn pause_keeps_the_tick_resume_skips_and_trigger_starts_now(h: Harness) -> TestResult {
    let s = &*schedules(&h)?;
    let row = s.schedule_upsert(&spec("s", MINUTE), Some(T0)).await?;
    assert_eq!(s.schedule_set_paused("nope", true, Some(T0)).await?, None);
    let leader = lead(s, "me").await?;
    s.schedule_fire(&ScheduleFire {
        buffered_tick: Some(at(60)),
        ..fire("s", &leader, row.revision, Vec::new())
    })
    .await?;
    let row = s.schedule_get("s").await?.ok_or("row")?;
    assert!(
        s.schedule_record_error("s", row.revision, "down", at(900))
            .await?
    );
    let paused = s
        .schedule_set_paused("s", true, Some(T0))
        .await?
        .ok_or("row")?;
    assert!(paused.paused);
    assert_eq!(paused.revision, row.revision + 1);
    assert_eq!(
        (paused.next_tick, paused.buffered_tick),
        (Some(at(120)), Some(at(60)))
    );
    assert_eq!((paused.failures, paused.retry_at), (1, Some(at(900))));
    let same = s
        .schedule_set_paused("s", true, Some(T0))
        .await?
        .ok_or("row")?;
    assert_eq!(same.revision, paused.revision, "already paused: unchanged");

    // Paused, a trigger still starts one run now.
    let triggered = s
        .schedule_trigger("s", Some(at(3600)))
        .await?
        .ok_or("row")?;
    assert!(triggered.created);
    let id = keiro_resume::trigger_instance_id("s", at(3600))?;
    assert_eq!(triggered.instance.key.id, id);
    assert_eq!(triggered.instance.input, json!({"from": "s"}));
    let row = s.schedule_get("s").await?.ok_or("row")?;
    assert_eq!(row.last_instance, Some(id));
    assert_eq!(row.revision, paused.revision + 1);
    assert_eq!(s.schedule_trigger("nope", Some(at(3600))).await?, None);

    // Resume: the next tick after now, the buffered tick and the back-off gone.
    let resumed = s
        .schedule_set_paused("s", false, Some(at(3600)))
        .await?
        .ok_or("row")?;
    assert!(!resumed.paused);
    assert_eq!(resumed.next_tick, Some(at(3660)));
    assert_eq!(resumed.buffered_tick, None);
    assert_eq!((resumed.failures, resumed.retry_at), (0, None));
    assert_eq!(
        resumed.last_error.as_deref(),
        Some("down"),
        "kept until a fire"
    );
    Ok(())
}
