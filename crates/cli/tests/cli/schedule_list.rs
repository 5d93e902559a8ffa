//! `keiro schedule list` shows why a schedule could not start and how long it is backed off.

use std::process::Command;

use keiro::{
    schedule::Overlap, schedule::ScheduleSpec, schedule::SchedulerOptions, store::ScheduleStore,
    Keiro,
};
use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;
use time::macros::datetime;

#[tokio::test]
async fn schedule_list_shows_the_error_and_the_back_off() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    // Written past the facade's checks, as another build or a hand-written row could: no tick
    // of a name with a `:` can start.
    let spec = ScheduleSpec {
        name: "bad:name".into(),
        workflow: keiro::workflow::WorkflowName::new("report")?,
        cadence: keiro::schedule::Cadence::Every(std::time::Duration::from_secs(60)),
        input: serde_json::Value::Null,
        overlap: Overlap::Skip,
        catch_up: keiro::schedule::CatchUp::None,
    };
    store
        .schedule_upsert(&spec, Some(datetime!(2026-01-01 10:00:30 UTC)))
        .await?;
    let keiro = Keiro::builder(store).without_push().build();
    let worker = keiro
        .worker()
        .scheduler(Some(SchedulerOptions {
            owner: "list-test".into(),
            ..SchedulerOptions::default()
        }))
        .build()?;
    let pass = worker
        .schedule_once(Some(datetime!(2026-01-01 10:01:01 UTC)))
        .await?;
    assert_eq!(pass.failed, 1);

    let output = Command::new(env!("CARGO_BIN_EXE_keiro"))
        .env_remove("DATABASE_URL")
        .env_remove("KEIRO_SCHEMA")
        .args([
            "--database-url",
            db.url(),
            "--schema",
            db.schema(),
            "schedule",
            "list",
        ])
        .output()?;
    let stdout = String::from_utf8(output.stdout)?;
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("bad:name"), "{stdout}");
    assert!(
        stdout.contains("last error schedule bad:name cannot start its tick")
            && stdout.contains("forbidden character"),
        "{stdout}"
    );
    assert!(
        stdout.contains("backed off after 1 failure(s) until 2026-01-01 10:01:0"),
        "{stdout}"
    );
    Ok(())
}
