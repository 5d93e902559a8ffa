//! Starts one order workflow, approves it from "another process", and runs a worker until the
//! order completes. Run twice: the second start is a no-op (idempotent by id) and the journal
//! answers every step.

use std::convert::Infallible;
use std::time::Duration;

use keiro::{Ctx, Keiro, Status, WorkflowError};

async fn order(ctx: Ctx, order_id: String) -> Result<String, WorkflowError> {
    let charge: String = ctx
        .step("charge", || async {
            Ok::<_, Infallible>(format!("ch_{order_id}"))
        })
        .await?;
    let approved: bool = ctx.await_step("approval").await?; // parks; costs nothing while parked
    if !approved {
        return Err(WorkflowError::app("rejected"));
    }
    ctx.sleep("cool-off", Duration::from_millis(200)).await?; // durable timer
    let label: String = ctx
        .step("ship", || async {
            Ok::<_, Infallible>(format!("label-{order_id}"))
        })
        .await?;
    Ok(format!("{charge} {label}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut config = keiro::postgres::Config::new(url);
    config.schema = "keiro_quickstart".into();
    let keiro = Keiro::connect_with(config).await?; // migrates
    keiro.start("order", "order-42", "order-42").await?; // durable, idempotent by id
    keiro
        .deliver("order", "order-42", "approval", &true)
        .await?; // from anywhere

    let worker = keiro.worker().register("order", order).build()?;
    let watcher = keiro.clone();
    worker
        .run_until(async move {
            while !matches!(watcher.instance("order", "order-42").await, Ok(Some(row)) if row.status == Status::Completed) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
    let row = keiro
        .instance("order", "order-42")
        .await?
        .ok_or("the order exists")?;
    println!(
        "order-42 {}: {}",
        row.status,
        row.output.unwrap_or_default()
    );
    for entry in keiro.journal("order", "order-42").await? {
        println!("  journal #{}: {}", entry.seq, entry.event.step_name());
    }
    Ok(())
}
