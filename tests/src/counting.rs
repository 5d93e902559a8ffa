//! A store wrapper that counts the calls made through it, and can make the store's clock look
//! skewed against the worker's, for the scenarios that bound how often keiro asks the store.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keiro::store::Result;
use keiro::{
    operate::ResurrectOutcome, store::Append, store::AppendOutcome, store::ClaimOutcome,
    store::CrashOutcome, store::Fence, store::Instance, store::JournalEntry, store::JournalStore,
    store::LeaseStore, store::Started, InstanceKey, Status,
};
use keiro_journal::{
    store::ChildSpawn, store::Park, store::ParkOutcome, store::RemoteArm, store::RemoteArmOutcome,
    store::ReturnedSignal, store::SignalWait, store::SignalWaitOutcome, store::StartRequest,
    store::TimerArm, store::TimerDue, AwakeableOutcome, SignalOptions, SignalSendOutcome,
    TimerFiring,
};
use keiro_lease::{Crash, OpenRefusal, RefusalOutcome};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

/// Delegates to `inner`, counting each call by operation (the trait method's name).
///
/// With [`CountingStore::with_clock_offset`] it also shifts every instant that crosses it on
/// the timer and discovery paths, so the worker sees a store whose clock runs `offset` ahead
/// of its own (behind, when negative): absolute due times, `now` pins and park deadlines go in
/// moved back, fire times and due times come out moved forward. Instance rows come out as the
/// store wrote them; the scenarios using the offset read none of their instants.
///
/// With [`CountingStore::with_append_delay`] each journal append takes that much longer, for
/// the scenarios that time a step to the end of its append.
#[derive(Debug, Clone)]
pub struct CountingStore {
    inner: Arc<dyn LeaseStore>,
    calls: Arc<Mutex<BTreeMap<&'static str, u64>>>,
    offset: time::Duration,
    append_delay: Duration,
}

impl CountingStore {
    /// Wraps `inner`, with no clock offset.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        Self {
            inner,
            calls: Arc::default(),
            offset: time::Duration::ZERO,
            append_delay: Duration::ZERO,
        }
    }

    /// The same store, whose journal appends (alone or with a completion) each wait `delay`
    /// before they go to the store.
    #[must_use]
    pub fn with_append_delay(mut self, delay: Duration) -> Self {
        self.append_delay = delay;
        self
    }

    /// The same store, seen with its clock `offset` ahead of the worker's.
    #[must_use]
    pub fn with_clock_offset(mut self, offset: time::Duration) -> Self {
        self.offset = offset;
        self
    }

    /// Calls of `operation` so far.
    pub fn calls(&self, operation: &str) -> u64 {
        self.lock().get(operation).copied().unwrap_or(0)
    }

    /// Every call so far.
    pub fn total(&self) -> u64 {
        self.lock().values().sum()
    }

    /// Every operation called so far, with its count.
    pub fn all(&self) -> BTreeMap<&'static str, u64> {
        self.lock().clone()
    }

    /// Forgets the counts.
    pub fn reset(&self) {
        self.lock().clear();
    }

    async fn delay_append(&self) {
        if !self.append_delay.is_zero() {
            tokio::time::sleep(self.append_delay).await;
        }
    }

    fn count(&self, operation: &'static str) {
        *self.lock().entry(operation).or_default() += 1;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, u64>> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An instant of the worker's view, on the store's clock.
    fn inward(&self, at: OffsetDateTime) -> OffsetDateTime {
        at - self.offset
    }

    /// An instant of the store's clock, in the worker's view.
    fn outward(&self, at: OffsetDateTime) -> OffsetDateTime {
        at + self.offset
    }

    fn park_inward(&self, park: &Park) -> Park {
        Park {
            wake_after: park.wake_after.map(|at| self.inward(at)),
            ..park.clone()
        }
    }
}

#[async_trait::async_trait]
impl JournalStore for CountingStore {
    async fn instance_start(&self, request: &StartRequest) -> Result<Started> {
        self.count("instance_start");
        self.inner.instance_start(request).await
    }
    async fn instance_get(&self, key: &InstanceKey) -> Result<Option<Instance>> {
        self.count("instance_get");
        self.inner.instance_get(key).await
    }
    async fn journal_load(&self, key: &InstanceKey, generation: i32) -> Result<Vec<JournalEntry>> {
        self.count("journal_load");
        self.inner.journal_load(key, generation).await
    }
    async fn journal_history(&self, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
        self.count("journal_history");
        self.inner.journal_history(key).await
    }
    async fn journal_append(&self, append: &Append) -> Result<AppendOutcome> {
        self.count("journal_append");
        self.delay_append().await;
        self.inner.journal_append(append).await
    }
    async fn journal_append_closing(
        &self,
        step: &Append,
        completion: &Append,
    ) -> Result<keiro_journal::store::ClosingOutcome> {
        self.count("journal_append_closing");
        self.delay_append().await;
        self.inner.journal_append_closing(step, completion).await
    }
    async fn delivery_append(
        &self,
        append: &Append,
        backlog: &keiro_journal::DeliveryBacklog,
    ) -> Result<keiro_journal::store::DeliveryOutcome> {
        self.count("delivery_append");
        self.inner.delivery_append(append, backlog).await
    }
    async fn deliveries_read(
        &self,
        key: &InstanceKey,
        generation: keiro_journal::Generation,
        read: keiro_journal::Deliveries,
    ) -> Result<()> {
        self.count("deliveries_read");
        self.inner.deliveries_read(key, generation, read).await
    }
    async fn instance_confirm(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<Status> {
        self.count("instance_confirm");
        self.inner.instance_confirm(key, fence, ttl).await
    }
    async fn instance_park(&self, park: &Park) -> Result<ParkOutcome> {
        self.count("instance_park");
        self.inner.instance_park(&self.park_inward(park)).await
    }
    async fn instance_settle_leftovers(&self, key: &InstanceKey, generation: i32) -> Result<u64> {
        self.count("instance_settle_leftovers");
        self.inner.instance_settle_leftovers(key, generation).await
    }
    async fn instance_fail_diverged(
        &self,
        key: &InstanceKey,
        fence: Option<&Fence>,
        reason: &str,
    ) -> Result<bool> {
        self.count("instance_fail_diverged");
        self.inner.instance_fail_diverged(key, fence, reason).await
    }
    async fn timer_arm(&self, arm: &TimerArm) -> Result<OffsetDateTime> {
        self.count("timer_arm");
        let due = match arm.due {
            TimerDue::At(at) => TimerDue::At(self.inward(at)),
            relative => relative,
        };
        let arm = TimerArm { due, ..arm.clone() };
        Ok(self.outward(self.inner.timer_arm(&arm).await?))
    }
    async fn timers_fire_due(
        &self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> Result<TimerFiring> {
        self.count("timers_fire_due");
        let mut firing = self
            .inner
            .timers_fire_due(now.map(|at| self.inward(at)), limit)
            .await?;
        for fired in &mut firing.fired {
            fired.fire_at = self.outward(fired.fire_at);
            fired.fired_at = self.outward(fired.fired_at);
        }
        firing.next_due = firing.next_due.map(|at| self.outward(at));
        firing.clock = self.outward(firing.clock);
        Ok(firing)
    }
    async fn timers_requeue_stuck(&self, older_than: Duration) -> Result<u64> {
        self.count("timers_requeue_stuck");
        self.inner.timers_requeue_stuck(older_than).await
    }
    async fn timers_due_count(&self, now: Option<OffsetDateTime>) -> Result<u64> {
        self.count("timers_due_count");
        self.inner
            .timers_due_count(now.map(|at| self.inward(at)))
            .await
    }
    async fn event_set(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        self.count("event_set");
        self.inner.event_set(append, key).await
    }
    async fn attributes_set(
        &self,
        append: &Append,
        attributes: &keiro_journal::attribute::Attributes,
    ) -> Result<keiro_journal::store::AttributesOutcome> {
        self.count("attributes_set");
        self.inner.attributes_set(append, attributes).await
    }
    async fn stream_write(
        &self,
        append: &Append,
        write: &keiro_journal::store::StreamWrite,
    ) -> Result<keiro_journal::store::StreamOutcome> {
        self.count("stream_write");
        self.inner.stream_write(append, write).await
    }
    async fn stream_close(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        self.count("stream_close");
        self.inner.stream_close(append, key).await
    }
    async fn update_send(
        &self,
        send: &keiro_journal::update::UpdateSend,
    ) -> Result<keiro_journal::update::UpdateSendOutcome> {
        self.count("update_send");
        self.inner.update_send(send).await
    }
    async fn update_answer(
        &self,
        append: &Append,
        answer: &keiro_journal::update::UpdateAnswer,
    ) -> Result<keiro_journal::update::UpdateAnswerOutcome> {
        self.count("update_answer");
        self.inner.update_answer(append, answer).await
    }
    async fn signal_with_start(
        &self,
        start: &keiro_journal::store::StartRequest,
        token: &str,
        payload: &serde_json::Value,
        options: &keiro_journal::SignalOptions,
    ) -> Result<keiro_journal::update::SignalStarted> {
        self.count("signal_with_start");
        self.inner
            .signal_with_start(start, token, payload, options)
            .await
    }
    async fn awakeable_create(&self, append: &Append, id: Uuid) -> Result<AppendOutcome> {
        self.count("awakeable_create");
        self.inner.awakeable_create(append, id).await
    }
    async fn awakeable_complete(&self, id: Uuid, payload: &Value) -> Result<AwakeableOutcome> {
        self.count("awakeable_complete");
        self.inner.awakeable_complete(id, payload).await
    }
    async fn awakeable_cancel(&self, id: Uuid) -> Result<AwakeableOutcome> {
        self.count("awakeable_cancel");
        self.inner.awakeable_cancel(id).await
    }
    async fn awakeables_pending(&self) -> Result<u64> {
        self.count("awakeables_pending");
        self.inner.awakeables_pending().await
    }
    async fn signal_wait(&self, wait: &SignalWait) -> Result<SignalWaitOutcome> {
        self.count("signal_wait");
        self.inner.signal_wait(wait).await
    }
    async fn signal_withdraw(
        &self,
        key: &InstanceKey,
        generation: i32,
        step: &str,
    ) -> Result<bool> {
        self.count("signal_withdraw");
        self.inner.signal_withdraw(key, generation, step).await
    }
    async fn signal_return(
        &self,
        decision: &Append,
        signals: &[ReturnedSignal],
    ) -> Result<AppendOutcome> {
        self.count("signal_return");
        self.inner.signal_return(decision, signals).await
    }
    async fn signal_send_with(
        &self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome> {
        self.count("signal_send_with");
        self.inner.signal_send_with(token, payload, options).await
    }
    async fn child_spawn(&self, append: &Append, spawn: &ChildSpawn) -> Result<AppendOutcome> {
        self.count("child_spawn");
        self.inner.child_spawn(append, spawn).await
    }
    async fn instance_cancel(&self, key: &InstanceKey, cascade: bool) -> Result<AppendOutcome> {
        self.count("instance_cancel");
        self.inner.instance_cancel(key, cascade).await
    }
    async fn remote_arm(&self, arm: &RemoteArm) -> Result<RemoteArmOutcome> {
        self.count("remote_arm");
        self.inner.remote_arm(arm).await
    }
    async fn instance_park_dispatch(
        &self,
        park: &Park,
        arms: &[RemoteArm],
    ) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
        self.count("instance_park_dispatch");
        self.inner
            .instance_park_dispatch(&self.park_inward(park), arms)
            .await
    }
}

#[async_trait::async_trait]
impl LeaseStore for CountingStore {
    async fn instances_runnable(
        &self,
        now: Option<OffsetDateTime>,
        limit: Option<i64>,
    ) -> Result<Vec<InstanceKey>> {
        self.count("instances_runnable");
        self.inner
            .instances_runnable(now.map(|at| self.inward(at)), limit)
            .await
    }
    async fn instance_claim_serving(
        &self,
        key: &InstanceKey,
        versions: &keiro_lease::Versions,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        self.count("instance_claim");
        self.inner
            .instance_claim_serving(key, versions, owner, ttl, now.map(|at| self.inward(at)))
            .await
    }
    async fn instance_start_claimed(
        &self,
        request: &StartRequest,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<keiro_lease::StartClaim> {
        self.count("instance_start_claimed");
        self.inner
            .instance_start_claimed(request, owner, ttl, now.map(|at| self.inward(at)))
            .await
    }
    async fn instances_claim_batch_serving(
        &self,
        names: &[keiro::workflow::WorkflowName],
        versions: &keiro_lease::Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<keiro_lease::Claim>> {
        self.count("instances_claim_batch");
        self.inner
            .instances_claim_batch_serving(
                names,
                versions,
                owner,
                ttl,
                limit,
                now.map(|at| self.inward(at)),
            )
            .await
    }
    async fn queue_admit_serving(
        &self,
        queues: &[String],
        names: &[keiro::workflow::WorkflowName],
        versions: &keiro_lease::Versions,
        owner: &str,
        ttl: Duration,
        limit: i64,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<keiro_lease::Claim>> {
        self.count("queue_admit");
        self.inner
            .queue_admit_serving(
                queues,
                names,
                versions,
                owner,
                ttl,
                limit,
                now.map(|at| self.inward(at)),
            )
            .await
    }
    async fn instance_lease_renew(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<()> {
        self.count("instance_lease_renew");
        self.inner.instance_lease_renew(key, fence, ttl).await
    }
    async fn instance_release(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        progressed: bool,
    ) -> Result<bool> {
        self.count("instance_release");
        self.inner.instance_release(key, fence, progressed).await
    }
    async fn instance_lease_force_release(&self, key: &InstanceKey) -> Result<bool> {
        self.count("instance_lease_force_release");
        self.inner.instance_lease_force_release(key).await
    }
    async fn instance_record_crash(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        crash: &Crash,
    ) -> Result<CrashOutcome> {
        self.count("instance_record_crash");
        self.inner.instance_record_crash(key, fence, crash).await
    }
    async fn instance_refuse_open(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        refusal: &OpenRefusal,
    ) -> Result<RefusalOutcome> {
        self.count("instance_refuse_open");
        self.inner.instance_refuse_open(key, fence, refusal).await
    }
    async fn instance_resurrect(&self, key: &InstanceKey) -> Result<ResurrectOutcome> {
        self.count("instance_resurrect");
        self.inner.instance_resurrect(key).await
    }
}
