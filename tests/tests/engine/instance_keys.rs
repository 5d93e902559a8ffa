//! Facade calls take an instance key (issue 16, item 4): an `InstanceKey`, a reference to one,
//! a typed handle, or a `(name, id)` pair of strings in any form. A pair that names no valid
//! instance is refused with the typed `Error::InvalidId` before anything reaches the store.

use std::time::Duration;

use keiro::{Ctx, Error, InstanceKey, Keiro, ResultError, Status, WorkflowDef, WorkflowError};
use keiro_tests::pg::TestDb;
use keiro_tests::TestResult;

#[derive(Default)]
struct Gate;

impl WorkflowDef for Gate {
    const NAME: &'static str = "gate";
    type Input = u32;
    type Output = u32;

    async fn run(&self, ctx: Ctx, n: u32) -> Result<u32, WorkflowError> {
        let opened: u32 = ctx.await_step("open").await?;
        Ok(n + opened)
    }
}

/// Every key-taking call on `keiro` refuses a bad pair with `Error::InvalidId`.
async fn bad_pairs_are_invalid_ids(keiro: &Keiro) -> TestResult {
    for (name, id) in [("gate", "a/b"), ("", "g-1"), ("gate", " g-1")] {
        let key = (name, id);
        let invalid = |e: &Error| matches!(e, Error::InvalidId(_));
        assert!(invalid(&keiro.cancel(key).await.unwrap_err()), "{key:?}");
        assert!(invalid(&keiro.cancel_cascade(key).await.unwrap_err()));
        assert!(invalid(&keiro.instance(key).await.unwrap_err()));
        assert!(invalid(&keiro.journal(key).await.unwrap_err()));
        assert!(invalid(&keiro.deliver(key, "open", &1).await.unwrap_err()));
        assert!(invalid(
            &keiro.deliver_to(key, 0, "open", &1).await.unwrap_err()
        ));
        assert!(invalid(&keiro.waits(key, 10).await.unwrap_err()));
        assert!(invalid(&keiro.resurrect(key).await.unwrap_err()));
        assert!(invalid(&keiro.force_release(key).await.unwrap_err()));
        assert!(invalid(&keiro.requeue(key).await.unwrap_err()));
        assert!(invalid(&keiro.redispatch_pending(key).await.unwrap_err()));
        assert!(invalid(&keiro.remote_tasks(key).await.unwrap_err()));
        assert!(invalid(&keiro.retry_with_input(key, &1).await.unwrap_err()));
        assert!(matches!(
            keiro
                .result::<u32>(key, Duration::from_secs(1))
                .await
                .unwrap_err(),
            ResultError::InvalidId(_)
        ));
    }
    Ok(())
}

/// Each key form reaches the same instance.
async fn every_form_names_the_instance(keiro: &Keiro) -> TestResult {
    let handle = keiro.start_workflow::<Gate>("g-1", &40).await?;
    let key = InstanceKey::parse("gate", "g-1")?;
    let (name, id) = (String::from("gate"), String::from("g-1"));
    let rows = [
        keiro.instance(&key).await?,
        keiro.instance(key.clone()).await?,
        keiro.instance(("gate", "g-1")).await?,
        keiro.instance((&name, &id)).await?,
        keiro.instance((name.clone(), id.clone())).await?,
        keiro.instance((key.name.clone(), key.id.clone())).await?,
        keiro.instance(&handle).await?,
    ];
    for row in rows {
        assert_eq!(row.expect("the instance exists").key, key);
    }
    keiro.deliver(&key, "open", &2).await?;
    let worker = keiro.worker().register_workflow::<Gate>().build()?;
    worker.drain().await?;
    assert_eq!(
        keiro.result::<u32>(&handle, Duration::from_secs(5)).await?,
        42
    );
    assert_eq!(
        keiro.instance(&key).await?.expect("row").status,
        Status::Completed
    );
    assert!(!keiro.journal(&handle).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn sqlite_takes_every_key_form() -> TestResult {
    let keiro = Keiro::temporary()?;
    bad_pairs_are_invalid_ids(&keiro).await?;
    every_form_names_the_instance(&keiro).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_takes_every_key_form() -> TestResult {
    let db = TestDb::new().await;
    let keiro = Keiro::connect(db.config()).await?;
    bad_pairs_are_invalid_ids(&keiro).await?;
    every_form_names_the_instance(&keiro).await
}
