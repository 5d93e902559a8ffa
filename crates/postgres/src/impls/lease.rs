//! [`LeaseStore`] for [`PgStore`]: each method routes to its operation (`ops::lease`), or,
//! for a direct start, to the direct start lane, inside the method's store span.

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{span::traced, store_span};
use keiro_journal::{store::StartRequest, Fence, InstanceKey, WorkflowName};
use keiro_lease::{
    Claim, ClaimOutcome, Crash, CrashOutcome, LeaseStore, ResurrectOutcome, StartClaim,
};
use time::OffsetDateTime;

use crate::ops::lease::{self as op, StartClaimed};
use crate::PgStore;

#[async_trait::async_trait]
impl LeaseStore for PgStore {
    async fn instances_runnable(
        &self,
        now: Option<OffsetDateTime>,
        limit: Option<i64>,
    ) -> Result<Vec<InstanceKey>> {
        let span = store_span!("instances_runnable");
        traced(span, op::instances_runnable(self.db(), now, limit)).await
    }

    async fn instance_claim(
        &self,
        key: &InstanceKey,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        let span = store_span!("instance_claim", key = key);
        traced(span, op::instance_claim(self.db(), key, owner, ttl, now)).await
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
        traced(
            span,
            op::instances_claim_batch(self.db(), names, owner, ttl, limit, now),
        )
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
        traced(
            span,
            self.lanes().instance_start_claimed(
                self.db(),
                StartClaimed {
                    request: request.clone(),
                    owner: owner.to_owned(),
                    ttl,
                    now,
                },
            ),
        )
        .await
    }

    async fn instance_lease_renew(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<()> {
        let span = store_span!("instance_lease_renew", key = key);
        traced(span, op::instance_lease_renew(self.db(), key, fence, ttl)).await
    }

    async fn instance_release(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        progressed: bool,
    ) -> Result<bool> {
        let span = store_span!("instance_release", key = key);
        traced(
            span,
            op::instance_release(self.db(), key, fence, progressed),
        )
        .await
    }

    async fn instance_lease_force_release(&self, key: &InstanceKey) -> Result<bool> {
        let span = store_span!("instance_lease_force_release", key = key);
        traced(span, op::instance_lease_force_release(self.db(), key)).await
    }

    async fn instance_record_crash(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        crash: &Crash,
    ) -> Result<CrashOutcome> {
        let span = store_span!("instance_record_crash", key = key);
        traced(
            span,
            op::instance_record_crash(self.db(), key, fence, crash),
        )
        .await
    }

    async fn instance_resurrect(&self, key: &InstanceKey) -> Result<ResurrectOutcome> {
        let span = store_span!("instance_resurrect", key = key);
        traced(span, op::instance_resurrect(self.db(), key)).await
    }
}
