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
//! The crate root is the journal's vocabulary: the context, the errors, identities, events,
//! instances, the options of steps and runs, and the store traits. The machinery beneath it is
//! for the crates that implement a store or drive runs: [`store`] (the storage contract, the
//! requests and outcomes of its operations, and the helpers the stores and workers share),
//! [`batch`] (natural batching) and [`span`] (the `tracing` span of each store operation).
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
pub mod batch;
mod ctx;
mod diagnostics;
mod faults;
mod inspect;
mod model;
mod payloads;
mod retention;
mod run;
mod state;
pub mod store;
/// Payload codecs: the contract of what seals a payload for the store and opens it again (see
/// the module's docs); the facade applies one to every stored payload.
pub mod codec {
    pub use crate::model::codec::{
        first_sealed_key_id, holds_sealed, open_all, open_readable, reseal, sealed_key_id, Codec,
        CodecError, SEALED_KEY_ID, SEALED_TAG,
    };
}

/// Queues: flow-control declarations and what a start on a queue asks (plain data).
pub mod queue {
    pub use crate::model::queue::{
        checked_queue, DebounceRequest, DedupPolicy, Fairness, QueueError, QueueInfo, QueueRefusal,
        QueueSpec, QueueStart, Rate,
    };
}
/// Events and streams: what a running workflow tells its callers (plain data), and their
/// bounds.
pub mod message {
    pub use crate::model::message::{
        EventRead, EventRecord, Messages, StreamBudget, StreamHead, StreamItem, StreamPage,
        STREAM_BYTES_MAX_DEFAULT, STREAM_GENERATION_BYTES_MAX_DEFAULT,
        STREAM_GENERATION_ITEMS_MAX_DEFAULT, STREAM_ITEMS_MAX_DEFAULT,
    };
}
/// Search attributes: the typed name-value pairs a run carries (plain data), their bounds, and
/// the list's filters on them.
pub mod attribute {
    pub use crate::inspect::{AttrFilter, AttrOp, ATTR_FILTERS_MAX};
    pub use crate::model::attribute::{
        validate_attribute_name, AttrError, AttrValue, Attributes, ATTRIBUTES_MAX,
        ATTRIBUTES_STEP_PREFIX, ATTRIBUTE_NAME_LEN_MAX, ATTRIBUTE_TEXT_LEN_MAX,
    };
}
/// Updates: a caller's request into a running run, answered once (plain data).
pub mod update {
    pub use crate::model::update::{
        update_state, update_token, validate_update_id, validate_update_name, SignalStarted,
        Update, UpdateAnswer, UpdateRead, UpdateRecord, UpdateSend, UpdateSendOutcome, UpdateState,
        UPDATE_STEP_PREFIX,
    };
    pub use crate::store::contract::UpdateAnswerOutcome;
}
mod store_span;
mod unwind;
mod workflow;

pub use backoff::{Backoff, InvalidBackoff};
pub use ctx::awakeables::Awakeable;
pub use ctx::{BoxFuture, Ctx};
pub use diagnostics::{error_chain, panic_message};
pub use inspect::{
    parse_status, AwakeableInfo, Counts, Cursor, FilterError, GroupCount, InspectStore,
    InstanceSummary, ListFilter, ListOrder, ListRequest, Page, SignalWaitInfo, StatusCount,
    TimeRange, TimerInfo, TimerState, Waits, ID_PREFIX_LEN_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX,
    WAITS_LIMIT_DEFAULT,
};
pub use model::budget::{JournalBudget, JOURNAL_BYTES_MAX_DEFAULT, JOURNAL_STEPS_MAX_DEFAULT};
pub use model::delivery::{
    Deliveries, DeliveryBacklog, DELIVERIES_UNREAD_BYTES_MAX_DEFAULT, DELIVERIES_UNREAD_MAX_DEFAULT,
};
pub use model::error::WorkflowError;
pub use model::event::{Event, Generation, JournalEntry, Marker, StepKind};
pub use model::id::{
    IdError, InstanceKey, IntoInstanceKey, WorkflowId, WorkflowName, ID_LEN_MAX,
    RESERVED_STEP_PREFIXES,
};
pub use model::instance::{Fence, Instance, Started, Status};
pub use model::observe::{StepObserver, TraceContext};
pub use model::remote::{RemoteHandlerDef, RemoteOptions, RemoteStepError, REDISPATCH_MAX_DEFAULT};
pub use model::retry::{StepOptions, STEP_ATTEMPTS_DEFAULT};
pub use model::wake::{
    AwakeableOutcome, AwakeableStatus, Envelope, SignalOptions, SignalSendOutcome, TimerFiring,
    TimerKind, SIGNAL_TTL_DEFAULT, SIGNAL_TTL_MAX,
};
pub use retention::{GcBatch, GcRequest, RetentionStore, GC_BATCH_DEFAULT, GC_BATCH_MAX};
pub use run::inline::{
    cancel, deliver, deliver_to, run, start, CancelOutcome, DeliveryRefusal, Error,
};
pub use run::{drive, Driven, RunError, RunOutcome};
pub use state::options::{
    RunOptions, LEASE_TTL_DEFAULT, PAYLOAD_LEN_MAX_DEFAULT, RECONCILE_DEFAULT,
};
pub use state::RunStats;
pub use store::{Append, AppendOutcome, Error as StoreError, JournalStore};
pub use workflow::{workflow_fn, FnWorkflow, Workflow};

// The machinery, public under `batch`, `store` and `span`, reachable at the crate root for this
// crate's own modules.
use backoff::unit_random;
use faults::Faults;
use model::budget::encoded_len;
use model::instance::StartRequest;
use model::payload::encode_payload;
use model::remote::{remote_group, remote_step_id, RemoteArm, RemoteArmOutcome};
use model::storable::{check_value, storable_text};
use model::wake::{
    awakeable_step, child_result_step, validate_signal_token, ChildSpawn, ReturnedSignal,
    SignalWait, SignalWaitOutcome, TimerArm, TimerDue,
};

/// The `tracing` span each store operation runs in: [`store_span!`] opens it, [`span::traced`]
/// runs an operation in it. For the crates that implement a store.
pub mod span {
    pub use crate::store_span::{traced, SpanOutcome, STORE_SPAN_TARGET};
    /// What [`store_span!`](crate::store_span) expands to, so a store crate need not depend on
    /// `tracing` itself.
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
