//! [`SqliteStore`]'s updates (`JournalStore::update_send`, `update_answer`,
//! `signal_with_start` and `InspectStore::update_get`), over the rules of the crate's `update`
//! and `signal` modules.

use keiro_journal::store::{Append, Error as StoreError, Result, StartRequest};
use keiro_journal::update::{
    update_token, SignalStarted, UpdateAnswer, UpdateAnswerOutcome, UpdateRead, UpdateRecord,
    UpdateSend, UpdateSendOutcome, UpdateState,
};
use keiro_journal::{InstanceKey, SignalOptions, SignalSendOutcome, SIGNAL_TTL_MAX};
use serde_json::Value;

use crate::update::{self, AnswerCode, Send, SendCode};
use crate::{row, signal, storable};

use super::journal::{append_outcome, append_to, encoded_step};
use super::SqliteStore;

const SEND: &str = "sending an update";
const ANSWER: &str = "answering an update";
const GET: &str = "reading an update";
const WITH_START: &str = "sending a signal with a start";
const UPDATES: &str = "listing an instance's updates";

/// How long an update waits in its token's buffer for the run to take it: as long as a
/// buffered signal may wait at most.
fn update_ttl_ms() -> i64 {
    i64::try_from(SIGNAL_TTL_MAX.as_millis()).unwrap_or(i64::MAX)
}

/// Refuses a start that takes a queue or search attributes: a start with an update or a signal
/// is a plain start.
fn plain_start(operation: &'static str, start: &StartRequest) -> Result<()> {
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
    storable::value(operation, &start.input)
}

impl SqliteStore {
    /// Writes update `send` and offers it to the run, starting the instance first when asked,
    /// in one transaction; or answers the update already under its id
    /// (`JournalStore::update_send`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a request or input holding a NUL, or a start on a queue.
    pub async fn update_send(&self, send: &UpdateSend) -> Result<UpdateSendOutcome> {
        storable::value(SEND, &send.request)?;
        storable::text(SEND, "update name", &send.name)?;
        storable::text(SEND, "update id", &send.id)?;
        if let Some(start) = &send.start {
            plain_start(SEND, start)?;
        }
        let send = send.clone();
        let token = update_token(&send.key, &send.name);
        self.inner
            .writer
            .write(SEND, move |conn, now| {
                let (code, started) = update::update_send(
                    conn,
                    now,
                    Send {
                        name: send.key.name.as_str(),
                        id: send.key.id.as_str(),
                        update_id: &send.id,
                        update_name: &send.name,
                        request: &send.request,
                        token: &token,
                        ttl_ms: update_ttl_ms(),
                        start: send.start.as_ref().map(|s| (&s.input, s.priority)),
                    },
                )?;
                Ok(match code {
                    SendCode::Sent => UpdateSendOutcome::Sent {
                        created: true,
                        state: UpdateState::Requested,
                        started,
                    },
                    SendCode::Exists(state) => UpdateSendOutcome::Sent {
                        created: false,
                        state,
                        started,
                    },
                    SendCode::Conflict => UpdateSendOutcome::Conflict,
                    SendCode::NotFound => UpdateSendOutcome::NotFound,
                    SendCode::Terminal(status) => UpdateSendOutcome::Finished(status),
                })
            })
            .await
    }

    /// Journals the answer step `append` and settles update `answer.id` with it, in one
    /// transaction, unless the update is unknown or answered (`JournalStore::update_answer`).
    ///
    /// # Errors
    ///
    /// As `journal_append`; `ValueRefused` for a value holding a NUL.
    pub async fn update_answer(
        &self,
        append: &Append,
        answer: &UpdateAnswer,
    ) -> Result<UpdateAnswerOutcome> {
        let encoded = encoded_step(append, ANSWER)?;
        storable::append(ANSWER, append)?;
        let (append, answer) = (append.clone(), answer.clone());
        self.inner
            .writer
            .write(ANSWER, move |conn, now| {
                let to = append_to(&append, &encoded);
                match update::update_answer(
                    conn,
                    now,
                    to,
                    &answer.id,
                    &answer.name,
                    answer.rejected,
                )? {
                    AnswerCode::Unknown => Ok(UpdateAnswerOutcome::Unknown),
                    AnswerCode::Answered => Ok(UpdateAnswerOutcome::Answered),
                    AnswerCode::Append(code) => {
                        append_outcome(code, &append.key, append.fence.as_ref())
                            .map(UpdateAnswerOutcome::Append)
                    }
                }
            })
            .await
    }

    /// Starts `start` when it does not exist and sends the signal, in one transaction
    /// (`JournalStore::signal_with_start`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a token a wait could not take, a value holding a NUL, or a start on
    /// a queue.
    pub async fn signal_with_start(
        &self,
        start: &StartRequest,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalStarted> {
        keiro_journal::store::validate_store_token(token).map_err(|e| {
            StoreError::ValueRefused {
                operation: WITH_START,
                reason: e.to_string(),
            }
        })?;
        plain_start(WITH_START, start)?;
        storable::value(WITH_START, payload)?;
        let (start, token, payload) = (start.clone(), token.to_owned(), payload.clone());
        let ttl_ms = i64::try_from(options.time_to_live().as_millis()).unwrap_or(i64::MAX);
        self.inner
            .writer
            .write(WITH_START, move |conn, now| {
                let (started, to) = signal::signal_with_start(
                    conn,
                    now,
                    start.key.name.as_str(),
                    start.key.id.as_str(),
                    &start.input,
                    start.priority,
                    &token,
                    &payload,
                    ttl_ms,
                )?;
                let signal = match to {
                    Some((name, id)) => SignalSendOutcome::Delivered {
                        to: row::key(&name, &id, WITH_START)?,
                    },
                    None => SignalSendOutcome::Buffered,
                };
                Ok(SignalStarted { started, signal })
            })
            .await
    }

    /// The updates of `key`, oldest first, at most `limit` (`InspectStore::instance_updates`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn instance_updates(
        &self,
        key: &InstanceKey,
        limit: u32,
    ) -> Result<Vec<UpdateRecord>> {
        let key = key.clone();
        self.read(UPDATES, move |conn, _| {
            update::instance_updates(conn, key.name.as_str(), key.id.as_str(), i64::from(limit))
        })
        .await
    }

    /// Update `update_id` of `key` with the instance's status; `None` for an unknown instance
    /// (`InspectStore::update_get`).
    ///
    /// # Errors
    ///
    /// `Malformed` for a row keiro cannot read.
    pub async fn update_get(
        &self,
        key: &InstanceKey,
        update_id: &str,
    ) -> Result<Option<UpdateRead>> {
        let (key, update_id) = (key.clone(), update_id.to_owned());
        self.read(GET, move |conn, _| {
            update::update_get(conn, key.name.as_str(), key.id.as_str(), &update_id)
        })
        .await
    }
}
