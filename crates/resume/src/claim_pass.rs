//! A worker loop's pass: claim runnable instances in batches beside the runs already going,
//! and drive them, up to `max_concurrent_advances` bodies at once.
//!
//! The runs a loop holds ([`Held`]) outlive any one pass: a pass that reaches its claim limit
//! hands them to the next pass instead of waiting for the slowest of them, so a long run never
//! holds back the runs started after it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keiro_journal::{store::stretched, StoreError, WorkflowName};
use keiro_lease::{Claim, LeaseStore};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::log::ResumeLogEvent;
use crate::pass::{drive_claimed, pass, release, sample_awakeables_pending, transient};
use crate::wake::WakeSource;
use crate::{Delivered, Registry, ResumeOptions, ResumeSummary};

/// The runs a worker loop holds between and across its passes: claimed and waiting for a slot,
/// running their bodies, and closing (their body returned; their completion, park or release
/// waits for its commit).
pub(crate) struct Held {
    /// Running and closing runs, each answering its line of the summary.
    tasks: JoinSet<ResumeSummary>,
    /// Claimed, not started yet: each with the time its claim was asked for, since its lease
    /// was granted no earlier (a run that waited past `confirm_after` confirms its lease before
    /// its first fresh action).
    pending: VecDeque<(Claim, Instant)>,
    /// One permit a body: a run gives its permit back when its body returns.
    slots: Arc<Semaphore>,
    /// A slot the pass waited for, kept for the next run it starts.
    spare: Option<OwnedSemaphorePermit>,
    /// `max_concurrent_advances`, as the slots were sized.
    concurrency: usize,
    /// Whether the last claim, of this pass or an earlier one, came back short: nothing else
    /// was claimable then.
    last_claim_short: bool,
}

impl Held {
    /// Nothing held, with `concurrency` slots: at most [`Semaphore::MAX_PERMITS`] (2^61 - 1 on
    /// 64-bit targets), so a `max_concurrent_advances` of `usize::MAX`, meaning "no bound",
    /// is a bound no worker reaches rather than a panic.
    pub(crate) fn new(concurrency: usize) -> Self {
        let concurrency = concurrency.min(Semaphore::MAX_PERMITS);
        Self {
            tasks: JoinSet::new(),
            pending: VecDeque::new(),
            slots: Arc::new(Semaphore::new(concurrency)),
            spare: None,
            concurrency,
            last_claim_short: false,
        }
    }

    /// Whether no run is held: none claimed and waiting, running or closing.
    pub(crate) fn is_empty(&self) -> bool {
        self.tasks.is_empty() && self.pending.is_empty()
    }

    /// Runs whose body is running.
    fn bodies(&self) -> usize {
        self.concurrency - self.slots.available_permits() - usize::from(self.spare.is_some())
    }

    /// A slot for the next run: the spare one, or a free one.
    fn take_slot(&mut self) -> Option<OwnedSemaphorePermit> {
        self.spare
            .take()
            .or_else(|| self.slots.clone().try_acquire_owned().ok())
    }
}

/// A claim sent beside the runs: its answer, how many it asked for, and when it asked.
type ClaimInFlight =
    Pin<Box<dyn Future<Output = (Result<Vec<Claim>, StoreError>, usize, Instant)> + Send>>;

/// A worker loop's pass: claim up to `limit` runnable instances of the registered workflows in
/// batches of one round trip each, and drive them and the runs `held` from earlier passes, up to
/// `max_concurrent_advances` bodies at once. Cheaper than discover-then-claim (no claim round
/// trip per run); the summary counts what was claimed and the runs that ended in this pass, so
/// unknown names, paced and leased-elsewhere instances are reported by `resume_once`, not here.
///
/// The next claim runs beside the runs, not between them: a claim is sent once fewer than half
/// a slot-set of runs wait, so the runs that finish while it is in flight find their successors
/// queued instead of idling for a round trip. A claim that came back short (nothing more was
/// claimable) is sent again, while there is room, on the next `wake` or after the poll
/// interval. A pass that has claimed `limit` runs ends at once and leaves what it holds to the
/// next pass. So neither a short claim nor the limit makes new runs wait for the pass's
/// longest run.
///
/// A run holds one of the `max_concurrent_advances` slots while its body runs; once the body
/// has returned, its closing write (completion, park, failure, crash record, release) no longer
/// holds a slot, so the next run starts while that write waits for its commit. Runs running
/// and closing together stay within two slot-sets, so a slow store cannot pile up closings.
///
/// Runs started in this process and handed to the loop (`options.hand_off`,
/// [`HandOff`](crate::HandOff)) join the claimed ones as they come, and count as claims; the
/// pass takes them only while its last claim came back short, each in a free slot it took.
///
/// Once `stop` is set the pass claims and starts nothing more, closes its hand-off, waits for
/// every run held (handed over ones too) and releases the claims not started.
pub(crate) async fn claim_pass(
    store: &Arc<dyn LeaseStore>,
    registry: &Registry,
    options: &ResumeOptions,
    limit: usize,
    stop: &AtomicBool,
    wake: &mut dyn WakeSource,
    held: &mut Held,
) -> Result<ResumeSummary, StoreError> {
    sample_awakeables_pending(store, options).await;
    let owner = options
        .owner
        .clone()
        .unwrap_or_else(|| format!("keiro-{}", uuid::Uuid::new_v4()));
    let names: Arc<[WorkflowName]> = registry.names().into();
    let queues: Arc<[String]> = options.queues.clone().into();
    let concurrency = held.concurrency;
    let refill = concurrency.saturating_mul(2);
    // Claim again once fewer than this many runs are queued or running: the queue then still
    // holds half a slot-set, enough to feed the slots that free while the claim is in flight.
    let low_water = refill - concurrency.div_ceil(2);
    // Runs in their body plus runs closing: the slots bound the first, this bounds both.
    let tasks_max = concurrency.saturating_mul(2);
    let mut summary = ResumeSummary::default();
    let shared = Arc::new(options.clone());
    let mut claiming: Option<ClaimInFlight> = None;
    let (mut claimed, mut exhausted) = (0usize, false);
    // When a claim that came back short may be sent again without a wake: the poll interval
    // after it, kept across the loop's turns so that runs ending often do not postpone it.
    let mut poll_at: Option<Instant> = None;
    let hand_off = options.hand_off.as_ref();
    if let Some(hand_off) = hand_off {
        hand_off.attach_slots(held.slots.clone());
    }
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        if let Some(hand_off) = hand_off {
            // Runs started in this process, leased to this loop from their start, each in a
            // slot it took; once stopping, none more, and those delivered are given back.
            let delivered = if stopping {
                hand_off.close()
            } else {
                hand_off.take()
            };
            // Counted as claims: the pass limit bounds them too.
            claimed += delivered.len();
            summary.discovered += u64::try_from(delivered.len()).unwrap_or(u64::MAX);
            for Delivered { claim, asked, slot } in delivered {
                let workflow = registry.get(&claim.instance.key.name).cloned();
                let Some(workflow) = workflow.filter(|_| !stopping) else {
                    release(store, options, &claim.instance.key, &claim.fence, false).await;
                    continue;
                };
                let (store, shared) = (store.clone(), shared.clone());
                held.tasks.spawn(async move {
                    drive_claimed(&store, workflow, &shared, claim, asked, move || drop(slot)).await
                });
            }
            // Taking hand-offs only while nothing else was claimable (the last claim came
            // back short), so they do not overtake runs waiting in the store (those that
            // became runnable since wait at most for the claim in flight).
            hand_off.set_taking(!stopping && held.last_claim_short && claimed < limit);
        }
        let waiting = held.pending.len() + held.bodies();
        let room = !stopping && waiting < low_water && claimed < limit;
        if claiming.is_none() && !exhausted && room {
            let want = refill.saturating_sub(waiting).min(limit - claimed);
            let (store, names, owner, ttl) = (
                store.clone(),
                names.clone(),
                owner.clone(),
                options.lease_ttl,
            );
            let asked = Instant::now();
            let queues = queues.clone();
            let versions = options.versions.clone();
            let metrics = options.metrics.clone();
            claiming = Some(Box::pin(async move {
                // Runs that hold their queue slot come back through the ordinary claim;
                // room left goes to admitting waiting runs of the queues served.
                let batch = store
                    .claim_and_admit_serving(
                        &names,
                        &queues,
                        &versions,
                        &owner,
                        ttl,
                        i64::try_from(want).unwrap_or(i64::MAX),
                        None,
                    )
                    .await
                    .map(|batch| {
                        crate::pass::record_admitted(metrics.as_ref(), &batch.admitted);
                        let mut claims = batch.claimed;
                        claims.extend(batch.admitted);
                        claims
                    });
                (batch, want, asked)
            }));
        }
        while !stopping && held.tasks.len() < tasks_max && !held.pending.is_empty() {
            let Some(slot) = held.take_slot() else {
                break;
            };
            let Some((claim, asked)) = held.pending.pop_front() else {
                break;
            };
            let Some(workflow) = registry.get(&claim.instance.key.name).cloned() else {
                // Only registered names are claimed; a registry cannot shrink mid-pass.
                release(store, options, &claim.instance.key, &claim.fence, false).await;
                held.spare = Some(slot);
                continue;
            };
            let (store, shared) = (store.clone(), shared.clone());
            held.tasks.spawn(async move {
                drive_claimed(&store, workflow, &shared, claim, asked, move || drop(slot)).await
            });
        }
        if claimed >= limit && claiming.is_none() && !stop.load(Ordering::Relaxed) {
            // The limit is reached: the runs held go on, and the next pass takes them over.
            break;
        }
        if held.tasks.is_empty() && claiming.is_none() {
            // Nothing running or being claimed: stop when asked to (unstarted claims are
            // released below) or when there is nothing left to start or claim.
            if stopping || (held.pending.is_empty() && exhausted) {
                break;
            }
            // Unless slots are taken by hand-offs still being started: their delivery (or
            // their end without one) wakes the wait below.
            if hand_off.is_none_or(|hand_off| hand_off.reserved() == 0) {
                continue;
            }
        }
        let waiting_for_slot = !stopping
            && held.spare.is_none()
            && !held.pending.is_empty()
            && held.tasks.len() < tasks_max;
        let claim_again = exhausted && room && claiming.is_none();
        let poll_in = poll_at.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        });
        let slots = held.slots.clone();
        tokio::select! {
            Some(joined) = held.tasks.join_next(), if !held.tasks.is_empty() => match joined {
                Ok(line) => summary += line,
                Err(join_error) => {
                    summary.transient_errors += 1;
                    (options.log)(&ResumeLogEvent::TransientError {
                        key: None,
                        error: format!("candidate task failed: {join_error}"),
                    });
                }
            },
            // A body returned: its slot goes to the next queued run.
            Ok(slot) = slots.acquire_owned(), if waiting_for_slot => held.spare = Some(slot),
            // Something may have become runnable since the short claim: claim again.
            _ = wake.wait(poll_in), if claim_again => (exhausted, poll_at) = (false, None),
            // A run started here was handed to this loop: taken at the top of the next turn.
            () = async { hand_off.expect("guarded").delivered().await },
                if hand_off.is_some() && !stopping => {}
            (batch, want, asked) = async { claiming.as_mut().expect("guarded").await },
                if claiming.is_some() =>
            {
                claiming = None;
                match batch {
                    Ok(claims) => {
                        exhausted = claims.len() < want;
                        held.last_claim_short = exhausted;
                        if exhausted {
                            poll_at = Some(Instant::now() + stretched(options.poll_interval));
                        }
                        claimed += claims.len();
                        summary.discovered += u64::try_from(claims.len()).unwrap_or(u64::MAX);
                        held.pending.extend(claims.into_iter().map(|claim| (claim, asked)));
                    }
                    // A refused value (a journal past what one claim can load) refuses every
                    // batch that may pick its instance: claim one instance at a time instead,
                    // so the others run and that one is set aside. Only with nothing held:
                    // until then, claims are retried as after a short one.
                    Err(error) if held.is_empty() && error.is_value_refused() => {
                        transient(options, None, &error);
                        return pass(store, registry, options, Some(limit), stop).await;
                    }
                    // A claim failing with nothing held fails the pass, like a failed
                    // discovery; otherwise it is counted and tried again as a short claim is,
                    // while the runs held go on.
                    Err(error) if held.is_empty() => return Err(error),
                    Err(error) => {
                        exhausted = true;
                        poll_at = Some(Instant::now() + stretched(options.poll_interval));
                        transient(options, None, &error);
                    }
                }
            }
        }
    }
    if stop.load(Ordering::Relaxed) {
        for (claim, _) in std::mem::take(&mut held.pending) {
            release(store, options, &claim.instance.key, &claim.fence, false).await;
        }
    }
    (options.log)(&ResumeLogEvent::PassFinished {
        summary: summary.clone(),
    });
    Ok(summary)
}
