//! How the journal stores repeated markers: each failure and resurrection after the first
//! gets a numbered step name (`failed/2`), so the unique index on the step name holds one
//! row per occurrence. What an append answers is the contract suite's
//! (`keiro_tests::contract::journal::append`).

use crate::common::{key, start, TestResult};
use keiro_journal::store::marker_name;
use keiro_journal::{Append, AppendOutcome, Event, JournalStore};
use keiro_lease::{LeaseStore, ResurrectOutcome};
use keiro_tests::pg::TestDb;
use serde_json::json;

#[tokio::test]
async fn repeated_markers_are_stored_under_numbered_step_names() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let fail = |reason: &str| Append {
        generation: Some(0),
        ..Append::external(
            k.clone(),
            Event::WorkflowFailed {
                reason: reason.into(),
            },
        )
    };
    for reason in ["first", "second"] {
        assert_eq!(
            store.journal_append(&fail(reason)).await?,
            AppendOutcome::Appended
        );
        assert_eq!(
            store.instance_resurrect(&k).await?,
            ResurrectOutcome::Resurrected
        );
    }
    let client = store.pool().get().await?;
    let names: Vec<String> = client
        .query("SELECT step_name FROM journal ORDER BY seq", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let (failed, resurrected) = (marker_name::FAILED, marker_name::RESURRECTED);
    assert_eq!(
        names,
        [
            failed.to_owned(),
            resurrected.to_owned(),
            format!("{failed}/2"),
            format!("{resurrected}/2")
        ]
    );
    Ok(())
}
