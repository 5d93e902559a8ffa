//! The store traits [`SqliteStore`] implements (but `QueueStore`, in `queue.rs`, and
//! `VersionStore`, in `versions.rs`), each method its inherent operation of the same
//! name (in `journal.rs`, `timer.rs`, `sources.rs`, `remote.rs`, `lease.rs`, `queue.rs`,
//! `inspect.rs`, `retention.rs`, `message.rs` and `update.rs`) run in the
//! `keiro.store.<operation>` span every store opens; `ScheduleStore` is implemented beside its
//! operations in `schedule.rs`. A trait is implemented only once every one of its methods is
//! (see the crate's Status).

use std::time::Duration;

use keiro_journal::store::{
    Append, AppendOutcome, ClosingOutcome, DeliveryOutcome, Park, ParkOutcome, Result,
    StreamOutcome, StreamWrite,
};
use keiro_journal::update::{
    SignalStarted, UpdateAnswer, UpdateAnswerOutcome, UpdateRead, UpdateRecord, UpdateSend,
    UpdateSendOutcome,
};
use keiro_journal::{
    span::traced, store::ChildSpawn, store::RemoteArm, store::RemoteArmOutcome,
    store::ReturnedSignal, store::SignalWait, store::SignalWaitOutcome, store::StartRequest,
    store::TimerArm, store_span, AwakeableOutcome, Deliveries, DeliveryBacklog, Fence, Generation,
    Instance, InstanceKey, JournalEntry, JournalStore, SignalOptions, SignalSendOutcome, Started,
    Status, TimerFiring, WorkflowName,
};
use keiro_journal::{
    Counts, GcBatch, GcRequest, InspectStore, ListRequest, Page, RetentionStore, Waits,
};
use keiro_lease::{
    Claim, ClaimBatch, ClaimOutcome, Crash, CrashOutcome, LeaseStore, OpenRefusal, RefusalOutcome,
    ResurrectOutcome, StartClaim, Versions,
};
use keiro_remote::{
    ClaimRequest, ClaimedTask, HeartbeatOutcome, RemoteAdmin, RemoteTask, ReportOutcome,
    RequeueOutcome, RetryOutcome, TaskFailure, Transport,
};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use super::SqliteStore;

#[async_trait::async_trait]
impl JournalStore for SqliteStore {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    async fn instance_start(&self, request: &StartRequest) -> Result<Started> {
        traced(
            store_span!("instance_start", key = request.key),
            SqliteStore::instance_start(self, request),
        )
        .await
    }

    async fn instances_start(&self, requests: &[StartRequest]) -> Vec<Result<Started>> {
        traced(
            store_span!("instances_start", keiro.store.len = requests.len()),
            SqliteStore::instances_start(self, requests),
        )
        .await
    }

    async fn instance_get(&self, key: &InstanceKey) -> Result<Option<Instance>> {
        traced(
            store_span!("instance_get", key = key),
            SqliteStore::instance_get(self, key),
        )
        .await
    }

    async fn journal_load(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<Vec<JournalEntry>> {
        traced(
            store_span!("journal_load", key = key),
            SqliteStore::journal_load(self, key, generation),
        )
        .await
    }

    async fn journal_history(&self, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
        traced(
            store_span!("journal_history", key = key),
            SqliteStore::journal_history(self, key),
        )
        .await
    }

    async fn journal_append(&self, append: &Append) -> Result<AppendOutcome> {
        traced(store_span!("journal_append", key = append.key, keiro.workflow.step = %append.event.step_name()), SqliteStore::journal_append(self, append)).await
    }

    async fn journal_append_batch(&self, appends: &[Append]) -> Vec<Result<AppendOutcome>> {
        traced(
            store_span!("journal_append_batch", keiro.store.len = appends.len()),
            SqliteStore::journal_append_batch(self, appends),
        )
        .await
    }

    async fn journal_append_closing(
        &self,
        step: &Append,
        completion: &Append,
    ) -> Result<ClosingOutcome> {
        traced(store_span!("journal_append_closing", key = step.key, keiro.workflow.step = %step.event.step_name()), SqliteStore::journal_append_closing(self, step, completion)).await
    }

    async fn delivery_append(
        &self,
        append: &Append,
        backlog: &DeliveryBacklog,
    ) -> Result<DeliveryOutcome> {
        traced(store_span!("delivery_append", key = append.key, keiro.workflow.step = %append.event.step_name()), SqliteStore::delivery_append(self, append, backlog)).await
    }

    async fn deliveries_read(
        &self,
        key: &InstanceKey,
        generation: Generation,
        read: Deliveries,
    ) -> Result<()> {
        traced(
            store_span!("deliveries_read", key = key),
            SqliteStore::deliveries_read(self, key, generation, read),
        )
        .await
    }

    async fn instance_confirm(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<Status> {
        traced(
            store_span!("instance_confirm", key = key),
            SqliteStore::instance_confirm(self, key, fence, ttl),
        )
        .await
    }

    async fn instance_park(&self, park: &Park) -> Result<ParkOutcome> {
        traced(
            store_span!("instance_park", key = park.key),
            SqliteStore::instance_park(self, park),
        )
        .await
    }

    async fn instance_settle_leftovers(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<u64> {
        traced(
            store_span!("instance_settle_leftovers", key = key),
            SqliteStore::instance_settle_leftovers(self, key, generation),
        )
        .await
    }

    async fn instance_fail_diverged(
        &self,
        key: &InstanceKey,
        fence: Option<&Fence>,
        reason: &str,
    ) -> Result<bool> {
        traced(
            store_span!("instance_fail_diverged", key = key),
            SqliteStore::instance_fail_diverged(self, key, fence, reason),
        )
        .await
    }

    async fn timer_arm(&self, arm: &TimerArm) -> Result<OffsetDateTime> {
        traced(
            store_span!("timer_arm", key = arm.key, keiro.workflow.step = %arm.step),
            SqliteStore::timer_arm(self, arm),
        )
        .await
    }

    async fn timers_fire_due(
        &self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> Result<TimerFiring> {
        traced(
            store_span!("timers_fire_due"),
            SqliteStore::timers_fire_due(self, now, limit),
        )
        .await
    }

    async fn timers_requeue_stuck(&self, older_than: Duration) -> Result<u64> {
        traced(
            store_span!("timers_requeue_stuck"),
            SqliteStore::timers_requeue_stuck(self, older_than),
        )
        .await
    }

    async fn timers_due_count(&self, now: Option<OffsetDateTime>) -> Result<u64> {
        traced(
            store_span!("timers_due_count"),
            SqliteStore::timers_due_count(self, now),
        )
        .await
    }

    async fn event_set(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        let span = store_span!("event_set", key = append.key);
        traced(span, SqliteStore::event_set(self, append, key)).await
    }

    async fn stream_write(&self, append: &Append, write: &StreamWrite) -> Result<StreamOutcome> {
        let span = store_span!("stream_write", key = append.key);
        traced(span, SqliteStore::stream_write(self, append, write)).await
    }

    async fn stream_close(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        let span = store_span!("stream_close", key = append.key);
        traced(span, SqliteStore::stream_close(self, append, key)).await
    }

    async fn attributes_set(
        &self,
        append: &Append,
        attributes: &keiro_journal::attribute::Attributes,
    ) -> Result<keiro_journal::store::AttributesOutcome> {
        let span = store_span!("attributes_set", key = append.key);
        traced(span, SqliteStore::attributes_set(self, append, attributes)).await
    }

    async fn update_send(&self, send: &UpdateSend) -> Result<UpdateSendOutcome> {
        let span = store_span!("update_send", key = send.key);
        traced(span, SqliteStore::update_send(self, send)).await
    }

    async fn update_answer(
        &self,
        append: &Append,
        answer: &UpdateAnswer,
    ) -> Result<UpdateAnswerOutcome> {
        let span = store_span!("update_answer", key = append.key);
        traced(span, SqliteStore::update_answer(self, append, answer)).await
    }

    async fn signal_with_start(
        &self,
        start: &StartRequest,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalStarted> {
        let span = store_span!("signal_with_start", key = start.key);
        traced(
            span,
            SqliteStore::signal_with_start(self, start, token, payload, options),
        )
        .await
    }

    async fn awakeable_create(&self, append: &Append, id: Uuid) -> Result<AppendOutcome> {
        traced(store_span!("awakeable_create", key = append.key, keiro.workflow.step = %append.event.step_name(), keiro.awakeable.id = %id), SqliteStore::awakeable_create(self, append, id)).await
    }

    async fn awakeable_complete(&self, id: Uuid, payload: &Value) -> Result<AwakeableOutcome> {
        traced(
            store_span!("awakeable_complete", keiro.awakeable.id = %id),
            SqliteStore::awakeable_complete(self, id, payload),
        )
        .await
    }

    async fn awakeable_cancel(&self, id: Uuid) -> Result<AwakeableOutcome> {
        traced(
            store_span!("awakeable_cancel", keiro.awakeable.id = %id),
            SqliteStore::awakeable_cancel(self, id),
        )
        .await
    }

    async fn awakeables_pending(&self) -> Result<u64> {
        traced(
            store_span!("awakeables_pending"),
            SqliteStore::awakeables_pending(self),
        )
        .await
    }

    async fn signal_wait(&self, wait: &SignalWait) -> Result<SignalWaitOutcome> {
        traced(store_span!("signal_wait", key = wait.key, keiro.workflow.step = %wait.step, keiro.signal.token = %wait.token), SqliteStore::signal_wait(self, wait)).await
    }

    async fn signal_withdraw(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
    ) -> Result<bool> {
        traced(
            store_span!("signal_withdraw", key = key, keiro.workflow.step = %step),
            SqliteStore::signal_withdraw(self, key, generation, step),
        )
        .await
    }

    async fn signal_send_with(
        &self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome> {
        traced(
            store_span!("signal_send_with", keiro.signal.token = %token),
            SqliteStore::signal_send_with(self, token, payload, options),
        )
        .await
    }

    async fn signal_return(
        &self,
        decision: &Append,
        signals: &[ReturnedSignal],
    ) -> Result<AppendOutcome> {
        traced(store_span!("signal_return", key = decision.key, keiro.workflow.step = %decision.event.step_name()), SqliteStore::signal_return(self, decision, signals)).await
    }

    async fn child_spawn(&self, append: &Append, spawn: &ChildSpawn) -> Result<AppendOutcome> {
        traced(store_span!("child_spawn", key = append.key, keiro.workflow.step = %append.event.step_name(), keiro.child = %spawn.child), SqliteStore::child_spawn(self, append, spawn)).await
    }

    async fn instance_cancel(&self, key: &InstanceKey, cascade: bool) -> Result<AppendOutcome> {
        traced(
            store_span!("instance_cancel", key = key),
            SqliteStore::instance_cancel(self, key, cascade),
        )
        .await
    }

    async fn remote_arm(&self, arm: &RemoteArm) -> Result<RemoteArmOutcome> {
        traced(store_span!("remote_arm", key = arm.key, keiro.workflow.step = %arm.step, keiro.remote.step_id = %arm.step_id), SqliteStore::remote_arm(self, arm)).await
    }

    async fn instance_park_dispatch(
        &self,
        park: &Park,
        arms: &[RemoteArm],
    ) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
        traced(
            store_span!("instance_park_dispatch", key = park.key),
            SqliteStore::instance_park_dispatch(self, park, arms),
        )
        .await
    }
}

#[async_trait::async_trait]
impl LeaseStore for SqliteStore {
    async fn instances_runnable(
        &self,
        now: Option<OffsetDateTime>,
        limit: Option<i64>,
    ) -> Result<Vec<InstanceKey>> {
        traced(
            store_span!("instances_runnable"),
            SqliteStore::instances_runnable(self, now, limit),
        )
        .await
    }

    async fn instance_claim_serving(
        &self,
        key: &InstanceKey,
        versions: &Versions,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        traced(
            store_span!("instance_claim", key = key),
            SqliteStore::instance_claim_serving(self, key, versions, owner, ttl, now),
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
        traced(
            store_span!("instances_claim_batch"),
            SqliteStore::instances_claim_batch_serving(
                self, names, versions, owner, ttl, limit, now,
            ),
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
        traced(
            store_span!("claim_and_admit"),
            SqliteStore::claim_and_admit_serving(
                self, names, queues, versions, owner, ttl, limit, now,
            ),
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
        traced(
            store_span!("queue_admit"),
            SqliteStore::queue_admit_serving(self, queues, names, versions, owner, ttl, limit, now),
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
        traced(
            store_span!("instance_start_claimed", key = request.key),
            SqliteStore::instance_start_claimed(self, request, owner, ttl, now),
        )
        .await
    }

    async fn instance_lease_renew(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<()> {
        traced(
            store_span!("instance_lease_renew", key = key),
            SqliteStore::instance_lease_renew(self, key, fence, ttl),
        )
        .await
    }

    async fn instance_release(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        progressed: bool,
    ) -> Result<bool> {
        traced(
            store_span!("instance_release", key = key),
            SqliteStore::instance_release(self, key, fence, progressed),
        )
        .await
    }

    async fn instance_lease_force_release(&self, key: &InstanceKey) -> Result<bool> {
        traced(
            store_span!("instance_lease_force_release", key = key),
            SqliteStore::instance_lease_force_release(self, key),
        )
        .await
    }

    async fn instance_record_crash(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        crash: &Crash,
    ) -> Result<CrashOutcome> {
        traced(
            store_span!("instance_record_crash", key = key),
            SqliteStore::instance_record_crash(self, key, fence, crash),
        )
        .await
    }

    async fn instance_refuse_open(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        refusal: &OpenRefusal,
    ) -> Result<RefusalOutcome> {
        traced(
            store_span!("instance_refuse_open", key = key),
            SqliteStore::instance_refuse_open(self, key, fence, refusal),
        )
        .await
    }

    async fn instance_resurrect(&self, key: &InstanceKey) -> Result<ResurrectOutcome> {
        traced(
            store_span!("instance_resurrect", key = key),
            SqliteStore::instance_resurrect(self, key),
        )
        .await
    }
}

#[async_trait::async_trait]
impl RemoteAdmin for SqliteStore {
    async fn remote_redispatch_pending(&self, key: &InstanceKey) -> Result<Option<u64>> {
        let span = store_span!("remote_redispatch_pending", key = key);
        traced(span, SqliteStore::remote_redispatch_pending(self, key)).await
    }

    async fn instance_requeue(&self, key: &InstanceKey) -> Result<RequeueOutcome> {
        let span = store_span!("instance_requeue", key = key);
        traced(span, SqliteStore::instance_requeue(self, key)).await
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
            SqliteStore::instance_retry_with_input(self, origin, retry, input),
        )
        .await
    }

    async fn remote_tasks(&self, key: &InstanceKey) -> Result<Vec<RemoteTask>> {
        let span = store_span!("remote_tasks", key = key);
        traced(span, SqliteStore::remote_tasks(self, key)).await
    }
}

#[async_trait::async_trait]
impl Transport for SqliteStore {
    async fn tasks_claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedTask>> {
        let span = store_span!("tasks_claim", keiro.remote.groups = ?request.groups);
        traced(span, SqliteStore::tasks_claim(self, request)).await
    }

    async fn task_heartbeat(
        &self,
        step_id: &str,
        claim: Uuid,
        ttl: Duration,
    ) -> Result<HeartbeatOutcome> {
        let span = store_span!("task_heartbeat", keiro.remote.step_id = %step_id);
        traced(span, SqliteStore::task_heartbeat(self, step_id, claim, ttl)).await
    }

    async fn task_complete(&self, step_id: &str, output: &Value) -> Result<ReportOutcome> {
        let span = store_span!("task_complete", keiro.remote.step_id = %step_id);
        traced(span, SqliteStore::task_complete(self, step_id, output)).await
    }

    async fn tasks_complete(&self, reports: &[(String, Value)]) -> Result<Vec<ReportOutcome>> {
        let span = store_span!("tasks_complete", keiro.store.len = reports.len());
        traced(span, SqliteStore::tasks_complete(self, reports)).await
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
            SqliteStore::task_fail(self, step_id, claim, failure, retry_delay),
        )
        .await
    }
}

#[async_trait::async_trait]
impl InspectStore for SqliteStore {
    async fn instances_list(&self, request: &ListRequest) -> Result<Page> {
        traced(
            store_span!("instances_list"),
            SqliteStore::instances_list(self, request),
        )
        .await
    }

    async fn instances_counts(&self, now: Option<OffsetDateTime>) -> Result<Counts> {
        traced(
            store_span!("instances_counts"),
            SqliteStore::instances_counts(self, now),
        )
        .await
    }

    async fn instances_throughput(
        &self,
        request: &keiro_journal::store::ThroughputRequest,
    ) -> Result<keiro_journal::store::Throughput> {
        traced(
            store_span!("instances_throughput"),
            SqliteStore::instances_throughput(self, request),
        )
        .await
    }

    async fn instance_waits(&self, key: &InstanceKey, limit: u32) -> Result<Waits> {
        traced(
            store_span!("instance_waits", key = key),
            SqliteStore::instance_waits(self, key, limit),
        )
        .await
    }

    async fn event_get(
        &self,
        key: &InstanceKey,
        event: &str,
    ) -> Result<Option<keiro_journal::message::EventRead>> {
        let span = store_span!("event_get", key = key);
        traced(span, SqliteStore::event_get(self, key, event)).await
    }

    async fn stream_read(
        &self,
        key: &InstanceKey,
        stream: &str,
        from: u64,
        limit: u32,
    ) -> Result<Option<keiro_journal::message::StreamPage>> {
        let span = store_span!("stream_read", key = key);
        traced(
            span,
            SqliteStore::stream_read(self, key, stream, from, limit),
        )
        .await
    }

    async fn instance_updates(&self, key: &InstanceKey, limit: u32) -> Result<Vec<UpdateRecord>> {
        let span = store_span!("instance_updates", key = key);
        traced(span, SqliteStore::instance_updates(self, key, limit)).await
    }

    async fn update_get(&self, key: &InstanceKey, update_id: &str) -> Result<Option<UpdateRead>> {
        let span = store_span!("update_get", key = key);
        traced(span, SqliteStore::update_get(self, key, update_id)).await
    }

    async fn instance_messages(
        &self,
        key: &InstanceKey,
    ) -> Result<keiro_journal::message::Messages> {
        let span = store_span!("instance_messages", key = key);
        traced(span, SqliteStore::instance_messages(self, key)).await
    }

    async fn instance_attributes(
        &self,
        key: &InstanceKey,
    ) -> Result<keiro_journal::attribute::Attributes> {
        let span = store_span!("instance_attributes", key = key);
        traced(span, SqliteStore::instance_attributes(self, key)).await
    }
}

#[async_trait::async_trait]
impl RetentionStore for SqliteStore {
    async fn instances_gc(&self, request: &GcRequest) -> Result<GcBatch> {
        traced(
            store_span!("instances_gc"),
            SqliteStore::instances_gc(self, request),
        )
        .await
    }

    async fn instances_gc_eligible(&self, request: &GcRequest) -> Result<u64> {
        traced(
            store_span!("instances_gc_eligible"),
            SqliteStore::instances_gc_eligible(self, request),
        )
        .await
    }
}
