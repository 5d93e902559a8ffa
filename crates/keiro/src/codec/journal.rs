//! [`JournalStore`] through the codec: every operation forwards to the inner store's own (its
//! batched forms too), with the payloads of its request sealed and of its answer opened.

use std::sync::Arc;
use std::time::Duration;

use keiro_journal::store::{
    Append, AppendOutcome, ChildSpawn, ClosingOutcome, DeliveryOutcome, Park, ParkOutcome,
    RemoteArm, RemoteArmOutcome, Result, ReturnedSignal, SignalWait, SignalWaitOutcome,
    StartRequest, StreamOutcome, StreamWrite, TimerArm, UpdateAnswerOutcome,
};
use keiro_journal::update::{SignalStarted, UpdateAnswer, UpdateSend, UpdateSendOutcome};
use keiro_journal::{
    AwakeableOutcome, Deliveries, DeliveryBacklog, Fence, Generation, Instance, InstanceKey,
    JournalEntry, JournalStore, SignalOptions, SignalSendOutcome, Started, Status, TimerFiring,
};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Codec, Sealing};

const START: &str = "starting an instance (payload codec)";
const READ: &str = "reading an instance (payload codec)";
const APPEND: &str = "appending to the journal (payload codec)";
const SIGNAL: &str = "sending a signal (payload codec)";
const REMOTE: &str = "arming a remote step (payload codec)";
const UPDATE: &str = "sending an update (payload codec)";

impl<T: ?Sized> Sealing<T> {
    fn seal_arm(&self, arm: &RemoteArm) -> Result<RemoteArm> {
        Ok(RemoteArm {
            input: self.seal(REMOTE, &arm.input)?,
            ..arm.clone()
        })
    }

    fn open_arm_outcome(&self, outcome: RemoteArmOutcome) -> Result<RemoteArmOutcome> {
        Ok(match outcome {
            RemoteArmOutcome::Settled { value, lost } => RemoteArmOutcome::Settled {
                value: self.open(REMOTE, value)?,
                lost,
            },
            other => other,
        })
    }
}

#[async_trait::async_trait]
impl<T: JournalStore + ?Sized> JournalStore for Sealing<T> {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        // The built-in store underneath: its push, and the Postgres store's own kinds of step,
        // which seal through the run's options.
        self.inner.as_any()
    }

    fn payload_codec(&self) -> Option<Arc<dyn Codec>> {
        Some(self.codec.clone())
    }

    async fn instance_start(&self, request: &StartRequest) -> Result<Started> {
        let request = self.seal_start(START, request)?;
        let started = self.inner.instance_start(&request).await?;
        self.open_started(START, started)
    }

    async fn instances_start(&self, requests: &[StartRequest]) -> Vec<Result<Started>> {
        let sealed: Vec<Result<StartRequest>> =
            requests.iter().map(|r| self.seal_start(START, r)).collect();
        let ok: Vec<StartRequest> = sealed
            .iter()
            .filter_map(|r| r.as_ref().ok().cloned())
            .collect();
        let mut answers = self.inner.instances_start(&ok).await.into_iter();
        sealed
            .into_iter()
            .map(|request| match request {
                Err(error) => Err(error),
                Ok(_) => answers
                    .next()
                    .expect("the inner store answers every request")
                    .and_then(|started| self.open_started(START, started)),
            })
            .collect()
    }

    async fn instance_get(&self, key: &InstanceKey) -> Result<Option<Instance>> {
        self.inner
            .instance_get(key)
            .await?
            .map(|instance| self.open_instance(READ, instance))
            .transpose()
    }

    async fn journal_load(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<Vec<JournalEntry>> {
        let journal = self.inner.journal_load(key, generation).await?;
        self.open_journal(READ, journal)
    }

    async fn journal_history(&self, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
        let journal = self.inner.journal_history(key).await?;
        self.open_journal(READ, journal)
    }

    /// Forwarded as it is: search attributes stay readable (operators filter on them), and the
    /// journal step that records them carries the same values.
    async fn attributes_set(
        &self,
        append: &Append,
        attributes: &keiro_journal::attribute::Attributes,
    ) -> Result<keiro_journal::store::AttributesOutcome> {
        self.inner.attributes_set(append, attributes).await
    }

    async fn journal_append(&self, append: &Append) -> Result<AppendOutcome> {
        let append = self.seal_append(APPEND, append)?;
        let outcome = self.inner.journal_append(&append).await?;
        self.open_outcome(APPEND, outcome)
    }

    async fn journal_append_batch(&self, appends: &[Append]) -> Vec<Result<AppendOutcome>> {
        let sealed: Vec<Result<Append>> = appends
            .iter()
            .map(|a| self.seal_append(APPEND, a))
            .collect();
        let ok: Vec<Append> = sealed
            .iter()
            .filter_map(|a| a.as_ref().ok().cloned())
            .collect();
        let mut answers = self.inner.journal_append_batch(&ok).await.into_iter();
        sealed
            .into_iter()
            .map(|append| match append {
                Err(error) => Err(error),
                Ok(_) => answers
                    .next()
                    .expect("the inner store answers every append")
                    .and_then(|outcome| self.open_outcome(APPEND, outcome)),
            })
            .collect()
    }

    async fn journal_append_closing(
        &self,
        step: &Append,
        completion: &Append,
    ) -> Result<ClosingOutcome> {
        let step = self.seal_append(APPEND, step)?;
        let completion = self.seal_append(APPEND, completion)?;
        let closing = self
            .inner
            .journal_append_closing(&step, &completion)
            .await?;
        Ok(ClosingOutcome {
            step: self.open_outcome(APPEND, closing.step)?,
            completion: closing
                .completion
                .map(|outcome| self.open_outcome(APPEND, outcome))
                .transpose()?,
        })
    }

    async fn delivery_append(
        &self,
        append: &Append,
        backlog: &DeliveryBacklog,
    ) -> Result<DeliveryOutcome> {
        let append = self.seal_append(APPEND, append)?;
        Ok(match self.inner.delivery_append(&append, backlog).await? {
            DeliveryOutcome::Append(outcome) => {
                DeliveryOutcome::Append(self.open_outcome(APPEND, outcome)?)
            }
            other => other,
        })
    }

    async fn deliveries_read(
        &self,
        key: &InstanceKey,
        generation: Generation,
        read: Deliveries,
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

    async fn instance_park(&self, park: &Park) -> Result<ParkOutcome> {
        self.inner.instance_park(park).await
    }

    async fn instance_settle_leftovers(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<u64> {
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

    async fn awakeable_create(&self, append: &Append, id: Uuid) -> Result<AppendOutcome> {
        let append = self.seal_append(APPEND, append)?;
        let outcome = self.inner.awakeable_create(&append, id).await?;
        self.open_outcome(APPEND, outcome)
    }

    async fn awakeable_complete(&self, id: Uuid, payload: &Value) -> Result<AwakeableOutcome> {
        let payload = self.seal(SIGNAL, payload)?;
        self.inner.awakeable_complete(id, &payload).await
    }

    async fn awakeable_cancel(&self, id: Uuid) -> Result<AwakeableOutcome> {
        self.inner.awakeable_cancel(id).await
    }

    async fn awakeables_pending(&self) -> Result<u64> {
        self.inner.awakeables_pending().await
    }

    async fn signal_wait(&self, wait: &SignalWait) -> Result<SignalWaitOutcome> {
        Ok(match self.inner.signal_wait(wait).await? {
            SignalWaitOutcome::Delivered(value) => {
                SignalWaitOutcome::Delivered(self.open(SIGNAL, value)?)
            }
            other => other,
        })
    }

    async fn signal_withdraw(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
    ) -> Result<bool> {
        self.inner.signal_withdraw(key, generation, step).await
    }

    async fn signal_send_with(
        &self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome> {
        let payload = self.seal_signal(SIGNAL, token, payload)?;
        self.inner.signal_send_with(token, &payload, options).await
    }

    async fn signal_return(
        &self,
        decision: &Append,
        signals: &[ReturnedSignal],
    ) -> Result<AppendOutcome> {
        let decision = self.seal_append(APPEND, decision)?;
        let signals = signals
            .iter()
            .map(|s| {
                Ok(ReturnedSignal {
                    token: s.token.clone(),
                    payload: self.seal_signal(SIGNAL, &s.token, &s.payload)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let outcome = self.inner.signal_return(&decision, &signals).await?;
        self.open_outcome(APPEND, outcome)
    }

    async fn signal_send(&self, token: &str, payload: &Value) -> Result<SignalSendOutcome> {
        let payload = self.seal_signal(SIGNAL, token, payload)?;
        self.inner.signal_send(token, &payload).await
    }

    async fn child_spawn(&self, append: &Append, spawn: &ChildSpawn) -> Result<AppendOutcome> {
        let append = self.seal_append(APPEND, append)?;
        let spawn = ChildSpawn {
            input: self.seal(START, &spawn.input)?,
            ..spawn.clone()
        };
        let outcome = self.inner.child_spawn(&append, &spawn).await?;
        self.open_outcome(APPEND, outcome)
    }

    async fn instance_cancel(&self, key: &InstanceKey, cascade: bool) -> Result<AppendOutcome> {
        let outcome = self.inner.instance_cancel(key, cascade).await?;
        self.open_outcome(APPEND, outcome)
    }

    async fn event_set(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        let append = self.seal_append(APPEND, append)?;
        let outcome = self.inner.event_set(&append, key).await?;
        self.open_outcome(APPEND, outcome)
    }

    async fn stream_write(&self, append: &Append, write: &StreamWrite) -> Result<StreamOutcome> {
        let append = self.seal_append(APPEND, append)?;
        Ok(match self.inner.stream_write(&append, write).await? {
            StreamOutcome::Append(outcome) => {
                StreamOutcome::Append(self.open_outcome(APPEND, outcome)?)
            }
            other => other,
        })
    }

    async fn stream_close(&self, append: &Append, key: &str) -> Result<AppendOutcome> {
        let outcome = self.inner.stream_close(append, key).await?;
        self.open_outcome(APPEND, outcome)
    }

    async fn update_send(&self, send: &UpdateSend) -> Result<UpdateSendOutcome> {
        let sealed = self.seal_update(UPDATE, send)?;
        let outcome = self.inner.update_send(&sealed).await?;
        self.open_update_outcome(UPDATE, outcome)
    }

    async fn update_answer(
        &self,
        append: &Append,
        answer: &UpdateAnswer,
    ) -> Result<UpdateAnswerOutcome> {
        let append = self.seal_append(APPEND, append)?;
        Ok(match self.inner.update_answer(&append, answer).await? {
            UpdateAnswerOutcome::Append(outcome) => {
                UpdateAnswerOutcome::Append(self.open_outcome(APPEND, outcome)?)
            }
            other => other,
        })
    }

    async fn signal_with_start(
        &self,
        start: &StartRequest,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalStarted> {
        let start = self.seal_start(START, start)?;
        let payload = self.seal_signal(SIGNAL, token, payload)?;
        self.inner
            .signal_with_start(&start, token, &payload, options)
            .await
    }

    async fn remote_arm(&self, arm: &RemoteArm) -> Result<RemoteArmOutcome> {
        let arm = self.seal_arm(arm)?;
        let outcome = self.inner.remote_arm(&arm).await?;
        self.open_arm_outcome(outcome)
    }

    async fn instance_park_dispatch(
        &self,
        park: &Park,
        arms: &[RemoteArm],
    ) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
        let arms = arms
            .iter()
            .map(|arm| self.seal_arm(arm))
            .collect::<Result<Vec<_>>>()?;
        let (parked, outcomes) = self.inner.instance_park_dispatch(park, &arms).await?;
        let outcomes = outcomes
            .into_iter()
            .map(|outcome| self.open_arm_outcome(outcome))
            .collect::<Result<Vec<_>>>()?;
        Ok((parked, outcomes))
    }
}
