//! What migration 0004 changed that only SQL shows: deleting an instance's row still deletes
//! its journal without the foreign key. The rest of that migration (claims carry the journal
//! in append order, a fenced step renews the lease only once it is no longer fresh) keeps the
//! same outcomes, which the contract suite checks (`keiro_tests::contract::lease::claim`,
//! `keiro_tests::contract::journal::append`).

use crate::common::{key, start, TestResult};
use keiro_journal::{AppendOutcome, JournalStore, StepKind};
use keiro_tests::pg::TestDb;
use serde_json::json;

#[tokio::test]
async fn deleting_an_instance_deletes_its_journal() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let (gone, kept) = (key("order", "gone"), key("order", "kept"));
    for k in [&gone, &kept] {
        store.instance_start(&start(k, json!(null))).await?;
        let append = crate::common::step(k, "a", StepKind::Step, json!(1));
        assert_eq!(
            store.journal_append(&append).await?,
            AppendOutcome::Appended
        );
    }
    let client = store.pool().get().await?;
    let deleted = client
        .execute(
            "DELETE FROM workflows WHERE workflow_name = $1 AND workflow_id = $2",
            &[&gone.name.as_str(), &gone.id.as_str()],
        )
        .await?;
    assert_eq!(deleted, 1);
    assert!(store.journal_history(&gone).await?.is_empty());
    assert_eq!(store.journal_history(&kept).await?.len(), 1);
    Ok(())
}
