//! The round-trip counter counts every statement the store sends, prepares included.

use std::time::Duration;

use crate::common::{key, start, TestResult};
use keiro_journal::{store::Park, Append, Event, JournalStore, StepKind};
use keiro_lease::{ClaimOutcome, LeaseStore};
use keiro_tests::pg::TestDb;
use serde_json::json;

#[tokio::test]
async fn each_operation_is_one_round_trip_once_prepared() -> TestResult {
    let db = TestDb::new().await;
    let store = db.store();
    assert!(store.round_trips() > 0, "migrating counts too");
    let k = key("order", "o-1");

    // First use of a statement on a connection: prepare, then execute.
    let before = store.round_trips();
    store.instance_start(&start(&k, json!(1))).await?;
    assert_eq!(store.round_trips() - before, 2);
    // Prepared: one round trip.
    let before = store.round_trips();
    store.instance_start(&start(&k, json!(1))).await?;
    assert_eq!(store.round_trips() - before, 1);

    // Warm every statement of a step's life, then measure it.
    let step = |n: u32| Append {
        key: k.clone(),
        generation: Some(0),
        event: Event::StepRecorded {
            step: format!("s{n}"),
            kind: StepKind::Step,
            result: json!(n),
        },
        fence: None,
        renew: None,
    };
    let claim_and_step = |n: u32| {
        let (store, k, step) = (store.clone(), k.clone(), step(n));
        async move {
            let ClaimOutcome::Acquired(claim) = store
                .instance_claim(&k, "w", Duration::from_secs(60), None)
                .await?
            else {
                panic!("claimable");
            };
            store
                .journal_append(&Append {
                    fence: Some(claim.fence.clone()),
                    renew: Some(Duration::from_secs(60)),
                    ..step
                })
                .await?;
            store
                .instance_confirm(&k, &claim.fence, Duration::from_secs(60))
                .await?;
            store
                .instance_park(&Park {
                    key: k.clone(),
                    generation: 0,
                    fence: Some(claim.fence.clone()),
                    awaited: vec![format!("s{n}")],
                    wake_after: None,
                })
                .await?;
            Ok::<_, keiro_journal::StoreError>(())
        }
    };
    claim_and_step(1).await?;
    let before = store.round_trips();
    claim_and_step(2).await?;
    assert_eq!(
        store.round_trips() - before,
        4,
        "claim, append, confirm, park"
    );

    // Clones share the counter.
    let clone = store.clone();
    let before = store.round_trips();
    clone.instance_get(&k).await?;
    clone.instance_get(&k).await?;
    assert_eq!(store.round_trips() - before, 3);
    Ok(())
}
