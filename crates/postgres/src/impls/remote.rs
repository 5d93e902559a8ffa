//! The remote-step traits for [`PgStore`]: [`Transport`] (the task table) and [`RemoteAdmin`]
//! (the operator's recovery tools), each method routing to its operation (`ops::remote`,
//! `ops::instance`) inside the method's store span.

use std::time::Duration;

use keiro_journal::store::Result;
use keiro_journal::{span::traced, store_span, InstanceKey};
use keiro_remote::{
    ClaimRequest, ClaimedTask, HeartbeatOutcome, RemoteAdmin, RemoteTask, ReportOutcome,
    RequeueOutcome, RetryOutcome, TaskFailure, Transport,
};
use serde_json::Value;
use uuid::Uuid;

use crate::ops::instance as op_instance;
use crate::ops::remote as op;
use crate::PgStore;

/// The task table as the remote workers' transport: a claim is one round trip that also
/// counts expired claims as failed attempts, and a report settles the task and journals its
/// result into the owner in one transaction.
#[async_trait::async_trait]
impl Transport for PgStore {
    async fn tasks_claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedTask>> {
        let span = store_span!("tasks_claim", keiro.remote.groups = ?request.groups);
        traced(span, op::tasks_claim(self.db(), request)).await
    }

    async fn task_heartbeat(
        &self,
        step_id: &str,
        claim: Uuid,
        ttl: Duration,
    ) -> Result<HeartbeatOutcome> {
        let span = store_span!("task_heartbeat", keiro.remote.step_id = %step_id);
        traced(span, op::task_heartbeat(self.db(), step_id, claim, ttl)).await
    }

    async fn task_complete(&self, step_id: &str, output: &Value) -> Result<ReportOutcome> {
        let span = store_span!("task_complete", keiro.remote.step_id = %step_id);
        traced(span, op::task_complete(self.db(), step_id, output)).await
    }

    async fn tasks_complete(&self, reports: &[(String, Value)]) -> Result<Vec<ReportOutcome>> {
        let span = store_span!("tasks_complete", keiro.store.len = reports.len());
        traced(span, op::tasks_complete(self.db(), reports)).await
    }

    async fn task_fail(
        &self,
        step_id: &str,
        claim: Uuid,
        failure: &TaskFailure,
        retry_delay: Duration,
    ) -> Result<ReportOutcome> {
        let span = store_span!("task_fail", keiro.remote.step_id = %step_id);
        traced(
            span,
            op::task_fail(self.db(), step_id, claim, failure, retry_delay),
        )
        .await
    }
}

/// The operator's recovery tools, each one function call (one transaction).
#[async_trait::async_trait]
impl RemoteAdmin for PgStore {
    async fn remote_redispatch_pending(&self, key: &InstanceKey) -> Result<Option<u64>> {
        let span = store_span!("remote_redispatch_pending", key = key);
        traced(span, op::remote_redispatch_pending(self.db(), key)).await
    }

    async fn instance_requeue(&self, key: &InstanceKey) -> Result<RequeueOutcome> {
        let span = store_span!("instance_requeue", key = key);
        traced(span, op_instance::instance_requeue(self.db(), key)).await
    }

    async fn instance_retry_with_input(
        &self,
        origin: &InstanceKey,
        retry: &InstanceKey,
        input: &Value,
    ) -> Result<RetryOutcome> {
        let span =
            store_span!("instance_retry_with_input", key = origin, keiro.retry.id = %retry.id);
        traced(
            span,
            op_instance::instance_retry_with_input(self.db(), origin, retry, input),
        )
        .await
    }

    async fn remote_tasks(&self, key: &InstanceKey) -> Result<Vec<RemoteTask>> {
        let span = store_span!("remote_tasks", key = key);
        traced(span, op::remote_tasks(self.db(), key)).await
    }
}
