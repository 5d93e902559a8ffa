//! [`SqliteStore`]'s worker-facing side of remote steps (`Transport`'s methods): claim,
//! heartbeat, reports.

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::Backoff;
use keiro_remote::{ClaimRequest, ClaimedTask, HeartbeatOutcome, ReportOutcome, TaskFailure};
use serde_json::Value;
use uuid::Uuid;

use crate::error::malformed;
use crate::remote::{self, Claimed, HeartbeatCode, ReportCode};
use crate::row;
use crate::storable;

use super::{span_ms, SqliteStore};

const CLAIM: &str = "claiming remote tasks";
const HEARTBEAT: &str = "extending a remote task's claim";
const COMPLETE: &str = "completing a remote task";
const FAIL: &str = "failing a remote task";

/// A count that is never negative, as keiro's `u32`.
fn natural(n: i64, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| malformed(CLAIM, format_args!("negative {what} {n}")))
}

/// Milliseconds that are never negative.
fn millis(ms: i64, what: &str) -> Result<Duration> {
    u64::try_from(ms)
        .map(Duration::from_millis)
        .map_err(|_| malformed(CLAIM, format_args!("negative {what} {ms}")))
}

/// A claimed row as keiro's [`ClaimedTask`].
fn claimed_task(c: Claimed) -> Result<ClaimedTask> {
    Ok(ClaimedTask {
        step_id: c.0,
        claim: Uuid::parse_str(&c.1).map_err(|e| malformed(CLAIM, format_args!("claim: {e}")))?,
        key: row::key(&c.2, &c.3, CLAIM)?,
        generation: c.4,
        step: c.5,
        group: c.6,
        input: row::value(&c.7, CLAIM)?,
        priority: c.8,
        traceparent: c.9,
        attempt: natural(c.10, "attempts")?.saturating_add(1),
        max_attempts: natural(c.11, "max_attempts")?,
        backoff: Backoff {
            initial: millis(c.12, "backoff_initial_ms")?,
            max: millis(c.13, "backoff_max_ms")?,
            jitter: c.14,
        },
        dispatches: natural(c.15, "dispatches")?,
        available_at: row::instant(c.16, CLAIM)?,
    })
}

/// A report's code as its outcome.
fn report_outcome(code: ReportCode, operation: &'static str) -> Result<ReportOutcome> {
    Ok(match code {
        ReportCode::Delivered => ReportOutcome::Delivered,
        ReportCode::OwnerGone => ReportOutcome::OwnerGone,
        ReportCode::Retrying(at) => ReportOutcome::Retrying {
            at: row::instant(at, operation)?,
        },
        ReportCode::AlreadySettled => ReportOutcome::AlreadySettled,
        ReportCode::Cancelled => ReportOutcome::Cancelled,
        ReportCode::Stale => ReportOutcome::Stale,
        ReportCode::NotFound => ReportOutcome::NotFound,
    })
}

impl SqliteStore {
    /// Counts the groups' expired claims as failed attempts, then claims up to
    /// `request.limit` available tasks of the groups (`Transport::tasks_claim`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a stored row keiro cannot read.
    pub async fn tasks_claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedTask>> {
        if request.groups.is_empty() || request.limit == 0 {
            return Ok(Vec::new());
        }
        storable::text(CLAIM, "worker name", &request.worker)?;
        let request = request.clone();
        self.inner
            .writer
            .write(CLAIM, move |conn, now| {
                remote::remote_tasks_claim(
                    conn,
                    now,
                    &request.groups,
                    &request.worker,
                    i64::from(request.limit),
                    span_ms(request.claim_ttl),
                )?
                .into_iter()
                .map(claimed_task)
                .collect()
            })
            .await
    }

    /// Extends the claim `claim` of a running task to now + `ttl`
    /// (`Transport::task_heartbeat`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn task_heartbeat(
        &self,
        step_id: &str,
        claim: Uuid,
        ttl: Duration,
    ) -> Result<HeartbeatOutcome> {
        let step_id = step_id.to_owned();
        self.inner
            .writer
            .write(HEARTBEAT, move |conn, now| {
                let code = remote::remote_task_heartbeat(
                    conn,
                    now,
                    &step_id,
                    &claim.hyphenated().to_string(),
                    span_ms(ttl),
                )?;
                Ok(match code {
                    HeartbeatCode::Extended => HeartbeatOutcome::Extended,
                    HeartbeatCode::Cancelled => HeartbeatOutcome::Cancelled,
                    HeartbeatCode::Lost => HeartbeatOutcome::Lost,
                })
            })
            .await
    }

    /// Settles a task `completed` with `output` (the first result wins) and journals it into
    /// the owner (`Transport::task_complete`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for an output holding a NUL.
    pub async fn task_complete(&self, step_id: &str, output: &Value) -> Result<ReportOutcome> {
        storable::value(COMPLETE, output)?;
        let (step_id, output) = (step_id.to_owned(), output.clone());
        self.inner
            .writer
            .write(COMPLETE, move |conn, now| {
                let code = remote::remote_task_complete(conn, now, &step_id, &output)?;
                report_outcome(code, COMPLETE)
            })
            .await
    }

    /// Completes several tasks in one transaction, one outcome per report in the callers'
    /// order (`Transport::tasks_complete`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for an output holding a NUL (nothing is settled then).
    pub async fn tasks_complete(&self, reports: &[(String, Value)]) -> Result<Vec<ReportOutcome>> {
        for (_, output) in reports {
            storable::value(COMPLETE, output)?;
        }
        let reports = reports.to_vec();
        self.inner
            .writer
            .write(COMPLETE, move |conn, now| {
                remote::remote_tasks_complete(conn, now, &reports)?
                    .into_iter()
                    .map(|code| report_outcome(code, COMPLETE))
                    .collect()
            })
            .await
    }

    /// Counts a failed attempt of the claim `claim`: pending again after `retry_delay` with
    /// attempts left and a retryable failure, else failed with its error journaled into the
    /// owner (`Transport::task_fail`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a message or code holding a NUL.
    pub async fn task_fail(
        &self,
        step_id: &str,
        claim: Uuid,
        failure: &TaskFailure,
        retry_delay: Duration,
    ) -> Result<ReportOutcome> {
        storable::text(FAIL, "failure message", &failure.message)?;
        if let Some(code) = &failure.code {
            storable::text(FAIL, "failure code", code)?;
        }
        let (step_id, failure) = (step_id.to_owned(), failure.clone());
        self.inner
            .writer
            .write(FAIL, move |conn, now| {
                let code = remote::remote_task_fail(
                    conn,
                    now,
                    &step_id,
                    &claim.hyphenated().to_string(),
                    &failure.message,
                    failure.code.as_deref(),
                    failure.retryable,
                    span_ms(retry_delay),
                )?;
                report_outcome(code, FAIL)
            })
            .await
    }
}
