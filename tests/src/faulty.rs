//! A store wrapper that injects failures, for the "a store error is transient" scenarios.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keiro::store::{Error, Result};
use keiro::{
    operate::ResurrectOutcome, store::Append, store::AppendOutcome, store::ClaimOutcome,
    store::CrashOutcome, store::Fence, store::Instance, store::JournalEntry, store::JournalStore,
    store::LeaseStore, store::Started, InstanceKey, Status,
};
use keiro_journal::{
    store::ChildSpawn, store::Park, store::ParkOutcome, store::RemoteArm, store::RemoteArmOutcome,
    store::ReturnedSignal, store::SignalWait, store::SignalWaitOutcome, store::StartRequest,
    store::TimerArm, AwakeableOutcome, SignalOptions, SignalSendOutcome, TimerFiring,
};
use keiro_lease::{Crash, OpenRefusal, RefusalOutcome};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

/// Delegates to `inner`, but fails every step append while `fail_appends` is set, with an
/// error shaped like a dropped connection; refuses every claim that would load the journal of
/// the instance set with `unloadable`, as PostgreSQL refuses a journal past what one jsonb
/// array holds (54000); and keeps every completion waiting while `hold_completions` is set, as
/// a slow commit would.
#[derive(Debug, Clone)]
pub struct FaultyStore {
    inner: Arc<dyn LeaseStore>,
    fail_appends: Arc<AtomicBool>,
    unloadable: Arc<std::sync::Mutex<Option<InstanceKey>>>,
    completions_held: Arc<tokio::sync::watch::Sender<bool>>,
    completions_waiting: Arc<AtomicUsize>,
}

impl FaultyStore {
    /// Wraps `inner`; failures start switched off.
    pub fn new(inner: Arc<dyn LeaseStore>) -> Self {
        Self {
            inner,
            fail_appends: Arc::new(AtomicBool::new(false)),
            unloadable: Arc::default(),
            completions_held: Arc::new(tokio::sync::watch::Sender::new(false)),
            completions_waiting: Arc::default(),
        }
    }

    /// Holds every completion append (the `WorkflowCompleted` marker) before the store sees it
    /// while `on`; switching it off lets the held ones through.
    pub fn hold_completions(&self, on: bool) {
        self.completions_held.send_replace(on);
    }

    /// How many completion appends are held right now.
    pub fn completions_waiting(&self) -> usize {
        self.completions_waiting.load(Ordering::SeqCst)
    }

    async fn wait_while_held(&self, append: &Append) {
        if !matches!(append.event, keiro::store::Event::WorkflowCompleted { .. }) {
            return;
        }
        let mut held = self.completions_held.subscribe();
        if !*held.borrow_and_update() {
            return;
        }
        self.completions_waiting.fetch_add(1, Ordering::SeqCst);
        let _ = held.wait_for(|on| !*on).await;
        self.completions_waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// Makes the journal of `key` one no claim can load (`None`: every journal loads).
    pub fn unloadable(&self, key: Option<InstanceKey>) {
        *self
            .unloadable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = key;
    }

    /// The refusal a claim gets when it would load the unloadable journal: while that instance
    /// is runnable, every batch claim may pick it, so every batch claim is refused.
    async fn refuse_unloadable(&self, key: Option<&InstanceKey>) -> Result<()> {
        let unloadable = self
            .unloadable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let Some(unloadable) = unloadable else {
            return Ok(());
        };
        if key.is_some_and(|k| *k != unloadable) {
            return Ok(());
        }
        let runnable = self
            .inner
            .instance_get(&unloadable)
            .await?
            .is_some_and(|row| matches!(row.status, Status::Running | Status::Suspended));
        if runnable {
            return Err(Error::ValueRefused {
                operation: "claiming instances",
                reason: "injected: total size of jsonb array elements exceeds the maximum".into(),
            });
        }
        Ok(())
    }

    /// Switches append failures on or off.
    pub fn fail_appends(&self, on: bool) {
        self.fail_appends.store(on, Ordering::SeqCst);
    }
}

fn unavailable(operation: &'static str) -> Error {
    Error::Unavailable {
        operation,
        source: "injected: connection reset".into(),
    }
}

#[async_trait::async_trait]
impl JournalStore for FaultyStore {
    async fn instance_start(&self, request: &StartRequest) -> Result<Started> {
        self.inner.instance_start(request).await
    }
    async fn instance_get(&self, key: &InstanceKey) -> Result<Option<Instance>> {
        self.inner.instance_get(key).await
    }
    async fn journal_load(&self, key: &InstanceKey, generation: i32) -> Result<Vec<JournalEntry>> {
        self.inner.journal_load(key, generation).await
    }
    async fn journal_history(&self, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
        self.inner.journal_history(key).await
    }
    async fn journal_append(&self, append: &Append) -> Result<AppendOutcome> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable("appending to the journal"));
        }
        self.wait_while_held(append).await;
        self.inner.journal_append(append).await
    }
    async fn delivery_append(
        &self,
        append: &Append,
        backlog: &keiro_journal::DeliveryBacklog,
    ) -> Result<keiro_journal::store::DeliveryOutcome> {
        self.inner.delivery_append(append, backlog).await
    }
    async fn deliveries_read(
        &self,
        key: &InstanceKey,
        generation: keiro_journal::Generation,
        read: keiro_journal::Deliveries,
    ) -> Result<()> {
        self.inner.deliveries_read(key, generation, read).await
    }
    async fn instance_confirm(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<Status> {
        self.inner.instance_confirm(key, fence, ttl).await
    }
    async fn signal_withdraw(
        &self,
        key: &InstanceKey,
        generation: i32,
        step: &str,
    ) -> Result<bool> {
        self.inner.signal_withdraw(key, generation, step).await
    }
    async fn instance_park(&self, park: &Park) -> Result<ParkOutcome> {
        self.inner.instance_park(park).await
    }
    async fn instance_settle_leftovers(&self, key: &InstanceKey, generation: i32) -> Result<u64> {
        self.inner.instance_settle_leftovers(key, generation).await
    }
    async fn instance_fail_diverged(
        &self,
        key: &InstanceKey,
        fence: Option<&Fence>,
        reason: &str,
    ) -> Result<bool> {
        self.inner.instance_fail_diverged(key, fence, reason).await
    }
    async fn timer_arm(&self, arm: &TimerArm) -> Result<OffsetDateTime> {
        self.inner.timer_arm(arm).await
    }
    async fn timers_fire_due(
        &self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> Result<TimerFiring> {
        self.inner.timers_fire_due(now, limit).await
    }
    async fn timers_requeue_stuck(&self, older_than: Duration) -> Result<u64> {
        self.inner.timers_requeue_stuck(older_than).await
    }
    async fn timers_due_count(&self, now: Option<OffsetDateTime>) -> Result<u64> {
        self.inner.timers_due_count(now).await
    }
    async fn event_set(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable("setting an event"));
        }
        self.inner.event_set(append, key).await
    }
    async fn attributes_set(
        &self,
        append: &Append,
        attributes: &keiro_journal::attribute::Attributes,
    ) -> Result<keiro_journal::store::AttributesOutcome> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable("setting search attributes"));
        }
        self.inner.attributes_set(append, attributes).await
    }
    async fn stream_write(
        &self,
        append: &Append,
        write: &keiro_journal::store::StreamWrite,
    ) -> Result<keiro_journal::store::StreamOutcome> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable("writing to a stream"));
        }
        self.inner.stream_write(append, write).await
    }
    async fn stream_close(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable("closing a stream"));
        }
        self.inner.stream_close(append, key).await
    }
    async fn update_send(
        &self,
        send: &keiro_journal::update::UpdateSend,
    ) -> Result<keiro_journal::update::UpdateSendOutcome> {
        self.inner.update_send(send).await
    }
    async fn update_answer(
        &self,
        append: &Append,
        answer: &keiro_journal::update::UpdateAnswer,
    ) -> Result<keiro_journal::update::UpdateAnswerOutcome> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable("answering an update"));
        }
        self.inner.update_answer(append, answer).await
    }
    async fn signal_with_start(
        &self,
        start: &keiro_journal::store::StartRequest,
        token: &str,
        payload: &serde_json::Value,
        options: &keiro_journal::SignalOptions,
    ) -> Result<keiro_journal::update::SignalStarted> {
        self.inner
            .signal_with_start(start, token, payload, options)
            .await
    }
    async fn awakeable_create(&self, append: &Append, id: Uuid) -> Result<AppendOutcome> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable("creating an awakeable"));
        }
        self.inner.awakeable_create(append, id).await
    }
    async fn awakeable_complete(&self, id: Uuid, payload: &Value) -> Result<AwakeableOutcome> {
        self.inner.awakeable_complete(id, payload).await
    }
    async fn awakeable_cancel(&self, id: Uuid) -> Result<AwakeableOutcome> {
        self.inner.awakeable_cancel(id).await
    }
    async fn awakeables_pending(&self) -> Result<u64> {
        self.inner.awakeables_pending().await
    }
    async fn signal_wait(&self, wait: &SignalWait) -> Result<SignalWaitOutcome> {
        self.inner.signal_wait(wait).await
    }
    async fn signal_send_with(
        &self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome> {
        self.inner.signal_send_with(token, payload, options).await
    }
    async fn signal_return(
        &self,
        decision: &Append,
        signals: &[ReturnedSignal],
    ) -> Result<AppendOutcome> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable("giving signals back to their tokens"));
        }
        self.inner.signal_return(decision, signals).await
    }
    async fn child_spawn(&self, append: &Append, spawn: &ChildSpawn) -> Result<AppendOutcome> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable("spawning a child"));
        }
        self.inner.child_spawn(append, spawn).await
    }
    async fn instance_cancel(&self, key: &InstanceKey, cascade: bool) -> Result<AppendOutcome> {
        self.inner.instance_cancel(key, cascade).await
    }
    async fn remote_arm(&self, arm: &RemoteArm) -> Result<RemoteArmOutcome> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(unavailable("dispatching a remote step"));
        }
        self.inner.remote_arm(arm).await
    }
}

#[async_trait::async_trait]
impl LeaseStore for FaultyStore {
    async fn instances_runnable(
        &self,
        now: Option<OffsetDateTime>,
        limit: Option<i64>,
    ) -> Result<Vec<InstanceKey>> {
        self.inner.instances_runnable(now, limit).await
    }
    async fn instance_claim_serving(
        &self,
        key: &InstanceKey,
        versions: &keiro_lease::Versions,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<ClaimOutcome> {
        self.refuse_unloadable(Some(key)).await?;
        self.inner
            .instance_claim_serving(key, versions, owner, ttl, now)
            .await
    }
    async fn instance_start_claimed(
        &self,
        request: &StartRequest,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<keiro_lease::StartClaim> {
        self.refuse_unloadable(Some(&request.key)).await?;
        self.inner
            .instance_start_claimed(request, owner, ttl, now)
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
        self.refuse_unloadable(None).await?;
        self.inner
            .instances_claim_batch_serving(names, versions, owner, ttl, limit, now)
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
        self.refuse_unloadable(None).await?;
        self.inner
            .queue_admit_serving(queues, names, versions, owner, ttl, limit, now)
            .await
    }
    async fn instance_lease_renew(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<()> {
        self.inner.instance_lease_renew(key, fence, ttl).await
    }
    async fn instance_release(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        progressed: bool,
    ) -> Result<bool> {
        self.inner.instance_release(key, fence, progressed).await
    }
    async fn instance_lease_force_release(&self, key: &InstanceKey) -> Result<bool> {
        self.inner.instance_lease_force_release(key).await
    }
    async fn instance_record_crash(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        crash: &Crash,
    ) -> Result<CrashOutcome> {
        self.inner.instance_record_crash(key, fence, crash).await
    }
    async fn instance_refuse_open(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        refusal: &OpenRefusal,
    ) -> Result<RefusalOutcome> {
        self.inner.instance_refuse_open(key, fence, refusal).await
    }
    async fn instance_resurrect(&self, key: &InstanceKey) -> Result<ResurrectOutcome> {
        self.inner.instance_resurrect(key).await
    }
}
