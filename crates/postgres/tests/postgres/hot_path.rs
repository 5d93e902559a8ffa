//! What migration 0004 changed under the same outcomes: claims return the journal in append
//! order from a one-pass aggregate, a fenced step renews the lease only once it is no longer
//! fresh, and deleting an instance still deletes its journal without the foreign key.

use std::time::Duration;

use crate::common::{key, start, TestResult};
use keiro_journal::{
    Append, AppendOutcome, Event, Fence, InstanceKey, JournalEntry, JournalStore, StepKind,
    WorkflowName,
};
use keiro_lease::{ClaimOutcome, LeaseStore};
use keiro_tests::pg::TestDb;
use serde_json::json;
use time::OffsetDateTime;

fn fenced_step(k: &InstanceKey, fence: &Fence, name: &str, renew: Duration) -> Append {
    Append {
        generation: Some(0),
        fence: Some(fence.clone()),
        renew: Some(renew),
        ..Append::external(
            k.clone(),
            Event::StepRecorded {
                step: name.into(),
                kind: StepKind::Step,
                result: json!(name),
            },
        )
    }
}

fn step_names(journal: &[JournalEntry]) -> Vec<String> {
    journal
        .iter()
        .map(|entry| entry.event.step_name().into_owned())
        .collect()
}

async fn lease_expiry(
    store: &keiro_postgres::PgStore,
    k: &InstanceKey,
) -> Result<OffsetDateTime, Box<dyn std::error::Error + Send + Sync>> {
    let row = store.instance_get(k).await?.ok_or("missing")?;
    Ok(row.lease_expires_at.ok_or("not leased")?)
}

#[tokio::test]
async fn claims_return_the_journal_in_append_order() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    // Appended in an order that is not the step names' order (the unique index's order).
    for name in ["zeta", "alpha", "mu"] {
        let append = Append {
            generation: Some(0),
            ..crate::common::step(&k, name, StepKind::Step, json!(name))
        };
        assert_eq!(
            store.journal_append(&append).await?,
            AppendOutcome::Appended
        );
    }
    let ttl = Duration::from_secs(60);

    let ClaimOutcome::Acquired(claim) = store.instance_claim(&k, "one", ttl, None).await? else {
        panic!("claimable");
    };
    assert_eq!(step_names(&claim.journal), ["zeta", "alpha", "mu"]);
    assert!(claim.journal.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(store.instance_release(&k, &claim.fence, false).await?);

    let names = [WorkflowName::new("order")?];
    let batch = store
        .instances_claim_batch(&names, "many", ttl, 10, None)
        .await?;
    assert_eq!(batch.len(), 1);
    assert_eq!(step_names(&batch[0].journal), ["zeta", "alpha", "mu"]);
    assert_eq!(batch[0].journal, store.journal_load(&k, 0).await?);
    Ok(())
}

#[tokio::test]
async fn a_fenced_step_renews_the_lease_once_it_is_no_longer_fresh() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let ttl = Duration::from_secs(600);
    let ClaimOutcome::Acquired(claim) = store.instance_claim(&k, "w", ttl, None).await? else {
        panic!("claimable");
    };
    let granted = lease_expiry(&store, &k).await?;

    // Just claimed: more than three quarters of the TTL left, so the row is not rewritten.
    let append = fenced_step(&k, &claim.fence, "a", ttl);
    assert_eq!(
        store.journal_append(&append).await?,
        AppendOutcome::Appended
    );
    assert_eq!(lease_expiry(&store, &k).await?, granted);

    // A longer renewal finds the lease short of three quarters of it, and renews it.
    let long = Duration::from_secs(3600);
    let append = fenced_step(&k, &claim.fence, "b", long);
    assert_eq!(
        store.journal_append(&append).await?,
        AppendOutcome::Appended
    );
    let renewed = lease_expiry(&store, &k).await?;
    assert!(renewed > granted + time::Duration::minutes(30), "{renewed}");

    // A stale holder still learns recorded values and still cannot write.
    let stale = Fence {
        owner: "w".into(),
        epoch: claim.fence.epoch - 1,
    };
    assert_eq!(
        store
            .journal_append(&fenced_step(&k, &stale, "a", ttl))
            .await?,
        AppendOutcome::AlreadyPresent(json!("a"))
    );
    let err = store
        .journal_append(&fenced_step(&k, &stale, "c", ttl))
        .await
        .unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    Ok(())
}

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
