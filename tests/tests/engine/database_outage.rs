//! The database goes away in the middle of a run: the run stops with a transient store error,
//! consumes no crash attempt, loses nothing, and the next pass (on fresh connections) completes
//! it without re-running journaled steps.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use keiro::postgres::{Config, PgStore};
use keiro::{worker::Registry, Ctx, Keiro, Status};
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
    let keiro = Keiro::builder(store).without_push().build();
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
    let options = keiro::worker::ResumeOptions {
        backoff: keiro::Backoff::exponential(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(1),
        )
        .without_jitter(),
        lease_ttl: std::time::Duration::from_millis(300),
        ..keiro::worker::ResumeOptions::default()
    };
    keiro.start("outage", "o-1", &()).await?;
    // Depending on timing the pool either hands the next append a dead connection (a transient
    // store error: the run stops, no attempt is consumed, a later pass resumes it) or notices
    // the closed connections and reconnects at once. Either way nothing may be lost, doubled
    // or counted as a crash.
    let mut total = keiro::worker::ResumeSummary::default();
    for _ in 0..20 {
        total += keiro::worker::resume_once(keiro.store(), &registry, &options).await?;
        let row = keiro.instance(("outage", "o-1")).await?.expect("row");
        assert_eq!(row.attempts, 0, "a store error is not a crash: {total:?}");
        if row.status == Status::Completed {
            break;
        }
        // A lease whose release was lost with its connection expires like a dead worker's.
        tokio::time::sleep(options.lease_ttl + std::time::Duration::from_millis(50)).await;
    }
    assert_eq!((total.completed, total.failed), (1, 0), "{total:?}");
    assert_eq!((ledger.count("before"), ledger.count("after")), (1, 1));
    let cut = ledger.count("cut");
    assert!(
        cut == 1 || (cut == 2 && total.transient_errors >= 1),
        "the cut step re-ran only if its append was lost: ran {cut}, {total:?}"
    );
    let names: Vec<String> = keiro
        .journal(("outage", "o-1"))
        .await?
        .iter()
        .map(|e| e.event.step_name().into_owned())
        .collect();
    assert_eq!(names, ["before", "cut", "after", "__workflow_completed__"]);
    Ok(())
}
