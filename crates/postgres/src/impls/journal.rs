//! [`JournalStore`] for [`PgStore`]: each method routes to its operation (`ops`) or, for the
//! batched ones (appends, starts, parks with dispatches), to its group-commit lane (`lanes`),
//! inside the method's store span.

use std::time::Duration;

use keiro_journal::store::{
    Append, AppendOutcome, ClosingOutcome, DeliveryOutcome, JournalStore, Park, ParkOutcome,
    Result, StreamOutcome, StreamWrite,
};
use keiro_journal::{span::traced, store_span};
use keiro_journal::{
    store::ChildSpawn, store::RemoteArm, store::RemoteArmOutcome, store::ReturnedSignal,
    store::SignalWait, store::SignalWaitOutcome, store::StartRequest, store::TimerArm,
    AwakeableOutcome, Deliveries, DeliveryBacklog, Fence, Generation, Instance, InstanceKey,
    JournalEntry, SignalOptions, SignalSendOutcome, Started, Status, TimerFiring,
};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::ops as op;
use crate::ops::message::MessageWrite;
use crate::PgStore;

#[async_trait::async_trait]
impl JournalStore for PgStore {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    async fn instance_start(&self, request: &StartRequest) -> Result<Started> {
        let span = store_span!("instance_start", key = request.key);
        // A start on a queue shares the start lane's batches too (`keiro_queues_start`).
        traced(span, self.lanes().instance_start(self.db(), request)).await
    }

    async fn instance_get(&self, key: &InstanceKey) -> Result<Option<Instance>> {
        traced(
            store_span!("instance_get", key = key),
            self.lanes().instance_get(self.db(), key),
        )
        .await
    }

    async fn journal_load(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<Vec<JournalEntry>> {
        let span = store_span!("journal_load", key = key);
        traced(span, op::journal::journal_load(self.db(), key, generation)).await
    }

    async fn journal_history(&self, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
        let span = store_span!("journal_history", key = key);
        traced(span, op::journal::journal_history(self.db(), key)).await
    }

    async fn journal_append(&self, append: &Append) -> Result<AppendOutcome> {
        let span = store_span!(
            "journal_append",
            key = append.key,
            keiro.workflow.step = %append.event.step_name()
        );
        let outcome = traced(span, self.lanes().journal_append(self.db(), append)).await;
        if matches!(outcome, Ok(AppendOutcome::Appended)) {
            self.closed_here(append);
        }
        outcome
    }

    async fn journal_append_batch(&self, appends: &[Append]) -> Vec<Result<AppendOutcome>> {
        let span = store_span!("journal_append_batch", keiro.store.len = appends.len());
        traced(span, self.lanes().journal_append_batch(self.db(), appends)).await
    }

    async fn journal_append_closing(
        &self,
        step: &Append,
        completion: &Append,
    ) -> Result<ClosingOutcome> {
        let span = store_span!(
            "journal_append_closing",
            key = step.key,
            keiro.workflow.step = %step.event.step_name()
        );
        let outcome = traced(
            span,
            self.lanes()
                .journal_append_closing(self.db(), step, completion),
        )
        .await;
        if let Ok(ClosingOutcome {
            completion: Some(AppendOutcome::Appended),
            ..
        }) = &outcome
        {
            self.closed_here(completion);
        }
        outcome
    }

    async fn instances_start(&self, requests: &[StartRequest]) -> Vec<Result<Started>> {
        let span = store_span!("instances_start", keiro.store.len = requests.len());
        traced(span, self.lanes().instances_start(self.db(), requests)).await
    }

    async fn delivery_append(
        &self,
        append: &Append,
        backlog: &DeliveryBacklog,
    ) -> Result<DeliveryOutcome> {
        let span = store_span!("delivery_append", key = append.key, keiro.workflow.step = %append.event.step_name());
        traced(
            span,
            op::journal::delivery_append(self.db(), append, backlog),
        )
        .await
    }

    async fn deliveries_read(
        &self,
        key: &InstanceKey,
        generation: Generation,
        read: Deliveries,
    ) -> Result<()> {
        let span = store_span!("deliveries_read", key = key);
        traced(
            span,
            op::journal::deliveries_read(self.db(), key, generation, read),
        )
        .await
    }

    async fn instance_confirm(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<Status> {
        let span = store_span!("instance_confirm", key = key);
        traced(
            span,
            op::instance::instance_confirm(self.db(), key, fence, ttl),
        )
        .await
    }

    async fn instance_park(&self, park: &Park) -> Result<ParkOutcome> {
        let span = store_span!("instance_park", key = park.key);
        traced(span, op::instance::instance_park(self.db(), park)).await
    }

    async fn instance_settle_leftovers(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<u64> {
        let span = store_span!("instance_settle_leftovers", key = key);
        traced(
            span,
            op::instance::instance_settle_leftovers(self.db(), key, generation),
        )
        .await
    }

    async fn instance_fail_diverged(
        &self,
        key: &InstanceKey,
        fence: Option<&Fence>,
        reason: &str,
    ) -> Result<bool> {
        let span = store_span!("instance_fail_diverged", key = key);
        traced(
            span,
            op::instance::instance_fail_diverged(self.db(), key, fence, reason),
        )
        .await
    }

    async fn timer_arm(&self, arm: &TimerArm) -> Result<OffsetDateTime> {
        let span = store_span!("timer_arm", key = arm.key, keiro.workflow.step = %arm.step);
        traced(span, op::timer::timer_arm(self.db(), arm)).await
    }

    async fn timers_fire_due(
        &self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> Result<TimerFiring> {
        let span = store_span!("timers_fire_due");
        traced(span, op::timer::timers_fire_due(self.db(), now, limit)).await
    }

    async fn timers_requeue_stuck(&self, older_than: Duration) -> Result<u64> {
        let span = store_span!("timers_requeue_stuck");
        traced(span, op::timer::timers_requeue_stuck(self.db(), older_than)).await
    }

    async fn timers_due_count(&self, now: Option<OffsetDateTime>) -> Result<u64> {
        let span = store_span!("timers_due_count");
        traced(span, op::timer::timers_due_count(self.db(), now)).await
    }

    async fn awakeable_create(&self, append: &Append, id: Uuid) -> Result<AppendOutcome> {
        let span = store_span!(
            "awakeable_create",
            key = append.key,
            keiro.workflow.step = %append.event.step_name(),
            keiro.awakeable.id = %id
        );
        traced(span, op::awakeable::awakeable_create(self.db(), append, id)).await
    }

    async fn awakeable_complete(&self, id: Uuid, payload: &Value) -> Result<AwakeableOutcome> {
        let span = store_span!("awakeable_complete", keiro.awakeable.id = %id);
        traced(
            span,
            op::awakeable::awakeable_complete(self.db(), id, payload),
        )
        .await
    }

    async fn awakeable_cancel(&self, id: Uuid) -> Result<AwakeableOutcome> {
        let span = store_span!("awakeable_cancel", keiro.awakeable.id = %id);
        traced(span, op::awakeable::awakeable_cancel(self.db(), id)).await
    }

    async fn awakeables_pending(&self) -> Result<u64> {
        traced(
            store_span!("awakeables_pending"),
            op::awakeable::awakeables_pending(self.db()),
        )
        .await
    }

    async fn signal_wait(&self, wait: &SignalWait) -> Result<SignalWaitOutcome> {
        let span = store_span!(
            "signal_wait",
            key = wait.key,
            keiro.workflow.step = %wait.step,
            keiro.signal.token = %wait.token
        );
        traced(span, op::signal::signal_wait(self.db(), wait)).await
    }

    async fn signal_send_with(
        &self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome> {
        let span = store_span!("signal_send_with", keiro.signal.token = %token);
        traced(
            span,
            op::signal::signal_send(self.db(), token, payload, options),
        )
        .await
    }

    async fn signal_withdraw(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
    ) -> Result<bool> {
        let span = store_span!("signal_withdraw", key = key, keiro.workflow.step = %step);
        traced(
            span,
            op::signal::signal_withdraw(self.db(), key, generation, step),
        )
        .await
    }

    async fn signal_return(
        &self,
        decision: &Append,
        signals: &[ReturnedSignal],
    ) -> Result<AppendOutcome> {
        let span = store_span!(
            "signal_return",
            key = decision.key,
            keiro.workflow.step = %decision.event.step_name()
        );
        traced(
            span,
            op::signal::signal_return(self.db(), decision, signals),
        )
        .await
    }

    async fn child_spawn(&self, append: &Append, spawn: &ChildSpawn) -> Result<AppendOutcome> {
        let span = store_span!(
            "child_spawn",
            key = append.key,
            keiro.workflow.step = %append.event.step_name(),
            keiro.child = %spawn.child
        );
        traced(span, op::child::child_spawn(self.db(), append, spawn)).await
    }

    async fn instance_cancel(&self, key: &InstanceKey, cascade: bool) -> Result<AppendOutcome> {
        let span = store_span!("instance_cancel", key = key);
        traced(span, op::instance::instance_cancel(self.db(), key, cascade)).await
    }

    async fn event_set(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        let span = store_span!("event_set", key = append.key, keiro.workflow.step = %append.event.step_name());
        let write = MessageWrite::Event(key.to_owned());
        let outcome = traced(span, self.message_write(append, write)).await?;
        append_of_message(outcome, append)
    }

    async fn stream_write(&self, append: &Append, write: &StreamWrite) -> Result<StreamOutcome> {
        let span = store_span!("stream_write", key = append.key, keiro.workflow.step = %append.event.step_name());
        let write = MessageWrite::Stream(write.clone());
        traced(span, self.message_write(append, write)).await
    }

    async fn stream_close(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        let span = store_span!("stream_close", key = append.key, keiro.workflow.step = %append.event.step_name());
        let write = MessageWrite::Close(key.to_owned());
        let outcome = traced(span, self.message_write(append, write)).await?;
        append_of_message(outcome, append)
    }

    async fn attributes_set(
        &self,
        append: &Append,
        _attributes: &keiro_journal::attribute::Attributes,
    ) -> Result<keiro_journal::store::AttributesOutcome> {
        let span = store_span!("attributes_set", key = append.key, keiro.workflow.step = %append.event.step_name());
        traced(span, op::attribute::attributes_set(self.db(), append)).await
    }

    async fn update_send(
        &self,
        send: &keiro_journal::update::UpdateSend,
    ) -> Result<keiro_journal::update::UpdateSendOutcome> {
        let span = store_span!("update_send", key = send.key);
        traced(span, op::update::update_send(self.db(), send)).await
    }

    async fn update_answer(
        &self,
        append: &Append,
        answer: &keiro_journal::update::UpdateAnswer,
    ) -> Result<keiro_journal::update::UpdateAnswerOutcome> {
        let span = store_span!("update_answer", key = append.key, keiro.workflow.step = %append.event.step_name());
        let outcome = traced(span, op::update::update_answer(self.db(), append, answer)).await?;
        if outcome == keiro_journal::update::UpdateAnswerOutcome::Append(AppendOutcome::Appended) {
            self.messages_here(&append.key);
        }
        Ok(outcome)
    }

    async fn signal_with_start(
        &self,
        start: &keiro_journal::store::StartRequest,
        token: &str,
        payload: &serde_json::Value,
        options: &keiro_journal::SignalOptions,
    ) -> Result<keiro_journal::update::SignalStarted> {
        let span = store_span!("signal_with_start", key = start.key);
        traced(
            span,
            op::signal::signal_with_start(self.db(), start, token, payload, options),
        )
        .await
    }

    async fn remote_arm(&self, arm: &RemoteArm) -> Result<RemoteArmOutcome> {
        let span = store_span!(
            "remote_arm",
            key = arm.key,
            keiro.workflow.step = %arm.step,
            keiro.remote.step_id = %arm.step_id
        );
        traced(span, async {
            let outcome = op::remote::remote_arm(self.db(), arm).await?;
            if matches!(outcome, RemoteArmOutcome::Settled { .. }) {
                // The body acts on a settled value at once: the report it comes from, committed
                // asynchronously, must be on disk first.
                op::remote::flushed(self.db(), &arm.step_id).await?;
            }
            Ok(outcome)
        })
        .await
    }

    async fn instance_park_dispatch(
        &self,
        park: &Park,
        arms: &[RemoteArm],
    ) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
        let span = store_span!("instance_park_dispatch", key = park.key);
        traced(
            span,
            self.lanes().instance_park_dispatch(self.db(), park, arms),
        )
        .await
    }
}

impl PgStore {
    /// An event or stream write through the message lane; once it is appended, this process's
    /// readers of the instance are woken (readers elsewhere hear the `msg:` payload, when the
    /// instance is watched).
    async fn message_write(&self, append: &Append, write: MessageWrite) -> Result<StreamOutcome> {
        let outcome = self.lanes().message_write(self.db(), append, write).await?;
        if outcome == StreamOutcome::Append(AppendOutcome::Appended) {
            self.messages_here(&append.key);
        }
        Ok(outcome)
    }
}

/// The append outcome of an event's or a close's write, which has no stream refusal.
fn append_of_message(outcome: StreamOutcome, append: &Append) -> Result<AppendOutcome> {
    match outcome {
        StreamOutcome::Append(outcome) => Ok(outcome),
        other => Err(keiro_journal::StoreError::Database {
            operation: op::message::MESSAGES_WRITE,
            retryable: false,
            source: format!(
                "{}: a stream refusal ({other:?}) answered a write that is not a stream item",
                append.key
            )
            .into(),
        }),
    }
}
