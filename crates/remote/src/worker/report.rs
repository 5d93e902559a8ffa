//! Reporting a handler's result, surviving a short store outage, and a store that refuses
//! one output of a batch.

use std::time::Duration;

use keiro_journal::{store::storable_text, Backoff, StoreError};
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

/// The pauses between a report's tries: 50 ms, doubling, jittered so the workers of a fleet
/// that lost the database together do not report in lockstep (at most about 3 s in all).
const REPORT_RETRY_BACKOFF: Backoff =
    Backoff::exponential(Duration::from_millis(50), Duration::from_secs(2));

/// Runs `call` until it succeeds, fails for good, or has failed transiently `REPORT_TRIES`
/// times, pausing on [`REPORT_RETRY_BACKOFF`] between tries.
async fn retrying<T, F, Fut>(mut call: F) -> crate::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::Result<T>>,
{
    let mut tries = 0;
    loop {
        tries += 1;
        match call().await {
            Err(error) if error.is_retryable() && tries < REPORT_TRIES => {
                tracing::debug!(%error, tries, "remote worker: report failed, retrying");
                tokio::time::sleep(REPORT_RETRY_BACKOFF.delay_random(tries)).await;
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
    let retry_delay = task.backoff.delay_random(task.attempt);
    retrying(|| transport.task_fail(&task.step_id, task.claim, &failure, retry_delay)).await
}

/// The code of the failure a refused output becomes.
const OUTPUT_REFUSED: &str = "output_refused";

/// The fatal failure to report instead of an output the store refused: the store refuses the
/// same output on every attempt, so the step fails at once rather than running again after
/// its claim expires. `None` for any other error.
pub(crate) fn output_refused(error: &StoreError) -> Option<TaskError> {
    match error {
        StoreError::ValueRefused { reason, .. } => Some(
            TaskError::fatal(format!(
                "the store refused the handler's output: {}",
                storable_text(reason)
            ))
            .with_code(OUTPUT_REFUSED),
        ),
        _ => None,
    }
}

/// One output waiting for the batch reporter, with where its outcome goes.
pub(crate) struct Completion {
    pub(crate) step_id: String,
    pub(crate) output: Value,
    pub(crate) reply: tokio::sync::oneshot::Sender<crate::Result<ReportOutcome>>,
}

/// The most outputs one batch carries.
const BATCH_MAX: usize = 128;

/// Batches in flight at once: while one commits, the next fills. With one, results wait
/// behind a slow commit; with more, a busy worker's results split into small batches that each
/// pay a batch's fixed cost (figures: docs/benchmarks-history.md, "Remote steps").
const BATCHES_IN_FLIGHT: usize = 2;

/// Reports outputs in natural batches (keiro-journal's loop) until every sender is gone:
/// whatever finished while the batches in flight were committing goes in the next one, so an
/// idle worker reports at once and a busy one pays one commit for many results. The queue is
/// unbounded, but each handler waits for its own report's answer, so it never holds more
/// than the worker's concurrency.
pub(crate) async fn run_reporter(
    transport: std::sync::Arc<dyn Transport>,
    completions: tokio::sync::mpsc::UnboundedReceiver<Completion>,
) {
    let limits = keiro_journal::batch::BatchLimits {
        len_max: BATCH_MAX,
        in_flight: BATCHES_IN_FLIGHT,
    };
    keiro_journal::batch::run_batches(completions, limits, |batch, slot| {
        let transport = transport.clone();
        Some(async move {
            report_batch(transport, batch).await;
            // Held until the reports are answered: a transport reports nothing earlier.
            drop(slot);
        })
    })
    .await;
}

/// Reports one batch, retrying transient errors, and answers each report.
///
/// A batch the store refuses for a value (one output it cannot keep) is reported again one
/// report at a time, so only the report holding that value is refused and every other one
/// lands (one that already landed answers `AlreadySettled`).
async fn report_batch(transport: std::sync::Arc<dyn Transport>, mut batch: Vec<Completion>) {
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
        Err(error) if batch.len() == 1 => {
            if let Some(completion) = batch.pop() {
                let _ = completion.reply.send(Err(error));
            }
        }
        Err(error) if error.is_value_refused() => {
            tracing::debug!(%error, reports = batch.len(), "remote worker: a report batch was refused; reporting one by one");
            for completion in batch {
                let outcome =
                    retrying(|| transport.task_complete(&completion.step_id, &completion.output))
                        .await;
                let _ = completion.reply.send(outcome);
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::store::{ClaimRequest, TaskFailure};

    /// Refuses a value the way PostgreSQL does (a batch as a whole), and records every call.
    #[derive(Debug, Default)]
    struct Refusing {
        calls: Mutex<Vec<String>>,
    }

    fn refusal(output: &Value) -> crate::Result<()> {
        keiro_journal::store::check_value(output).map_err(|reason| StoreError::ValueRefused {
            operation: "test",
            reason,
        })
    }

    #[async_trait::async_trait]
    impl Transport for Refusing {
        async fn tasks_claim(&self, _: &ClaimRequest) -> crate::Result<Vec<ClaimedTask>> {
            Ok(Vec::new())
        }

        async fn task_heartbeat(
            &self,
            _: &str,
            _: Uuid,
            _: Duration,
        ) -> crate::Result<crate::store::HeartbeatOutcome> {
            Ok(crate::store::HeartbeatOutcome::Extended)
        }

        async fn task_complete(
            &self,
            step_id: &str,
            output: &Value,
        ) -> crate::Result<ReportOutcome> {
            self.calls.lock().unwrap().push(format!("one {step_id}"));
            refusal(output)?;
            Ok(ReportOutcome::Delivered)
        }

        async fn tasks_complete(
            &self,
            reports: &[(String, Value)],
        ) -> crate::Result<Vec<ReportOutcome>> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("batch of {}", reports.len()));
            for (_, output) in reports {
                refusal(output)?;
            }
            Ok(vec![ReportOutcome::Delivered; reports.len()])
        }

        async fn task_fail(
            &self,
            _: &str,
            _: Uuid,
            _: &TaskFailure,
            _: Duration,
        ) -> crate::Result<ReportOutcome> {
            Ok(ReportOutcome::Delivered)
        }
    }

    fn completion(
        step_id: &str,
        output: Value,
    ) -> (
        Completion,
        tokio::sync::oneshot::Receiver<crate::Result<ReportOutcome>>,
    ) {
        let (reply, replied) = tokio::sync::oneshot::channel();
        let completion = Completion {
            step_id: step_id.to_owned(),
            output,
            reply,
        };
        (completion, replied)
    }

    #[tokio::test]
    async fn a_refused_batch_is_reported_one_by_one_and_only_the_refused_report_fails() {
        let transport = Arc::new(Refusing::default());
        let (a, a_replied) = completion("a", json!("fine"));
        let (b, b_replied) = completion("b", json!({"label": "x\u{0}y"}));
        let (c, c_replied) = completion("c", json!(3));
        report_batch(transport.clone(), vec![a, b, c]).await;

        assert_eq!(a_replied.await.unwrap().unwrap(), ReportOutcome::Delivered);
        assert_eq!(c_replied.await.unwrap().unwrap(), ReportOutcome::Delivered);
        let refused = b_replied.await.unwrap().unwrap_err();
        assert!(refused.is_value_refused(), "{refused}");
        assert_eq!(
            *transport.calls.lock().unwrap(),
            ["batch of 3", "one a", "one b", "one c"]
        );

        let failure = output_refused(&refused).expect("a refused value");
        assert_eq!(
            (failure.code.as_deref(), failure.retryable),
            (Some(OUTPUT_REFUSED), false)
        );
        assert!(failure.message.contains("/label"), "{}", failure.message);
        let other = StoreError::Malformed {
            operation: "test",
            detail: "x".into(),
        };
        assert!(output_refused(&other).is_none());
    }

    #[tokio::test]
    async fn a_batch_of_one_answers_with_the_stores_own_error() {
        let transport = Arc::new(Refusing::default());
        let (b, b_replied) = completion("b", json!("\u{0}"));
        report_batch(transport.clone(), vec![b]).await;
        assert!(b_replied.await.unwrap().unwrap_err().is_value_refused());
        assert_eq!(*transport.calls.lock().unwrap(), ["batch of 1"]);
    }
}
