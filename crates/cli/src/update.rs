//! `keiro update NAME ID UPDATE_NAME JSON`: sends an update to a running workflow and prints the
//! run's answer as one JSON line. With `--update-id`, the update id: a second call with the same id
//! gets the same answer (so a call that timed out can be repeated). A rejection, a run that
//! ended first, a taken id or the timeout exit 1 with the reason.

use std::time::Duration;

use clap::Args;
use keiro::workflow::UpdateCall;
use serde_json::Value;

use crate::common::{Global, Outcome, Result, ResultExt};
use crate::ops::{keiro, KeyArgs};

/// Which instance, which update, the request, and how long to wait.
#[derive(Debug, Clone, Args)]
pub(crate) struct UpdateArgs {
    #[command(flatten)]
    pub(crate) key: KeyArgs,
    /// The update's name, as the workflow takes it (`ctx.next_update(UPDATE_NAME)`).
    pub(crate) update: String,
    /// The request, as JSON.
    pub(crate) request: String,
    /// The update id: repeat it to get the answer of an update sent before. Defaults to a
    /// fresh random id.
    #[arg(long)]
    pub(crate) update_id: Option<String>,
    /// How long to wait for the answer, in seconds (the update stays when it passes).
    #[arg(long, default_value_t = 60)]
    pub(crate) timeout_s: u64,
}

/// `keiro update`: sends the update, waits, prints the answer.
pub(crate) async fn run(global: &Global, args: &UpdateArgs) -> Result<Outcome> {
    let request: Value =
        serde_json::from_str(&args.request).context("reading the request as JSON")?;
    let mut call =
        UpdateCall::new(&args.update, &request).timeout(Duration::from_secs(args.timeout_s));
    if let Some(id) = &args.update_id {
        call = call.id(id.clone());
    }
    let keiro = keiro(global).await?;
    match keiro.update_with::<_, Value>(&args.key, call).await {
        Ok(answer) => {
            println!("{answer}");
            Ok(Outcome::Success)
        }
        Err(
            error @ (keiro::Error::UpdateRejected { .. }
            | keiro::Error::UpdateUnanswered { .. }
            | keiro::Error::UpdateTimeout { .. }
            | keiro::Error::UpdateConflict { .. }
            | keiro::Error::RunFinished { .. }),
        ) => {
            eprintln!("{error}");
            Ok(Outcome::Failed)
        }
        Err(error) => Err::<Outcome, _>(error).context(format!(
            "sending update {:?} to {}/{}",
            args.update, args.key.name, args.key.id
        )),
    }
}
