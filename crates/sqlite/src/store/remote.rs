//! [`SqliteStore`]'s remote-step operations of `JournalStore`: arming a remote step, and the
//! park that goes with a run's dispatches.

use keiro_journal::queue::QueueRefusal;
use keiro_journal::store::{Park, ParkOutcome, Result};
use keiro_journal::{store::RemoteArm, store::RemoteArmOutcome, StoreError};
use serde_json::Value;

use crate::error::malformed;
use crate::remote::{self, Arm, ArmCode, ParkDispatchCode};
use crate::row;
use crate::storable;

use super::journal::park_outcome;
use super::{lease_lost, not_found, span_ms, SqliteStore};

const ARM: &str = "arming a remote step";
const PARK_DISPATCH: &str = "parking with dispatches";

/// A count or limit for an `integer` column; larger values mean "no limit" anyway.
fn int(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Refuses an arm whose texts or input PostgreSQL would refuse.
fn storable_arm(operation: &'static str, arm: &RemoteArm) -> Result<()> {
    storable::text(operation, "remote step id", &arm.step_id)?;
    storable::text(operation, "remote step name", &arm.step)?;
    storable::text(operation, "step name", &arm.journal_step)?;
    storable::text(operation, "worker group", &arm.group)?;
    if let Some(traceparent) = &arm.traceparent {
        storable::text(operation, "traceparent", traceparent)?;
    }
    if let Some(queue) = &arm.queue {
        storable::text(operation, "queue", queue)?;
    }
    if let Some(key) = &arm.queue_key {
        storable::text(operation, "queue key", key)?;
    }
    storable::value(operation, &arm.input)
}

/// `arm` as `keiro_remote_arm`'s arguments.
fn arm_args(arm: &RemoteArm) -> Arm<'_> {
    Arm {
        step_id: &arm.step_id,
        name: arm.key.name.as_str(),
        id: arm.key.id.as_str(),
        generation: arm.generation,
        step: &arm.step,
        journal_step: &arm.journal_step,
        group: &arm.group,
        input: &arm.input,
        priority: arm.priority,
        traceparent: arm.traceparent.as_deref(),
        max_attempts: int(arm.max_attempts),
        backoff_initial_ms: span_ms(arm.backoff.initial),
        backoff_max_ms: span_ms(arm.backoff.max),
        backoff_jitter: arm.backoff.jitter,
        redispatch_after_ms: arm.redispatch_after.map(span_ms),
        redispatch_max: int(arm.redispatch_max),
        owner: arm.fence.as_ref().map(|f| f.owner.as_str()),
        epoch: arm.fence.as_ref().map(|f| f.epoch),
        queue: arm.queue.as_deref(),
        queue_key: arm.queue_key.as_deref(),
    }
}

/// One arm's code as its outcome or error.
fn arm_outcome(
    code: ArmCode,
    arm: &RemoteArm,
    operation: &'static str,
) -> Result<RemoteArmOutcome> {
    let deadline = |d: Option<i64>| row::instant_opt(d, operation);
    let settled = |value: Value, lost| RemoteArmOutcome::Settled { value, lost };
    match code {
        ArmCode::Dispatched(d) => Ok(RemoteArmOutcome::Dispatched {
            deadline: deadline(d)?,
        }),
        ArmCode::Waiting(d) => Ok(RemoteArmOutcome::Waiting {
            deadline: deadline(d)?,
        }),
        ArmCode::Redispatched(d) => Ok(RemoteArmOutcome::Redispatched {
            deadline: deadline(d)?,
        }),
        ArmCode::Settled(value) => Ok(settled(value, false)),
        ArmCode::Lost(value) => Ok(settled(value, true)),
        ArmCode::NotFound => Err(not_found(&arm.key)),
        ArmCode::LeaseLost => match &arm.fence {
            Some(fence) => Err(lease_lost(&arm.key, &fence.owner, fence.epoch)),
            None => Err(malformed(operation, "lease_lost without a fence")),
        },
        ArmCode::UnknownQueue(queue) => Err(StoreError::QueueRefused {
            queue,
            refusal: QueueRefusal::Unknown,
        }),
    }
}

impl SqliteStore {
    /// Arms a remote step: writes its task once, or learns its result, its redispatch or
    /// loss past its deadline, or that it still waits (`JournalStore::remote_arm`).
    ///
    /// # Errors
    ///
    /// `NotFound`; `LeaseLost` for a stale fence (nothing written); `ValueRefused` for a
    /// text or an input holding a NUL.
    pub async fn remote_arm(&self, arm: &RemoteArm) -> Result<RemoteArmOutcome> {
        storable_arm(ARM, arm)?;
        let arm = arm.clone();
        self.inner
            .writer
            .write(ARM, move |conn, now| {
                let code = remote::remote_arm(conn, now, arm_args(&arm))?;
                arm_outcome(code, &arm, ARM)
            })
            .await
    }

    /// Arms remote steps and parks the run in one transaction, the park's wake time moved to
    /// the earliest deadline an arm returned (`JournalStore::instance_park_dispatch`).
    ///
    /// # Errors
    ///
    /// The first arm's `NotFound` or `LeaseLost`, `QueueRefused` for an undeclared queue
    /// (nothing written); the park's errors;
    /// `ValueRefused` for a text or an input holding a NUL.
    pub async fn instance_park_dispatch(
        &self,
        park: &Park,
        arms: &[RemoteArm],
    ) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
        for step in &park.awaited {
            storable::text(PARK_DISPATCH, "step name", step)?;
        }
        for arm in arms {
            storable_arm(PARK_DISPATCH, arm)?;
        }
        let (park, arms) = (park.clone(), arms.to_vec());
        self.inner
            .writer
            .write(PARK_DISPATCH, move |conn, now| {
                let fence = park.fence.as_ref().map(|f| (f.owner.as_str(), f.epoch));
                let args: Vec<Arm<'_>> = arms.iter().map(arm_args).collect();
                match remote::instance_park_dispatch(
                    conn,
                    now,
                    park.key.name.as_str(),
                    park.key.id.as_str(),
                    park.generation,
                    fence,
                    &park.awaited,
                    park.wake_after,
                    &args,
                )? {
                    ParkDispatchCode::Refused(code) => {
                        let arm = arms
                            .first()
                            .ok_or_else(|| malformed(PARK_DISPATCH, "a refusal with no arm"))?;
                        // The refusal fails the operation: its savepoint undoes the arms made.
                        Err(arm_outcome(code, arm, PARK_DISPATCH)
                            .err()
                            .unwrap_or_else(|| malformed(PARK_DISPATCH, "a refusal")))
                    }
                    ParkDispatchCode::Parked(code, codes) => {
                        let parked = park_outcome(code, &park)?;
                        let outcomes = codes
                            .into_iter()
                            .zip(&arms)
                            .map(|(code, arm)| arm_outcome(code, arm, PARK_DISPATCH))
                            .collect::<Result<Vec<_>>>()?;
                        Ok((parked, outcomes))
                    }
                }
            })
            .await
    }
}
