//! Schedule rows only SQL can make, and the store's own dispatch: a row this build cannot read
//! is named by the due query rather than failing it, and every trait method goes to the
//! inherent one of the same name (none recurses). The schedule rules every store keeps are the
//! contract suite's (`keiro_tests::contract::schedule`).

use std::time::Duration;

use crate::common::{pinned, T0};
use keiro_journal::WorkflowName;
use keiro_resume::{Cadence, CatchUp, Overlap, ScheduleSpec, ScheduleStore};
use keiro_sqlite::SqliteStore;
use serde_json::json;
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

#[tokio::test]
async fn a_row_this_build_cannot_read_is_named_not_the_reads_failure() {
    let (dir, store) = pinned("schedule-unreadable");
    let s: &dyn ScheduleStore = &store;
    for (name, every) in [("soon", MINUTE), ("mid", MINUTE * 2)] {
        s.schedule_upsert(&spec(name, every), None)
            .await
            .expect("writes");
    }
    let conn = rusqlite::Connection::open(dir.file("keiro.db")).expect("opens");
    conn.execute(
        "UPDATE schedules SET input = 'not json' WHERE name = 'mid'",
        [],
    )
    .expect("edits");
    let due = s.schedules_due(Some(at(200)), 10).await.expect("reads");
    assert_eq!(due.unreadable.len(), 1);
    assert_eq!(due.unreadable[0].name, "mid");
    let names: Vec<&str> = due
        .due
        .iter()
        .map(|d| d.schedule.spec.name.as_str())
        .collect();
    assert_eq!(names, ["soon"]);
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
