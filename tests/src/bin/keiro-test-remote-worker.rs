//! A remote worker process for the multi-process remote-step tests.
//!
//! Usage: `keiro-test-remote-worker <database-url> <schema> <ok|hang|abort> [witness-file]`;
//! runs until killed. `ok` serves `print` and also resumes `parcel` runs; `hang` claims `print`
//! tasks and never finishes them (a worker about to be killed); `abort` claims a `print` task,
//! appends `<pid> <attempt>` to the witness file and aborts the process (a handler that
//! kills its process, as an out-of-memory kill would), with claims that expire after 300 ms.

use std::time::Duration;

use keiro::postgres::{Config, PgStore};
use keiro::{remote::RemoteWorkerOptions, remote::TaskContext, remote::TaskError, Keiro};
use keiro_tests::remote_fixtures::{parcel, print};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(schema), Some(mode)) = (args.next(), args.next(), args.next()) else {
        return Err(
            "usage: keiro-test-remote-worker <database-url> <schema> <ok|hang|abort> [witness]"
                .into(),
        );
    };
    let store = PgStore::connect(Config {
        schema,
        ..Config::new(url)
    })
    .await?;
    let keiro = Keiro::builder(store).build();
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
        "abort" => {
            let witness = args.next().ok_or("abort needs a witness file")?;
            let remote = keiro
                .remote_worker()?
                .options(RemoteWorkerOptions {
                    claim_ttl: Duration::from_millis(300),
                    heartbeat_every: Duration::from_millis(100),
                    ..options
                })
                .handle("print", move |_: String, task: TaskContext| {
                    abort_after_witness(witness.clone(), task)
                })
                .build();
            remote.run_until(forever).await;
        }
        other => return Err(format!("unknown mode {other:?}").into()),
    }
    Ok(())
}

/// The `abort` mode's handler: records its start, then kills its own process.
async fn abort_after_witness(witness: String, task: TaskContext) -> Result<String, TaskError> {
    witness_start(&witness, task.attempt);
    std::process::abort()
}

/// Appends `<pid> <attempt>` to the witness file and flushes it to disk, so the line survives
/// the abort that follows.
fn witness_start(path: &str, attempt: u32) {
    use std::io::Write;
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| {
            writeln!(file, "{} {attempt}", std::process::id())?;
            file.sync_all()
        });
    if let Err(error) = written {
        eprintln!("keiro-test-remote-worker: witness {path}: {error}");
    }
}
