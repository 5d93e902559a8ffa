//! A workflow whose label is printed by a remote worker, with retries: the first attempt of
//! each print fails (a jammed printer), the retry succeeds after the backoff, and the run
//! resumes when the result is reported. Both workers run in this process to keep the example
//! short; in production the remote worker is its own binary, next to the printer.
//!
//! `cargo run -p keiro-examples --bin remote`

use std::time::Duration;

use keiro::{
    remote::RemoteOptions, remote::TaskContext, remote::TaskError, Backoff, Ctx, Keiro, Status,
    WorkflowError,
};

async fn shipment(ctx: Ctx, order: String) -> Result<String, WorkflowError> {
    let options = RemoteOptions::default().retries(
        3,
        Backoff::exponential(Duration::from_millis(100), Duration::from_secs(2)),
    );
    let label: String = ctx.remote("print-label", &order, &options).await?; // parks
    Ok(format!("{order} shipped with {label}"))
}

/// The remote handler: dedupes on `task.step_id` in real life; here the first attempt jams.
async fn print_label(order: String, task: TaskContext) -> Result<String, TaskError> {
    if task.attempt == 1 {
        return Err(TaskError::retryable("printer jammed").with_code("jam"));
    }
    Ok(format!(
        "label<{order}> (attempt {}, step {})",
        task.attempt, task.step_id
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut config = keiro::postgres::Config::new(url);
    config.schema = "keiro_remote_example".into();
    let keiro = Keiro::connect(config).await?; // migrates
    let orders = ["order-1", "order-2", "order-3"];
    for order in orders {
        keiro.start("shipment", order, order).await?; // idempotent by id
    }

    let remote = keiro
        .remote_worker()?
        .handle("print-label", print_label)
        .build();
    let resume = keiro.worker().register("shipment", shipment).build()?;
    let watcher = keiro.clone();
    let all_done = async move {
        loop {
            let mut done = 0;
            for order in orders {
                if let Ok(Some(row)) = watcher.instance(("shipment", order)).await {
                    done += usize::from(row.status == Status::Completed);
                }
            }
            if done == orders.len() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let remote_task = tokio::spawn(async move {
        remote
            .run_until(async {
                let _ = stopped.await;
            })
            .await;
    });
    resume.run_until(all_done).await;
    let _ = stop.send(());
    remote_task.await?;

    for order in orders {
        let row = keiro.instance(("shipment", order)).await?.ok_or("exists")?;
        println!("{order} {}: {}", row.status, row.output.unwrap_or_default());
        for task in keiro.remote_tasks(("shipment", order)).await? {
            println!(
                "  task {} {:?}: {} failed attempt(s), last error {}",
                task.step_id,
                task.status,
                task.attempts,
                task.last_error.unwrap_or_default()
            );
        }
    }
    Ok(())
}
