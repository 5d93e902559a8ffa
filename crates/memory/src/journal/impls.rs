//! [`JournalStore`] for [`MemoryStore`]: each method checks what Postgres would refuse
//! ([`storable`]), then runs one critical section over `State` that calls the rule of its SQL
//! function (the journal's rules in [`super`], the wake sources' in `crate::sources`, the
//! remote arm in `crate::remote`). Nothing is decided here.

use std::time::Duration;

use keiro_journal::store::{
    Append, AppendOutcome, DeliveryOutcome, JournalStore, Park, ParkOutcome, Result,
};
use keiro_journal::{span::traced, store_span};
use keiro_journal::{
    store::ChildSpawn, store::RemoteArm, store::RemoteArmOutcome, store::ReturnedSignal,
    store::SignalWait, store::SignalWaitOutcome, store::StartRequest, store::TimerArm,
    AwakeableOutcome, AwakeableStatus, Deliveries, DeliveryBacklog, Envelope, Fence, Generation,
    Instance, InstanceKey, JournalEntry, SignalOptions, SignalSendOutcome, Started, Status,
    TimerFiring,
};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use super::{APPEND, DELIVER};
use crate::{storable, MemoryStore};

const DELIVERIES_READ: &str = "counting the deliveries a run read";
const START: &str = "starting an instance";
const FAIL_DIVERGED: &str = "failing a diverged instance";
const ARM_TIMER: &str = "arming a timer";
const CREATE_AWAKEABLE: &str = "creating an awakeable";
const COMPLETE_AWAKEABLE: &str = "completing an awakeable";
const WAIT_SIGNAL: &str = "waiting for a signal";
const WITHDRAW_SIGNAL: &str = "withdrawing a signal wait";
const SETTLE_LEFTOVERS: &str = "settling a completed run's leftovers";
const SEND_SIGNAL: &str = "sending a signal";
const RETURN_SIGNALS: &str = "giving signals back to their tokens";
const SPAWN: &str = "spawning a child workflow";
const ARM_REMOTE: &str = "arming a remote step";
const PARK_DISPATCH: &str = "parking a run with its remote dispatches";

#[async_trait::async_trait]
impl JournalStore for MemoryStore {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    async fn instance_start(&self, request: &StartRequest) -> Result<Started> {
        let span = store_span!("instance_start", key = request.key);
        traced(span, async {
            storable::value(START, &request.input)?;
            self.transact(START, |state| Ok(state.instance_start(request)))
        })
        .await
    }

    async fn instance_get(&self, key: &InstanceKey) -> Result<Option<Instance>> {
        let span = store_span!("instance_get", key = key);
        traced(span, async {
            self.transact("reading an instance", |state| {
                Ok(state.instances.get(key).map(|entry| entry.row.clone()))
            })
        })
        .await
    }

    async fn journal_load(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<Vec<JournalEntry>> {
        let span = store_span!("journal_load", key = key);
        traced(span, async {
            self.transact("loading a journal generation", |state| {
                state.journal_load(key, generation)
            })
        })
        .await
    }

    async fn journal_history(&self, key: &InstanceKey) -> Result<Vec<JournalEntry>> {
        let span = store_span!("journal_history", key = key);
        traced(span, async {
            self.transact("loading a journal's history", |state| {
                state.journal_history(key)
            })
        })
        .await
    }

    /// The trait's one-at-a-time default, in the span the Postgres store opens for the batch.
    async fn instances_start(&self, requests: &[StartRequest]) -> Vec<Result<Started>> {
        let span = store_span!("instances_start", keiro.store.len = requests.len());
        traced(span, async {
            let mut outcomes = Vec::with_capacity(requests.len());
            for request in requests {
                outcomes.push(self.instance_start(request).await);
            }
            outcomes
        })
        .await
    }

    /// The trait's one-at-a-time default, in the span the Postgres store opens for the batch.
    async fn journal_append_batch(&self, appends: &[Append]) -> Vec<Result<AppendOutcome>> {
        let span = store_span!("journal_append_batch", keiro.store.len = appends.len());
        traced(span, async {
            let mut outcomes = Vec::with_capacity(appends.len());
            for append in appends {
                outcomes.push(self.journal_append(append).await);
            }
            outcomes
        })
        .await
    }

    async fn journal_append(&self, append: &Append) -> Result<AppendOutcome> {
        let span = store_span!("journal_append", key = append.key, keiro.workflow.step = %append.event.step_name());
        traced(span, async {
            storable::append(APPEND, append)?;
            self.transact(APPEND, |state| state.append(append))
        })
        .await
    }

    async fn delivery_append(
        &self,
        append: &Append,
        backlog: &DeliveryBacklog,
    ) -> Result<DeliveryOutcome> {
        let span = store_span!("delivery_append", key = append.key, keiro.workflow.step = %append.event.step_name());
        traced(span, async {
            storable::append(DELIVER, append)?;
            self.transact(DELIVER, |state| state.delivery_append(append, backlog))
        })
        .await
    }

    async fn deliveries_read(
        &self,
        key: &InstanceKey,
        generation: Generation,
        read: Deliveries,
    ) -> Result<()> {
        let span = store_span!("deliveries_read", key = key);
        traced(span, async {
            self.transact(DELIVERIES_READ, |state| {
                state.deliveries_read(key, generation, read)
            })
        })
        .await
    }

    async fn instance_confirm(
        &self,
        key: &InstanceKey,
        fence: &Fence,
        ttl: Duration,
    ) -> Result<Status> {
        let span = store_span!("instance_confirm", key = key);
        traced(span, async {
            self.transact("confirming a lease", |state| {
                state.instance_confirm(key, fence, ttl)
            })
        })
        .await
    }

    async fn instance_park(&self, park: &Park) -> Result<ParkOutcome> {
        let span = store_span!("instance_park", key = park.key);
        traced(span, async {
            self.transact("parking an instance", |state| state.instance_park(park))
        })
        .await
    }

    async fn instance_settle_leftovers(
        &self,
        key: &InstanceKey,
        generation: Generation,
    ) -> Result<u64> {
        let span = store_span!("instance_settle_leftovers", key = key);
        traced(span, async {
            self.transact(SETTLE_LEFTOVERS, |state| {
                let completed = state
                    .instances
                    .get(key)
                    .is_some_and(|entry| entry.row.status == Status::Completed);
                if !completed {
                    return Ok(0);
                }
                let tasks = state.remote_tasks_cancel(key, generation);
                Ok(tasks + state.awakeables_cancel(key, generation))
            })
        })
        .await
    }

    async fn instance_fail_diverged(
        &self,
        key: &InstanceKey,
        fence: Option<&Fence>,
        reason: &str,
    ) -> Result<bool> {
        let span = store_span!("instance_fail_diverged", key = key);
        traced(span, async {
            storable::text(FAIL_DIVERGED, "failure reason", reason)?;
            self.transact(FAIL_DIVERGED, |state| {
                state.instance_fail_diverged(key, fence, reason)
            })
        })
        .await
    }

    async fn timer_arm(&self, arm: &TimerArm) -> Result<OffsetDateTime> {
        let span = store_span!("timer_arm", key = arm.key, keiro.workflow.step = %arm.step);
        traced(span, async {
            storable::timer(ARM_TIMER, arm)?;
            self.transact(ARM_TIMER, |state| state.timer_arm(arm))
        })
        .await
    }

    async fn timers_fire_due(
        &self,
        now: Option<OffsetDateTime>,
        limit: i64,
    ) -> Result<TimerFiring> {
        let span = store_span!("timers_fire_due");
        traced(span, async {
            self.transact("firing due timers", |state| {
                state.timers_fire_due(now, limit)
            })
        })
        .await
    }

    async fn timers_requeue_stuck(&self, _older_than: Duration) -> Result<u64> {
        let span = store_span!("timers_requeue_stuck");
        traced(span, async {
            // Firing is one critical section here, so no timer is ever left `firing`: there is
            // never anything to requeue. Still a transaction, so a poisoned store refuses it too.
            self.transact("requeuing stuck timers", |_| Ok(0))
        })
        .await
    }

    async fn timers_due_count(&self, now: Option<OffsetDateTime>) -> Result<u64> {
        let span = store_span!("timers_due_count");
        traced(span, async {
            self.transact("counting due timers", |state| {
                Ok(state.timers_due_count(now))
            })
        })
        .await
    }

    async fn awakeable_create(&self, append: &Append, id: Uuid) -> Result<AppendOutcome> {
        let span = store_span!("awakeable_create", key = append.key, keiro.workflow.step = %append.event.step_name(), keiro.awakeable.id = %id);
        traced(span, async {
            storable::append(CREATE_AWAKEABLE, append)?;
            self.transact(CREATE_AWAKEABLE, |state| state.awakeable_create(append, id))
        })
        .await
    }

    async fn awakeable_complete(&self, id: Uuid, payload: &Value) -> Result<AwakeableOutcome> {
        let span = store_span!("awakeable_complete", keiro.awakeable.id = %id);
        traced(span, async {
            storable::value(COMPLETE_AWAKEABLE, payload)?;
            self.transact(COMPLETE_AWAKEABLE, |state| {
                state.awakeable_settle(
                    id,
                    AwakeableStatus::Completed,
                    Envelope::ok(payload.clone()),
                )
            })
        })
        .await
    }

    async fn awakeable_cancel(&self, id: Uuid) -> Result<AwakeableOutcome> {
        let span = store_span!("awakeable_cancel", keiro.awakeable.id = %id);
        traced(span, async {
            self.transact("cancelling an awakeable", |state| {
                state.awakeable_settle(id, AwakeableStatus::Cancelled, Envelope::cancelled())
            })
        })
        .await
    }

    async fn awakeables_pending(&self) -> Result<u64> {
        let span = store_span!("awakeables_pending");
        traced(span, async {
            self.transact("counting pending awakeables", |state| {
                Ok(state.awakeables_pending())
            })
        })
        .await
    }

    async fn signal_wait(&self, wait: &SignalWait) -> Result<SignalWaitOutcome> {
        let span = store_span!("signal_wait", key = wait.key, keiro.workflow.step = %wait.step, keiro.signal.token = %wait.token);
        traced(span, async {
            storable::text(WAIT_SIGNAL, "step name", &wait.step)?;
            storable::text(WAIT_SIGNAL, "signal token", &wait.token)?;
            self.transact(WAIT_SIGNAL, |state| state.signal_wait(wait))
        })
        .await
    }

    async fn signal_withdraw(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
    ) -> Result<bool> {
        let span = store_span!("signal_withdraw", key = key, keiro.workflow.step = %step);
        traced(span, async {
            self.transact(WITHDRAW_SIGNAL, |state| {
                Ok(state.signal_withdraw(key, generation, step))
            })
        })
        .await
    }

    async fn signal_send_with(
        &self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome> {
        let span = store_span!("signal_send_with", keiro.signal.token = %token);
        traced(span, async {
            storable::text(SEND_SIGNAL, "signal token", token)?;
            storable::value(SEND_SIGNAL, payload)?;
            self.transact(SEND_SIGNAL, |state| {
                state.signal_send(token, payload, options)
            })
        })
        .await
    }

    async fn signal_return(
        &self,
        decision: &Append,
        signals: &[ReturnedSignal],
    ) -> Result<AppendOutcome> {
        let span = store_span!("signal_return", key = decision.key, keiro.workflow.step = %decision.event.step_name());
        traced(span, async {
            storable::append(RETURN_SIGNALS, decision)?;
            for signal in signals {
                storable::text(RETURN_SIGNALS, "signal token", &signal.token)?;
                storable::value(RETURN_SIGNALS, &signal.payload)?;
            }
            self.transact(RETURN_SIGNALS, |state| {
                state.signal_return(decision, signals)
            })
        })
        .await
    }

    async fn child_spawn(&self, append: &Append, spawn: &ChildSpawn) -> Result<AppendOutcome> {
        let span = store_span!("child_spawn", key = append.key, keiro.workflow.step = %append.event.step_name(), keiro.child = %spawn.child);
        traced(span, async {
            storable::spawn(SPAWN, append, spawn)?;
            self.transact(SPAWN, |state| state.child_spawn(append, spawn))
        })
        .await
    }

    async fn instance_cancel(&self, key: &InstanceKey, cascade: bool) -> Result<AppendOutcome> {
        let span = store_span!("instance_cancel", key = key);
        traced(span, async {
            self.transact("cancelling an instance", |state| {
                state.instance_cancel(key, cascade)
            })
        })
        .await
    }

    async fn remote_arm(&self, arm: &RemoteArm) -> Result<RemoteArmOutcome> {
        let span = store_span!("remote_arm", key = arm.key, keiro.workflow.step = %arm.step, keiro.remote.step_id = %arm.step_id);
        traced(span, async {
            storable::remote_arm(ARM_REMOTE, arm)?;
            self.transact(ARM_REMOTE, |state| state.remote_arm(arm))
        })
        .await
    }

    async fn instance_park_dispatch(
        &self,
        park: &Park,
        arms: &[RemoteArm],
    ) -> Result<(ParkOutcome, Vec<RemoteArmOutcome>)> {
        let span = store_span!("instance_park_dispatch", key = park.key);
        traced(span, async {
            for arm in arms {
                storable::remote_arm(PARK_DISPATCH, arm)?;
            }
            self.transact(PARK_DISPATCH, |state| {
                state.park_fence_check(park)?;
                let mut park = park.clone();
                let mut outcomes = Vec::with_capacity(arms.len());
                for arm in arms {
                    let outcome = state.remote_arm(arm)?;
                    if let Some(deadline) = outcome.deadline() {
                        park.wake_after =
                            Some(park.wake_after.map_or(deadline, |w| w.min(deadline)));
                    }
                    outcomes.push(outcome);
                }
                Ok((state.instance_park(&park)?, outcomes))
            })
        })
        .await
    }
}
