//! [`SqliteStore`]'s lease operations (`LeaseStore`'s methods, as they are implemented).

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{store::StartRequest, Fence, InstanceKey, JournalEntry, WorkflowName};
use keiro_lease::{
    Claim, ClaimGate, ClaimOutcome, Crash, CrashOutcome, OpenRefusal, RefusalOutcome,
    ResurrectOutcome, StartClaim, Versions,
};
use time::OffsetDateTime;

use crate::error::malformed;
use crate::lease::{self, CrashCode, RefuseCode, ResurrectCode};
use crate::row::{self, Stored};
use crate::storable;

use super::{lease_lost, not_found, span_ms, SqliteStore};

const CLAIM: &str = "claiming an instance";
const START_CLAIMED: &str = "starting an instance claimed";
const CLAIM_BATCH: &str = "claiming a batch of instances";
const RENEW: &str = "renewing a lease";
const RELEASE: &str = "releasing a lease";
const FORCE_RELEASE: &str = "force-releasing a lease";
const RECORD_CRASH: &str = "recording a crash";
const REFUSE_OPEN: &str = "handing back a run its worker cannot open";
const RESURRECT: &str = "resurrecting an instance";

impl SqliteStore {
    /// Exact discovery (`LeaseStore::instances_runnable`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a stored key keiro cannot read.
    pub async fn instances_runnable(
        &self,
        now: Option<OffsetDateTime>,
        limit: Option<i64>,
    ) -> Result<Vec<InstanceKey>> {
        self.read(lease::RUNNABLE, move |conn, clock| {
            lease::instances_runnable(conn, now.unwrap_or(clock), limit)?
                .into_iter()
                .map(|(name, id)| row::key(&name, &id, lease::RUNNABLE))
                .collect()
        })
        .await
    }

    /// Claims `key` for `owner` until `now + ttl` (`LeaseStore::instance_claim`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instance_claim(
        &self,
        key: &InstanceKey,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        self.instance_claim_serving(key, &Versions::Any, owner, ttl, now)
            .await
    }

    /// Claims `key` for `owner` until `now + ttl` when its version is one `versions` serves
    /// (`LeaseStore::instance_claim_serving`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instance_claim_serving(
        &self,
        key: &InstanceKey,
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        let (key, owner) = (key.clone(), owner.to_owned());
        let versions = versions.as_filter().map(<[String]>::to_vec);
        self.inner
            .writer
            .write(CLAIM, move |conn, clock| {
                let claimed = lease::instance_claim(
                    conn,
                    clock,
                    key.name.as_str(),
                    key.id.as_str(),
                    &owner,
                    span_ms(ttl),
                    now,
                    versions.as_deref(),
                )?;
                claim_outcome(claimed, CLAIM)
            })
            .await
    }

    /// Starts `request`'s instance already leased to `owner` until `now + ttl`, in one
    /// operation, notifying nobody (`LeaseStore::instance_start_claimed`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for an input PostgreSQL would refuse; `Malformed` for a row keiro cannot
    /// read (the claim is then undone with the operation).
    pub async fn instance_start_claimed(
        &self,
        request: &StartRequest,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<StartClaim> {
        storable::value(START_CLAIMED, &request.input)?;
        let (request, owner) = (request.clone(), owner.to_owned());
        self.inner
            .writer
            .write(START_CLAIMED, move |conn, clock| {
                let parent = request
                    .parent
                    .as_ref()
                    .map(|p| (p.name.as_str(), p.id.as_str()));
                let (created, claimed) = lease::instance_start_claimed(
                    conn,
                    clock,
                    request.key.name.as_str(),
                    request.key.id.as_str(),
                    &request.input,
                    parent,
                    request.priority,
                    &owner,
                    span_ms(ttl),
                    now,
                )?;
                Ok(StartClaim {
                    created,
                    claim: claim_outcome(claimed, START_CLAIMED)?,
                })
            })
            .await
    }

    /// Claims up to `limit` runnable instances of `names` (`LeaseStore::instances_claim_batch`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instances_claim_batch(
        &self,
        names: &[WorkflowName],
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        self.instances_claim_batch_serving(names, &Versions::Any, owner, ttl, limit, now)
            .await
    }

    /// Claims up to `limit` runnable instances of `names` whose version is one `versions`
    /// serves (`LeaseStore::instances_claim_batch_serving`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instances_claim_batch_serving(
        &self,
        names: &[WorkflowName],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        let names: Vec<String> = names.iter().map(|n| n.as_str().to_owned()).collect();
        let owner = owner.to_owned();
        let versions = versions.as_filter().map(<[String]>::to_vec);
        self.inner
            .writer
            .write(CLAIM_BATCH, move |conn, clock| {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                lease::instances_claim_batch(
                    conn,
                    clock,
                    &names,
                    &owner,
                    span_ms(ttl),
                    limit,
                    now,
                    versions.as_deref(),
                    &[],
                )?
                .into_iter()
                .map(|(row, journal)| claim(&row, journal, CLAIM_BATCH))
                .collect()
            })
            .await
    }

    /// Renews a held lease to `now + ttl` (`LeaseStore::instance_lease_renew`).
    ///
    /// # Errors
    ///
    /// `LeaseLost` when the fence no longer matches; `NotFound`.
    pub async fn instance_lease_renew(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<()> {
        let (key, fence) = (key.clone(), fence.clone());
        self.inner
            .writer
            .write(RENEW, move |conn, now| {
                match lease::instance_lease_renew(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    &fence.owner,
                    fence.epoch,
                    span_ms(ttl),
                )? {
                    Some(true) => Ok(()),
                    Some(false) => Err(lease_lost(&key, &fence.owner, fence.epoch)),
                    None => Err(not_found(&key)),
                }
            })
            .await
    }

    /// Releases a held lease; when `progressed`, also resets attempts, error and gate
    /// (`LeaseStore::instance_release`). `false` when the fence no longer matched.
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn instance_release(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        progressed: bool,
    ) -> Result<bool> {
        let (key, fence) = (key.clone(), fence.clone());
        self.inner
            .writer
            .write(RELEASE, move |conn, now| {
                lease::instance_release(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    &fence.owner,
                    fence.epoch,
                    progressed,
                )
            })
            .await
    }

    /// Drops whatever lease the instance has (`LeaseStore::instance_lease_force_release`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn instance_lease_force_release(&self, key: &InstanceKey) -> Result<bool> {
        let key = key.clone();
        self.inner
            .writer
            .write(FORCE_RELEASE, move |conn, now| {
                lease::instance_lease_force_release(conn, now, key.name.as_str(), key.id.as_str())
            })
            .await
    }

    /// Records a crash of the run holding `fence` and releases its lease; at the ceiling the
    /// run is failed (`LeaseStore::instance_record_crash`).
    ///
    /// # Errors
    ///
    /// `LeaseLost`, `NotFound`, `ValueRefused` for an error text holding a NUL.
    pub async fn instance_record_crash(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        crash: &Crash,
    ) -> Result<CrashOutcome> {
        storable::text(RECORD_CRASH, "failure reason", &crash.error)?;
        let (key, fence, crash) = (key.clone(), fence.clone(), crash.clone());
        self.inner
            .writer
            .write(
                RECORD_CRASH,
                move |conn, now| match lease::instance_record_crash(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    &fence.owner,
                    fence.epoch,
                    &crash.error,
                    span_ms(crash.retry_delay),
                    crash.max_attempts,
                )? {
                    CrashCode::Retrying(attempts, next_attempt_at) => Ok(CrashOutcome::Retrying {
                        attempts,
                        next_attempt_at,
                    }),
                    CrashCode::Failed(attempts) => Ok(CrashOutcome::Failed { attempts }),
                    CrashCode::Terminal => Ok(CrashOutcome::AlreadyTerminal),
                    CrashCode::NotFound => Err(not_found(&key)),
                    CrashCode::LeaseLost => Err(lease_lost(&key, &fence.owner, fence.epoch)),
                },
            )
            .await
    }

    /// Hands back the lease of the run holding `fence`, whose payload the claiming worker
    /// could not open, without counting a crash (`LeaseStore::instance_refuse_open`).
    ///
    /// # Errors
    ///
    /// `LeaseLost`, `NotFound`, `ValueRefused` for an error text holding a NUL.
    pub async fn instance_refuse_open(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        refusal: &OpenRefusal,
    ) -> Result<RefusalOutcome> {
        storable::text(REFUSE_OPEN, "refusal reason", &refusal.error)?;
        let (key, fence, refusal) = (key.clone(), fence.clone(), refusal.clone());
        self.inner
            .writer
            .write(
                REFUSE_OPEN,
                move |conn, now| match lease::instance_refuse_open(
                    conn,
                    now,
                    key.name.as_str(),
                    key.id.as_str(),
                    &fence.owner,
                    fence.epoch,
                    &refusal.error,
                    span_ms(refusal.retry_delay),
                )? {
                    RefuseCode::Refused(refusals, next_attempt_at) => {
                        Ok(RefusalOutcome::Released {
                            refusals,
                            next_attempt_at,
                        })
                    }
                    RefuseCode::Terminal => Ok(RefusalOutcome::AlreadyTerminal),
                    RefuseCode::NotFound => Err(not_found(&key)),
                    RefuseCode::LeaseLost => Err(lease_lost(&key, &fence.owner, fence.epoch)),
                },
            )
            .await
    }

    /// Returns a failed instance to `running`, appending `Resurrected`
    /// (`LeaseStore::instance_resurrect`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn instance_resurrect(&self, key: &InstanceKey) -> Result<ResurrectOutcome> {
        let key = key.clone();
        self.inner
            .writer
            .write(RESURRECT, move |conn, now| match lease::instance_resurrect(
                conn,
                now,
                key.name.as_str(),
                key.id.as_str(),
            )? {
                ResurrectCode::Resurrected => Ok(ResurrectOutcome::Resurrected),
                ResurrectCode::NotFailed(status) => Ok(ResurrectOutcome::NotFailed(row::status(
                    &status, RESURRECT,
                )?)),
                ResurrectCode::NotFound => Ok(ResurrectOutcome::NotFound),
            })
            .await
    }
}

/// A claim's answer: acquired with its row and journal, or the refusal classified at the
/// instant the claim was judged at.
fn claim_outcome(claimed: lease::Claimed, operation: &'static str) -> Result<ClaimOutcome> {
    let Some(row) = claimed.instance else {
        return Ok(keiro_lease::classify_refusal(None, claimed.clock).into());
    };
    if claimed.granted {
        return Ok(ClaimOutcome::Acquired(Box::new(claim(
            &row,
            claimed.journal,
            operation,
        )?)));
    }
    let gate = ClaimGate {
        status: row::status(&row.status, operation)?,
        lease_expires_at: row::instant_opt(row.lease_expires_at, operation)?,
        next_attempt_at: row::instant_opt(row.next_attempt_at, operation)?,
    };
    Ok(keiro_lease::classify_refusal(Some(gate), claimed.clock).into())
}

/// A granted claim: the fence, the row after it, the journal.
pub(super) fn claim(
    row: &Stored,
    journal: Vec<JournalEntry>,
    operation: &'static str,
) -> Result<Claim> {
    let instance = row.instance(operation)?;
    let owner = instance
        .lease_owner
        .clone()
        .ok_or_else(|| malformed(operation, "a claimed row has no lease owner"))?;
    Ok(Claim {
        fence: Fence {
            owner,
            epoch: instance.lease_epoch,
        },
        instance,
        journal,
    })
}
