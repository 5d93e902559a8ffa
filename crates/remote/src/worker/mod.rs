//! The remote worker: claims tasks of the groups it serves, runs their handlers, heartbeats
//! long ones (telling a handler when its task was cancelled with its run) and reports results,
//! until shut down gracefully.

mod handler;
mod report;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use keiro_journal::RemoteHandlerDef;
use keiro_resume::{FixedPoll, Notifier, WakeFilter, WakeSource};

use crate::store::{ClaimRequest, ClaimedTask, HeartbeatOutcome, ReportOutcome, Transport};
use handler::{erase, ErasedHandler};
pub use handler::{TaskContext, TaskError, TaskHandler};
use report::{output_refused, report_failure, run_reporter, Completion, Report};

/// The pauses between claims while the store is unreachable: 50 ms, doubling, jittered so a
/// fleet does not hammer a recovering database in lockstep, and never longer than the poll
/// interval.
const CLAIM_RETRY_BACKOFF: keiro_journal::Backoff =
    keiro_journal::Backoff::exponential(Duration::from_millis(50), Duration::from_secs(60));

/// How a remote worker claims and runs tasks.
#[derive(Debug, Clone)]
pub struct RemoteWorkerOptions {
    /// Names the worker in `claimed_by`. Defaults to `remote-<8 hex>`.
    pub worker_id: String,
    /// Handlers running at once. Defaults to 16.
    pub concurrency: usize,
    /// How long a claim lasts without a heartbeat; a killed worker's tasks are claimable again
    /// after it, each expiry counting as a failed attempt (see
    /// [`RemoteStepError::CRASHED`](keiro_journal::RemoteStepError::CRASHED)). Defaults to 30 s.
    pub claim_ttl: Duration,
    /// How often a running handler's claim is extended. Defaults to a third of `claim_ttl`.
    pub heartbeat_every: Duration,
    /// How often an idle worker polls when no notification arrives (with push) or at all
    /// (without). Defaults to 1 s.
    pub poll_interval: Duration,
    /// How long shutdown waits for running handlers before abandoning them (their claims
    /// expire, which counts an attempt, and another worker runs them again if attempts remain).
    /// Defaults to 10 s.
    pub drain_timeout: Duration,
    /// The largest encoded handler output reported; a larger one fails the step at once with
    /// code `output_too_large` (it would be journaled and replayed on every drive).
    /// Defaults to [`PAYLOAD_LEN_MAX_DEFAULT`](keiro_journal::PAYLOAD_LEN_MAX_DEFAULT).
    pub payload_len_max: usize,
}

impl Default for RemoteWorkerOptions {
    fn default() -> Self {
        let claim_ttl = Duration::from_secs(30);
        Self {
            worker_id: format!("remote-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            concurrency: 16,
            claim_ttl,
            heartbeat_every: claim_ttl / 3,
            poll_interval: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(10),
            payload_len_max: keiro_journal::PAYLOAD_LEN_MAX_DEFAULT,
        }
    }
}

/// Counts of what a worker did, for tests, logs and benchmarks.
#[derive(Debug, Default)]
pub struct WorkerStats {
    claimed: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    report_errors: AtomicU64,
}

impl WorkerStats {
    /// Tasks claimed.
    pub fn claimed(&self) -> u64 {
        self.claimed.load(Ordering::Relaxed)
    }
    /// Tasks whose handler succeeded and whose result was reported.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }
    /// Tasks whose handler failed (or panicked) and whose failure was reported.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
    /// Tasks whose report was refused because the task was cancelled while its handler ran
    /// (its run was cancelled, or continued as new): nothing was journaled, and a failure was
    /// not retried.
    pub fn cancelled(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }
    /// Reports that could not reach the store (the claim then expires and the task runs again).
    pub fn report_errors(&self) -> u64 {
        self.report_errors.load(Ordering::Relaxed)
    }
}

/// Builds a [`RemoteWorker`].
pub struct RemoteWorkerBuilder {
    /// What the worker will hold, filled in by the builder's methods.
    inner: Inner,
}

impl std::fmt::Debug for RemoteWorkerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWorkerBuilder")
            .field("groups", &self.inner.groups)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl RemoteWorkerBuilder {
    /// Serves the group `step` with `handler`: the remote steps named `step`, and the steps of
    /// any name dispatched with [`RemoteOptions::handler`](keiro_journal::RemoteOptions::handler)
    /// naming it ([`TaskContext::step`] tells them apart).
    pub fn handle<I, O, F, Fut>(self, step: &str, handler: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
        F: Fn(I, TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, TaskError>> + Send + 'static,
    {
        self.handle_group(step, None, handler)
    }

    /// Serves the remote step `step` in `partition` (group `<step>@<partition>`) with
    /// `handler`.
    pub fn handle_partition<I, O, F, Fut>(self, step: &str, partition: &str, handler: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
        F: Fn(I, TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, TaskError>> + Send + 'static,
    {
        self.handle_group(step, Some(partition), handler)
    }

    /// Serves the handler `H` (group `H::NAME`) with `handler`, which must take `H::Input` and
    /// answer `H::Output` (write its parameter types): the types the workflows calling
    /// [`Ctx::remote_typed::<H>`](keiro_journal::Ctx::remote_typed) send and expect, so a
    /// mismatch is a compile error wherever both sides see `H`.
    ///
    /// ```no_run
    /// # use keiro_journal::RemoteHandlerDef;
    /// # use keiro_remote::{RemoteWorker, TaskContext, TaskError, Transport};
    /// struct PrintLabel;
    ///
    /// impl RemoteHandlerDef for PrintLabel {
    ///     const NAME: &'static str = "print-label";
    ///     type Input = String;
    ///     type Output = String;
    /// }
    ///
    /// # fn demo(transport: std::sync::Arc<dyn Transport>) {
    /// let worker = RemoteWorker::builder(transport)
    ///     .handle_typed::<PrintLabel>(|order: String, task: TaskContext| async move {
    ///         Ok::<_, TaskError>(format!("label for {order} ({})", task.step))
    ///     })
    ///     .build();
    /// # }
    /// ```
    ///
    /// A handler of other types does not compile:
    ///
    /// ```compile_fail
    /// # use keiro_journal::RemoteHandlerDef;
    /// # use keiro_remote::{RemoteWorker, TaskContext, TaskError, Transport};
    /// # struct PrintLabel;
    /// # impl RemoteHandlerDef for PrintLabel {
    /// #     const NAME: &'static str = "print-label";
    /// #     type Input = String;
    /// #     type Output = String;
    /// # }
    /// # fn demo(transport: std::sync::Arc<dyn Transport>) {
    /// RemoteWorker::builder(transport)
    ///     .handle_typed::<PrintLabel>(|grams: u32, _task: TaskContext| async move {
    ///         Ok::<_, TaskError>(grams) // expected `String`, found `u32`
    ///     });
    /// # }
    /// ```
    pub fn handle_typed<H: RemoteHandlerDef>(
        self,
        handler: impl TaskHandler<H::Input, H::Output>,
    ) -> Self {
        self.handle_group(H::NAME, None, move |input, task| handler.call(input, task))
    }

    /// Serves the handler `H` in `partition` (group `<H::NAME>@<partition>`) with `handler`,
    /// typed as [`handle_typed`](Self::handle_typed).
    pub fn handle_typed_partition<H: RemoteHandlerDef>(
        self,
        partition: &str,
        handler: impl TaskHandler<H::Input, H::Output>,
    ) -> Self {
        self.handle_group(H::NAME, Some(partition), move |input, task| {
            handler.call(input, task)
        })
    }

    fn handle_group<I, O, F, Fut>(mut self, step: &str, partition: Option<&str>, handler: F) -> Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
        F: Fn(I, TaskContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, TaskError>> + Send + 'static,
    {
        let group = keiro_journal::store::remote_group(step, partition);
        if !self.inner.groups.contains(&group) {
            self.inner.groups.push(group.clone());
        }
        self.inner.handlers.insert(group, erase(handler));
        self
    }

    /// Replaces the options.
    pub fn options(mut self, options: RemoteWorkerOptions) -> Self {
        self.inner.options = options;
        self
    }

    /// Wakes the worker as soon as a task is dispatched (Postgres LISTEN/NOTIFY) instead of at
    /// its next poll.
    pub fn push(mut self, notifier: Arc<dyn Notifier>) -> Self {
        self.inner.notifier = Some(notifier);
        self
    }

    /// Records `keiro.step.duration` for handlers (kind `remote`). Defaults to `None`.
    pub fn metrics(mut self, metrics: Option<keiro_telemetry::Metrics>) -> Self {
        self.inner.metrics = metrics;
        self
    }

    /// Runs each handler in a `remote <step>` OpenTelemetry span, a child of the dispatching
    /// drive's `workflow <name>` span (through the task's W3C trace context), so the handler's
    /// spans join the workflow's trace. Defaults to `None`.
    pub fn tracing(mut self, tracing: Option<keiro_telemetry::Tracing>) -> Self {
        self.inner.tracing = tracing;
        self
    }

    /// The worker.
    pub fn build(self) -> RemoteWorker {
        RemoteWorker {
            inner: Arc::new(self.inner),
        }
    }
}

struct Inner {
    transport: Arc<dyn Transport>,
    handlers: HashMap<String, ErasedHandler>,
    groups: Vec<String>,
    options: RemoteWorkerOptions,
    notifier: Option<Arc<dyn Notifier>>,
    metrics: Option<keiro_telemetry::Metrics>,
    tracing: Option<keiro_telemetry::Tracing>,
    stats: WorkerStats,
}

/// Runs remote-step handlers for a set of groups, in any process that can reach the store.
///
/// Cheap to clone; clones share one worker.
#[derive(Clone)]
pub struct RemoteWorker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RemoteWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteWorker")
            .field("worker_id", &self.inner.options.worker_id)
            .field("groups", &self.inner.groups)
            .finish_non_exhaustive()
    }
}

impl RemoteWorker {
    /// A builder over `transport` (a `PgStore` or a `SqliteStore`).
    pub fn builder(transport: Arc<dyn Transport>) -> RemoteWorkerBuilder {
        RemoteWorkerBuilder {
            inner: Inner {
                transport,
                handlers: HashMap::new(),
                groups: Vec::new(),
                options: RemoteWorkerOptions::default(),
                notifier: None,
                metrics: None,
                tracing: None,
                stats: WorkerStats::default(),
            },
        }
    }

    /// What the worker did so far.
    pub fn stats(&self) -> &WorkerStats {
        &self.inner.stats
    }

    /// The groups served.
    pub fn groups(&self) -> &[String] {
        &self.inner.groups
    }

    /// Claims and runs tasks until `shutdown` resolves, then stops claiming and waits up to
    /// `drain_timeout` for running handlers to finish and report.
    pub async fn run_until<F: Future<Output = ()> + Send>(&self, shutdown: F) {
        let inner = &self.inner;
        if inner.groups.is_empty() {
            shutdown.await;
            return;
        }
        let mut wake: Box<dyn WakeSource> = match &inner.notifier {
            Some(n) => n.subscribe(WakeFilter::RemoteTasks),
            None => Box::new(FixedPoll),
        };
        let mut running: JoinSet<()> = JoinSet::new();
        // The earliest moment a retry this worker reported becomes claimable: the worker wakes
        // for it rather than waiting for its next poll.
        let mut retry_at: Option<Instant> = None;
        let (retry_tx, mut retry_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
        let (completions, reporting) = tokio::sync::mpsc::unbounded_channel::<Completion>();
        let reporter = tokio::spawn(run_reporter(inner.transport.clone(), reporting));
        tokio::pin!(shutdown);
        let concurrency = inner.options.concurrency.max(1);
        let mut claim_failures = 0u32;
        // Whether claimable tasks may be waiting: set by a wake (a notification, the poll, a
        // retry coming due) and by a claim that filled every free slot. A claim that came back
        // short saw the queue empty, so a handler finishing after it claims nothing new: only
        // the next wake does (an empty claim costs the database as much as a full one).
        let mut may_have_work = true;
        loop {
            // Count only handlers still running: finished ones free their slot now, so one
            // claim refills every free slot instead of one claim per finished task.
            while running.try_join_next().is_some() {}
            let free = concurrency.saturating_sub(running.len());
            let mut full_batch = false;
            if free > 0 && may_have_work {
                match self.claim(free).await {
                    Ok(tasks) => {
                        claim_failures = 0;
                        full_batch = tasks.len() == free;
                        may_have_work = full_batch;
                        for task in tasks {
                            let worker = self.clone();
                            let (retry_tx, completions) = (retry_tx.clone(), completions.clone());
                            running.spawn(async move {
                                worker.execute(task, retry_tx, completions).await;
                            });
                        }
                    }
                    Err(error) => {
                        // A store outage: back off (up to the poll interval) and try again.
                        claim_failures = claim_failures.saturating_add(1);
                        let pause = CLAIM_RETRY_BACKOFF
                            .delay_random(claim_failures)
                            .min(inner.options.poll_interval);
                        tracing::warn!(%error, "remote worker: claim failed");
                        tokio::select! {
                            _ = &mut shutdown => break,
                            _ = tokio::time::sleep(pause) => {}
                        }
                        continue;
                    }
                }
            }
            if full_batch {
                // More may be waiting: claim again at once.
                tokio::task::yield_now().await;
                continue;
            }
            let fallback = match retry_at {
                Some(at) => at
                    .saturating_duration_since(Instant::now())
                    .min(inner.options.poll_interval),
                None => inner.options.poll_interval,
            };
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(at) = retry_rx.recv() => {
                    retry_at = Some(retry_at.map_or(at, |r| r.min(at)));
                }
                Some(_) = running.join_next(), if !running.is_empty() => {}
                _ = wake.wait(fallback) => {
                    may_have_work = true;
                    if retry_at.is_some_and(|at| at <= Instant::now()) {
                        retry_at = None;
                    }
                }
            }
        }
        // Graceful shutdown: no new claims; let running handlers finish and report.
        let drained = tokio::time::timeout(inner.options.drain_timeout, async {
            while running.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                abandoned = running.len(),
                "remote worker: handlers still running at the drain timeout; their claims will expire"
            );
            running.abort_all();
        }
        // Every handler is done: the reporter sends what is left, then stops.
        drop(completions);
        let _ = reporter.await;
    }

    async fn claim(&self, limit: usize) -> crate::Result<Vec<ClaimedTask>> {
        let inner = &self.inner;
        let request = ClaimRequest {
            groups: inner.groups.clone(),
            worker: inner.options.worker_id.clone(),
            limit: u32::try_from(limit).unwrap_or(u32::MAX),
            claim_ttl: inner.options.claim_ttl,
        };
        let tasks = inner.transport.tasks_claim(&request).await?;
        inner
            .stats
            .claimed
            .fetch_add(tasks.len() as u64, Ordering::Relaxed);
        Ok(tasks)
    }

    /// Runs one claimed task: the handler (in its own task, so a panic is a failure, not a
    /// crash of the worker) beside a heartbeat, then the report. An output the store refuses
    /// (a NUL character in a string, say) is reported as a fatal failure with code
    /// `output_refused` instead: it would be refused again on every attempt.
    async fn execute(
        self,
        task: ClaimedTask,
        retry_tx: tokio::sync::mpsc::UnboundedSender<Instant>,
        completions: tokio::sync::mpsc::UnboundedSender<Completion>,
    ) {
        let inner = &self.inner;
        let Some(handler) = inner.handlers.get(&task.group).cloned() else {
            return; // only served groups are claimed
        };
        let span = tracing::info_span!(
            "remote step",
            otel.name = %format!("remote {}", task.step),
            keiro.remote.step = %task.step,
            keiro.remote.step_id = %task.step_id,
            keiro.remote.attempt = task.attempt,
            keiro.workflow.name = %task.key.name,
            keiro.workflow.id = %task.key.id,
            traceparent = task.traceparent.as_deref().unwrap_or(""),
        );
        let started = std::time::Instant::now();
        let (cancel, cancelled) = tokio::sync::watch::channel(false);
        let context = TaskContext::of(&task, cancelled);
        let handling = tracing::Instrument::instrument(handler(task.input.clone(), context), span);
        let mut run = match &inner.tracing {
            None => tokio::spawn(handling),
            Some(otel) => {
                let cx = otel.remote(&task.step, &task.step_id, task.traceparent.as_deref());
                tokio::spawn(async move {
                    let result = keiro_telemetry::Tracing::in_context(handling, cx.clone()).await;
                    keiro_telemetry::Tracing::end(&cx);
                    result
                })
            }
        };
        let mut beat = tokio::time::interval_at(
            Instant::now() + inner.options.heartbeat_every,
            inner.options.heartbeat_every.max(Duration::from_millis(10)),
        );
        // A cancelled task is settled for good: there is no claim left to keep alive.
        let mut was_cancelled = false;
        let outcome = loop {
            tokio::select! {
                joined = &mut run => break joined,
                _ = beat.tick(), if !was_cancelled => {
                    match inner.transport.task_heartbeat(&task.step_id, task.claim, inner.options.claim_ttl).await {
                        Ok(HeartbeatOutcome::Extended) => {}
                        // Redispatched or re-claimed: keep running; a success still counts
                        // (first result wins), a failure will be ignored as stale.
                        Ok(HeartbeatOutcome::Lost) => tracing::debug!(step_id = %task.step_id, "remote worker: claim lost"),
                        // The handler decides how to stop; its report will be refused anyway.
                        Ok(HeartbeatOutcome::Cancelled) => {
                            tracing::info!(step_id = %task.step_id, "remote worker: the task was cancelled; telling its handler");
                            was_cancelled = true;
                            cancel.send_replace(true);
                        }
                        Err(error) => tracing::warn!(%error, "remote worker: heartbeat failed"),
                    }
                }
            }
        };
        if let Some(metrics) = &inner.metrics {
            metrics.step_duration(task.key.name.as_str(), "remote", started.elapsed());
        }
        let report = match outcome {
            Ok(Ok(output)) => match keiro_journal::store::encoded_len(&output) {
                len if len <= inner.options.payload_len_max => Report::Complete(output),
                len => Report::Fail(
                    TaskError::fatal(format!(
                        "the output is {len} bytes, the limit is {}",
                        inner.options.payload_len_max
                    ))
                    .with_code("output_too_large"),
                ),
            },
            Ok(Err(error)) => Report::Fail(error),
            Err(join) if join.is_panic() => Report::Fail(TaskError::retryable(format!(
                "the handler panicked: {}",
                keiro_journal::panic_message(join.into_panic().as_ref())
            ))),
            Err(_) => return, // aborted at the drain timeout: the claim will expire
        };
        let (reported, succeeded) = match report {
            // Outputs go through the batch reporter; failures are rare and reported alone.
            Report::Complete(output) => {
                let (reply, replied) = tokio::sync::oneshot::channel();
                let completion = Completion {
                    step_id: task.step_id.clone(),
                    output,
                    reply,
                };
                if completions.send(completion).is_err() {
                    return; // the worker is gone; the claim will expire
                }
                let reported = replied.await.unwrap_or(Ok(ReportOutcome::NotFound));
                match reported.as_ref().err().and_then(output_refused) {
                    Some(error) => (
                        report_failure(inner.transport.as_ref(), &task, error).await,
                        false,
                    ),
                    None => (reported, true),
                }
            }
            Report::Fail(error) => (
                report_failure(inner.transport.as_ref(), &task, error).await,
                false,
            ),
        };
        match reported {
            Ok(ReportOutcome::Cancelled) => {
                inner.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                tracing::info!(step_id = %task.step_id,
                    "remote worker: the task was cancelled; its report was refused");
            }
            Ok(ReportOutcome::Retrying { at }) => {
                let wait = (at - time::OffsetDateTime::now_utc()).max(time::Duration::ZERO);
                let wait = Duration::try_from(wait).unwrap_or_default();
                let _ = retry_tx.send(Instant::now() + wait);
                inner.stats.failed.fetch_add(1, Ordering::Relaxed);
            }
            Ok(_) if succeeded => {
                inner.stats.completed.fetch_add(1, Ordering::Relaxed);
            }
            Ok(_) => {
                inner.stats.failed.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                inner.stats.report_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%error, step_id = %task.step_id,
                    "remote worker: report failed; the task runs again once its claim expires");
            }
        }
    }
}
