//! What the file's rows hold that the store traits do not show: a repeated marker's numbered
//! step name, and the deliveries a park waits on. What an append or a park answers is the
//! contract suite's (`keiro_tests::contract::journal`, `keiro_tests::contract::lease`).

use std::time::Duration;

use crate::common::{append, claim, pinned, start, step_names, T0};
use keiro_journal::store::{marker_name, Park, ParkOutcome};
use keiro_journal::Event;
use keiro_lease::{Crash, CrashOutcome, ResurrectOutcome};
use rusqlite::Connection;
use time::Duration as Span;

#[tokio::test]
async fn repeated_markers_are_stored_under_numbered_step_names() {
    let (dir, store) = pinned("rows-numbered");
    let key = start(&store, "a").await;
    let crash = Crash {
        error: "boom".into(),
        retry_delay: Duration::from_secs(30),
        max_attempts: 1,
    };
    // A failure by the crash ceiling, then one appended as a marker: each after a resurrection.
    let fence = claim(&store, &key, "w").await;
    assert_eq!(
        store
            .instance_record_crash(&key, &fence, &crash)
            .await
            .unwrap(),
        CrashOutcome::Failed { attempts: 1 }
    );
    assert_eq!(
        store.instance_resurrect(&key).await.unwrap(),
        ResurrectOutcome::Resurrected
    );
    let fail = Event::WorkflowFailed {
        reason: "two".into(),
    };
    append(&store, &key, None, fail, None).await.unwrap();
    assert_eq!(
        store.instance_resurrect(&key).await.unwrap(),
        ResurrectOutcome::Resurrected
    );
    let (failed, resurrected) = (marker_name::FAILED, marker_name::RESURRECTED);
    assert_eq!(
        step_names(&dir.file("keiro.db"), &key),
        [
            failed.to_owned(),
            resurrected.to_owned(),
            format!("{failed}/2"),
            format!("{resurrected}/2"),
        ]
    );
}

#[tokio::test]
async fn a_park_records_the_deliveries_it_waits_on() {
    let (dir, store) = pinned("rows-parked-on");
    let key = start(&store, "a").await;
    let fence = claim(&store, &key, "w").await;
    let park = Park {
        key: key.clone(),
        generation: 0,
        fence: Some(fence),
        awaited: vec!["awk:x".into(), "await:order".into()],
        wake_after: Some(T0 + Span::hours(1)),
    };
    assert_eq!(
        store.instance_park(&park).await.unwrap(),
        ParkOutcome::Suspended
    );
    // Only the `await:` steps: the deliveries the bound on unread deliveries lets through.
    let raw = Connection::open(dir.file("keiro.db")).unwrap();
    let parked_on: Option<String> = raw
        .query_row("SELECT parked_on FROM workflows", [], |r| r.get(0))
        .unwrap();
    assert_eq!(parked_on.as_deref(), Some(r#"["await:order"]"#));
}
