//! Driving one run of a workflow body against its journal, and settling how it ended (its
//! completion, park or failure). The inline operations built on it (`start`, `run`,
//! `cancel`, `deliver`) are in [`inline`].

pub(crate) mod inline;

use std::sync::Arc;

use serde_json::Value;

use crate::model::budget::JournalSize;
use crate::model::payload::check_payload;
use crate::state::held_back::{drive_body, HeldBack};
use crate::state::replay::Replay;
use crate::state::{Halt, Parked, RunStats};
use crate::store::contract::{
    self as store, Append, AppendOutcome, JournalStore, Park, ParkOutcome,
};
use crate::unwind::CatchPanic;
use crate::{
    Ctx, Event, Generation, Instance, InstanceKey, JournalEntry, Marker, RunOptions, Status,
    Workflow, WorkflowError,
};

/// How a run ended normally.
#[derive(Debug, Clone, PartialEq)]
pub enum RunOutcome {
    /// The body returned; carries the recorded output.
    Completed(Value),
    /// The run is parked on a wake source.
    Suspended,
    /// The instance is failed.
    Failed,
    /// The instance is cancelled.
    Cancelled,
    /// The generation closed and the instance continues on `generation`.
    ContinuedAsNew {
        /// The new generation.
        generation: Generation,
    },
}

/// Why a run stopped abnormally.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The run's lease was lost; it stopped before any further side effect. Not a crash.
    #[error("lease on {key} lost")]
    LeaseLost {
        /// The instance.
        key: InstanceKey,
    },
    /// A store call failed. Transient: the run will be driven again; not a crash.
    #[error("store error while driving {key}")]
    Store {
        /// The instance.
        key: InstanceKey,
        /// The store's error.
        #[source]
        source: store::Error,
    },
    /// The code no longer matches the journal; the instance is parked `failed` with this reason
    /// and nothing was appended.
    #[error("{key} diverged from its journal at step {step:?}: {detail}")]
    NonDeterminism {
        /// The instance.
        key: InstanceKey,
        /// Where.
        step: String,
        /// What differs.
        detail: String,
    },
    /// An append met a generation or kind conflict. Transient.
    #[error("append of step {step:?} to {key} conflicted")]
    Conflict {
        /// The instance.
        key: InstanceKey,
        /// The step.
        step: String,
    },
    /// The body returned an error or panicked: a crash, counted by the resume worker.
    #[error("{key} crashed: {message}")]
    Crashed {
        /// The instance.
        key: InstanceKey,
        /// The error chain, rendered.
        message: String,
    },
}

impl RunError {
    /// Whether this is a crash (counts an attempt), as opposed to a skip or a transient error.
    pub fn is_crash(&self) -> bool {
        matches!(self, Self::Crashed { .. })
    }
}

/// The result of one drive and what it did.
#[derive(Debug)]
pub struct Driven {
    /// How the run ended.
    pub result: Result<RunOutcome, RunError>,
    /// What it did.
    pub stats: RunStats,
    /// How the park went, when the run parked: lets a caller tell a wake that landed mid-run
    /// from a due deadline without reading the row again.
    pub parked: Option<Parked>,
}

/// Drives one run of `workflow` for `instance` over its preloaded `journal` (the instance's
/// current generation).
///
/// The caller owns the lease, if any (`options.fence`). Completion and parking release it in
/// their own transaction; every other ending leaves release to the caller.
pub async fn drive(
    store: Arc<dyn JournalStore>,
    workflow: &dyn Workflow,
    instance: &Instance,
    journal: &[JournalEntry],
    options: RunOptions,
) -> Driven {
    drive_notifying(store, workflow, instance, journal, options, || {}).await
}

/// [`drive`], calling `body_returned` once the body has returned or panicked (or at once, for a
/// terminal instance, which runs no body), before the run's closing write (its completion,
/// park or failure) is sent.
///
/// A worker counts a run against its concurrency until then: what is left is one store write
/// that runs no workflow code, so the run's slot can go to the next run while that write
/// waits for its commit (River's workers give a job's slot back when its work returns, and
/// complete jobs in batches, the same way). The drive still waits for the write, and its
/// outcome is the one [`drive`] gives.
pub async fn drive_notifying(
    store: Arc<dyn JournalStore>,
    workflow: &dyn Workflow,
    instance: &Instance,
    journal: &[JournalEntry],
    options: RunOptions,
    body_returned: impl FnOnce() + Send,
) -> Driven {
    if instance.status.is_terminal() {
        body_returned();
        let result = Ok(outcome_of_status(instance));
        return Driven {
            result,
            stats: RunStats::default(),
            parked: None,
        };
    }
    let key = instance.key.clone();
    let generation = instance.generation;
    let entries: Vec<JournalEntry> = journal
        .iter()
        .filter(|e| e.generation == generation)
        .cloned()
        .collect();
    let ctx = Ctx::new(
        store.clone(),
        key.clone(),
        generation,
        Replay::new(&entries),
        JournalSize::of(&entries),
        options.clone(),
    );
    let body = CatchPanic::new(workflow.call(ctx.clone(), instance.input.clone()));
    let body = drive_body(&ctx.inner, body).await;
    body_returned();
    let result = settle(&store, &ctx, &options, body).await;
    let (stats, parked) = {
        let state = ctx.state();
        (state.stats, state.parked)
    };
    Driven {
        result,
        stats,
        parked,
    }
}

async fn settle(
    store: &Arc<dyn JournalStore>,
    ctx: &Ctx,
    options: &RunOptions,
    body: Result<Result<Value, WorkflowError>, String>,
) -> Result<RunOutcome, RunError> {
    let key = ctx.key().clone();
    // A step the body held back goes with the completion, or alone before any other ending
    // (dropped when the run halted: it stops before any further write).
    let completes = matches!(&body, Ok(Ok(_))) && {
        let state = ctx.state();
        state.halt.is_none() && state.awaiting.is_empty()
    };
    let held = if completes {
        ctx.inner.take_held_back()
    } else {
        flush_held_back(ctx).await;
        None
    };
    let (halt, store_error, awaiting, wake_at, open_ended) = {
        let mut state = ctx.state();
        (
            state.halt.take(),
            state.store_error.take(),
            std::mem::take(&mut state.awaiting),
            state.wake_at,
            state.open_ended,
        )
    };
    let store_err = |source| RunError::Store {
        key: key.clone(),
        source,
    };
    match halt {
        Some(Halt::LeaseLost) => return Err(RunError::LeaseLost { key }),
        Some(Halt::Store) => {
            let source = store_error.unwrap_or_else(|| store::Error::Malformed {
                operation: "driving a run",
                detail: "a store halt without its error".into(),
            });
            return Err(store_err(source));
        }
        Some(Halt::Conflict { step }) => return Err(RunError::Conflict { key, step }),
        Some(Halt::NonDeterminism { step, detail }) => {
            return park_diverged(store, ctx, options, step, detail).await;
        }
        Some(Halt::Terminal(marker)) => return outcome_of_marker(store, &key, marker).await,
        Some(Halt::Fail { reason }) => return fail_run(store, ctx, options, &reason).await,
        Some(Halt::Crash { message }) => return Err(RunError::Crashed { key, message }),
        Some(Halt::ContinueAsNew { input }) => {
            let next_generation = ctx.generation() + 1;
            let event = Event::WorkflowContinuedAsNew {
                next_generation,
                input,
            };
            return match append_marker(store, ctx, options, event).await? {
                AppendOutcome::Appended | AppendOutcome::AlreadyPresent(_) => {
                    Ok(RunOutcome::ContinuedAsNew {
                        generation: next_generation,
                    })
                }
                AppendOutcome::RefusedTerminal(marker) => {
                    outcome_of_marker(store, &key, marker).await
                }
                AppendOutcome::Conflict => Err(RunError::Conflict {
                    key,
                    step: Marker::ContinuedAsNew.step_name().into(),
                }),
            };
        }
        None => {}
    }
    match body {
        Err(panic) => Err(RunError::Crashed {
            key,
            message: format!("panicked: {panic}"),
        }),
        Ok(result)
            if !awaiting.is_empty()
                && matches!(&result, Ok(_) | Err(WorkflowError::Suspended { .. })) =>
        {
            let reconcile = if open_ended {
                options.reconcile.map(|r| options.store_now() + r)
            } else {
                None
            };
            let wake_after = match (wake_at, reconcile) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let park = Park {
                key: key.clone(),
                generation: ctx.generation(),
                fence: options.fence.clone(),
                awaited: awaiting,
                wake_after,
            };
            // What the awaits read no longer counts against the deliveries' bound: the store
            // learns it before the run parks, when the next delivery may need the room.
            let read = ctx.state().replay.deliveries_read();
            if read.count > 0 {
                store
                    .deliveries_read(&key, ctx.generation(), read)
                    .await
                    .map_err(store_err)?;
            }
            let deferred = std::mem::take(&mut ctx.state().deferred);
            let parked = if deferred.is_empty() {
                store.instance_park(&park).await
            } else {
                // The dispatches the body deferred go with the park, in one transaction.
                store
                    .instance_park_dispatch(&park, &deferred)
                    .await
                    .map(|(outcome, arms)| {
                        for (arm, outcome) in deferred.iter().zip(&arms) {
                            outcome.observe(options.observer.as_ref(), &arm.group);
                        }
                        outcome
                    })
            };
            if let Ok(outcome) = &parked {
                ctx.state().parked = Some(Parked {
                    outcome: *outcome,
                    wake_after,
                });
            }
            match parked {
                Ok(ParkOutcome::Suspended | ParkOutcome::WokenBeforePark) => {
                    Ok(RunOutcome::Suspended)
                }
                Ok(ParkOutcome::Terminal(status)) => {
                    let row = store.instance_get(&key).await.map_err(store_err)?;
                    Ok(row.map_or(RunOutcome::Cancelled, |r| {
                        outcome_of_status(&Instance { status, ..r })
                    }))
                }
                Err(e) if e.is_lease_lost() => Err(RunError::LeaseLost { key }),
                Err(e @ store::Error::ValueRefused { .. }) => {
                    fail_run(store, ctx, options, &e.to_string()).await
                }
                Err(e) => Err(store_err(e)),
            }
        }
        Ok(Ok(output)) => {
            // The body is done: a body-recorded step it never reached is a divergence.
            let unreached = ctx.state().replay.first_unconsumed().map(str::to_owned);
            if let Some(step) = unreached {
                let detail =
                    format!("recorded step {step:?} was never reached before the body returned");
                send_alone(ctx, held).await;
                return park_diverged(store, ctx, options, step, detail).await;
            }
            // An output that cannot be stored fails the run: the body would return it again.
            let output_step = crate::workflow::OUTPUT_STEP;
            let checked =
                check_payload(output_step, &output, options.payload_len_max).and_then(|()| {
                    crate::check_value(&output).map_err(|reason| WorkflowError::PayloadRefused {
                        step: output_step.into(),
                        reason,
                    })
                });
            if let Err(e) = checked {
                send_alone(ctx, held).await;
                return fail_run(store, ctx, options, &crate::error_chain(&e)).await;
            }
            let event = Event::WorkflowCompleted {
                output: output.clone(),
            };
            let appended = match held {
                None => append_marker(store, ctx, options, event).await,
                Some(held) => append_closing(store, ctx, options, held, event).await,
            };
            match appended {
                Ok(AppendOutcome::Appended) => {
                    settle_leftovers(store, ctx).await;
                    Ok(RunOutcome::Completed(output))
                }
                Ok(AppendOutcome::AlreadyPresent(recorded)) => Ok(RunOutcome::Completed(recorded)),
                Ok(AppendOutcome::RefusedTerminal(marker)) => {
                    outcome_of_marker(store, &key, marker).await
                }
                Ok(AppendOutcome::Conflict) => Err(RunError::Conflict {
                    key,
                    step: Marker::Completed.step_name().into(),
                }),
                Err(RunError::Store {
                    source: source @ store::Error::ValueRefused { .. },
                    ..
                }) => fail_run(store, ctx, options, &source.to_string()).await,
                Err(e) => Err(e),
            }
        }
        // The body's own failure, or one every retry would meet again: final, not a crash.
        Ok(Err(error)) if error.fails_run_at_once() => {
            fail_run(store, ctx, options, &crate::error_chain(&error)).await
        }
        Ok(Err(error)) => Err(RunError::Crashed {
            key,
            message: crate::error_chain(&error),
        }),
    }
}

/// After a completion: a run that decided a race or allocated an awakeable may have left a
/// losing branch's remote task or an unawaited awakeable live; settle them (one call, only for
/// such runs). Best effort: the run is complete either way, and a task left live only runs
/// for nothing.
async fn settle_leftovers(store: &Arc<dyn JournalStore>, ctx: &Ctx) {
    let may_have = {
        let state = ctx.state();
        state.replay.holds_prefix("race:") || state.replay.holds_prefix("awkid:")
    };
    if !may_have {
        return;
    }
    if let Err(error) = store
        .instance_settle_leftovers(ctx.key(), ctx.generation())
        .await
    {
        tracing::warn!(key = %ctx.key(), %error, "settling a completed run's leftovers failed");
    }
}

/// Closes the generation with the failed marker and `reason` (made storable first).
async fn fail_run(
    store: &Arc<dyn JournalStore>,
    ctx: &Ctx,
    options: &RunOptions,
    reason: &str,
) -> Result<RunOutcome, RunError> {
    let event = Event::WorkflowFailed {
        reason: crate::storable_text(reason).into_owned(),
    };
    match append_marker(store, ctx, options, event).await? {
        AppendOutcome::Appended | AppendOutcome::AlreadyPresent(_) => Ok(RunOutcome::Failed),
        AppendOutcome::RefusedTerminal(marker) => outcome_of_marker(store, ctx.key(), marker).await,
        AppendOutcome::Conflict => Err(RunError::Conflict {
            key: ctx.key().clone(),
            step: Marker::Failed.step_name().into(),
        }),
    }
}

async fn park_diverged(
    store: &Arc<dyn JournalStore>,
    ctx: &Ctx,
    options: &RunOptions,
    step: String,
    detail: String,
) -> Result<RunOutcome, RunError> {
    let key = ctx.key().clone();
    let reason =
        crate::storable_text(&format!("non-determinism at step {step:?}: {detail}")).into_owned();
    match store
        .instance_fail_diverged(&key, options.fence.as_ref(), &reason)
        .await
    {
        Ok(_) => Err(RunError::NonDeterminism { key, step, detail }),
        Err(e) if e.is_lease_lost() => Err(RunError::LeaseLost { key }),
        Err(source) => Err(RunError::Store { key, source }),
    }
}

async fn append_marker(
    store: &Arc<dyn JournalStore>,
    ctx: &Ctx,
    options: &RunOptions,
    event: Event,
) -> Result<AppendOutcome, RunError> {
    let key = ctx.key().clone();
    let append = Append {
        key: key.clone(),
        generation: Some(ctx.generation()),
        event,
        fence: options.fence.clone(),
        renew: None,
    };
    match store.journal_append(&append).await {
        Ok(outcome) => {
            if outcome == AppendOutcome::Appended {
                ctx.state().stats.appended += 1;
            }
            Ok(outcome)
        }
        Err(e) if e.is_lease_lost() => Err(RunError::LeaseLost { key }),
        Err(source) => Err(RunError::Store { key, source }),
    }
}

/// Sends the run's held-back step alone, before the run's other closing write: the journal
/// keeps what the body did, as when each step waited for its append. Dropped when the run
/// halted because it may no longer write (its lease, the store, its generation or its
/// instance gone): it then stops before any further write, and a resumed run runs the step
/// again.
async fn flush_held_back(ctx: &Ctx) {
    let may_write = !matches!(
        ctx.state().halt,
        Some(Halt::LeaseLost | Halt::Store | Halt::Conflict { .. } | Halt::Terminal(_))
    );
    if may_write {
        // An error halts the run, which the settle then reports.
        let _ = ctx.inner.send_held_back().await;
    } else {
        ctx.inner.take_held_back();
    }
}

/// Puts a held-back step taken for the completion back and sends it alone: the run ends
/// otherwise.
async fn send_alone(ctx: &Ctx, held: Option<HeldBack>) {
    if let Some(held) = held {
        ctx.state().held_back = Some(held);
        flush_held_back(ctx).await;
    }
}

/// The completion with the run's held-back last step, in one store call: answers as
/// [`append_marker`] for the completion, or with the step's answer when that did not record
/// the value the body saw (a terminal instance: its marker; otherwise a conflict, and the run
/// is driven again from the journal).
async fn append_closing(
    store: &Arc<dyn JournalStore>,
    ctx: &Ctx,
    options: &RunOptions,
    held: HeldBack,
    event: Event,
) -> Result<AppendOutcome, RunError> {
    let key = ctx.key().clone();
    let completion = Append {
        key: key.clone(),
        generation: Some(ctx.generation()),
        event,
        fence: options.fence.clone(),
        renew: None,
    };
    let sent_at = std::time::Instant::now();
    let closing = match store
        .journal_append_closing(&held.append, &completion)
        .await
    {
        Ok(closing) => closing,
        Err(e) if e.is_lease_lost() => return Err(RunError::LeaseLost { key }),
        Err(source) => return Err(RunError::Store { key, source }),
    };
    if ctx
        .inner
        .held_back_answered(&held, &closing.step, sent_at)
        .is_err()
    {
        return match closing.step {
            AppendOutcome::RefusedTerminal(marker) => Ok(AppendOutcome::RefusedTerminal(marker)),
            _ => Err(RunError::Conflict {
                key,
                step: held.step,
            }),
        };
    }
    match closing.completion {
        Some(outcome) => {
            if outcome == AppendOutcome::Appended {
                ctx.state().stats.appended += 1;
            }
            Ok(outcome)
        }
        // A store that did not try the completion of a step that recorded its value.
        None => Err(RunError::Conflict {
            key,
            step: Marker::Completed.step_name().into(),
        }),
    }
}

async fn outcome_of_marker(
    store: &Arc<dyn JournalStore>,
    key: &InstanceKey,
    marker: Marker,
) -> Result<RunOutcome, RunError> {
    Ok(match marker {
        Marker::Cancelled => RunOutcome::Cancelled,
        Marker::Failed => RunOutcome::Failed,
        Marker::Completed | Marker::ContinuedAsNew => {
            let row = store
                .instance_get(key)
                .await
                .map_err(|source| RunError::Store {
                    key: key.clone(),
                    source,
                })?;
            match row {
                Some(row) if marker == Marker::Completed => outcome_of_status(&row),
                Some(row) => RunOutcome::ContinuedAsNew {
                    generation: row.generation,
                },
                None => RunOutcome::Cancelled,
            }
        }
    })
}

fn outcome_of_status(instance: &Instance) -> RunOutcome {
    match instance.status {
        Status::Completed => RunOutcome::Completed(instance.output.clone().unwrap_or(Value::Null)),
        Status::Failed => RunOutcome::Failed,
        Status::Cancelled => RunOutcome::Cancelled,
        Status::Running | Status::Suspended => RunOutcome::Suspended,
    }
}
