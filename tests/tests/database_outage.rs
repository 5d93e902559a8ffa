//! The database goes away in the middle of a run: the run stops with a transient store error,
//! consumes no crash attempt, loses nothing, and the next pass (on fresh connections) completes
//! it without re-running journaled steps.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use keiro::postgres::{Config, PgStore};
use keiro::{Ctx, Keiro, Registry, Status};
use keiro_tests::pg::TestDb;
use keiro_tests::{Ledger, TestResult};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_mid_run_is_transient_and_loses_nothing() -> TestResult {
    let db = TestDb::new().await;
    // The store under test gets its own application name, so the "outage" below can cut exactly
    // its connections and nobody else's.
    let app = format!("keiro-outage-{}", uuid::Uuid::new_v4().simple());
    let config = Config {
        application_name: app.clone(),
        ..db.config()
    };
    let store = PgStore::connect(config).await?;
    let keiro = Keiro::new(store);
    let ledger = Ledger::default();
    let cut_once = Arc::new(AtomicBool::new(true));
    let mut registry = Registry::new();
    let (l, admin_url, app_name) = (ledger.clone(), db.url().to_owned(), app.clone());
    registry.register("outage", move |ctx: Ctx, (): ()| {
        let (l, cut_once, admin_url, app_name) = (l.clone(), cut_once.clone(), admin_url.clone(), app_name.clone());
        async move {
            ctx.step("before", || async { l.bump("before"); Ok::<_, Infallible>(()) }).await?;
            ctx.step("cut", || async {
                l.bump("cut");
                if cut_once.swap(false, Ordering::SeqCst) {
                    // Every connection of the store is terminated while this step runs.
                    let (client, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
                        .await
                        .map_err(|e| e.to_string())?;
                    tokio::spawn(connection);
                    client
                        .execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                            &[&app_name],
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            })
            .await?;
            ctx.step("after", || async { l.bump("after"); Ok::<_, Infallible>(()) }).await?;
            Ok(())
        }
    })?;
    let options = keiro::ResumeOptions {
        backoff: keiro::BackoffPolicy {
            base: std::time::Duration::from_millis(1),
            cap: std::time::Duration::from_millis(1),
            jitter: 0.0,
        },
        ..keiro::ResumeOptions::default()
    };
    keiro.start("outage", "o-1", &()).await?;
    let first = keiro::resume_once(keiro.store(), &registry, &options).await?;
    assert_eq!(
        (first.resumed, first.transient_errors, first.failed),
        (1, 1, 0),
        "{first:?}"
    );
    let row = keiro.instance("outage", "o-1").await?.expect("row");
    assert_eq!(
        (row.status, row.attempts),
        (Status::Running, 0),
        "no crash attempt consumed"
    );

    assert!(
        row.lease_owner.is_none(),
        "the lease was released on a fresh connection"
    );
    let second = keiro::resume_once(keiro.store(), &registry, &options).await?;
    assert_eq!(second.completed, 1, "{second:?}");
    assert_eq!((ledger.count("before"), ledger.count("after")), (1, 1));
    assert_eq!(
        ledger.count("cut"),
        2,
        "the cut step had not been journaled, so it ran again"
    );
    let names: Vec<String> = keiro
        .journal("outage", "o-1")
        .await?
        .iter()
        .map(|e| e.event.step_name().to_owned())
        .collect();
    assert_eq!(names, ["before", "cut", "after", "__workflow_completed__"]);
    Ok(())
}
