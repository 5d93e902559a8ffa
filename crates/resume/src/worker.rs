//! The worker loop: passes, separated by waits on a wake source, until shutdown.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use keiro_lease::LeaseStore;

use crate::claim_pass::{claim_pass, Held};
use crate::log::ResumeLogEvent;
use crate::pass::release;
use crate::wake::{WakeReason, WakeSource};
use crate::{Registry, ResumeOptions, ResumeSummary};
use keiro_journal::error_chain;

/// Runs passes until `shutdown` resolves, returning the sum of every pass.
///
/// Each pass claims batches of runnable instances of the registered workflows, one round trip
/// each (`instances_claim_batch`), and drives them; unknown names, paced and leased-elsewhere
/// instances are left alone (report them with `resume_once`). A pass that reaches
/// `pass_limit` claims ends at once; the runs it leaves going are the next pass's.
///
/// After a pass that advanced something, or left runs going, the next pass starts at once;
/// otherwise the loop waits on `wake` for a notification or `poll_interval` (plus 0-20%). A
/// failing pass is logged and the loop goes on. Shutdown is graceful: once it resolves no new run is
/// claimed, runs already started finish and release their leases, then the loop returns.
pub async fn run_loop<W: WakeSource>(
    store: Arc<dyn LeaseStore>,
    registry: Registry,
    options: ResumeOptions,
    mut wake: W,
    shutdown: impl Future<Output = ()> + Send,
) -> ResumeSummary {
    let mut total = ResumeSummary::default();
    let mut shutdown = std::pin::pin!(shutdown);
    let stop = AtomicBool::new(false);
    // The runs claimed and not yet ended, handed from pass to pass.
    let mut held = Held::new(options.concurrency());
    loop {
        let result = {
            let batch = options.pass_limit.unwrap_or(usize::MAX);
            let current = claim_pass(
                &store, &registry, &options, batch, &stop, &mut wake, &mut held,
            );
            let mut current = std::pin::pin!(current);
            loop {
                tokio::select! {
                    result = &mut current => break result,
                    () = &mut shutdown, if !stop.load(Ordering::Relaxed) => stop.store(true, Ordering::Relaxed),
                }
            }
        };
        let advanced = match result {
            Ok(summary) => {
                let advanced = summary.advanced > 0;
                total += summary;
                advanced
            }
            Err(error) => {
                (options.log)(&ResumeLogEvent::PassFailed {
                    error: error_chain(&error),
                });
                false
            }
        };
        // Stopped with runs still held (they were handed over as the shutdown came): the next
        // pass, stopping, waits for them.
        if stop.load(Ordering::Relaxed) && held.is_empty() {
            give_back_hand_offs(&store, &options).await;
            return total;
        }
        // A pass that reached its claim limit left runs going: the next one takes them over.
        if advanced || !held.is_empty() {
            continue;
        }
        let hand_off = options.hand_off.as_ref();
        tokio::select! {
            biased;
            () = &mut shutdown => {
                give_back_hand_offs(&store, &options).await;
                return total;
            }
            // A run started in this process was handed to this loop: the next pass takes it.
            () = async { hand_off.expect("guarded").delivered().await }, if hand_off.is_some() => {}
            reason = wake.wait(keiro_journal::store::stretched(options.poll_interval)) => {
                if reason == WakeReason::Reconnected {
                    tracing::debug!("wake source reconnected; polling at once");
                }
            }
        }
    }
}

/// Closes the loop's hand-off, if it has one, and gives back the leases of the runs delivered
/// to it and not taken, so other workers claim them at once.
async fn give_back_hand_offs(store: &Arc<dyn LeaseStore>, options: &ResumeOptions) {
    let Some(hand_off) = &options.hand_off else {
        return;
    };
    for delivered in hand_off.close() {
        let claim = &delivered.claim;
        release(store, options, &claim.instance.key, &claim.fence, false).await;
    }
}
