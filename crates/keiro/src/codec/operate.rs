//! The remote-step, operator and schedule traits through the codec. Their reads open what the
//! codec can and leave the rest sealed (an operator's display says "encrypted"; a remote
//! worker refuses the task, naming its key id; a schedule with an input sealed under a key
//! this process lacks still fires, the run then failing to open it until the key is given).

use std::time::Duration;

use keiro_journal::message::{EventRead, Messages, StreamPage};
use keiro_journal::store::{Result, Throughput, ThroughputRequest};
use keiro_journal::update::{UpdateRead, UpdateRecord, UpdateState};
use keiro_journal::{Counts, Fence, InspectStore, InstanceKey, ListRequest, Page, Started, Waits};
use keiro_remote::{
    ClaimRequest, ClaimedTask, HeartbeatOutcome, RemoteAdmin, RemoteTask, ReportOutcome,
    RequeueOutcome, RetryOutcome, TaskFailure, Transport,
};
use keiro_resume::{
    FireOutcome, Schedule, ScheduleFire, ScheduleSpec, ScheduleStore, SchedulesDue,
};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use super::Sealing;

const REPORT: &str = "reporting a remote task (payload codec)";
const RETRY: &str = "retrying with a new input (payload codec)";
const SCHEDULE: &str = "writing a schedule (payload codec)";
const TRIGGER: &str = "triggering a schedule (payload codec)";

impl<T: ?Sized> Sealing<T> {
    fn readable_schedule(&self, mut schedule: Schedule) -> Schedule {
        schedule.spec.input = self.readable(schedule.spec.input);
        schedule
    }

    fn readable_state(&self, state: UpdateState) -> UpdateState {
        match state {
            UpdateState::Replied(reply) => UpdateState::Replied(self.readable(reply)),
            other => other,
        }
    }
}

#[async_trait::async_trait]
impl<T: Transport + ?Sized> Transport for Sealing<T> {
    async fn tasks_claim(&self, request: &ClaimRequest) -> Result<Vec<ClaimedTask>> {
        let tasks = self.inner.tasks_claim(request).await?;
        Ok(tasks
            .into_iter()
            .map(|mut task| {
                task.input = self.readable(task.input);
                task
            })
            .collect())
    }

    async fn task_heartbeat(
        &self,
        step_id: &str,
        claim: Uuid,
        ttl: Duration,
    ) -> Result<HeartbeatOutcome> {
        self.inner.task_heartbeat(step_id, claim, ttl).await
    }

    async fn task_complete(&self, step_id: &str, output: &Value) -> Result<ReportOutcome> {
        let output = self.seal(REPORT, output)?;
        self.inner.task_complete(step_id, &output).await
    }

    async fn tasks_complete(&self, reports: &[(String, Value)]) -> Result<Vec<ReportOutcome>> {
        let reports = reports
            .iter()
            .map(|(step_id, output)| Ok((step_id.clone(), self.seal(REPORT, output)?)))
            .collect::<Result<Vec<_>>>()?;
        self.inner.tasks_complete(&reports).await
    }

    async fn task_fail(
        &self,
        step_id: &str,
        claim: Uuid,
        failure: &TaskFailure,
        retry_delay: Duration,
    ) -> Result<ReportOutcome> {
        self.inner
            .task_fail(step_id, claim, failure, retry_delay)
            .await
    }
}

#[async_trait::async_trait]
impl<T: RemoteAdmin + ?Sized> RemoteAdmin for Sealing<T> {
    async fn remote_redispatch_pending(&self, key: &InstanceKey) -> Result<Option<u64>> {
        self.inner.remote_redispatch_pending(key).await
    }

    async fn instance_requeue(&self, key: &InstanceKey) -> Result<RequeueOutcome> {
        self.inner.instance_requeue(key).await
    }

    async fn instance_retry_with_input(
        &self,
        origin: &InstanceKey,
        retry: &InstanceKey,
        input: &Value,
    ) -> Result<RetryOutcome> {
        let input = self.seal(RETRY, input)?;
        self.inner
            .instance_retry_with_input(origin, retry, &input)
            .await
    }

    async fn remote_tasks(&self, key: &InstanceKey) -> Result<Vec<RemoteTask>> {
        let tasks = self.inner.remote_tasks(key).await?;
        Ok(tasks
            .into_iter()
            .map(|mut task| {
                task.output = task.output.map(|v| self.readable(v));
                task
            })
            .collect())
    }
}

#[async_trait::async_trait]
impl<T: InspectStore + ?Sized> InspectStore for Sealing<T> {
    /// Search attributes are kept readable, never sealed.
    async fn instance_attributes(
        &self,
        key: &InstanceKey,
    ) -> Result<keiro_journal::attribute::Attributes> {
        self.inner.instance_attributes(key).await
    }

    async fn instances_list(&self, request: &ListRequest) -> Result<Page> {
        self.inner.instances_list(request).await
    }

    async fn instances_counts(&self, now: Option<OffsetDateTime>) -> Result<Counts> {
        self.inner.instances_counts(now).await
    }

    async fn instances_throughput(&self, request: &ThroughputRequest) -> Result<Throughput> {
        self.inner.instances_throughput(request).await
    }

    async fn instance_waits(&self, key: &InstanceKey, limit: u32) -> Result<Waits> {
        self.inner.instance_waits(key, limit).await
    }

    async fn event_get(&self, key: &InstanceKey, event: &str) -> Result<Option<EventRead>> {
        Ok(self.inner.event_get(key, event).await?.map(|mut read| {
            if let Some(record) = &mut read.event {
                record.value = self.readable(std::mem::take(&mut record.value));
            }
            read
        }))
    }

    async fn stream_read(
        &self,
        key: &InstanceKey,
        stream: &str,
        from: u64,
        limit: u32,
    ) -> Result<Option<StreamPage>> {
        Ok(self
            .inner
            .stream_read(key, stream, from, limit)
            .await?
            .map(|mut page| {
                for item in &mut page.items {
                    item.value = self.readable(std::mem::take(&mut item.value));
                }
                page
            }))
    }

    async fn instance_messages(&self, key: &InstanceKey) -> Result<Messages> {
        let mut messages = self.inner.instance_messages(key).await?;
        for event in &mut messages.events {
            event.value = self.readable(std::mem::take(&mut event.value));
        }
        Ok(messages)
    }

    async fn update_get(&self, key: &InstanceKey, update_id: &str) -> Result<Option<UpdateRead>> {
        Ok(self
            .inner
            .update_get(key, update_id)
            .await?
            .map(|mut read| {
                read.update = read
                    .update
                    .map(|(name, state)| (name, self.readable_state(state)));
                read
            }))
    }

    async fn instance_updates(&self, key: &InstanceKey, limit: u32) -> Result<Vec<UpdateRecord>> {
        let records = self.inner.instance_updates(key, limit).await?;
        Ok(records
            .into_iter()
            .map(|mut record| {
                record.request = self.readable(record.request);
                record.state = self.readable_state(record.state);
                record
            })
            .collect())
    }
}

#[async_trait::async_trait]
impl<T: ScheduleStore + ?Sized> ScheduleStore for Sealing<T> {
    async fn schedule_upsert(
        &self,
        spec: &ScheduleSpec,
        now: Option<OffsetDateTime>,
    ) -> Result<Schedule> {
        let spec = ScheduleSpec {
            input: self.seal(SCHEDULE, &spec.input)?,
            ..spec.clone()
        };
        let schedule = self.inner.schedule_upsert(&spec, now).await?;
        Ok(self.readable_schedule(schedule))
    }

    async fn schedule_get(&self, name: &str) -> Result<Option<Schedule>> {
        let schedule = self.inner.schedule_get(name).await?;
        Ok(schedule.map(|s| self.readable_schedule(s)))
    }

    async fn schedules_list(&self) -> Result<Vec<Schedule>> {
        let schedules = self.inner.schedules_list().await?;
        Ok(schedules
            .into_iter()
            .map(|s| self.readable_schedule(s))
            .collect())
    }

    async fn schedule_delete(&self, name: &str) -> Result<bool> {
        self.inner.schedule_delete(name).await
    }

    async fn schedule_set_paused(
        &self,
        name: &str,
        paused: bool,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Schedule>> {
        let schedule = self.inner.schedule_set_paused(name, paused, now).await?;
        Ok(schedule.map(|s| self.readable_schedule(s)))
    }

    async fn schedule_trigger(
        &self,
        name: &str,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Started>> {
        self.inner
            .schedule_trigger(name, now)
            .await?
            .map(|started| self.open_started(TRIGGER, started))
            .transpose()
    }

    async fn scheduler_lease(
        &self,
        owner: &str,
        ttl: Duration,
        now: Option<OffsetDateTime>,
    ) -> Result<Option<Fence>> {
        self.inner.scheduler_lease(owner, ttl, now).await
    }

    async fn scheduler_release(&self, owner: &str) -> Result<bool> {
        self.inner.scheduler_release(owner).await
    }

    async fn schedules_due(&self, now: Option<OffsetDateTime>, limit: i64) -> Result<SchedulesDue> {
        let mut due = self.inner.schedules_due(now, limit).await?;
        for entry in &mut due.due {
            entry.schedule.spec.input =
                self.readable(std::mem::take(&mut entry.schedule.spec.input));
        }
        Ok(due)
    }

    async fn schedule_fire(&self, fire: &ScheduleFire) -> Result<FireOutcome> {
        let starts = fire
            .starts
            .iter()
            .map(|start| self.seal_start(SCHEDULE, start))
            .collect::<Result<Vec<_>>>()?;
        let fire = ScheduleFire {
            starts,
            ..fire.clone()
        };
        Ok(match self.inner.schedule_fire(&fire).await? {
            FireOutcome::Fired(started) => FireOutcome::Fired(
                started
                    .into_iter()
                    .map(|s| self.open_started(SCHEDULE, s))
                    .collect::<Result<Vec<_>>>()?,
            ),
            other => other,
        })
    }

    async fn schedule_record_error(
        &self,
        name: &str,
        revision: i64,
        error: &str,
        retry_at: OffsetDateTime,
    ) -> Result<bool> {
        self.inner
            .schedule_record_error(name, revision, error, retry_at)
            .await
    }
}
