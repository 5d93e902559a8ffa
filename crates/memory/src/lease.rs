//! [`LeaseStore`] for [`MemoryStore`]: discovery, claims with fencing, renewals, releases,
//! crash accounting and resurrection, each one critical section.
//!
//! The store is authoritative for expiry: a lease is live while `lease_expires_at >= now` by
//! the store's clock, or by the `now` a caller passes (tests pin it). A claim bumps the
//! epoch, so every fenced write by an earlier holder (appends, confirms, renewals, parks,
//! divergence, crash records, releases) compares owner and epoch and fails with `LeaseLost`
//! instead of landing. Expiry alone fences nothing: a lapsed lease nobody took over still
//! lets its holder write, exactly as the Postgres `WHERE` clauses do.

use std::cmp::Reverse;
use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{span::traced, store_span};
use keiro_journal::{
    store::marker_name, store::StartRequest, Event, Fence, InstanceKey, Status, WorkflowName,
};
use keiro_lease::{
    classify_refusal, Claim, ClaimGate, ClaimOutcome, Crash, CrashOutcome, LeaseStore,
    ResurrectOutcome, StartClaim,
};
use time::OffsetDateTime;

use crate::clock::later;
use crate::state::{clear_lease, holds, lease_lost, refused, reset_attempts, JournalRow};
use crate::State;
use crate::{storable, MemoryStore};

const RECORD_CRASH: &str = "recording a crash";
const START_CLAIMED: &str = "starting an instance leased to its caller";

impl State {
    fn instances_runnable(
        &self,
        now: Option<OffsetDateTime>,
        limit: Option<i64>,
    ) -> Vec<InstanceKey> {
        let now = now.unwrap_or_else(|| self.clock.now());
        let mut due: Vec<_> = self
            .instances
            .values()
            .map(|entry| &entry.row)
            .filter(|row| match row.status {
                Status::Running => true,
                Status::Suspended => row.wake_after.is_some_and(|at| at <= now),
                Status::Completed | Status::Failed | Status::Cancelled => false,
            })
            .collect();
        due.sort_by_key(|row| (Reverse(row.priority), row.created_at, &row.key));
        // A negative limit selects nothing rather than everything: asking for fewer than
        // zero candidates is never a request for all of them.
        let limit = limit.map_or(usize::MAX, |n| {
            usize::try_from(n.max(0)).unwrap_or(usize::MAX)
        });
        due.into_iter()
            .take(limit)
            .map(|row| row.key.clone())
            .collect()
    }

    fn instance_claim(
        &mut self,
        key: &InstanceKey,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        let now = now.unwrap_or_else(|| self.clock.now());
        let Some(entry) = self.instances.get_mut(key) else {
            return Ok(classify_refusal(None, now).into());
        };
        let gate = ClaimGate {
            status: entry.row.status,
            lease_expires_at: entry.row.lease_expires_at,
            next_attempt_at: entry.row.next_attempt_at,
        };
        if !gate.is_claimable(now) {
            return Ok(classify_refusal(Some(gate), now).into());
        }
        // Read before writing: a journal that does not decode must leave the lease untouched.
        let journal = entry.load(entry.row.generation, "claiming an instance")?;
        let epoch = entry
            .row
            .lease_epoch
            .checked_add(1)
            .ok_or_else(|| refused("claiming an instance", "the lease epoch is exhausted"))?;
        let row = &mut entry.row;
        row.lease_owner = Some(owner.to_owned());
        row.lease_epoch = epoch;
        row.lease_expires_at = Some(later(now, ttl));
        row.updated_at = now;
        Ok(ClaimOutcome::Acquired(Box::new(Claim {
            fence: Fence {
                owner: owner.to_owned(),
                epoch,
            },
            instance: row.clone(),
            journal,
        })))
    }

    fn instance_start_claimed(
        &mut self,
        request: &StartRequest,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<StartClaim> {
        let now = now.unwrap_or_else(|| self.clock.now());
        let key = &request.key;
        let Some(entry) = self.instances.get(key) else {
            // Leased from its first moment, with the epoch a first claim would mint; nobody is
            // notified, as no one else may advance it while the lease lives.
            self.instance_insert(
                key,
                request.input.clone(),
                request.parent.clone(),
                request.priority,
            );
            let row = &mut self.entry_mut(key)?.row;
            row.lease_owner = Some(owner.to_owned());
            row.lease_epoch = 1;
            row.lease_expires_at = Some(later(now, ttl));
            return Ok(StartClaim {
                created: true,
                claim: ClaimOutcome::Acquired(Box::new(Claim {
                    fence: Fence {
                        owner: owner.to_owned(),
                        epoch: 1,
                    },
                    instance: row.clone(),
                    journal: Vec::new(),
                })),
            });
        };
        // An existing instance is claimed only when discovery would offer it to a worker now.
        let row = &entry.row;
        let runnable = match row.status {
            Status::Running => true,
            Status::Suspended => row.wake_after.is_some_and(|at| at <= now),
            Status::Completed | Status::Failed | Status::Cancelled => false,
        };
        let claim = if runnable {
            self.instance_claim(key, owner, ttl, Some(now))?
        } else {
            let gate = ClaimGate {
                status: row.status,
                lease_expires_at: row.lease_expires_at,
                next_attempt_at: row.next_attempt_at,
            };
            classify_refusal(Some(gate), now).into()
        };
        Ok(StartClaim {
            created: false,
            claim,
        })
    }

    fn instance_lease_renew(
        &mut self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<()> {
        let now = self.clock.now();
        let row = &mut self.entry_mut(key)?.row;
        if row.status.is_terminal() || !holds(row, fence) {
            return Err(lease_lost(key, fence));
        }
        row.lease_expires_at = Some(later(now, ttl));
        row.updated_at = now;
        Ok(())
    }

    fn instance_release(&mut self, key: &InstanceKey, fence: &Fence, progressed: bool) -> bool {
        let now = self.clock.now();
        let Some(entry) = self.instances.get_mut(key) else {
            return false;
        };
        let row = &mut entry.row;
        if !holds(row, fence) {
            return false;
        }
        clear_lease(row);
        if progressed {
            reset_attempts(row);
        }
        row.updated_at = now;
        true
    }

    fn instance_lease_force_release(&mut self, key: &InstanceKey) -> bool {
        let now = self.clock.now();
        let Some(entry) = self.instances.get_mut(key) else {
            return false;
        };
        let row = &mut entry.row;
        if row.lease_owner.is_none() {
            return false;
        }
        clear_lease(row);
        row.updated_at = now;
        true
    }

    fn instance_record_crash(
        &mut self,
        key: &InstanceKey,
        fence: &Fence,
        crash: &Crash,
    ) -> Result<CrashOutcome> {
        let now = self.clock.now();
        let entry = self.entry_mut(key)?;
        if entry.row.status.is_terminal() {
            return Ok(CrashOutcome::AlreadyTerminal);
        }
        if !holds(&entry.row, fence) {
            return Err(lease_lost(key, fence));
        }
        let attempts = entry.row.attempts.saturating_add(1);
        if attempts < crash.max_attempts {
            let row = &mut entry.row;
            let next_attempt_at = later(now, crash.retry_delay);
            row.attempts = attempts;
            row.last_error = Some(crash.error.clone());
            row.next_attempt_at = Some(next_attempt_at);
            clear_lease(row);
            row.updated_at = now;
            return Ok(CrashOutcome::Retrying {
                attempts,
                next_attempt_at,
            });
        }

        let generation = entry.row.generation;
        let step_name = entry.repeatable_name(generation, marker_name::FAILED);
        let encoded = Event::WorkflowFailed {
            reason: crash.error.clone(),
        }
        .encode();
        let seq = self.seq.next()?;
        let entry = self.entry_mut(key)?;
        entry.push(JournalRow {
            seq,
            generation,
            step_name,
            kind: encoded.kind,
            payload: encoded.payload,
            recorded_at: now,
        })?;
        let row = &mut entry.row;
        row.attempts = attempts;
        row.status = Status::Failed;
        row.last_error = Some(crash.error.clone());
        row.completed_at = Some(now);
        clear_lease(row);
        row.updated_at = now;
        self.close(key);
        self.deliver_to_parent(key)?;
        Ok(CrashOutcome::Failed { attempts })
    }

    fn instance_resurrect(&mut self, key: &InstanceKey) -> Result<ResurrectOutcome> {
        let now = self.clock.now();
        let Some(entry) = self.instances.get(key) else {
            return Ok(ResurrectOutcome::NotFound);
        };
        if entry.row.status != Status::Failed {
            return Ok(ResurrectOutcome::NotFailed(entry.row.status));
        }
        let generation = entry.row.generation;
        let step_name = entry.repeatable_name(generation, marker_name::RESURRECTED);
        let encoded = Event::Resurrected.encode();
        let seq = self.seq.next()?;
        let entry = self.entry_mut(key)?;
        entry.push(JournalRow {
            seq,
            generation,
            step_name,
            kind: encoded.kind,
            payload: encoded.payload,
            recorded_at: now,
        })?;
        let row = &mut entry.row;
        row.status = Status::Running;
        reset_attempts(row);
        clear_lease(row);
        row.completed_at = None;
        row.updated_at = now;
        self.wake(key);
        Ok(ResurrectOutcome::Resurrected)
    }
}

#[async_trait::async_trait]
impl LeaseStore for MemoryStore {
    async fn instances_runnable(
        &self,
        now: Option<OffsetDateTime>,
        limit: Option<i64>,
    ) -> Result<Vec<InstanceKey>> {
        let span = store_span!("instances_runnable");
        traced(span, async {
            self.transact("discovering runnable instances", |state| {
                Ok(state.instances_runnable(now, limit))
            })
        })
        .await
    }

    async fn instance_claim(
        &self,
        key: &InstanceKey,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        let span = store_span!("instance_claim", key = key);
        traced(span, async {
            self.transact("claiming an instance", |state| {
                state.instance_claim(key, owner, ttl, now)
            })
        })
        .await
    }

    async fn instances_claim_batch(
        &self,
        names: &[WorkflowName],
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        let span = store_span!("instances_claim_batch");
        traced(span, async {
            self.transact("claiming a batch of instances", |state| {
                let now = now.unwrap_or_else(|| state.clock.now());
                // Discovery order, restricted to the caller's names; each candidate then goes
                // through the single claim, so the rules cannot drift apart. Under the one lock no
                // other claimer can interleave, which is what SKIP LOCKED buys in Postgres.
                let candidates: Vec<InstanceKey> = state
                    .instances_runnable(Some(now), None)
                    .into_iter()
                    .filter(|key| names.contains(&key.name))
                    .collect();
                let limit = usize::try_from(limit.max(0)).unwrap_or(usize::MAX);
                let mut claims = Vec::new();
                for key in candidates {
                    if claims.len() >= limit {
                        break;
                    }
                    if let ClaimOutcome::Acquired(claim) =
                        state.instance_claim(&key, owner, ttl, Some(now))?
                    {
                        claims.push(*claim);
                    }
                }
                Ok(claims)
            })
        })
        .await
    }

    async fn instance_start_claimed(
        &self,
        request: &StartRequest,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<StartClaim> {
        let span = store_span!("instance_start_claimed", key = request.key);
        traced(span, async {
            storable::value(START_CLAIMED, &request.input)?;
            self.transact(START_CLAIMED, |state| {
                state.instance_start_claimed(request, owner, ttl, now)
            })
        })
        .await
    }

    async fn instance_lease_renew(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<()> {
        let span = store_span!("instance_lease_renew", key = key);
        traced(span, async {
            self.transact("renewing a lease", |state| {
                state.instance_lease_renew(key, fence, ttl)
            })
        })
        .await
    }

    async fn instance_release(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        progressed: bool,
    ) -> Result<bool> {
        let span = store_span!("instance_release", key = key);
        traced(span, async {
            self.transact("releasing a lease", |state| {
                Ok(state.instance_release(key, fence, progressed))
            })
        })
        .await
    }

    async fn instance_lease_force_release(&self, key: &InstanceKey) -> Result<bool> {
        let span = store_span!("instance_lease_force_release", key = key);
        traced(span, async {
            self.transact("force-releasing a lease", |state| {
                Ok(state.instance_lease_force_release(key))
            })
        })
        .await
    }

    async fn instance_record_crash(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        crash: &Crash,
    ) -> Result<CrashOutcome> {
        let span = store_span!("instance_record_crash", key = key);
        traced(span, async {
            storable::text(RECORD_CRASH, "crash error", &crash.error)?;
            self.transact(RECORD_CRASH, |state| {
                state.instance_record_crash(key, fence, crash)
            })
        })
        .await
    }

    async fn instance_resurrect(&self, key: &InstanceKey) -> Result<ResurrectOutcome> {
        let span = store_span!("instance_resurrect", key = key);
        traced(span, async {
            self.transact("resurrecting an instance", |state| {
                state.instance_resurrect(key)
            })
        })
        .await
    }
}

/// How the state stores repeated markers. The lease rules are the store contract suite's
/// (`keiro_tests::contract::lease`).
#[cfg(test)]
mod tests {
    use keiro_journal::store::marker_name;

    use super::*;
    use crate::fixtures::{claim, start, store};

    #[tokio::test]
    async fn resurrection_numbers_repeated_markers_in_the_state() {
        let store = store();
        let key = start(&store, "a").await;
        let crash = Crash {
            error: "boom".into(),
            retry_delay: Duration::from_secs(30),
            max_attempts: 1,
        };
        for _ in 0..2 {
            let fence = claim(&store, &key, "w").await;
            store
                .instance_record_crash(&key, &fence, &crash)
                .await
                .unwrap();
            store.instance_resurrect(&key).await.unwrap();
        }
        let names = store.inspect(|state| {
            let entry = &state.instances[&key];
            let base = [marker_name::FAILED, marker_name::RESURRECTED];
            base.map(|name| {
                (
                    entry.step(0, name).is_some(),
                    entry.step(0, &format!("{name}/2")).is_some(),
                    entry.step(0, &format!("{name}/3")).is_some(),
                )
            })
        });
        assert_eq!(names, [(true, true, false); 2]);
    }
}
