//! The storage contract of the journal: whole atomic operations, never loose row writes.
//!
//! Every method is one transaction in the Postgres store and one critical section in the
//! memory store. The conformance suite in the workspace `tests/` crate runs against both; the
//! rule-by-rule contract it checks is `docs/store-contract.md` at the repository root.
//!
//! This module is the one path for store authors: the contract (`contract.rs`) and, re-exported
//! beside it, the machinery of the run that stores and workers share. The contract itself
//! depends on the journal's data only, so the run can depend on it without a cycle.

pub(crate) mod contract;

pub use contract::*;

// What a store's implementation and the crates that drive one use besides the trait: the
// requests and outcomes of its operations, the journal's reserved step names, the checks a
// stored value passes, and the helpers the run, the workers and the stores share. The crate
// root holds the vocabulary a workflow's author uses; this is the machinery beneath it.
pub use crate::backoff::{stretched, unit_random};
pub use crate::ctx::run_store;
pub use crate::ctx::transaction::{LeaseHeld, SelfJournalError, SelfJournaled, StepJournal};
pub use crate::faults::Faults;
pub use crate::inspect::{
    TerminalCount, Throughput, ThroughputRequest, THROUGHPUT_BUCKETS_MAX, THROUGHPUT_BUCKET_MAX,
};
pub use crate::model::budget::encoded_len;
pub use crate::model::event::{
    logical_step, marker_name, revised_step, step_revision, EncodedEvent, MalformedEvent,
};
pub use crate::model::instance::StartRequest;
pub use crate::model::message::{validate_message_key, EVENT_STEP_PREFIX, STREAM_STEP_PREFIX};
pub use crate::model::payload::encode_payload;
pub use crate::model::remote::{remote_group, remote_step_id, RemoteArm, RemoteArmOutcome};
pub use crate::model::storable::{check_value, storable_text};
pub use crate::model::update::validate_store_token;
pub use crate::model::wake::{
    awakeable_step, child_result_step, validate_signal_token, ChildSpawn, FiredTimer,
    ReturnedSignal, SignalWait, SignalWaitOutcome, TimerArm, TimerDue,
};
pub use crate::payloads::{
    PayloadColumn, PayloadPlace, PayloadRewrite, PayloadStore, StoredPayload, TextKey,
    PAYLOAD_PLACES,
};
pub use crate::run::drive_notifying;
pub use crate::run::inline::{
    cancel_outcome, delivery_append, delivery_backlogged, delivery_refused,
};
pub use crate::state::Parked;
pub use crate::workflow::{INPUT_STEP, OUTPUT_STEP};
