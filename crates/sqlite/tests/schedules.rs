//! Schedules (`ScheduleStore`), called through the trait: definitions and their revision, the
//! scheduler's lease and fencing epoch, the due query (order, limit, pause, buffered ticks,
//! back-off, the previous run's liveness, unreadable rows), fires (`NotLeader`, `Stale`,
//! atomic starts), pause and resume, trigger, and recorded errors.

mod common;

use std::time::Duration;

use common::{pinned, T0};
use keiro_journal::store::StartRequest;
use keiro_journal::{Fence, InstanceKey, WorkflowName};
use keiro_resume::{
    Cadence, CatchUp, FireOutcome, Overlap, ScheduleFire, ScheduleSpec, ScheduleStore,
};
use keiro_sqlite::SqliteStore;
use serde_json::{json, Value};
use time::OffsetDateTime;

const MINUTE: Duration = Duration::from_secs(60);

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

fn at(secs: i64) -> OffsetDateTime {
    T0 + time::Duration::seconds(secs)
}

fn start(id: &str, input: Value) -> StartRequest {
    StartRequest {
        key: InstanceKey::parse("job", id).expect("valid"),
        input,
        parent: None,
        priority: 0,
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

async fn lead(store: &dyn ScheduleStore, owner: &str) -> Fence {
    store
        .scheduler_lease(owner, MINUTE, None)
        .await
        .expect("leases")
        .expect("granted")
}

#[tokio::test]
async fn upsert_get_list_and_delete_keep_the_revision_rules() {
    let (_dir, store) = pinned("schedule-upsert");
    let s: &dyn ScheduleStore = &store;
    let created = s
        .schedule_upsert(&spec("b-every", MINUTE), None)
        .await
        .expect("writes");
    assert_eq!(created.revision, 1);
    assert_eq!(
        created.next_tick,
        Some(at(60)),
        "the first tick after the clock"
    );
    assert_eq!((created.created_at, created.updated_at), (T0, T0));
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
    s.schedule_upsert(&cron, None).await.expect("writes");
    assert_eq!(
        s.schedule_get("a-cron")
            .await
            .expect("reads")
            .map(|r| r.spec),
        Some(cron.clone())
    );

    // State the scheduler and operators wrote: an update keeps some, clears the rest.
    s.schedule_set_paused("b-every", true, None)
        .await
        .expect("pauses");
    let leader = lead(s, "me").await;
    let revision = s
        .schedule_get("b-every")
        .await
        .expect("reads")
        .expect("row")
        .revision;
    s.schedule_record_error("b-every", revision, "boom", at(600))
        .await
        .expect("records");
    store.advance_clock(Duration::from_secs(30));
    let updated = s
        .schedule_upsert(&spec("b-every", MINUTE * 2), None)
        .await
        .expect("writes");
    assert_eq!(updated.revision, revision + 1);
    assert!(updated.paused, "the paused flag is kept");
    assert_eq!(
        updated.next_tick,
        Some(at(120)),
        "the new cadence after the new clock"
    );
    assert_eq!(
        (updated.last_error, updated.failures, updated.retry_at),
        (None, 0, None)
    );
    assert_eq!((updated.created_at, updated.updated_at), (T0, at(30)));
    // A fire planned from the old revision is stale.
    assert_eq!(
        s.schedule_fire(&fire("b-every", &leader, revision, Vec::new()))
            .await
            .expect("answers"),
        FireOutcome::Stale
    );

    let names: Vec<String> = s
        .schedules_list()
        .await
        .expect("lists")
        .into_iter()
        .map(|r| r.spec.name)
        .collect();
    assert_eq!(names, ["a-cron", "b-every"]);
    assert!(s.schedule_delete("a-cron").await.expect("deletes"));
    assert!(!s.schedule_delete("a-cron").await.expect("deletes"));
    assert_eq!(s.schedule_get("a-cron").await.expect("reads"), None);
    // A cadence that does not compile is refused, nothing written.
    let bad = ScheduleSpec {
        cadence: Cadence::Cron {
            expression: "not cron".into(),
            time_zone: "UTC".into(),
        },
        ..spec("bad", MINUTE)
    };
    let err = s.schedule_upsert(&bad, None).await.unwrap_err();
    assert!(err.is_value_refused(), "{err}");
    let err = s
        .schedule_upsert(
            &ScheduleSpec {
                input: json!("a\u{0}"),
                ..spec("nul", MINUTE)
            },
            None,
        )
        .await
        .unwrap_err();
    assert!(err.is_value_refused(), "{err}");
    assert_eq!(s.schedules_list().await.expect("lists").len(), 1);
}

#[tokio::test]
async fn the_lease_is_one_owners_and_its_epoch_moves_only_with_the_holder() {
    let (_dir, store) = pinned("schedule-lease");
    let s: &dyn ScheduleStore = &store;
    let first = lead(s, "a").await;
    assert_eq!(first.owner, "a");
    assert_eq!(
        s.scheduler_lease("b", MINUTE, None).await.expect("answers"),
        None,
        "held by a"
    );
    store.advance_clock(Duration::from_secs(30));
    assert_eq!(lead(s, "a").await, first, "a renewal keeps the epoch");
    // Past the renewed expiry, b takes over with a new epoch; a's fence is refused.
    let taken = s
        .scheduler_lease("b", MINUTE, Some(at(30 + 60)))
        .await
        .expect("answers")
        .expect("granted");
    assert_eq!(taken.epoch, first.epoch + 1);
    s.schedule_upsert(&spec("s", MINUTE), None)
        .await
        .expect("writes");
    assert_eq!(
        s.schedule_fire(&fire("s", &first, 1, Vec::new()))
            .await
            .expect("answers"),
        FireOutcome::NotLeader
    );
    assert!(!s.scheduler_release("a").await.expect("answers"));
    assert!(s.scheduler_release("b").await.expect("answers"));
    assert_eq!(
        s.schedule_fire(&fire("s", &taken, 1, Vec::new()))
            .await
            .expect("answers"),
        FireOutcome::NotLeader,
        "released"
    );
    // Free again: anyone takes it at once, and the epoch is new even for the last holder.
    let again = lead(s, "b").await;
    assert_eq!(again.epoch, taken.epoch + 1);
}

#[tokio::test]
async fn a_fire_starts_its_runs_with_the_row_or_writes_nothing() {
    let (_dir, store) = pinned("schedule-fire");
    let s: &dyn ScheduleStore = &store;
    let row = s
        .schedule_upsert(&spec("s", MINUTE), None)
        .await
        .expect("writes");
    let leader = lead(s, "me").await;
    let revision = row.revision;
    s.schedule_record_error("s", revision, "earlier", at(30))
        .await
        .expect("records");

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
    assert_eq!(
        s.schedule_get("s")
            .await
            .expect("reads")
            .expect("row")
            .revision,
        revision
    );
    assert_eq!(
        store
            .instance_get(&InstanceKey::parse("job", "s@1").expect("valid"))
            .await
            .expect("reads"),
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
        .await
        .expect("fires");
    let FireOutcome::Fired(started) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(started.iter().all(|s| s.created));
    assert_eq!(started[1].instance.input, json!(2));
    let row = s.schedule_get("s").await.expect("reads").expect("row");
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
            .await
            .expect("answers"),
        FireOutcome::Stale
    );
    let paused = s
        .schedule_set_paused("s", true, None)
        .await
        .expect("pauses")
        .expect("row");
    assert_eq!(
        s.schedule_fire(&fire("s", &leader, paused.revision, Vec::new()))
            .await
            .expect("answers"),
        FireOutcome::Stale
    );
    // Starts are idempotent by id; a fire without starts keeps the last instance.
    let resumed = s
        .schedule_set_paused("s", false, None)
        .await
        .expect("resumes")
        .expect("row");
    let again = s
        .schedule_fire(&fire(
            "s",
            &leader,
            resumed.revision,
            vec![start("s@2", json!(9))],
        ))
        .await
        .expect("fires");
    let FireOutcome::Fired(again) = again else {
        panic!("{again:?}");
    };
    assert!(!again[0].created);
    assert_eq!(again[0].instance.input, json!(2));
    let row = s.schedule_get("s").await.expect("reads").expect("row");
    s.schedule_fire(&fire("s", &leader, row.revision, Vec::new()))
        .await
        .expect("fires");
    assert_eq!(
        s.schedule_get("s")
            .await
            .expect("reads")
            .expect("row")
            .last_instance
            .map(|i| i.to_string()),
        Some("s@2".into())
    );
    assert_eq!(
        s.schedule_fire(&fire("gone", &leader, 1, Vec::new()))
            .await
            .expect("answers"),
        FireOutcome::Stale
    );
}

#[tokio::test]
async fn due_schedules_come_earliest_first_without_the_paused_or_backed_off() {
    let (dir, store) = pinned("schedule-due");
    let s: &dyn ScheduleStore = &store;
    s.schedule_upsert(&spec("late", MINUTE * 3), None)
        .await
        .expect("writes");
    s.schedule_upsert(&spec("soon", MINUTE), None)
        .await
        .expect("writes");
    s.schedule_upsert(&spec("mid", MINUTE * 2), None)
        .await
        .expect("writes");
    s.schedule_upsert(&spec("paused", MINUTE), None)
        .await
        .expect("writes");
    s.schedule_set_paused("paused", true, None)
        .await
        .expect("pauses");
    let none = s.schedules_due(None, 10).await.expect("reads");
    assert_eq!(none.clock, T0);
    assert!(none.due.is_empty() && none.unreadable.is_empty());
    assert_eq!(none.next_due, Some(at(60)));

    let due = s.schedules_due(Some(at(180)), 10).await.expect("reads");
    let names: Vec<&str> = due
        .due
        .iter()
        .map(|d| d.schedule.spec.name.as_str())
        .collect();
    assert_eq!(names, ["soon", "mid", "late"]);
    assert!(due.due.iter().all(|d| !d.previous_live));
    let two = s.schedules_due(Some(at(180)), 2).await.expect("reads");
    assert_eq!(two.due.len(), 2);
    assert_eq!(
        s.schedules_due(Some(at(180)), -1)
            .await
            .expect("reads")
            .due
            .len(),
        0
    );

    // Backed off until 600: left out until then, and due no earlier than that.
    let soon = s.schedule_get("soon").await.expect("reads").expect("row");
    assert!(s
        .schedule_record_error("soon", soon.revision, "no worker", at(600))
        .await
        .expect("records"));
    assert!(!s
        .schedule_record_error("soon", soon.revision + 1, "stale", at(600))
        .await
        .expect("records"));
    let row = s.schedule_get("soon").await.expect("reads").expect("row");
    assert_eq!(row.revision, soon.revision, "not bumped");
    assert_eq!(
        (row.last_error.as_deref(), row.failures),
        (Some("no worker"), 1)
    );
    let due = s.schedules_due(Some(at(180)), 10).await.expect("reads");
    let names: Vec<&str> = due
        .due
        .iter()
        .map(|d| d.schedule.spec.name.as_str())
        .collect();
    assert_eq!(names, ["mid", "late"]);
    let due = s.schedules_due(Some(at(600)), 10).await.expect("reads");
    assert_eq!(due.due.len(), 3);

    // A buffered tick is due whatever the next tick; a live last instance is reported.
    let leader = lead(s, "me").await;
    let late = s.schedule_get("late").await.expect("reads").expect("row");
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
    .await
    .expect("fires");
    let due = s.schedules_due(Some(at(200)), 10).await.expect("reads");
    let late = due
        .due
        .iter()
        .find(|d| d.schedule.spec.name == "late")
        .expect("buffered, so due");
    assert!(late.previous_live, "late@1 is running");
    assert_eq!(due.next_due, Some(at(120)), "mid's next tick");

    // A row this build cannot read is named, not the read's failure.
    let conn = rusqlite::Connection::open(dir.file("keiro.db")).expect("opens");
    conn.execute(
        "UPDATE schedules SET input = 'not json' WHERE name = 'mid'",
        [],
    )
    .expect("edits");
    let due = s.schedules_due(Some(at(200)), 10).await.expect("reads");
    assert_eq!(due.unreadable.len(), 1);
    assert_eq!(due.unreadable[0].name, "mid");
    assert!(due.due.iter().all(|d| d.schedule.spec.name != "mid"));
}

#[tokio::test]
async fn pause_keeps_the_tick_resume_skips_and_trigger_starts_now() {
    let (_dir, store) = pinned("schedule-pause");
    let s: &dyn ScheduleStore = &store;
    let row = s
        .schedule_upsert(&spec("s", MINUTE), None)
        .await
        .expect("writes");
    assert_eq!(
        s.schedule_set_paused("nope", true, None)
            .await
            .expect("answers"),
        None
    );
    let leader = lead(s, "me").await;
    s.schedule_fire(&ScheduleFire {
        buffered_tick: Some(at(60)),
        ..fire("s", &leader, row.revision, Vec::new())
    })
    .await
    .expect("fires");
    let row = s.schedule_get("s").await.expect("reads").expect("row");
    s.schedule_record_error("s", row.revision, "down", at(900))
        .await
        .expect("records");
    let paused = s
        .schedule_set_paused("s", true, None)
        .await
        .expect("pauses")
        .expect("row");
    assert!(paused.paused);
    assert_eq!(paused.revision, row.revision + 1);
    assert_eq!(
        (paused.next_tick, paused.buffered_tick),
        (Some(at(120)), Some(at(60)))
    );
    assert_eq!((paused.failures, paused.retry_at), (1, Some(at(900))));
    let same = s
        .schedule_set_paused("s", true, None)
        .await
        .expect("pauses")
        .expect("row");
    assert_eq!(same.revision, paused.revision, "already paused: unchanged");

    // Paused, a trigger still starts one run now.
    store.advance_clock(Duration::from_secs(3600));
    let triggered = s
        .schedule_trigger("s", None)
        .await
        .expect("triggers")
        .expect("row");
    assert!(triggered.created);
    let id = keiro_resume::trigger_instance_id("s", at(3600)).expect("valid");
    assert_eq!(triggered.instance.key.id, id);
    assert_eq!(triggered.instance.input, json!({"from": "s"}));
    let row = s.schedule_get("s").await.expect("reads").expect("row");
    assert_eq!(row.last_instance, Some(id));
    assert_eq!(row.revision, paused.revision + 1);
    assert_eq!(
        s.schedule_trigger("nope", None).await.expect("answers"),
        None
    );

    // Resume: the next tick after now, the buffered tick and the back-off gone.
    let resumed = s
        .schedule_set_paused("s", false, None)
        .await
        .expect("resumes")
        .expect("row");
    assert!(!resumed.paused);
    assert_eq!(resumed.next_tick, Some(at(3660)));
    assert_eq!(resumed.buffered_tick, None);
    assert_eq!((resumed.failures, resumed.retry_at), (0, None));
    assert_eq!(
        resumed.last_error.as_deref(),
        Some("down"),
        "kept until a fire"
    );
}

#[tokio::test]
async fn the_trait_and_the_store_answer_alike() {
    // Every trait method goes to the inherent one of the same name (none recurses).
    let (_dir, store) = pinned("schedule-trait");
    let as_trait: &dyn ScheduleStore = &store;
    let row = as_trait
        .schedule_upsert(&spec("s", MINUTE), None)
        .await
        .expect("writes");
    assert_eq!(
        SqliteStore::schedule_get(&store, "s").await.expect("reads"),
        Some(row)
    );
    assert_eq!(
        SqliteStore::schedules_due(&store, Some(at(60)), 5)
            .await
            .expect("reads"),
        as_trait
            .schedules_due(Some(at(60)), 5)
            .await
            .expect("reads")
    );
}
