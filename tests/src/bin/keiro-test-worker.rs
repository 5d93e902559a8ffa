//! A worker process for the multi-process tests: drives `overlap` workflows whose steps detect
//! whether another process advances the same instance at the same moment.
//!
//! Usage: `keiro-test-worker <database-url> <schema>`; runs until killed.

use std::time::Duration;

use keiro::postgres::{Config, PgStore};
use keiro::{Ctx, Keiro, WorkflowError};

/// Each step holds a session advisory lock keyed by the instance for its whole duration, on a
/// connection of its own. If another process were inside a step of the same instance at the same
/// time, `pg_try_advisory_lock` would fail and the overlap is recorded.
async fn overlap(ctx: Ctx, steps: u32) -> Result<u32, WorkflowError> {
    let url = std::env::var("KEIRO_TEST_URL").map_err(WorkflowError::app)?;
    let schema = std::env::var("KEIRO_TEST_SCHEMA").map_err(WorkflowError::app)?;
    let id = ctx.key().id.to_string();
    for n in 0..steps {
        let (url, schema, id) = (url.clone(), schema.clone(), id.clone());
        ctx.step(&format!("step-{n}"), || async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            let driver = tokio::spawn(connection);
            let locked: bool = client
                .query_one("SELECT pg_try_advisory_lock(hashtext($1))", &[&format!("{schema}/{id}")])
                .await?
                .get(0);
            let ledger = format!("INSERT INTO {schema}.overlap_ledger (workflow_id, step, pid, overlapped) VALUES ($1, $2, $3, $4)");
            let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
            client.execute(&ledger, &[&id, &format!("step-{n}"), &pid, &!locked]).await?;
            tokio::time::sleep(Duration::from_millis(15)).await;
            if locked {
                client.execute("SELECT pg_advisory_unlock(hashtext($1))", &[&format!("{schema}/{id}")]).await?;
            }
            drop(client);
            let _ = driver.await;
            Ok::<_, tokio_postgres::Error>(n)
        })
        .await?;
    }
    Ok(steps)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(schema)) = (args.next(), args.next()) else {
        return Err("usage: keiro-test-worker <database-url> <schema>".into());
    };
    std::env::set_var("KEIRO_TEST_URL", &url);
    std::env::set_var("KEIRO_TEST_SCHEMA", &schema);
    let store = PgStore::connect(Config {
        schema,
        ..Config::new(url)
    })
    .await?;
    let keiro = Keiro::builder(store).build();
    let worker = keiro
        .worker()
        .register("overlap", overlap)
        .concurrency(8)
        .lease_ttl(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(50))
        .build()?;
    worker.run().await;
    Ok(())
}
