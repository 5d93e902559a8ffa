//! For workflow authors, beyond the root: the [`Workflow`] trait behind hand-written
//! workflows, what driving a run returns, the journal budget, deliveries and awakeables, the
//! identities an [`InstanceKey`](crate::InstanceKey) is made of, and the helpers that describe
//! an error, and the search attributes a body sets (`Ctx::set_attributes`).

pub use keiro_journal::attribute::{
    AttrError, AttrValue, Attributes, ATTRIBUTES_MAX, ATTRIBUTE_NAME_LEN_MAX,
    ATTRIBUTE_TEXT_LEN_MAX,
};
pub use keiro_journal::message::{
    StreamBudget, STREAM_BYTES_MAX_DEFAULT, STREAM_GENERATION_BYTES_MAX_DEFAULT,
    STREAM_GENERATION_ITEMS_MAX_DEFAULT, STREAM_ITEMS_MAX_DEFAULT,
};
pub use keiro_journal::{
    error_chain, panic_message, workflow_fn, Awakeable, AwakeableOutcome, BoxFuture, Deliveries,
    DeliveryBacklog, DeliveryRefusal, Driven, IdError, IntoInstanceKey, JournalBudget, RunError,
    RunOptions, RunOutcome, RunStats, SignalSendOutcome, Workflow, WorkflowId, WorkflowName,
    SIGNAL_TTL_DEFAULT,
};

pub use crate::messages::StreamReader;
pub use crate::result::{RESULT_POLL_INTERVAL_DEFAULT, RESULT_POLL_INTERVAL_MIN};
pub use crate::updates::{UpdateCall, UPDATE_TIMEOUT_DEFAULT};
pub use keiro_journal::update::{SignalStarted, Update, UpdateRecord, UpdateState};
