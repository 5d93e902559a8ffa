//! One resume pass: discover, then for each candidate look up, claim, drive, classify, release.
//!
//! Every candidate is isolated: it runs in its own task, so a panic that escapes even the
//! driver, a store error, or a poison workflow affects that candidate's line of the summary and
//! nothing else.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use keiro_journal::{
    store::drive_notifying, store::ParkOutcome, InstanceKey, JournalStore, RunError, RunOutcome,
    StoreError,
};
use keiro_lease::{ClaimOutcome, Crash, CrashOutcome, LeaseStore};
use time::OffsetDateTime;
use tokio::task::JoinSet;

use crate::log::ResumeLogEvent;
use crate::{Registry, ResumeOptions, ResumeSummary};
use keiro_journal::error_chain;

/// Runs one unbounded resume pass. See [`resume_once_up_to`].
///
/// # Errors
///
/// The discovery query's store error; per-candidate errors are counted, never returned.
pub async fn resume_once(
    store: &Arc<dyn LeaseStore>,
    registry: &Registry,
    options: &ResumeOptions,
) -> Result<ResumeSummary, StoreError> {
    resume_once_up_to(store, registry, options, None).await
}

/// Runs one resume pass over at most `limit` candidates (`None`: all).
///
/// One discovery query finds the runnable instances (running, or suspended with a due
/// `wake_after`); each is then claimed and driven, up to `max_concurrent_advances` at once.
///
/// # Errors
///
/// The discovery query's store error; per-candidate errors are counted, never returned.
pub async fn resume_once_up_to(
    store: &Arc<dyn LeaseStore>,
    registry: &Registry,
    options: &ResumeOptions,
    limit: Option<usize>,
) -> Result<ResumeSummary, StoreError> {
    pass(store, registry, options, limit, &AtomicBool::new(false)).await
}

/// A pass that stops claiming new candidates once `stop` is set; runs already started finish.
pub(crate) async fn pass(
    store: &Arc<dyn LeaseStore>,
    registry: &Registry,
    options: &ResumeOptions,
    limit: Option<usize>,
    stop: &AtomicBool,
) -> Result<ResumeSummary, StoreError> {
    let limit = limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
    sample_awakeables_pending(store, options).await;
    let candidates = store.instances_runnable(None, limit).await?;
    let owner = options
        .owner
        .clone()
        .unwrap_or_else(|| format!("keiro-{}", uuid::Uuid::new_v4()));
    let mut summary = ResumeSummary {
        discovered: u64::try_from(candidates.len()).unwrap_or(u64::MAX),
        ..ResumeSummary::default()
    };
    // Shared once per pass, so each candidate task costs a reference count, not a copy.
    let shared = Arc::new((registry.clone(), options.clone(), owner));
    let mut tasks = JoinSet::new();
    let mut pending = candidates.into_iter();
    loop {
        while tasks.len() < options.concurrency() && !stop.load(Ordering::Relaxed) {
            let Some(key) = pending.next() else { break };
            let (store, shared) = (store.clone(), shared.clone());
            tasks.spawn(async move {
                let (registry, options, owner) = &*shared;
                advance(&store, registry, options, owner, key).await
            });
        }
        match tasks.join_next().await {
            Some(Ok(line)) => summary += line,
            Some(Err(join_error)) => {
                // Only a panic outside the body (inside keiro or the store) lands here: the
                // candidate is left leased until expiry and retried by a later pass.
                summary.transient_errors += 1;
                (options.log)(&ResumeLogEvent::TransientError {
                    key: None,
                    error: format!("candidate task failed: {join_error}"),
                });
            }
            None => break,
        }
    }
    if !options.queues.is_empty() {
        let limit = limit.map(|l| u64::try_from(l).unwrap_or(0));
        admit_and_drive(store, registry, &shared, limit, stop, &mut summary).await;
    }
    (options.log)(&ResumeLogEvent::PassFinished {
        summary: summary.clone(),
    });
    Ok(summary)
}

/// The queue half of a pass: admits waiting runs of the queues served, a batch of up to the
/// pass's concurrency at a time, drives each batch, and admits again until nothing more is
/// admitted (every slot is taken or nothing waits) or the pass's limit is reached.
async fn admit_and_drive(
    store: &Arc<dyn LeaseStore>,
    registry: &Registry,
    shared: &Arc<(Registry, ResumeOptions, String)>,
    limit: Option<u64>,
    stop: &AtomicBool,
    summary: &mut ResumeSummary,
) {
    let (_, options, owner) = &**shared;
    let names = registry.names();
    while !stop.load(Ordering::Relaxed) {
        let room = limit.map_or(u64::MAX, |l| l.saturating_sub(summary.discovered));
        let want = u64::try_from(options.concurrency())
            .unwrap_or(u64::MAX)
            .min(room);
        if want == 0 {
            return;
        }
        let asked = Instant::now();
        let claims = match store
            .queue_admit_serving(
                &options.queues,
                &names,
                &options.versions,
                owner,
                options.lease_ttl,
                i64::try_from(want).unwrap_or(i64::MAX),
                None,
            )
            .await
        {
            Ok(claims) => claims,
            Err(error) => {
                summary.transient_errors += 1;
                transient(options, None, &error);
                return;
            }
        };
        if claims.is_empty() {
            return;
        }
        record_admitted(options.metrics.as_ref(), &claims);
        summary.discovered += u64::try_from(claims.len()).unwrap_or(u64::MAX);
        let mut tasks = JoinSet::new();
        for claim in claims {
            let Some(workflow) = registry.get(&claim.instance.key.name).cloned() else {
                // Only registered names are admitted; a registry cannot shrink mid-pass.
                let _ = store
                    .instance_release(&claim.instance.key, &claim.fence, false)
                    .await;
                continue;
            };
            let (store, shared) = (store.clone(), shared.clone());
            tasks.spawn(async move {
                drive_claimed(&store, workflow, &shared.1, claim, asked, || {}).await
            });
        }
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(line) => *summary += line,
                Err(join_error) => {
                    summary.transient_errors += 1;
                    (options.log)(&ResumeLogEvent::TransientError {
                        key: None,
                        error: format!("candidate task failed: {join_error}"),
                    });
                }
            }
        }
    }
}

/// Counts runs just admitted to their queues and, for a first admission (a fresh run: no
/// journal yet), how long each waited since its start.
pub(crate) fn record_admitted(
    metrics: Option<&keiro_telemetry::Metrics>,
    claims: &[keiro_lease::Claim],
) {
    let Some(metrics) = metrics else {
        return;
    };
    let now = OffsetDateTime::now_utc();
    for claim in claims {
        let Some(queue) = &claim.instance.queue else {
            continue;
        };
        let first = claim.journal.is_empty() && claim.instance.generation == 0;
        let waited = first.then(|| {
            std::time::Duration::try_from(now - claim.instance.created_at).unwrap_or_default()
        });
        metrics.queue_admitted(queue, waited);
    }
}

/// Records the pending awakeables when metrics are on and a sample is due: a count over a
/// table that grows with the backlog, so it is paced by the metrics handle (see
/// [`keiro_telemetry::Metrics::sample_due`]) rather than run on every pass.
pub(crate) async fn sample_awakeables_pending(
    store: &Arc<dyn LeaseStore>,
    options: &ResumeOptions,
) {
    let Some(metrics) = &options.metrics else {
        return;
    };
    if !metrics.sample_due(keiro_telemetry::SampledGauge::AwakeablesPending) {
        return;
    }
    if let Ok(pending) = store.awakeables_pending().await {
        metrics.awakeables_pending(pending);
    }
}

/// Repeats passes while they advance something; returns the sum. A pass that advances nothing
/// means the rest is blocked (paced, unregistered, leased elsewhere, transient, due sleeps
/// with no timer worker), so the drain stops rather than spinning.
///
/// # Errors
///
/// The first failing discovery query.
pub async fn drain(
    store: &Arc<dyn LeaseStore>,
    registry: &Registry,
    options: &ResumeOptions,
) -> Result<ResumeSummary, StoreError> {
    let mut total = ResumeSummary::default();
    loop {
        let pass = resume_once(store, registry, options).await?;
        let advanced = pass.advanced;
        total += pass;
        if advanced == 0 {
            return Ok(total);
        }
    }
}

/// One candidate's line of the summary.
async fn advance(
    store: &Arc<dyn LeaseStore>,
    registry: &Registry,
    options: &ResumeOptions,
    owner: &str,
    key: InstanceKey,
) -> ResumeSummary {
    let mut line = ResumeSummary::default();
    let Some(workflow) = registry.get(&key.name).cloned() else {
        line.unknown_name = 1;
        line.unregistered_names.insert(key.name.clone());
        (options.log)(&ResumeLogEvent::UnknownName { key });
        return line;
    };
    let asked = Instant::now();
    let claim = match store
        .instance_claim_serving(&key, &options.versions, owner, options.lease_ttl, None)
        .await
    {
        Ok(ClaimOutcome::Acquired(claim)) => claim,
        Ok(refused) => {
            // All three refusals count as a skip in metrics, as the seed records them.
            if let Some(metrics) = &options.metrics {
                metrics.lease_skipped(key.name.as_str());
            }
            if refused == ClaimOutcome::Paced {
                line.paced = 1;
            } else {
                line.lease_skipped = 1;
            }
            return line;
        }
        Err(error) if error.is_value_refused() => {
            fail_unclaimable(store, options, &key, &error, &mut line).await;
            return line;
        }
        Err(error) => {
            line.transient_errors = 1;
            transient(options, Some(&key), &error);
            return line;
        }
    };
    line += drive_claimed(store, workflow, options, *claim, asked, || {}).await;
    line
}

/// Fails an instance whose claim the store refuses for a value (its journal is past what a
/// claim can load): no worker can ever run it, and left runnable it would be tried on every
/// pass. Unfenced, because no lease can be had; the reason says what to do.
async fn fail_unclaimable(
    store: &Arc<dyn LeaseStore>,
    options: &ResumeOptions,
    key: &InstanceKey,
    error: &StoreError,
    line: &mut ResumeSummary,
) {
    let reason = format!(
        "the instance cannot be claimed: {error}: its journal is larger than the store can \
         load; keep generations within the journal budget (continue as new)"
    );
    match store.instance_fail_diverged(key, None, &reason).await {
        Ok(_) => {
            line.failed = 1;
            line.advanced = 1;
            if let Some(metrics) = &options.metrics {
                metrics.failed(key.name.as_str());
            }
            (options.log)(&ResumeLogEvent::FailedTerminally {
                key: key.clone(),
                error: reason,
            });
        }
        Err(error) => {
            line.transient_errors = 1;
            transient(options, Some(key), &error);
        }
    }
}

/// One drive of a claimed run: its line of a pass's summary and, when the drive ended
/// normally, how ([`drive_claim`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ClaimDriven {
    /// The run's line of the summary, as a pass counts it.
    pub summary: ResumeSummary,
    /// How the drive ended, when it ended normally: `Completed` carries the recorded output.
    /// `None` for an abnormal ending (a crash, a lost lease, a store error, a divergence),
    /// which the drive has already handled as a worker does (crash recorded with backoff,
    /// lease released, instance failed).
    pub outcome: Option<RunOutcome>,
}

/// Drives one run whose lease the caller holds (`claim`, asked for at `asked`) exactly as a
/// worker's pass drives a claimed candidate: the same replay, lease confirmation and renewal,
/// metrics, span and log events, and the same handling of each ending (a crash is recorded
/// with backoff and the lease released, a park releases it, a store error releases it, a
/// divergence fails the instance). Direct execution uses it to drive a run in the process
/// that started it.
///
/// ```no_run
/// # use std::sync::Arc;
/// # use std::time::{Duration, Instant};
/// # use keiro_lease::{ClaimOutcome, LeaseStore};
/// # use keiro_resume::{drive_claim, Registry, ResumeOptions};
/// # async fn demo(store: Arc<dyn LeaseStore>, registry: Registry, key: keiro_journal::InstanceKey)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// let options = ResumeOptions::default();
/// let asked = Instant::now();
/// if let ClaimOutcome::Acquired(claim) =
///     store.instance_claim(&key, "me", options.lease_ttl, None).await?
/// {
///     let workflow = registry.get(&key.name).cloned().expect("registered");
///     let driven = drive_claim(&store, workflow, &options, *claim, asked).await;
///     println!("{:?}", driven.outcome);
/// }
/// # Ok(()) }
/// ```
pub async fn drive_claim(
    store: &Arc<dyn LeaseStore>,
    workflow: Arc<dyn keiro_journal::Workflow>,
    options: &ResumeOptions,
    claim: keiro_lease::Claim,
    asked: Instant,
) -> ClaimDriven {
    let (summary, outcome) =
        drive_claimed_outcome(store, workflow, options, claim, asked, || {}).await;
    ClaimDriven { summary, outcome }
}

/// Drives one claimed run and classifies how it ended: the summary line of a granted claim
/// asked for at `asked`. `body_returned` is called once the body has returned, before the
/// run's closing writes ([`drive_notifying`]).
pub(crate) async fn drive_claimed(
    store: &Arc<dyn LeaseStore>,
    workflow: Arc<dyn keiro_journal::Workflow>,
    options: &ResumeOptions,
    claim: keiro_lease::Claim,
    asked: Instant,
    body_returned: impl FnOnce() + Send,
) -> ResumeSummary {
    drive_claimed_outcome(store, workflow, options, claim, asked, body_returned)
        .await
        .0
}

/// [`drive_claimed`], also returning the outcome of a drive that ended normally.
async fn drive_claimed_outcome(
    store: &Arc<dyn LeaseStore>,
    workflow: Arc<dyn keiro_journal::Workflow>,
    options: &ResumeOptions,
    claim: keiro_lease::Claim,
    asked: Instant,
    body_returned: impl FnOnce() + Send,
) -> (ResumeSummary, Option<RunOutcome>) {
    let mut line = ResumeSummary {
        resumed: 1,
        ..ResumeSummary::default()
    };
    let key = claim.instance.key.clone();
    let fence = claim.fence.clone();
    let mut run_options = options.run_options();
    run_options.fence = Some(fence.clone());
    run_options.confirmed_at = Some(asked);
    run_options.claimed_at = Some(claim.instance.updated_at);
    let journal_store: Arc<dyn JournalStore> = store.clone();
    // The guard keeps the active-runs gauge right even if this future is dropped mid-run.
    let active = options.metrics.as_ref().map(|m| {
        m.resumed(key.name.as_str());
        m.run_scope(key.name.as_str())
    });
    // The `workflow <name>` span of the seed; steps nest inside it.
    let span = tracing::info_span!(
        "workflow",
        otel.name = %format_args!("workflow {}", key.name),
        keiro.workflow.name = %key.name,
        keiro.workflow.id = %key.id,
    );
    let driven = tracing::Instrument::instrument(
        drive_notifying(
            journal_store,
            workflow.as_ref(),
            &claim.instance,
            &claim.journal,
            run_options,
            body_returned,
        ),
        span,
    );
    let driven = match &options.tracing {
        None => driven.await,
        Some(tracing) => {
            let cx = tracing.workflow(key.name.as_str(), key.id.as_str());
            let driven = keiro_telemetry::Tracing::in_context(driven, cx.clone()).await;
            keiro_telemetry::Tracing::end(&cx);
            driven
        }
    };
    drop(active);
    if let Some(metrics) = &options.metrics {
        metrics.step_executed(key.name.as_str(), driven.stats.executed);
        metrics.step_replayed(key.name.as_str(), driven.stats.replayed);
    }
    if driven.stats.appended > 0 {
        line.advanced = 1;
    }
    let outcome = driven.result.as_ref().ok().cloned();
    match driven.result {
        Ok(RunOutcome::Completed(_)) => {
            line.completed = 1;
            if let Some(metrics) = &options.metrics {
                let length =
                    claim.journal.len() + usize::try_from(driven.stats.appended).unwrap_or(0);
                metrics
                    .journal_length(key.name.as_str(), u64::try_from(length).unwrap_or(u64::MAX));
            }
        }
        Ok(RunOutcome::Suspended) => {
            if driven.stats.appended > 0 {
                line.still_suspended = 1;
            } else {
                classify_quiet_park(driven.parked, claim.instance.updated_at, &mut line);
            }
        }
        Ok(RunOutcome::ContinuedAsNew { .. }) => {}
        Ok(RunOutcome::Cancelled | RunOutcome::Failed) => {
            release(store, options, &key, &fence, true).await;
        }
        Err(RunError::LeaseLost { .. }) => {
            line.lease_skipped = 1;
            if let Some(metrics) = &options.metrics {
                metrics.lease_skipped(key.name.as_str());
            }
        }
        Err(RunError::Store { source, .. }) => {
            line.transient_errors = 1;
            transient(options, Some(&key), &source);
            release(store, options, &key, &fence, false).await;
        }
        Err(error @ RunError::Conflict { .. }) => {
            line.transient_errors = 1;
            transient(options, Some(&key), &error);
            release(store, options, &key, &fence, false).await;
        }
        Err(RunError::NonDeterminism { detail, step, .. }) => {
            line.failed = 1;
            line.advanced = 1;
            if let Some(metrics) = &options.metrics {
                metrics.failed(key.name.as_str());
            }
            (options.log)(&ResumeLogEvent::Diverged {
                key,
                detail: format!("at step {step:?}: {detail}"),
            });
        }
        Err(RunError::Crashed { message, .. }) => {
            record_crash(
                store,
                options,
                &claim.instance.attempts,
                &key,
                &fence,
                message,
                &mut line,
            )
            .await;
        }
        Err(other) => {
            // RunError is non-exhaustive; an unknown ending is treated as transient.
            line.transient_errors = 1;
            transient(options, Some(&key), &other);
            release(store, options, &key, &fence, false).await;
        }
    }
    (line, outcome)
}

/// A run that parked without appending: tell a wake that landed mid-run (advanced) from a
/// due sleep that no timer worker fired (blocked), from what the park itself reported.
///
/// Due means due at `claimed_at`, the claimed row's `updated_at`: the store's clock when the
/// claim was granted, the clock deadlines are kept on, never the worker's own (which may be
/// skewed, and which a test that moves the store's clock does not move).
fn classify_quiet_park(
    parked: Option<keiro_journal::store::Parked>,
    claimed_at: OffsetDateTime,
    line: &mut ResumeSummary,
) {
    match parked {
        Some(keiro_journal::store::Parked {
            outcome: ParkOutcome::WokenBeforePark,
            ..
        }) => line.advanced = 1,
        Some(keiro_journal::store::Parked {
            outcome: ParkOutcome::Suspended,
            wake_after: Some(wake_after),
        }) if wake_after <= claimed_at => line.sleep_due = 1,
        _ => {}
    }
}

async fn record_crash(
    store: &Arc<dyn LeaseStore>,
    options: &ResumeOptions,
    attempts_at_claim: &i32,
    key: &InstanceKey,
    fence: &keiro_journal::Fence,
    error: String,
    line: &mut ResumeSummary,
) {
    // A message quoting a refused value must not make the crash record refused in turn, or
    // the attempt ceiling would never be reached.
    let error = keiro_journal::store::storable_text(&error).into_owned();
    let crash = Crash {
        error: error.clone(),
        retry_delay: keiro_lease::crash_delay(&options.backoff, *attempts_at_claim),
        max_attempts: options.max_attempts,
    };
    match store.instance_record_crash(key, fence, &crash).await {
        Ok(CrashOutcome::Retrying { attempts, .. }) => {
            (options.log)(&ResumeLogEvent::Crashed {
                key: key.clone(),
                attempts,
                error,
            });
        }
        Ok(CrashOutcome::Failed { .. }) => {
            line.failed = 1;
            line.advanced = 1;
            if let Some(metrics) = &options.metrics {
                metrics.failed(key.name.as_str());
            }
            (options.log)(&ResumeLogEvent::FailedTerminally {
                key: key.clone(),
                error,
            });
        }
        Ok(CrashOutcome::AlreadyTerminal) => {
            line.transient_errors = 1;
            (options.log)(&ResumeLogEvent::CrashRecordSkipped { key: key.clone() });
        }
        Err(e) if e.is_lease_lost() => {
            line.lease_skipped = 1;
        }
        Err(e) => {
            line.transient_errors = 1;
            transient(options, Some(key), &e);
        }
    }
}

pub(crate) async fn release(
    store: &Arc<dyn LeaseStore>,
    options: &ResumeOptions,
    key: &InstanceKey,
    fence: &keiro_journal::Fence,
    progressed: bool,
) {
    // Best effort: a failed release only delays the next claim until the lease expires. One
    // retry, because a connection the database just dropped fails once and is then replaced.
    let mut result = store.instance_release(key, fence, progressed).await;
    if matches!(&result, Err(e) if e.is_retryable()) {
        result = store.instance_release(key, fence, progressed).await;
    }
    if let Err(error) = result {
        transient(options, Some(key), &error);
    }
}

pub(crate) fn transient(
    options: &ResumeOptions,
    key: Option<&InstanceKey>,
    error: &dyn std::error::Error,
) {
    if let Some(metrics) = &options.metrics {
        metrics.resume_error("store");
    }
    (options.log)(&ResumeLogEvent::TransientError {
        key: key.cloned(),
        error: error_chain(error),
    });
}
