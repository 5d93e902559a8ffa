//! keiro-journal: the append-only workflow journal, replay, and the workflow context.
//!
//! A workflow is an ordinary async function taking a [`Ctx`] and a serde input. Every
//! [`Ctx::step`] result is journaled; when the run is driven again (after a crash, a deploy, or
//! a wake) journaled steps return their recorded value without running, and only the
//! un-journaled tail runs. This crate holds the model and the storage contract; it knows
//! nothing of Postgres (see `keiro-postgres`) or of workers (see `keiro-resume`).
//!
//! ```no_run
//! use std::sync::Arc;
//! use keiro_journal::{run, start, workflow_fn, Ctx, InstanceKey, JournalStore, RunOptions, WorkflowError};
//!
//! async fn greet(ctx: Ctx, name: String) -> Result<String, WorkflowError> {
//!     let greeting: String = ctx
//!         .step("compose", || async move { Ok::<_, std::io::Error>(format!("hello {name}")) })
//!         .await?;
//!     Ok(greeting)
//! }
//!
//! # async fn demo(store: Arc<dyn JournalStore>) -> Result<(), Box<dyn std::error::Error>> {
//! let key = InstanceKey::parse("greet", "greet-1")?;
//! start(store.as_ref(), &key, "ada", keiro_journal::PAYLOAD_LEN_MAX_DEFAULT).await?;
//! let driven = run(store, &key, workflow_fn(greet).as_ref(), RunOptions::default()).await;
//! println!("{:?}", driven.result?);
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//!
//! - A step whose result is journaled never runs again; each `(instance, generation, step)` is
//!   journaled exactly once, and racing writers adopt the first result
//!   ([`AppendOutcome::AlreadyPresent`]).
//! - Lifecycle markers are first-writer-wins per generation; after `failed` or `cancelled` no
//!   step lands; a late append never moves a terminal instance row.
//! - Code that no longer matches its journal stops with `NonDeterminism` before any side effect
//!   (the rule is in the `replay` module docs, repeated on [`RunError::NonDeterminism`]).
//!
//! # Errors
//!
//! Identities are validated ([`IdError`]); store operations return [`StoreError`]; a body
//! sees [`WorkflowError`]; a drive ends in [`RunOutcome`] or [`RunError`].

mod backoff;
mod batch;
mod ctx;
mod diagnostics;
mod faults;
mod inspect;
mod model;
mod retention;
mod run;
mod state;
pub mod store;
mod store_span;
mod unwind;
mod workflow;

pub use backoff::{stretched, unit_random, Backoff, InvalidBackoff};
pub use batch::{
    run_batches, BatchLimits, Batcher, SharedSlots, Slot, BATCHES_IN_FLIGHT_DEFAULT,
    BATCH_LEN_MAX_DEFAULT,
};
pub use ctx::awakeables::Awakeable;
pub use ctx::transaction::{LeaseHeld, SelfJournalError, SelfJournaled, StepJournal};
pub use ctx::Ctx;
pub use diagnostics::{error_chain, panic_message};
pub use faults::Faults;
pub use inspect::{
    parse_status, AwakeableInfo, Counts, Cursor, FilterError, GroupCount, InspectStore,
    InstanceSummary, ListFilter, ListOrder, ListRequest, Page, SignalWaitInfo, StatusCount,
    TimeRange, TimerInfo, TimerState, Waits, ID_PREFIX_LEN_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX,
    WAITS_LIMIT_DEFAULT,
};
pub use model::budget::{
    encoded_len, JournalBudget, JOURNAL_BYTES_MAX_DEFAULT, JOURNAL_STEPS_MAX_DEFAULT,
};
pub use model::delivery::{
    Deliveries, DeliveryBacklog, DELIVERIES_UNREAD_BYTES_MAX_DEFAULT, DELIVERIES_UNREAD_MAX_DEFAULT,
};
pub use model::error::WorkflowError;
pub use model::event::{
    logical_step, marker_name, revised_step, step_revision, EncodedEvent, Event, Generation,
    JournalEntry, MalformedEvent, Marker, StepKind,
};
pub use model::id::{
    IdError, InstanceKey, IntoInstanceKey, WorkflowId, WorkflowName, ID_LEN_MAX,
    RESERVED_STEP_PREFIXES,
};
pub use model::instance::{Fence, Instance, StartRequest, Started, Status};
pub use model::observe::{StepObserver, TraceContext};
pub use model::payload::encode_payload;
pub use model::remote::{
    remote_group, remote_step_id, RemoteArm, RemoteArmOutcome, RemoteHandlerDef, RemoteOptions,
    RemoteStepError, REDISPATCH_MAX_DEFAULT,
};
pub use model::retry::{StepOptions, STEP_ATTEMPTS_DEFAULT};
pub use model::storable::{check_value, storable_text};
pub use model::wake::{
    awakeable_step, child_result_step, validate_signal_token, AwakeableOutcome, AwakeableStatus,
    ChildSpawn, Envelope, FiredTimer, ReturnedSignal, SignalOptions, SignalSendOutcome, SignalWait,
    SignalWaitOutcome, TimerArm, TimerDue, TimerFiring, TimerKind, SIGNAL_TTL_DEFAULT,
    SIGNAL_TTL_MAX,
};
pub use retention::{GcBatch, GcRequest, RetentionStore, GC_BATCH_DEFAULT, GC_BATCH_MAX};
pub use run::inline::{
    cancel, cancel_outcome, deliver, deliver_to, delivery_append, delivery_backlogged,
    delivery_refused, run, start, CancelOutcome, DeliveryRefusal, Error,
};
pub use run::{drive, drive_notifying, Driven, RunError, RunOutcome};
pub use state::options::{
    RunOptions, LEASE_TTL_DEFAULT, PAYLOAD_LEN_MAX_DEFAULT, RECONCILE_DEFAULT,
};
pub use state::{Parked, RunStats};
pub use store::{
    Append, AppendOutcome, ClosingOutcome, DeliveryOutcome, Error as StoreError, JournalStore,
    Park, ParkOutcome,
};
pub use store_span::{traced, SpanOutcome, STORE_SPAN_TARGET};
pub use workflow::{workflow_fn, BoxFuture, FnWorkflow, Workflow, INPUT_STEP, OUTPUT_STEP};

// What `store_span!` expands to, from crates that need not depend on `tracing` themselves.
#[doc(hidden)]
pub mod __private {
    pub use tracing;
}

/// Validates a user step name: non-empty, bounded, no control characters, no reserved prefix.
///
/// # Errors
///
/// [`IdError`] naming the rule broken.
pub fn validate_step_name(name: &str) -> Result<(), IdError> {
    model::id::validate_user_step(name)
}
