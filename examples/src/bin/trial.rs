//! A 7-day trial workflow (sleep a week, then send a reminder), tested in milliseconds with the
//! test kit's time skipping, and with a crash injected right after the reminder was journaled.
//!
//! ```sh
//! cargo run -p keiro-examples --bin trial
//! ```

use std::convert::Infallible;
use std::time::{Duration, Instant};

use keiro::testing::TestEnv;
use keiro::{Ctx, Status, WorkflowError};

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

/// The workflow under test.
async fn trial(ctx: Ctx, user: String) -> Result<String, WorkflowError> {
    ctx.sleep("trial-period", WEEK).await?;
    let sent: String = ctx
        .step("remind", || async move {
            Ok::<_, Infallible>(format!("reminder sent to {user}"))
        })
        .await?;
    ctx.step("close-trial", || async { Ok::<_, Infallible>(()) })
        .await?;
    Ok(sent)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let began = Instant::now();
    let env = TestEnv::sqlite()?.register("trial", trial).build()?;
    env.crash_after("remind"); // the process "dies" right after the reminder is journaled
    env.start("trial", "ada", &"ada").await?;
    env.run_until_idle().await?;
    assert_eq!(env.status(("trial", "ada")).await?, Status::Suspended);
    env.advance(WEEK).await?; // a week passes at once
    let output: String = env.output(("trial", "ada")).await?;
    let row = env.instance(("trial", "ada")).await?;
    println!("{output}: {} after a simulated week", row.status);
    println!("steps: {:?}", env.steps(("trial", "ada")).await?);
    // The history the run recorded still replays against this code.
    env.verify_replay(("trial", "ada")).await??;
    println!("replay verified; the whole test took {:?}", began.elapsed());
    Ok(())
}
