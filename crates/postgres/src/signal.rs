//! Signals: payloads sent to a token, delivered to the oldest waiter or buffered until one
//! waits.
//!
//! Both operations take the token's transaction advisory lock first (`keiro_signal_lock`), so
//! a wait and a send on one token are totally ordered: the signal is either consumed from the
//! buffer by the wait or handed to the waiter by the send, exactly once. Delivery journals the
//! envelope into the waiter and flips it `running` in the same transaction.

use keiro_journal::store::Result;
use keiro_journal::{InstanceKey, SignalSendOutcome, SignalWait, SignalWaitOutcome};
use serde_json::Value;

use crate::journal::{lease_lost, not_found, unknown_outcome};
use crate::row::{column, malformed};
use crate::PgStore;

const WAIT: &str = "waiting for a signal";
const SEND: &str = "sending a signal";

const SIGNAL_WAIT: &str =
    "SELECT outcome, delivered FROM keiro_signal_wait($1, $2, $3, $4, $5, $6, $7)";

pub(crate) async fn signal_wait(store: &PgStore, wait: &SignalWait) -> Result<SignalWaitOutcome> {
    let key = &wait.key;
    let owner = wait.fence.as_ref().map(|f| f.owner.as_str());
    let epoch = wait.fence.as_ref().map(|f| f.epoch);
    let row = store
        .query_one(
            WAIT,
            SIGNAL_WAIT,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &wait.generation,
                &wait.step,
                &wait.token,
                &owner,
                &epoch,
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", WAIT)?;
    match outcome.as_str() {
        "delivered" => {
            let delivered: Option<Value> = column(&row, "delivered", WAIT)?;
            Ok(SignalWaitOutcome::Delivered(
                delivered.unwrap_or(Value::Null),
            ))
        }
        "waiting" => Ok(SignalWaitOutcome::Waiting),
        "not_found" => Err(not_found(key)),
        "lease_lost" => match &wait.fence {
            Some(fence) => Err(lease_lost(key, fence)),
            None => Err(unknown_outcome(WAIT, "lease_lost without a fence")),
        },
        other => Err(unknown_outcome(WAIT, other)),
    }
}

const SIGNAL_SEND: &str = "SELECT outcome, to_name, to_id FROM keiro_signal_send($1, $2)";

pub(crate) async fn signal_send(
    store: &PgStore,
    token: &str,
    payload: &Value,
) -> Result<SignalSendOutcome> {
    let row = store
        .query_one(SEND, SIGNAL_SEND, &[&token, payload])
        .await?;
    let outcome: String = column(&row, "outcome", SEND)?;
    match outcome.as_str() {
        "delivered" => {
            let name: String = column(&row, "to_name", SEND)?;
            let id: String = column(&row, "to_id", SEND)?;
            let to = InstanceKey::parse(&name, &id)
                .map_err(|e| malformed(SEND, format_args!("instance key {name:?}/{id:?}: {e}")))?;
            Ok(SignalSendOutcome::Delivered { to })
        }
        "buffered" => Ok(SignalSendOutcome::Buffered),
        other => Err(unknown_outcome(SEND, other)),
    }
}
