//! [`SqliteStore`]'s operator recovery tools (`RemoteAdmin`'s methods): redispatch, requeue,
//! fix-and-replay, and the list of an instance's remote tasks.

use keiro_journal::store::Result;
use keiro_journal::InstanceKey;
use keiro_remote::{RemoteTask, RequeueOutcome, RetryOutcome, TaskStatus};
use serde_json::Value;

use crate::error::{malformed, store};
use crate::instance::{self, RequeueCode, RetryCode};
use crate::remote;
use crate::row;
use crate::storable;

use super::SqliteStore;

const REDISPATCH: &str = "redispatching pending remote tasks";
const REQUEUE: &str = "requeueing an instance";
const RETRY: &str = "starting a fix of an instance";
const TASKS: &str = "listing remote tasks";

const REMOTE_TASKS: &str = "SELECT step_id, workflow_name, workflow_id, generation, step, \
     journal_step, grp, status, attempts, max_attempts, dispatches, claimed_by, last_error, \
     output, traceparent FROM remote_tasks \
     WHERE workflow_name = ?1 AND workflow_id = ?2 ORDER BY created_at, step_id";

/// One stored task's columns, as `REMOTE_TASKS` selects them.
type StoredTask = (
    String,
    String,
    String,
    i32,
    String,
    String,
    String,
    String,
    i64,
    i64,
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// A stored task as keiro's [`RemoteTask`].
fn remote_task(stored: StoredTask) -> Result<RemoteTask> {
    let (step_id, name, id, generation, step, journal_step, group, status) = (
        stored.0, stored.1, stored.2, stored.3, stored.4, stored.5, stored.6, stored.7,
    );
    let natural = |n: i64, what: &str| {
        u32::try_from(n).map_err(|_| malformed(TASKS, format_args!("{what} {n}")))
    };
    let json = |text: Option<String>| text.map(|t| row::value(&t, TASKS)).transpose();
    Ok(RemoteTask {
        step_id,
        key: row::key(&name, &id, TASKS)?,
        generation,
        step,
        journal_step,
        group,
        status: TaskStatus::parse(&status).ok_or_else(|| {
            malformed(TASKS, format_args!("unknown remote task status {status:?}"))
        })?,
        attempts: natural(stored.8, "attempts")?,
        max_attempts: natural(stored.9, "max_attempts")?,
        dispatches: natural(stored.10, "dispatches")?,
        claimed_by: stored.11,
        last_error: json(stored.12)?,
        output: json(stored.13)?,
        traceparent: stored.14,
    })
}

impl SqliteStore {
    /// Requeues a failed instance and its failed children: failed remote steps and awaited
    /// child failures are superseded by `StepReset` rows, their tasks pending again, the
    /// children relinked to the next revision (or their success journaled at once), a
    /// `Resurrected` event appended and the row `running` (`RemoteAdmin::instance_requeue`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a stored row keiro cannot read.
    pub async fn instance_requeue(&self, key: &InstanceKey) -> Result<RequeueOutcome> {
        let key = key.clone();
        self.inner
            .writer
            .write(REQUEUE, move |conn, now| match instance::instance_requeue(
                conn,
                now,
                key.name.as_str(),
                key.id.as_str(),
            )? {
                RequeueCode::NotFound => Ok(RequeueOutcome::NotFound),
                RequeueCode::NotFailed(status) => {
                    Ok(RequeueOutcome::NotFailed(row::status(&status, REQUEUE)?))
                }
                RequeueCode::Requeued(reset_steps, children) => {
                    let children = children
                        .iter()
                        .map(|(name, id)| row::key(name, id, REQUEUE))
                        .collect::<Result<Vec<_>>>()?;
                    Ok(RequeueOutcome::Requeued {
                        reset_steps,
                        children,
                    })
                }
            })
            .await
    }

    /// Starts `retry` of the origin's workflow with `input` and a clean history, linked to the
    /// origin's parent so that its success is also journaled where the parent awaits the
    /// origin (`RemoteAdmin::instance_retry_with_input`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for an input holding a NUL.
    pub async fn instance_retry_with_input(
        &self,
        origin: &InstanceKey,
        retry: &InstanceKey,
        input: &Value,
    ) -> Result<RetryOutcome> {
        storable::value(RETRY, input)?;
        let (origin, retry, input) = (origin.clone(), retry.clone(), input.clone());
        self.inner
            .writer
            .write(RETRY, move |conn, now| {
                let code = instance::instance_retry_with_input(
                    conn,
                    now,
                    (origin.name.as_str(), origin.id.as_str()),
                    (retry.name.as_str(), retry.id.as_str()),
                    &input,
                )?;
                Ok(match code {
                    RetryCode::Started => RetryOutcome::Started(retry),
                    RetryCode::Exists => RetryOutcome::Exists(retry),
                    RetryCode::OriginNotFound => RetryOutcome::OriginNotFound,
                })
            })
            .await
    }

    /// Dispatches every pending or claimed remote task of the instance's current generation
    /// again; how many, or `None` for an unknown instance
    /// (`RemoteAdmin::remote_redispatch_pending`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn remote_redispatch_pending(&self, key: &InstanceKey) -> Result<Option<u64>> {
        let key = key.clone();
        self.inner
            .writer
            .write(REDISPATCH, move |conn, now| {
                remote::remote_redispatch_pending(conn, now, key.name.as_str(), key.id.as_str())
            })
            .await
    }

    /// Every remote task of an instance, oldest first (`RemoteAdmin::remote_tasks`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a stored row keiro cannot read.
    pub async fn remote_tasks(&self, key: &InstanceKey) -> Result<Vec<RemoteTask>> {
        let key = key.clone();
        self.read(TASKS, move |conn, _| {
            let stored: Vec<StoredTask> = conn
                .prepare_cached(REMOTE_TASKS)
                .and_then(|mut s| {
                    s.query_map([key.name.as_str(), key.id.as_str()], |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get(2)?,
                            r.get(3)?,
                            r.get(4)?,
                            r.get(5)?,
                            r.get(6)?,
                            r.get(7)?,
                            r.get(8)?,
                            r.get(9)?,
                            r.get(10)?,
                            r.get(11)?,
                            r.get(12)?,
                            r.get(13)?,
                            r.get(14)?,
                        ))
                    })?
                    .collect()
                })
                .map_err(|e| store(TASKS, e))?;
            stored.into_iter().map(remote_task).collect()
        })
        .await
    }
}
