//! Updates: a request a caller sends into a running run, which the run answers once.
//!
//! A caller sends an update (an update name, an update id it chooses, a request) to an
//! instance; the body takes the next update of a name (`ctx.next_update`) and answers it with a
//! reply or a rejection (`ctx.reply`, `ctx.reject`); the caller waits for the answer. The
//! store keeps one row per `(instance, update id)`: the request, its state and the answer. A
//! second send under the same id finds that row (idempotent: the same answer), and one with
//! another name or request under an existing id is a conflict.
//!
//! Delivery rides on the signal machinery: each `(instance, update name)` has a token of its own
//! ([`update_token`], which no user token can equal, since user tokens hold no control
//! character), the send offers the update on that token in the transaction that writes its row,
//! and the body's take is a signal wait on it. So updates are taken first-in first-out per
//! name, a take is journaled (replay takes the same update), a wait parks the run like any
//! await and works as a [`Ctx::select`](crate::Ctx::select) branch (a losing wait is withdrawn,
//! an update it took goes back to the head of its token). The answer is a journaled step of the
//! body (kind [`StepKind::Update`](crate::StepKind::Update)) written with the row's answer in
//! one transaction. When the run ends, every update still unanswered is settled `unanswered` in
//! the transaction that ends it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::id::validate_identity;
use crate::model::instance::StartRequest;
use crate::{IdError, InstanceKey, Status};

/// The journal step-name prefix of an update's take (`update:<name>:<n>`, the `n`-th take of
/// `name` in the generation) and answer (`update:<name>#<update id>`).
pub const UPDATE_STEP_PREFIX: &str = "update:";

/// Checks an update's name: the identity rules (non-empty, at most 200 bytes, no `:`, `#`,
/// `/`, no control character, no surrounding whitespace).
///
/// ```
/// use keiro_journal::update::validate_update_name;
/// assert!(validate_update_name("approve").is_ok());
/// assert!(validate_update_name("a:b").is_err());
/// ```
///
/// # Errors
///
/// [`IdError`] naming the rule broken.
pub fn validate_update_name(name: &str) -> Result<(), IdError> {
    validate_identity("update name", name)
}

/// Checks an update id: the identity rules, as for an instance id.
///
/// ```
/// use keiro_journal::update::validate_update_id;
/// assert!(validate_update_id("approve-1").is_ok());
/// assert!(validate_update_id("").is_err());
/// ```
///
/// # Errors
///
/// [`IdError`] naming the rule broken.
pub fn validate_update_id(id: &str) -> Result<(), IdError> {
    validate_identity("update id", id)
}

/// The signal token the updates named `name` of instance `key` travel on. It starts with a
/// control character (U+001F), which a user's token may not hold, so no signal a caller sends
/// can pose as an update.
///
/// ```
/// # use keiro_journal::{InstanceKey, update::update_token};
/// let key = InstanceKey::parse("order", "order-1")?;
/// assert_eq!(update_token(&key, "approve"), "\u{1f}update/order/order-1/approve");
/// # Ok::<(), keiro_journal::IdError>(())
/// ```
pub fn update_token(key: &InstanceKey, name: &str) -> String {
    format!("\u{1f}update/{}/{}/{name}", key.name, key.id)
}

/// The journal step of the `n`-th take (from 1) of updates named `name`.
pub(crate) fn update_take_step(name: &str, n: u32) -> String {
    format!("{UPDATE_STEP_PREFIX}{name}:{n}")
}

/// The journal step of the answer to update `id` (named `name`).
pub(crate) fn update_answer_step(name: &str, id: &str) -> String {
    format!("{UPDATE_STEP_PREFIX}{name}#{id}")
}

/// An update as the body takes it ([`Ctx::next_update`](crate::Ctx::next_update)): answer it
/// with [`Ctx::reply`](crate::Ctx::reply) or [`Ctx::reject`](crate::Ctx::reject).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Update<T> {
    /// The id the caller sent it under.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The request.
    pub request: T,
}

/// An update to send ([`JournalStore::update_send`](crate::JournalStore::update_send)).
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateSend {
    /// The instance.
    pub key: InstanceKey,
    /// The update's name ([`validate_update_name`]).
    pub name: String,
    /// The caller's id for it ([`validate_update_id`]).
    pub id: String,
    /// The request.
    pub request: Value,
    /// Start the instance first, in the same transaction, when it does not exist
    /// (update-with-start); its key must be [`key`](Self::key) and it has no queue.
    pub start: Option<StartRequest>,
}

/// What [`JournalStore::signal_with_start`](crate::JournalStore::signal_with_start) did.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalStarted {
    /// Whether this call started the instance (`false`: it existed).
    pub started: bool,
    /// What the signal's send did.
    pub signal: crate::SignalSendOutcome,
}

/// Where an update stands.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateState {
    /// Sent, not answered yet.
    Requested,
    /// Answered with this reply.
    Replied(Value),
    /// Refused by the body, with this message.
    Rejected(String),
    /// The run ended (with this status) before it answered.
    Unanswered(Status),
}

/// What [`JournalStore::update_send`](crate::JournalStore::update_send) did.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateSendOutcome {
    /// The update is written: new (`created`) and offered to the run, or already there under
    /// this id with the same name and request, in the state given.
    Sent {
        /// Whether this call wrote the update (`false`: an earlier send did).
        created: bool,
        /// Its state.
        state: UpdateState,
        /// Whether this call started the instance (update-with-start).
        started: bool,
    },
    /// Refused, nothing written: the id is taken by an update with another name or request.
    Conflict,
    /// Refused, nothing written: the run has ended, with this status.
    Finished(Status),
    /// Refused, nothing written: no such instance (and no start asked).
    NotFound,
}

/// An answer for [`JournalStore::update_answer`](crate::JournalStore::update_answer): which
/// update, and whether it is a rejection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateAnswer {
    /// The update's name.
    pub name: String,
    /// Its id.
    pub id: String,
    /// A rejection (the step's value is `{"rejected": message}`), not a reply (`{"ok": reply}`).
    pub rejected: bool,
}

/// What [`InspectStore::update_get`](crate::InspectStore::update_get) read, in one snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateRead {
    /// The instance's status.
    pub status: Status,
    /// The update's name and state; `None` when the instance has no update under that id.
    pub update: Option<(String, UpdateState)>,
}

/// Checks a token as a store takes it: a user's
/// (`store::validate_signal_token`) or an update's
/// ([`update_token`]: its prefix, then no control character, at most 3 identities long).
///
/// # Errors
///
/// The user token's [`IdError`] when it is neither.
pub fn validate_store_token(token: &str) -> Result<(), IdError> {
    let user = crate::model::wake::validate_signal_token(token);
    match token.strip_prefix("\u{1f}update/") {
        Some(rest)
            if user.is_err()
                && rest.len() <= 3 * crate::ID_LEN_MAX + 2
                && !rest.chars().any(char::is_control) =>
        {
            Ok(())
        }
        _ => user,
    }
}

/// One update of an instance, as `keiro show` lists it
/// ([`InspectStore::instance_updates`](crate::InspectStore::instance_updates)).
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateRecord {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its request.
    pub request: Value,
    /// Where it stands.
    pub state: UpdateState,
    /// When it was sent (the store's clock).
    pub requested_at: time::OffsetDateTime,
    /// When it was answered or settled.
    pub settled_at: Option<time::OffsetDateTime>,
}

/// The state of an update from its stored columns: `state` and `reply` (the answer's journaled
/// value for `replied` and `rejected`, `{"status": ..}` for `unanswered`). `None` for columns
/// no store writes.
pub fn update_state(state: &str, reply: Option<Value>) -> Option<UpdateState> {
    Some(match (state, reply) {
        ("requested", _) => UpdateState::Requested,
        ("replied", Some(mut reply)) => UpdateState::Replied(reply.get_mut("ok")?.take()),
        ("rejected", Some(reply)) => {
            UpdateState::Rejected(reply.get("rejected")?.as_str()?.to_owned())
        }
        ("unanswered", Some(reply)) => {
            UpdateState::Unanswered(Status::parse(reply.get("status")?.as_str()?)?)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stored_columns_read_back_as_states() {
        assert_eq!(
            update_state("replied", Some(json!({"ok": 3}))),
            Some(UpdateState::Replied(json!(3)))
        );
        assert_eq!(
            update_state("rejected", Some(json!({"rejected": "no"}))),
            Some(UpdateState::Rejected("no".into()))
        );
        assert_eq!(
            update_state("unanswered", Some(json!({"status": "completed"}))),
            Some(UpdateState::Unanswered(Status::Completed))
        );
        assert_eq!(
            update_state("requested", None),
            Some(UpdateState::Requested)
        );
        assert_eq!(update_state("replied", None), None);
    }

    #[test]
    fn take_and_answer_steps_never_collide() {
        // A take ends in `:<n>`, an answer holds `#`, which neither names nor ids may hold.
        assert_eq!(update_take_step("approve", 1), "update:approve:1");
        assert_eq!(update_answer_step("approve", "1"), "update:approve#1");
    }
}
