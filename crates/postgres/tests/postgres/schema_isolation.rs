//! Two schemas in one database are two isolated installations.

use std::time::Duration;

use crate::common::{key, start, Listener, TestResult};
use keiro_journal::JournalStore;
use keiro_lease::{ClaimOutcome, LeaseStore};
use keiro_tests::pg::TestDb;
use serde_json::json;

#[tokio::test]
async fn instances_journals_leases_and_wakes_stay_in_their_schema() -> TestResult {
    let (db_a, db_b) = (TestDb::new().await, TestDb::new().await);
    let (a, b) = (db_a.store(), db_b.store());
    assert_ne!(a.wake_channel(), b.wake_channel());
    let mut listen_a = Listener::on(&a).await?;
    let mut listen_b = Listener::on(&b).await?;
    let k = key("order", "o-1");

    assert!(a.instance_start(&start(&k, json!("in a"))).await?.created);
    // The same key is new in the other schema.
    let started_b = b.instance_start(&start(&k, json!("in b"))).await?;
    assert!(started_b.created);
    assert_eq!(started_b.instance.input, json!("in b"));
    assert_eq!(
        a.instance_get(&k).await?.map(|i| i.input),
        Some(json!("in a"))
    );

    let ClaimOutcome::Acquired(claim) = a
        .instance_claim(&k, "w", Duration::from_secs(60), None)
        .await?
    else {
        panic!("a fresh instance is claimable");
    };
    assert_eq!(claim.fence.epoch, 1);
    // A lease in one schema is no lease in the other.
    assert!(matches!(
        b.instance_claim(&k, "w", Duration::from_secs(60), None)
            .await?,
        ClaimOutcome::Acquired(_)
    ));

    let wakes_a = listen_a.drain(Duration::from_millis(200)).await;
    let wakes_b = listen_b.drain(Duration::from_millis(200)).await;
    assert_eq!(
        wakes_a,
        [(a.wake_channel().to_owned(), "order/o-1".to_owned())]
    );
    assert_eq!(
        wakes_b,
        [(b.wake_channel().to_owned(), "order/o-1".to_owned())]
    );
    Ok(())
}
