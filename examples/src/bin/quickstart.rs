//! Starts one order workflow, approves it from "another process", runs a worker, and awaits
//! the order's result. Run twice: the second start is a no-op (idempotent by id) and the
//! journal answers every step.

use std::convert::Infallible;
use std::time::Duration;

use keiro::{Ctx, Keiro, WorkflowDef, WorkflowError};

#[derive(Default)]
struct Order;

impl WorkflowDef for Order {
    const NAME: &'static str = "order";
    type Input = String; // the order id
    type Output = String; // the receipt

    async fn run(&self, ctx: Ctx, order_id: String) -> Result<String, WorkflowError> {
        let charge: String = ctx
            .step("charge", || async {
                Ok::<_, Infallible>(format!("ch_{order_id}"))
            })
            .await?; // journaled: never re-run once recorded
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
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut config = keiro::postgres::Config::new(url);
    config.schema = "keiro_quickstart".into();
    let keiro = Keiro::connect(config).await?; // migrates

    let order = keiro
        .start_workflow::<Order>("order-42", &"order-42".to_owned())
        .await?; // durable, idempotent by id; the input type is checked
    order.deliver("approval", &true).await?; // from anywhere

    let worker = keiro
        .worker()
        .register_workflow::<Order>()
        .concurrency(16)
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });
    let receipt = order.result_within(Duration::from_secs(30)).await?; // woken by push
    let _ = stop.send(());
    running.await?;

    println!("order-42 completed: {receipt}");
    for entry in keiro.journal(("order", "order-42")).await? {
        println!("  journal #{}: {}", entry.seq, entry.event.step_name());
    }
    Ok(())
}
