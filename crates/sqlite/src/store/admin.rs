//! [`SqliteStore`]'s operator recovery of failed instances (`RemoteAdmin`'s requeue and
//! fix-and-replay; the trait itself waits for the rest of remote.sql).

use keiro_journal::store::Result;
use keiro_journal::InstanceKey;
use keiro_remote::{RequeueOutcome, RetryOutcome};
use serde_json::Value;

use crate::instance::{self, RequeueCode, RetryCode};
use crate::row;
use crate::storable;

use super::SqliteStore;

const REQUEUE: &str = "requeueing an instance";
const RETRY: &str = "starting a fix of an instance";

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
}
