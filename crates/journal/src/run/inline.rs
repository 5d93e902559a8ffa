//! The inline operations over a store: start an instance, drive it once, cancel it, deliver
//! a value to its awaits; and their errors.

use std::sync::Arc;

use serde::Serialize;

use crate::model::id;
use crate::run::{drive, Driven, RunError};
use crate::store::contract::{self as store, Append, AppendOutcome, DeliveryOutcome, JournalStore};
use crate::{
    encode_payload, Deliveries, DeliveryBacklog, Event, Generation, InstanceKey, Marker,
    RunOptions, RunStats, StartRequest, Started, Status, StepKind, Workflow, WorkflowError,
};

/// Errors of the inline operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A name, id or step name was invalid.
    #[error("invalid identifier")]
    InvalidId(#[from] id::IdError),
    /// A payload did not encode or was too large.
    #[error("invalid payload")]
    Payload(#[source] WorkflowError),
    /// The store failed.
    #[error("store operation failed")]
    Store(#[from] store::Error),
    /// A delivery was refused and nothing was written.
    #[error("delivery to step {step:?} refused: {reason}")]
    DeliveryRefused {
        /// The step delivered to.
        step: String,
        /// Why.
        reason: DeliveryRefusal,
    },
}

/// Why a delivery was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeliveryRefusal {
    /// The delivery's journal name is recorded by another kind of call than an await. No call
    /// of the public API writes an await's name otherwise; a journal written by hand can.
    #[error("the step is recorded by another kind of call than an await")]
    KindMismatch,
    /// The delivery names a generation the instance has left (continue-as-new): it answers
    /// an await that no longer exists.
    #[error("the instance left generation {generation}; it is on {current}")]
    StaleGeneration {
        /// The generation named.
        generation: Generation,
        /// The instance's current generation.
        current: Generation,
    },
    /// The generation holds as many deliveries that no await has read as the caller's
    /// [`DeliveryBacklog`] allows, and this one answers no wait the parked run waits on.
    /// Nothing was written; the run's reads make room again, so a later try may succeed.
    #[error(
        "the instance holds {} deliveries ({} bytes) that no await has read, the most allowed \
         ({} deliveries, {} bytes)",
        .unread.count, .unread.bytes, .backlog.deliveries, .backlog.bytes
    )]
    Backlog {
        /// The unread deliveries the generation holds.
        unread: Deliveries,
        /// The bound they reached.
        backlog: DeliveryBacklog,
    },
}

/// Starts an instance `running` with `input`; idempotent by key (a second start returns the
/// existing instance with `created == false` and leaves its input alone).
///
/// # Errors
///
/// [`Error::Payload`] for an input that does not encode, exceeds `payload_len_max` or holds a
/// value no store keeps (a NUL character in a string);
/// [`Error::Store`] when the store fails.
pub async fn start<I: Serialize + ?Sized>(
    store: &dyn JournalStore,
    key: &InstanceKey,
    input: &I,
    payload_len_max: usize,
) -> Result<Started, Error> {
    let input = encode_payload(crate::workflow::INPUT_STEP, input, payload_len_max)
        .map_err(Error::Payload)?;
    Ok(store
        .instance_start(&StartRequest::new(key.clone(), input))
        .await?)
}

/// Loads the instance and its current generation's journal and drives one run inline.
///
/// # Errors
///
/// [`RunError::Store`] with a not-found source when the instance was never started, and the
/// errors of [`drive`].
pub async fn run(
    store: Arc<dyn JournalStore>,
    key: &InstanceKey,
    workflow: &dyn Workflow,
    options: RunOptions,
) -> Driven {
    let loaded = async {
        let instance = store
            .instance_get(key)
            .await?
            .ok_or_else(|| store::Error::NotFound { key: key.clone() })?;
        let journal = store.journal_load(key, instance.generation).await?;
        Ok::<_, store::Error>((instance, journal))
    }
    .await;
    match loaded {
        Ok((instance, journal)) => drive(store, workflow, &instance, &journal, options).await,
        Err(source) => Driven {
            result: Err(RunError::Store {
                key: key.clone(),
                source,
            }),
            stats: RunStats::default(),
            parked: None,
        },
    }
}

/// What `cancel` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The cancel marker was appended; the run stops at its next boundary.
    Recorded,
    /// The instance was already cancelled, completed or failed.
    AlreadyTerminal(Status),
}

/// Appends the cancel marker to the instance's current generation, and with `cascade` to every
/// live descendant, in one transaction. First writer wins against completion and failure:
/// exactly one marker closes a generation.
///
/// # Errors
///
/// [`store::Error::NotFound`] for an instance that was never started.
pub async fn cancel(
    store: &dyn JournalStore,
    key: &InstanceKey,
    cascade: bool,
) -> Result<CancelOutcome, store::Error> {
    match cancel_outcome(store.instance_cancel(key, cascade).await?) {
        Some(outcome) => Ok(outcome),
        // A rotation committed between reading and appending; the new generation is live.
        None => Box::pin(cancel(store, key, cascade)).await,
    }
}

/// What the store's answer to `instance_cancel` means to the caller; `None` for
/// [`AppendOutcome::Conflict`] (a rotation committed between reading and appending), which
/// the caller answers by cancelling again, now in the new generation.
///
/// ```
/// use keiro_journal::{store::cancel_outcome, AppendOutcome, CancelOutcome};
/// assert_eq!(cancel_outcome(AppendOutcome::Appended), Some(CancelOutcome::Recorded));
/// assert_eq!(cancel_outcome(AppendOutcome::Conflict), None);
/// ```
pub fn cancel_outcome(outcome: AppendOutcome) -> Option<CancelOutcome> {
    match outcome {
        AppendOutcome::Appended => Some(CancelOutcome::Recorded),
        AppendOutcome::AlreadyPresent(_) => Some(CancelOutcome::AlreadyTerminal(Status::Cancelled)),
        AppendOutcome::RefusedTerminal(marker) => {
            Some(CancelOutcome::AlreadyTerminal(match marker {
                Marker::Completed => Status::Completed,
                Marker::Failed => Status::Failed,
                Marker::Cancelled => Status::Cancelled,
                // The store cancels the current generation, which no rotation can have closed.
                Marker::ContinuedAsNew => Status::Running,
            }))
        }
        AppendOutcome::Conflict => None,
    }
}

/// Journals `value` under the user step `step` of the instance's current generation, for a run
/// waiting in [`Ctx::await_step`](crate::Ctx::await_step). Idempotent: a second delivery returns
/// [`AppendOutcome::AlreadyPresent`] with the first value.
///
/// A delivery may arrive before the run reaches its await: it waits in the journal, under
/// `await:<step>`, which only an await of that name reads. So a delivery that names a step the
/// body runs itself with `ctx.step`, before or after the body gets there, changes nothing the
/// run does; nor does one no await ever reads. When the caller knows which generation the
/// await belongs to (a run that continues as new awaits the same step name again in each
/// generation), [`deliver_to`] binds the delivery to it.
///
/// Deliveries no await has read are bounded per generation by `backlog` (see
/// [`DeliveryBacklog`]): past it a delivery is refused, unless it answers a wait the parked run
/// waits on.
///
/// # Errors
///
/// [`Error::InvalidId`] for a reserved or invalid step name, [`Error::Payload`] for a bad
/// payload, [`Error::DeliveryRefused`] with [`DeliveryRefusal::Backlog`] past the backlog,
/// [`Error::Store`] when the store fails.
pub async fn deliver<T: Serialize + ?Sized>(
    store: &dyn JournalStore,
    key: &InstanceKey,
    step: &str,
    value: &T,
    payload_len_max: usize,
    backlog: &DeliveryBacklog,
) -> Result<AppendOutcome, Error> {
    deliver_at(store, key, None, step, value, payload_len_max, backlog).await
}

/// [`deliver`] to generation `generation` only: a delivery that answers an await of a
/// generation the instance has left (a webhook retried after a continue-as-new) is refused
/// with [`DeliveryRefusal::StaleGeneration`] instead of being taken by the next generation's
/// await of the same name. A body hands out its generation with [`Ctx::generation`](crate::Ctx::generation).
///
/// # Errors
///
/// As [`deliver`].
pub async fn deliver_to<T: Serialize + ?Sized>(
    store: &dyn JournalStore,
    key: &InstanceKey,
    generation: Generation,
    step: &str,
    value: &T,
    payload_len_max: usize,
    backlog: &DeliveryBacklog,
) -> Result<AppendOutcome, Error> {
    deliver_at(
        store,
        key,
        Some(generation),
        step,
        value,
        payload_len_max,
        backlog,
    )
    .await
}

async fn deliver_at<T: Serialize + ?Sized>(
    store: &dyn JournalStore,
    key: &InstanceKey,
    generation: Option<Generation>,
    step: &str,
    value: &T,
    payload_len_max: usize,
    backlog: &DeliveryBacklog,
) -> Result<AppendOutcome, Error> {
    let append = delivery_append(key, generation, step, value, payload_len_max)?;
    match store.delivery_append(&append, backlog).await? {
        // The store's conflict: the generation named is not current, or the step is recorded
        // by another kind of call in it. Nothing was written either way.
        DeliveryOutcome::Append(AppendOutcome::Conflict) => {
            let current = store
                .instance_get(key)
                .await?
                .ok_or_else(|| store::Error::NotFound { key: key.clone() })?
                .generation;
            Err(delivery_refused(step, generation, current))
        }
        DeliveryOutcome::Append(outcome) => Ok(outcome),
        DeliveryOutcome::Backlog(unread) => Err(delivery_backlogged(step, unread, *backlog)),
    }
}

/// The error of a delivery the store refused with [`DeliveryOutcome::Backlog`]: the
/// generation holds `unread` deliveries no await has read, as many as `backlog` allows.
pub fn delivery_backlogged(step: &str, unread: Deliveries, backlog: DeliveryBacklog) -> Error {
    Error::DeliveryRefused {
        step: step.to_owned(),
        reason: DeliveryRefusal::Backlog { unread, backlog },
    }
}

/// The append a [`deliver`] (with `generation`: a [`deliver_to`]) makes, after the same
/// checks: for a store's own form of a delivery (such as one inside a caller's transaction)
/// that must validate and encode exactly as `deliver` does.
///
/// # Errors
///
/// [`Error::InvalidId`] for a reserved or invalid step name, [`Error::Payload`] for a bad
/// payload.
pub fn delivery_append<T: Serialize + ?Sized>(
    key: &InstanceKey,
    generation: Option<Generation>,
    step: &str,
    value: &T,
    payload_len_max: usize,
) -> Result<Append, Error> {
    id::validate_user_step(step)?;
    let value = encode_payload(step, value, payload_len_max).map_err(Error::Payload)?;
    let event = Event::StepRecorded {
        step: crate::model::event::await_step_name(step),
        kind: StepKind::Await,
        result: value,
    };
    Ok(Append {
        generation,
        ..Append::external(key.clone(), event)
    })
}

/// The error of a delivery of [`delivery_append`] that the store answered with
/// [`AppendOutcome::Conflict`], given the instance's `current` generation: the generation
/// named is stale, or else the delivery's `await:` name holds another kind of record (only in
/// a journal written by hand).
pub fn delivery_refused(step: &str, generation: Option<Generation>, current: Generation) -> Error {
    let reason = match generation {
        Some(generation) if generation != current => DeliveryRefusal::StaleGeneration {
            generation,
            current,
        },
        _ => DeliveryRefusal::KindMismatch,
    };
    Error::DeliveryRefused {
        step: step.to_owned(),
        reason,
    }
}
