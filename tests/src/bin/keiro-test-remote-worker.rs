//! A remote worker process for the multi-process remote-step tests.
//!
//! Usage: `keiro-test-remote-worker <database-url> <schema> <ok|hang>`; runs until killed.
//! `ok` serves `print` and also resumes `parcel` runs; `hang` claims `print` tasks and never
//! finishes them (a worker about to be killed).

use std::time::Duration;

use keiro::postgres::{Config, PgStore};
use keiro::{Keiro, RemoteWorkerOptions, TaskContext, TaskError};
use keiro_tests::remote_fixtures::{parcel, print};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(schema), Some(mode)) = (args.next(), args.next(), args.next()) else {
        return Err("usage: keiro-test-remote-worker <database-url> <schema> <ok|hang>".into());
    };
    let store = PgStore::connect(Config {
        schema,
        ..Config::new(url)
    })
    .await?;
    let keiro = Keiro::with_push(store);
    let options = RemoteWorkerOptions {
        poll_interval: Duration::from_millis(50),
        claim_ttl: Duration::from_secs(60),
        heartbeat_every: Duration::from_secs(20),
        ..RemoteWorkerOptions::default()
    };
    let forever = std::future::pending::<()>();
    match mode.as_str() {
        "ok" => {
            let remote = keiro
                .remote_worker()?
                .options(options)
                .handle("print", print)
                .build();
            let resume = keiro
                .worker()
                .register("parcel", parcel)
                .poll_interval(Duration::from_millis(50))
                .build()?;
            tokio::join!(remote.run_until(forever), resume.run());
        }
        "hang" => {
            let remote = keiro
                .remote_worker()?
                .options(options)
                .handle("print", |_: String, _: TaskContext| async {
                    std::future::pending::<Result<String, TaskError>>().await
                })
                .build();
            remote.run_until(forever).await;
        }
        other => return Err(format!("unknown mode {other:?}").into()),
    }
    Ok(())
}
