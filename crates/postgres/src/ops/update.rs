//! `crates/migrations/functions/update.sql`: updates, a caller's request into a running run
//! that the run answers once.
//!
//! The send (`keiro_update_send`, with or without a start) writes the update and offers it on
//! the instance's token for the update name through the signal functions, in one transaction;
//! the answer (`keiro_update_answer`) is the run's fenced journal step and the row's answer in
//! one transaction; the read (`keiro_update_get`) reads one snapshot.

use keiro_journal::store::{Append, Result, StartRequest};
use keiro_journal::update::{
    update_state, update_token, UpdateAnswer, UpdateAnswerOutcome, UpdateRead, UpdateRecord,
    UpdateSend, UpdateSendOutcome, UpdateState,
};
use keiro_journal::{InstanceKey, StoreError, SIGNAL_TTL_MAX};
use serde_json::Value;

use crate::db::Db;
use crate::ops::journal::{append_outcome, encoded_step, AppendArgs};
use crate::ops::unknown_outcome;
use crate::row::{self, column, malformed};

const SEND: &str = "sending an update";
const ANSWER: &str = "answering an update";
const GET: &str = "reading an update";

/// How long an update waits in its token's buffer for the run to take it: as long as a
/// buffered signal may wait at most. A run that ends first settles it `unanswered`.
pub(crate) fn update_ttl_ms() -> i64 {
    i64::try_from(SIGNAL_TTL_MAX.as_millis()).unwrap_or(i64::MAX)
}

/// Refuses a start that takes a queue or search attributes: a start with an update or a signal
/// is a plain start.
pub(crate) fn plain_start(operation: &'static str, start: &StartRequest) -> Result<()> {
    if start.queue.is_some() {
        return Err(StoreError::ValueRefused {
            operation,
            reason: "a start with an update or a signal takes no queue".into(),
        });
    }
    if !start.attributes.is_empty() {
        return Err(StoreError::ValueRefused {
            operation,
            reason: "a start with an update or a signal takes no search attributes".into(),
        });
    }
    Ok(())
}

const KEIRO_UPDATE_SEND: &str = "SELECT outcome, state, reply, status, started \
     FROM keiro_update_send($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// `keiro_update_send`: the update written and offered to the run (the instance started first
/// when `send.start` asks), or the update already under its id.
pub(crate) async fn update_send(db: &Db, send: &UpdateSend) -> Result<UpdateSendOutcome> {
    let key = &send.key;
    let (input, priority) = match &send.start {
        Some(start) => {
            plain_start(SEND, start)?;
            (Some(&start.input), start.priority)
        }
        None => (None, 0),
    };
    let token = update_token(key, &send.name);
    let ttl_ms = update_ttl_ms();
    let row = db
        .query_one(
            SEND,
            KEIRO_UPDATE_SEND,
            &[
                &key.name.as_str(),
                &key.id.as_str(),
                &send.id,
                &send.name,
                &send.request,
                &token,
                &ttl_ms,
                &input,
                &priority,
            ],
        )
        .await?;
    let outcome: String = column(&row, "outcome", SEND)?;
    let started: bool = column(&row, "started", SEND)?;
    match outcome.as_str() {
        "sent" => Ok(UpdateSendOutcome::Sent {
            created: true,
            state: UpdateState::Requested,
            started,
        }),
        "exists" => {
            let state: String = column(&row, "state", SEND)?;
            let reply: Option<Value> = column(&row, "reply", SEND)?;
            Ok(UpdateSendOutcome::Sent {
                created: false,
                state: stored_state(&state, reply, SEND)?,
                started,
            })
        }
        "conflict" => Ok(UpdateSendOutcome::Conflict),
        "not_found" => Ok(UpdateSendOutcome::NotFound),
        "terminal" => {
            let status: String = column(&row, "status", SEND)?;
            Ok(UpdateSendOutcome::Finished(row::status(&status, SEND)?))
        }
        other => Err(unknown_outcome(SEND, other)),
    }
}

/// An update's state from its stored `state` and `reply` columns.
fn stored_state(state: &str, reply: Option<Value>, operation: &'static str) -> Result<UpdateState> {
    update_state(state, reply)
        .ok_or_else(|| malformed(operation, format_args!("update state {state:?}")))
}

const KEIRO_UPDATE_ANSWER: &str = "SELECT outcome, recorded, marker \
     FROM keiro_update_answer($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";

/// `keiro_update_answer`: the answer step `append`, and the update's answer.
pub(crate) async fn update_answer(
    db: &Db,
    append: &Append,
    answer: &UpdateAnswer,
) -> Result<UpdateAnswerOutcome> {
    let args = AppendArgs::new(append, encoded_step(append, ANSWER)?);
    let mut params = args.params();
    params.push(&answer.id);
    params.push(&answer.name);
    params.push(&answer.rejected);
    let row = db.query_one(ANSWER, KEIRO_UPDATE_ANSWER, &params).await?;
    let outcome: String = column(&row, "outcome", ANSWER)?;
    match outcome.as_str() {
        "update_unknown" => Ok(UpdateAnswerOutcome::Unknown),
        "update_answered" => Ok(UpdateAnswerOutcome::Answered),
        _ => append_outcome(&row, ANSWER, &append.key, append.fence.as_ref())
            .map(UpdateAnswerOutcome::Append),
    }
}

const KEIRO_UPDATE_GET: &str =
    "SELECT status, update_name, state, reply FROM keiro_update_get($1, $2, $3)";

/// `keiro_update_get`: the instance's status and the update; `None` for an unknown instance.
pub(crate) async fn update_get(
    db: &Db,
    key: &InstanceKey,
    update_id: &str,
) -> Result<Option<UpdateRead>> {
    let rows = db
        .query(
            GET,
            KEIRO_UPDATE_GET,
            &[&key.name.as_str(), &key.id.as_str(), &update_id],
        )
        .await?;
    let Some(found) = rows.first() else {
        return Ok(None);
    };
    let status: String = column(found, "status", GET)?;
    let name: Option<String> = column(found, "update_name", GET)?;
    let update = match name {
        None => None,
        Some(name) => {
            let state: String = column(found, "state", GET)?;
            let reply: Option<Value> = column(found, "reply", GET)?;
            Some((name, stored_state(&state, reply, GET)?))
        }
    };
    Ok(Some(UpdateRead {
        status: row::status(&status, GET)?,
        update,
    }))
}

const UPDATES: &str = "listing an instance's updates";

// A plain statement (an operator's read, as `InspectStore`'s others), served by the primary key.
const INSTANCE_UPDATES: &str = "SELECT update_id, update_name, request, state, reply, \
         requested_at, settled_at \
     FROM workflow_updates WHERE workflow_name = $1 AND workflow_id = $2 \
     ORDER BY requested_at, update_id LIMIT $3";

/// The updates of `key`, oldest first, at most `limit`.
pub(crate) async fn instance_updates(
    db: &Db,
    key: &InstanceKey,
    limit: u32,
) -> Result<Vec<UpdateRecord>> {
    let limit = i64::from(limit);
    let rows = db
        .query(
            UPDATES,
            INSTANCE_UPDATES,
            &[&key.name.as_str(), &key.id.as_str(), &limit],
        )
        .await?;
    let mut updates = Vec::with_capacity(rows.len());
    for found in &rows {
        let state: String = column(found, "state", UPDATES)?;
        let reply: Option<Value> = column(found, "reply", UPDATES)?;
        updates.push(UpdateRecord {
            id: column(found, "update_id", UPDATES)?,
            name: column(found, "update_name", UPDATES)?,
            request: column(found, "request", UPDATES)?,
            state: stored_state(&state, reply, UPDATES)?,
            requested_at: column(found, "requested_at", UPDATES)?,
            settled_at: column(found, "settled_at", UPDATES)?,
        });
    }
    Ok(updates)
}
