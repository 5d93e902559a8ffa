//! An expense waits for a decision that a caller sends as an update: the run takes each
//! `decide` update (`ctx.next_update`), rejects one that names no approver (`ctx.reject`: the
//! caller gets `Error::UpdateRejected`), and answers a valid one (`ctx.reply`), which ends it.
//! The first call starts the run and sends its update in one transaction
//! (`Keiro::update_with_start`); each update has an id, so asking again with the same id (as a
//! caller retrying after a crash would) gets the same answer. Run it again: the run and its
//! answers are in the store, so every call answers as before.

use std::time::Duration;

use keiro::workflow::UpdateCall;
use keiro::{Ctx, Error, Keiro, WorkflowError};
use serde::{Deserialize, Serialize};

/// What the caller decides.
#[derive(Debug, Serialize, Deserialize)]
struct Decision {
    approver: String,
    approve: bool,
}

/// Waits for a valid decision on an expense of `amount`; returns the verdict.
async fn expense(ctx: Ctx, amount: u32) -> Result<String, WorkflowError> {
    loop {
        let update = ctx.next_update::<Decision>("decide").await?;
        let decision = &update.request;
        if decision.approver.trim().is_empty() {
            ctx.reject(&update, "a decision names its approver").await?;
            continue;
        }
        let verdict = format!(
            "{amount} EUR {} by {}",
            if decision.approve {
                "approved"
            } else {
                "denied"
            },
            decision.approver
        );
        ctx.reply(&update, &verdict).await?;
        return Ok(verdict);
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut config = keiro::postgres::Config::new(url);
    config.schema = "keiro_approval".into();
    let keiro = Keiro::connect(config).await?; // migrates

    let worker = keiro.worker().register("expense", expense).build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        worker
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });

    let key = ("expense", "expense-1");
    // Starts the run (if it does not exist) and sends the update, in one transaction.
    let unsigned = Decision {
        approver: String::new(),
        approve: true,
    };
    let first = keiro
        .update_with_start::<_, _, String>(
            key,
            &120u32,
            UpdateCall::new("decide", &unsigned).id("decision-0"),
        )
        .await;
    match first {
        Err(Error::UpdateRejected { message, .. }) => println!("decision-0 rejected: {message}"),
        other => println!("decision-0: {other:?}"),
    }

    let signed = Decision {
        approver: "ana".into(),
        approve: true,
    };
    let call = || {
        UpdateCall::new("decide", &signed)
            .id("decision-1")
            .timeout(Duration::from_secs(30))
    };
    let verdict: String = keiro.update_with(key, call()).await?;
    println!("decision-1 answered: {verdict}");
    // A retry under the same id is answered the same, once.
    let again: String = keiro.update_with(key, call()).await?;
    println!("decision-1 again:    {again}");

    let outcome: String = keiro.result(key, Duration::from_secs(30)).await?;
    println!("the run ended with: {outcome}");
    let _ = stop.send(());
    running.await?;
    Ok(())
}
