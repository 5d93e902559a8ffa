//! Reporting a handler's result, surviving a short store outage.

use std::time::Duration;

use serde_json::Value;

use crate::store::{ClaimedTask, ReportOutcome, Transport};
use crate::worker::TaskError;

/// What a handler ended with.
pub(crate) enum Report {
    Complete(Value),
    Fail(TaskError),
}

/// How many times a report is tried before the worker gives up on it (the claim then expires
/// and another worker runs the task again: at least once, never lost).
const REPORT_TRIES: u32 = 6;

/// Reports `report` for `task`, retrying transient store errors with a doubling pause
/// (50 ms .. 1.6 s, about 3 s in all).
pub(crate) async fn report_with_retries(
    transport: &dyn Transport,
    task: &ClaimedTask,
    report: Report,
) -> crate::Result<ReportOutcome> {
    let (failure, retry_delay) = match &report {
        Report::Complete(_) => (None, Duration::ZERO),
        Report::Fail(error) => (
            Some(error.clone().into_failure()),
            task.backoff.jittered_delay(task.attempt, unit_random()),
        ),
    };
    let mut pause = Duration::from_millis(50);
    let mut tries = 0;
    loop {
        tries += 1;
        let result = match (&report, &failure) {
            (Report::Complete(output), _) => transport.task_complete(&task.step_id, output).await,
            (Report::Fail(_), Some(failure)) => {
                transport
                    .task_fail(&task.step_id, task.claim, failure, retry_delay)
                    .await
            }
            (Report::Fail(_), None) => unreachable!("a failure report carries its failure"),
        };
        match result {
            Err(error) if error.is_retryable() && tries < REPORT_TRIES => {
                tracing::debug!(%error, tries, "remote worker: report failed, retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            other => return other,
        }
    }
}

/// A number in `[0, 1]` for backoff jitter, from the same source as task claims' ids.
fn unit_random() -> f64 {
    let sample = uuid::Uuid::new_v4().as_u128() % 10_001;
    f64::from(u32::try_from(sample).unwrap_or(0)) / 10_000.0
}
