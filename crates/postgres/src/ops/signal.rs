//! `crates/migrations/functions/signal.sql`. Signals: payloads sent to a token, delivered to the oldest waiter or buffered until one
//! waits.
//!
//! Both operations take the token's transaction advisory lock first (`keiro_signal_lock`), so
//! a wait and a send on one token are totally ordered: the signal is either consumed from the
//! buffer by the wait or handed to the waiter by the send, exactly once. Delivery journals the
//! envelope into the waiter and flips it `running` in the same transaction.

use keiro_journal::store::{Append, AppendOutcome, Result, StartRequest};
use keiro_journal::update::SignalStarted;
use keiro_journal::{
    store::validate_store_token, store::ReturnedSignal, store::SignalWait,
    store::SignalWaitOutcome, InstanceKey, SignalOptions, SignalSendOutcome, StoreError,
};
use serde_json::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::db::Db;
use crate::ops::journal::{append_outcome, encoded_step, AppendArgs};
use crate::ops::{lease_lost, not_found, unknown_outcome};
use crate::row::{column, malformed};

const WAIT: &str = "waiting for a signal";
pub(crate) const SEND: &str = "sending a signal";

const SIGNAL_WAIT: &str =
    "SELECT outcome, delivered FROM keiro_signal_wait($1, $2, $3, $4, $5, $6, $7)";

/// Refuses a token no wait could take before the database is asked anything: a send would
/// buffer it for nobody.
pub(crate) fn signal_token(operation: &'static str, token: &str) -> Result<()> {
    validate_store_token(token).map_err(|e| StoreError::ValueRefused {
        operation,
        reason: e.to_string(),
    })
}

pub(crate) async fn signal_wait(db: &Db, wait: &SignalWait) -> Result<SignalWaitOutcome> {
    signal_token(WAIT, &wait.token)?;
    let key = &wait.key;
    let owner = wait.fence.as_ref().map(|f| f.owner.as_str());
    let epoch = wait.fence.as_ref().map(|f| f.epoch);
    let row = db
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

const SIGNAL_SEND: &str = "SELECT outcome, to_name, to_id FROM keiro_signal_send($1, $2, $3)";

pub(crate) async fn signal_send(
    db: &Db,
    token: &str,
    payload: &Value,
    options: &SignalOptions,
) -> Result<SignalSendOutcome> {
    signal_token(SEND, token)?;
    let ttl_ms = ttl_ms(options);
    let row = db
        .query_one(SEND, SIGNAL_SEND, &[&token, payload, &ttl_ms])
        .await?;
    send_outcome(&row)
}

/// The signal's time to live as the milliseconds `keiro_signal_send` takes.
pub(crate) fn ttl_ms(options: &SignalOptions) -> i64 {
    // At most `SIGNAL_TTL_MAX`, a hundred years of milliseconds: far inside an i64.
    i64::try_from(options.time_to_live().as_millis()).unwrap_or(i64::MAX)
}

/// Reads the `outcome, to_name, to_id` columns of `keiro_signal_send`.
pub(crate) fn send_outcome(row: &Row) -> Result<SignalSendOutcome> {
    let outcome: String = column(row, "outcome", SEND)?;
    match outcome.as_str() {
        "delivered" => {
            let name: String = column(row, "to_name", SEND)?;
            let id: String = column(row, "to_id", SEND)?;
            let to = InstanceKey::parse(&name, &id)
                .map_err(|e| malformed(SEND, format_args!("instance key {name:?}/{id:?}: {e}")))?;
            Ok(SignalSendOutcome::Delivered { to })
        }
        "buffered" => Ok(SignalSendOutcome::Buffered),
        other => Err(unknown_outcome(SEND, other)),
    }
}

const WITH_START: &str = "sending a signal with a start";

const SIGNAL_WITH_START: &str = "SELECT started, outcome, to_name, to_id \
     FROM keiro_signal_with_start($1, $2, $3, $4, $5, $6, $7)";

/// `keiro_signal_with_start`: the instance started when it does not exist, and the signal
/// sent, in one transaction.
pub(crate) async fn signal_with_start(
    db: &Db,
    start: &StartRequest,
    token: &str,
    payload: &Value,
    options: &SignalOptions,
) -> Result<SignalStarted> {
    signal_token(WITH_START, token)?;
    crate::ops::update::plain_start(WITH_START, start)?;
    let ttl_ms = ttl_ms(options);
    let row = db
        .query_one(
            WITH_START,
            SIGNAL_WITH_START,
            &[
                &start.key.name.as_str(),
                &start.key.id.as_str(),
                &start.input,
                &start.priority,
                &token,
                payload,
                &ttl_ms,
            ],
        )
        .await?;
    Ok(SignalStarted {
        started: column(&row, "started", WITH_START)?,
        signal: send_outcome(&row)?,
    })
}

const RETURN: &str = "giving signals back to their tokens";

const SIGNAL_RETURN: &str = "SELECT outcome, recorded, marker \
     FROM keiro_signal_return($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/// A race's decision and the signals its losing waits took, in one transaction
/// (`keiro_signal_return`): each signal goes back to its token only when the decision lands.
pub(crate) async fn signal_return(
    db: &Db,
    decision: &Append,
    signals: &[ReturnedSignal],
) -> Result<AppendOutcome> {
    for signal in signals {
        signal_token(RETURN, &signal.token)?;
    }
    let args = AppendArgs::new(decision, encoded_step(decision, RETURN)?);
    let tokens: Vec<&str> = signals.iter().map(|s| s.token.as_str()).collect();
    let payloads: Vec<&Value> = signals.iter().map(|s| &s.payload).collect();
    let ttl_ms = ttl_ms(&SignalOptions::default());
    let mut params = args.params();
    params.extend([
        &tokens as &(dyn ToSql + Sync),
        &payloads as &(dyn ToSql + Sync),
        &ttl_ms as &(dyn ToSql + Sync),
    ]);
    let row = db.query_one(RETURN, SIGNAL_RETURN, &params).await?;
    append_outcome(&row, RETURN, &decision.key, decision.fence.as_ref())
}

const WITHDRAW: &str = "withdrawing a signal wait";

// A plain DELETE, not under the token's advisory lock: a send that takes the waiter first holds
// its row lock, so the DELETE either removes a waiter no send has taken or finds the row gone
// (the signal was delivered to it). A send already going through the token's waiters when the
// DELETE commits finds the row gone and passes on to the next waiter or the buffer
// (`keiro_signal_send`, crates/migrations/functions/signal.sql).
const SIGNAL_WITHDRAW: &str = "DELETE FROM signal_waiters \
     WHERE workflow_name = $1 AND workflow_id = $2 AND generation = $3 AND step = $4";

pub(crate) async fn signal_withdraw(
    db: &Db,
    key: &InstanceKey,
    generation: i32,
    step: &str,
) -> Result<bool> {
    let removed = db
        .execute(
            WITHDRAW,
            SIGNAL_WITHDRAW,
            &[&key.name.as_str(), &key.id.as_str(), &generation, &step],
        )
        .await?;
    Ok(removed > 0)
}
