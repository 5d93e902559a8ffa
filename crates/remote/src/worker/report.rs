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

/// Runs `call` until it succeeds, fails for good, or has failed transiently `REPORT_TRIES`
/// times, pausing 50 ms, doubling, between tries (about 3 s in all).
async fn retrying<T, F, Fut>(mut call: F) -> crate::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::Result<T>>,
{
    let mut pause = Duration::from_millis(50);
    let mut tries = 0;
    loop {
        tries += 1;
        match call().await {
            Err(error) if error.is_retryable() && tries < REPORT_TRIES => {
                tracing::debug!(%error, tries, "remote worker: report failed, retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            other => return other,
        }
    }
}

/// Reports a handler's failure for `task`, with the retry delay its backoff gives (jittered).
pub(crate) async fn report_failure(
    transport: &dyn Transport,
    task: &ClaimedTask,
    error: TaskError,
) -> crate::Result<ReportOutcome> {
    let failure = error.into_failure();
    let retry_delay = task.backoff.jittered_delay(task.attempt, unit_random());
    retrying(|| transport.task_fail(&task.step_id, task.claim, &failure, retry_delay)).await
}

/// A number in `[0, 1]` for backoff jitter, from the same source as task claims' ids.
fn unit_random() -> f64 {
    let sample = uuid::Uuid::new_v4().as_u128() % 10_001;
    f64::from(u32::try_from(sample).unwrap_or(0)) / 10_000.0
}

/// One output waiting for the batch reporter, with where its outcome goes.
pub(crate) struct Completion {
    pub(crate) step_id: String,
    pub(crate) output: Value,
    pub(crate) reply: tokio::sync::oneshot::Sender<crate::Result<ReportOutcome>>,
}

/// The most outputs one batch carries.
const BATCH_MAX: usize = 128;

/// Batches in flight at once: while one commits, the next fills. One alone made results wait
/// behind a slow commit (dispatch-to-result p50 over a second under load); four split a busy
/// worker's results into batches of about two, and each batch has a fixed cost (measured with
/// `keiro bench --mode remote`: two in flight used about 5% less CPU per remote step than four,
/// at the same latency).
const BATCHES_IN_FLIGHT: usize = 2;

/// Reports outputs in batches until every sender is gone: whatever finished while the
/// batches in flight were committing goes in the next one, so an idle worker reports at once
/// and a busy one pays one commit for many results.
pub(crate) async fn run_reporter(
    transport: std::sync::Arc<dyn Transport>,
    mut completions: tokio::sync::mpsc::Receiver<Completion>,
) {
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        if in_flight.len() >= BATCHES_IN_FLIGHT {
            in_flight.join_next().await;
            continue;
        }
        let mut batch = Vec::with_capacity(BATCH_MAX);
        if completions.recv_many(&mut batch, BATCH_MAX).await == 0 {
            break;
        }
        in_flight.spawn(report_batch(transport.clone(), batch));
    }
    while in_flight.join_next().await.is_some() {}
}

/// Reports one batch, retrying transient errors, and answers each report.
async fn report_batch(transport: std::sync::Arc<dyn Transport>, batch: Vec<Completion>) {
    let reports: Vec<(String, Value)> = batch
        .iter()
        .map(|c| (c.step_id.clone(), c.output.clone()))
        .collect();
    let result = retrying(|| transport.tasks_complete(&reports)).await;
    match result {
        Ok(outcomes) => {
            for (completion, outcome) in batch.into_iter().zip(outcomes) {
                let _ = completion.reply.send(Ok(outcome));
            }
        }
        Err(error) => {
            let message = error.to_string();
            for completion in batch {
                let _ = completion
                    .reply
                    .send(Err(keiro_journal::StoreError::Malformed {
                        operation: "reporting remote results",
                        detail: message.clone(),
                    }));
            }
        }
    }
}
