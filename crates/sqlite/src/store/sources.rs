//! [`SqliteStore`]'s wake-source operations beside the timers: signals, awakeables and child
//! spawns (`JournalStore`'s methods of those names).

use keiro_journal::store::{Append, AppendOutcome, Error as StoreError, Result};
use keiro_journal::{
    store::awakeable_step, store::validate_store_token, store::ChildSpawn, store::ReturnedSignal,
    store::SignalWait, store::SignalWaitOutcome, AwakeableOutcome, AwakeableStatus, Envelope,
    Generation, InstanceKey, SignalOptions, SignalSendOutcome,
};
use serde_json::Value;
use uuid::Uuid;

use crate::awakeable::{self, SettleCode};
use crate::child::{self, Spawned};
use crate::error::malformed;
use crate::row;
use crate::signal::{self, WaitCode};
use crate::storable;

use super::journal::{append_outcome, append_to, encoded_step};
use super::{lease_lost, not_found, SqliteStore};

const WAIT: &str = "waiting for a signal";
const WITHDRAW: &str = "withdrawing a signal wait";
const SEND: &str = "sending a signal";
const RETURN: &str = "giving signals back to their tokens";
const CREATE: &str = "creating an awakeable";
const COMPLETE: &str = "completing an awakeable";
const CANCEL: &str = "cancelling an awakeable";
const PENDING: &str = "counting pending awakeables";
const SPAWN: &str = "spawning a child";

/// Refuses a token no wait could take before anything is written: a send would buffer it for
/// nobody.
fn signal_token(operation: &'static str, token: &str) -> Result<()> {
    validate_store_token(token).map_err(|e| StoreError::ValueRefused {
        operation,
        reason: e.to_string(),
    })
}

/// A signal's time to live as the milliseconds `keiro_signal_send` takes (at most
/// `SIGNAL_TTL_MAX`, far inside an `i64`).
fn ttl_ms(options: &SignalOptions) -> i64 {
    i64::try_from(options.time_to_live().as_millis()).unwrap_or(i64::MAX)
}

impl SqliteStore {
    /// Arms a signal wait: consumes the oldest live buffered signal for the token (journaling
    /// it at once) or registers the waiter (`JournalStore::signal_wait`).
    ///
    /// # Errors
    ///
    /// `NotFound`; `LeaseLost` when consuming a buffered signal with a stale fence;
    /// `ValueRefused` for a token a send would refuse or a step holding a NUL.
    pub async fn signal_wait(&self, wait: &SignalWait) -> Result<SignalWaitOutcome> {
        signal_token(WAIT, &wait.token)?;
        storable::text(WAIT, "step name", &wait.step)?;
        let wait = wait.clone();
        self.inner
            .writer
            .write(WAIT, move |conn, now| {
                let fence = wait.fence.as_ref().map(|f| (f.owner.as_str(), f.epoch));
                match signal::signal_wait(
                    conn,
                    now,
                    wait.key.name.as_str(),
                    wait.key.id.as_str(),
                    wait.generation,
                    &wait.step,
                    &wait.token,
                    fence,
                )? {
                    WaitCode::Delivered(envelope) => Ok(SignalWaitOutcome::Delivered(envelope)),
                    WaitCode::Waiting => Ok(SignalWaitOutcome::Waiting),
                    WaitCode::NotFound => Err(not_found(&wait.key)),
                    WaitCode::LeaseLost => match fence {
                        Some((owner, epoch)) => Err(lease_lost(&wait.key, owner, epoch)),
                        None => Err(malformed(WAIT, "lease_lost without a fence")),
                    },
                }
            })
            .await
    }

    /// Withdraws the signal waiter of `step` (a wait that lost a `select` race); whether one
    /// was removed (`JournalStore::signal_withdraw`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn signal_withdraw(
        &self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
    ) -> Result<bool> {
        storable::text(WITHDRAW, "step name", step)?;
        let (key, step) = (key.clone(), step.to_owned());
        self.inner
            .writer
            .write(WITHDRAW, move |conn, _| {
                signal::signal_withdraw(conn, key.name.as_str(), key.id.as_str(), generation, &step)
            })
            .await
    }

    /// Sends a signal: delivers it to the oldest live waiter (journaled as `{"ok": payload}`,
    /// owner woken) or buffers it for `options.time_to_live()` (`JournalStore::
    /// signal_send_with`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a token a wait could not take or a payload holding a NUL, before
    /// anything is written.
    pub async fn signal_send_with(
        &self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome> {
        signal_token(SEND, token)?;
        storable::value(SEND, payload)?;
        let (token, payload, ttl_ms) = (token.to_owned(), payload.clone(), ttl_ms(options));
        self.inner
            .writer
            .write(SEND, move |conn, now| {
                match signal::signal_send(conn, now, &token, &payload, ttl_ms)? {
                    Some((name, id)) => Ok(SignalSendOutcome::Delivered {
                        to: row::key(&name, &id, SEND)?,
                    }),
                    None => Ok(SignalSendOutcome::Buffered),
                }
            })
            .await
    }

    /// [`signal_send_with`](Self::signal_send_with) with the default options
    /// (`JournalStore::signal_send`).
    ///
    /// # Errors
    ///
    /// As [`signal_send_with`](Self::signal_send_with).
    pub async fn signal_send(&self, token: &str, payload: &Value) -> Result<SignalSendOutcome> {
        self.signal_send_with(token, payload, &SignalOptions::default())
            .await
    }

    /// Journals a race's `decision` and, only when it is appended, gives each of `signals`
    /// back to its token, in one transaction (`JournalStore::signal_return`).
    ///
    /// # Errors
    ///
    /// As `journal_append`; `ValueRefused` for a token a wait could not take or a value
    /// holding a NUL, before anything is written.
    pub async fn signal_return(
        &self,
        decision: &Append,
        signals: &[ReturnedSignal],
    ) -> Result<AppendOutcome> {
        for signal in signals {
            signal_token(RETURN, &signal.token)?;
            storable::value(RETURN, &signal.payload)?;
        }
        let encoded = encoded_step(decision, RETURN)?;
        storable::append(RETURN, decision)?;
        let decision = decision.clone();
        let signals: Vec<(String, Value)> = signals
            .iter()
            .map(|s| (s.token.clone(), s.payload.clone()))
            .collect();
        let ttl_ms = ttl_ms(&SignalOptions::default());
        self.inner
            .writer
            .write(RETURN, move |conn, now| {
                let code = signal::signal_return(
                    conn,
                    now,
                    append_to(&decision, &encoded),
                    &signals,
                    ttl_ms,
                )?;
                append_outcome(code, &decision.key, decision.fence.as_ref())
            })
            .await
    }

    /// Journals the awakeable allocation step `append` and registers the pending awakeable
    /// `id` owned by the appending instance, in one transaction; a replayed allocation
    /// registers nothing (`JournalStore::awakeable_create`).
    ///
    /// # Errors
    ///
    /// As `journal_append`; a non-retryable `Database` error for an id already registered
    /// (the allocation step is not journaled then).
    pub async fn awakeable_create(&self, append: &Append, id: Uuid) -> Result<AppendOutcome> {
        let encoded = encoded_step(append, CREATE)?;
        storable::append(CREATE, append)?;
        let append = append.clone();
        self.inner
            .writer
            .write(CREATE, move |conn, now| {
                let code = awakeable::awakeable_create(
                    conn,
                    now,
                    append_to(&append, &encoded),
                    &id.hyphenated().to_string(),
                )?;
                append_outcome(code, &append.key, append.fence.as_ref())
            })
            .await
    }

    /// Settles `id` as `status` with `payload`, journaling `envelope` into its owner.
    async fn awakeable_settle(
        &self,
        operation: &'static str,
        id: Uuid,
        status: AwakeableStatus,
        payload: Option<Value>,
        envelope: Value,
    ) -> Result<AwakeableOutcome> {
        self.inner
            .writer
            .write(
                operation,
                move |conn, now| match awakeable::awakeable_settle(
                    conn,
                    now,
                    &id.hyphenated().to_string(),
                    status.as_str(),
                    payload.as_ref(),
                    &awakeable_step(id),
                    &envelope,
                )? {
                    SettleCode::Delivered => Ok(AwakeableOutcome::Delivered),
                    SettleCode::OwnerGone => Ok(AwakeableOutcome::OwnerGone),
                    SettleCode::NotFound => Ok(AwakeableOutcome::NotFound),
                    SettleCode::AlreadySettled(status) => Ok(AwakeableOutcome::AlreadySettled(
                        row::awakeable_status(&status, operation)?,
                    )),
                },
            )
            .await
    }

    /// Completes a pending awakeable with `payload`, journaling `{"ok": payload}` under
    /// `awk:<id>` into its owner; idempotent (`JournalStore::awakeable_complete`).
    ///
    /// # Errors
    ///
    /// `ValueRefused` for a payload holding a NUL.
    pub async fn awakeable_complete(&self, id: Uuid, payload: &Value) -> Result<AwakeableOutcome> {
        storable::value(COMPLETE, payload)?;
        let envelope = Envelope::ok(payload.clone());
        self.awakeable_settle(
            COMPLETE,
            id,
            AwakeableStatus::Completed,
            Some(payload.clone()),
            envelope,
        )
        .await
    }

    /// Cancels a pending awakeable, journaling `{"cancelled": true}` into its owner;
    /// idempotent (`JournalStore::awakeable_cancel`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when the file stayed locked or the commit failed.
    pub async fn awakeable_cancel(&self, id: Uuid) -> Result<AwakeableOutcome> {
        self.awakeable_settle(
            CANCEL,
            id,
            AwakeableStatus::Cancelled,
            None,
            Envelope::cancelled(),
        )
        .await
    }

    /// How many awakeables are pending (`JournalStore::awakeables_pending`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when a read connection cannot be opened.
    pub async fn awakeables_pending(&self) -> Result<u64> {
        self.read(PENDING, |conn, _| awakeable::awakeables_pending(conn))
            .await
    }

    /// Journals the spawn step `append` and creates the child `running`, linked to the parent
    /// and to `spawn.await_step`, in one transaction; adopts, delivers from or refuses an
    /// existing instance with the child's key by the rules of `keiro_child_spawn`
    /// (`JournalStore::child_spawn`).
    ///
    /// # Errors
    ///
    /// As `journal_append`; `ValueRefused` for an input or a step holding a NUL.
    pub async fn child_spawn(&self, append: &Append, spawn: &ChildSpawn) -> Result<AppendOutcome> {
        let encoded = encoded_step(append, SPAWN)?;
        storable::append(SPAWN, append)?;
        storable::value(SPAWN, &spawn.input)?;
        storable::text(SPAWN, "step name", &spawn.await_step)?;
        let (append, spawn) = (append.clone(), spawn.clone());
        self.inner
            .writer
            .write(SPAWN, move |conn, now| {
                let code = child::child_spawn(
                    conn,
                    now,
                    append_to(&append, &encoded),
                    Spawned {
                        name: spawn.child.name.as_str(),
                        id: spawn.child.id.as_str(),
                        input: &spawn.input,
                        await_step: &spawn.await_step,
                    },
                )?;
                append_outcome(code, &append.key, append.fence.as_ref())
            })
            .await
    }
}
