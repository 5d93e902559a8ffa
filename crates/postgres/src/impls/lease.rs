//! [`LeaseStore`] and [`QueueStore`] for [`PgStore`]: each method routes to its operation (`ops::lease`), or,
//! for a direct start, to the direct start lane, inside the method's store span.

use std::time::Duration;

use keiro_journal::queue::{DebounceRequest, QueueInfo, QueueSpec};
use keiro_journal::store::Result;
use keiro_journal::{span::traced, store_span};
use keiro_journal::{store::StartRequest, Fence, InstanceKey, WorkflowName};
use keiro_lease::{
    Claim, ClaimBatch, ClaimOutcome, Crash, CrashOutcome, LeaseStore, OpenRefusal, QueueStore,
    RefusalOutcome, ResurrectOutcome, StartClaim, Versions,
};
use time::OffsetDateTime;

use crate::ops::lease::{self as op, StartClaimed};
use crate::ops::queue;
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

    async fn instance_claim_serving(
        &self,
        key: &InstanceKey,
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        let span = store_span!("instance_claim", key = key);
        traced(
            span,
            op::instance_claim(self.db(), key, versions, owner, ttl, now),
        )
        .await
    }

    async fn instances_claim_batch_serving(
        &self,
        names: &[WorkflowName],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        let span = store_span!("instances_claim_batch");
        traced(
            span,
            op::instances_claim_batch(self.db(), names, versions, owner, ttl, limit, now),
        )
        .await
    }

    async fn claim_and_admit_serving(
        &self,
        names: &[WorkflowName],
        queues: &[String],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimBatch> {
        let span = store_span!("claim_and_admit");
        traced(
            span,
            queue::claim_and_admit(self.db(), names, queues, versions, owner, ttl, limit, now),
        )
        .await
    }

    async fn queue_admit_serving(
        &self,
        queues: &[String],
        names: &[WorkflowName],
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<Claim>> {
        let span = store_span!("queue_admit");
        traced(
            span,
            queue::queue_admit(self.db(), queues, names, versions, owner, ttl, limit, now),
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
        if !request.attributes.is_empty() {
            // A direct start is the caller's own run: it takes none (nothing would keep them).
            return Err(keiro_journal::StoreError::ValueRefused {
                operation: "starting a claimed instance",
                reason: "a direct start takes no search attributes".into(),
            });
        }
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

    async fn instance_refuse_open(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        refusal: &OpenRefusal,
    ) -> Result<RefusalOutcome> {
        let span = store_span!("instance_refuse_open", key = key);
        traced(
            span,
            op::instance_refuse_open(self.db(), key, fence, refusal),
        )
        .await
    }

    async fn instance_resurrect(&self, key: &InstanceKey) -> Result<ResurrectOutcome> {
        let span = store_span!("instance_resurrect", key = key);
        traced(span, op::instance_resurrect(self.db(), key)).await
    }
}

#[async_trait::async_trait]
impl QueueStore for PgStore {
    async fn queue_declare(&self, spec: &QueueSpec) -> Result<()> {
        let span = store_span!("queue_declare");
        traced(span, queue::queue_declare(self.db(), spec)).await
    }

    async fn queue_set_paused(&self, name: &str, paused: bool) -> Result<bool> {
        let span = store_span!("queue_set_paused");
        traced(span, queue::queue_set_paused(self.db(), name, paused)).await
    }

    async fn queue_key_weight(&self, name: &str, key: &str, weight: i32) -> Result<bool> {
        let span = store_span!("queue_key_weight");
        traced(span, queue::queue_key_weight(self.db(), name, key, weight)).await
    }

    async fn queue_debounce(&self, request: &DebounceRequest) -> Result<keiro_journal::Started> {
        let span = store_span!("queue_debounce");
        traced(span, queue::queue_debounce(self.db(), request)).await
    }

    async fn queues_list(
        &self,
        only: Option<&str>,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<QueueInfo>> {
        let span = store_span!("queues_list");
        traced(span, queue::queues_list(self.db(), only, now)).await
    }
}
