//! The workflow and handlers the multi-process remote-step tests share with their worker
//! binary (`keiro-test-remote-worker`).

use std::time::Duration;

use keiro::{remote::RemoteOptions, remote::TaskContext, remote::TaskError, Ctx, WorkflowError};
use serde::{Deserialize, Serialize};

/// The input of [`parcel`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Parcel {
    /// What to print a label for.
    pub order: String,
    /// Opt-in redispatch deadline, in milliseconds.
    pub redispatch_ms: Option<u64>,
    /// The remote step's retries (so `retries + 1` attempts in all). Absent in older inputs.
    #[serde(default)]
    pub retries: u32,
}

/// `parcel`: prints a label on a remote worker, then records which process resumed it.
///
/// # Errors
///
/// Suspension while the label is printed, and the remote step's final failure.
pub async fn parcel(ctx: Ctx, parcel: Parcel) -> Result<String, WorkflowError> {
    let mut options = RemoteOptions {
        retries: parcel.retries,
        ..RemoteOptions::default()
    };
    if let Some(ms) = parcel.redispatch_ms {
        options = options.redispatch(Duration::from_millis(ms), 5);
    }
    let label: String = ctx.remote("print", &parcel.order, &options).await?;
    let resumed_by: u32 = ctx
        .step("resumed-by", || async {
            Ok::<_, std::convert::Infallible>(std::process::id())
        })
        .await?;
    Ok(format!("{label}; resumed by {resumed_by}"))
}

/// The `print` handler: a label naming the printing process and the dispatch it served.
///
/// # Errors
///
/// Never; the signature is the handler's.
pub async fn print(order: String, task: TaskContext) -> Result<String, TaskError> {
    Ok(format!(
        "label {order} printed by {} on dispatch {}",
        std::process::id(),
        task.dispatches
    ))
}
