//! Signals in memory: the waiters and the buffer of undelivered signals, and the rules of
//! `crates/migrations/functions/signal.sql` (wait, withdraw, send, return). The store lock is the per-token
//! lock of the Postgres functions, so a send and a wait on one token never interleave.

use keiro_journal::store::{Append, AppendOutcome, Result};
use keiro_journal::{
    store::validate_signal_token, store::ReturnedSignal, store::SignalWait,
    store::SignalWaitOutcome, Envelope, Event, Generation, InstanceKey, SignalOptions,
    SignalSendOutcome, StepKind, StoreError,
};
use serde_json::Value;
use time::OffsetDateTime;

use super::{Buffered, Sources, StepId, Waiter};
use crate::state::refused;
use crate::State;

/// How many expired signals of any token a send deletes besides its own token's, so tokens
/// nobody uses again do not keep theirs forever (Postgres: the same bound in
/// `keiro_signal_send`).
const SIGNAL_SWEEP_BATCH: usize = 16;

impl Sources {
    pub(super) fn waiter_push(
        &mut self,
        waiter: StepId,
        token: &str,
        since: OffsetDateTime,
    ) -> Result<()> {
        let seq = self.waiter_seq.checked_add(1).ok_or_else(|| {
            refused(
                "waiting for a signal",
                "the signal waiter sequence is exhausted",
            )
        })?;
        self.waiter_seq = seq;
        self.queues
            .entry(token.to_owned())
            .or_default()
            .insert(seq, waiter.clone());
        self.waiters.insert(
            waiter,
            Waiter {
                token: token.to_owned(),
                seq,
                since,
            },
        );
        Ok(())
    }

    /// Drops a waiter; whether it was registered.
    pub(super) fn waiter_remove(&mut self, waiter: &StepId) -> bool {
        let Some(Waiter { token, seq, .. }) = self.waiters.remove(waiter) else {
            return false;
        };
        if let Some(queue) = self.queues.get_mut(&token) {
            queue.remove(&seq);
            if queue.is_empty() {
                self.queues.remove(&token);
            }
        }
        true
    }

    /// Takes the oldest waiter on `token` off the books.
    pub(super) fn waiter_pop_oldest(&mut self, token: &str) -> Option<StepId> {
        let oldest = self.queues.get(token)?.values().next()?.clone();
        self.waiter_remove(&oldest);
        Some(oldest)
    }

    pub(super) fn buffer_push(
        &mut self,
        token: &str,
        payload: Value,
        expires_at: OffsetDateTime,
    ) -> Result<()> {
        let seq = self.buffer_seq.checked_add(1).ok_or_else(|| {
            refused(
                "sending a signal",
                "the signal buffer sequence is exhausted",
            )
        })?;
        self.buffer_seq = seq;
        self.buffered.entry(token.to_owned()).or_default().insert(
            seq,
            Buffered {
                payload,
                expires_at,
            },
        );
        self.expiring.insert((expires_at, seq, token.to_owned()));
        Ok(())
    }

    /// Puts `payloads` (in their order) at the head of `token`'s buffer, ahead of every signal
    /// buffered for it: the token's signals are taken out and buffered again after them, so
    /// arrival numbers keep giving the order (Postgres: the same in `keiro_signal_return`).
    pub(super) fn buffer_push_front(
        &mut self,
        token: &str,
        payloads: Vec<Value>,
        expires_at: OffsetDateTime,
    ) -> Result<()> {
        let behind = self.buffered.remove(token).unwrap_or_default();
        for (seq, signal) in &behind {
            self.expiring
                .remove(&(signal.expires_at, *seq, token.to_owned()));
        }
        for payload in payloads {
            self.buffer_push(token, payload, expires_at)?;
        }
        for signal in behind.into_values() {
            self.buffer_push(token, signal.payload, signal.expires_at)?;
        }
        Ok(())
    }

    pub(super) fn buffered_remove(&mut self, token: &str, seq: u64) {
        let Some(queue) = self.buffered.get_mut(token) else {
            return;
        };
        if let Some(signal) = queue.remove(&seq) {
            self.expiring
                .remove(&(signal.expires_at, seq, token.to_owned()));
        }
        if queue.is_empty() {
            self.buffered.remove(token);
        }
    }

    /// Deletes the signals of `token` expired at `now`.
    pub(super) fn buffered_expire(&mut self, token: &str, now: OffsetDateTime) {
        let Some(queue) = self.buffered.get(token) else {
            return;
        };
        let expired: Vec<u64> = queue
            .iter()
            .filter(|(_, signal)| signal.expires_at <= now)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in expired {
            self.buffered_remove(token, seq);
        }
    }

    /// The oldest signal of `token` still live at `now`, after deleting the token's expired
    /// ones.
    pub(super) fn buffered_oldest(
        &mut self,
        token: &str,
        now: OffsetDateTime,
    ) -> Option<(u64, Value)> {
        self.buffered_expire(token, now);
        let (seq, signal) = self.buffered.get(token)?.first_key_value()?;
        Some((*seq, signal.payload.clone()))
    }

    /// Deletes up to `limit` signals of any token expired at `now`, the first to expire first.
    pub(super) fn buffered_sweep(&mut self, now: OffsetDateTime, limit: usize) {
        let expired: Vec<(u64, String)> = self
            .expiring
            .iter()
            .take_while(|(expires_at, _, _)| *expires_at <= now)
            .take(limit)
            .map(|(_, seq, token)| (*seq, token.clone()))
            .collect();
        for (seq, token) in expired {
            self.buffered_remove(&token, seq);
        }
    }
}

/// Refuses a token that no wait could take (see [`validate_signal_token`]) before anything is
/// written, as the Postgres store does.
fn signal_token(operation: &'static str, token: &str) -> Result<()> {
    validate_signal_token(token).map_err(|e| StoreError::ValueRefused {
        operation,
        reason: e.to_string(),
    })
}

/// When a signal buffered at `now` for `options` expires. A TTL is at most
/// [`SIGNAL_TTL_MAX`](keiro_journal::SIGNAL_TTL_MAX), so this only saturates on a clock set
/// near the end of time.
fn signal_expiry(now: OffsetDateTime, options: &SignalOptions) -> OffsetDateTime {
    time::Duration::try_from(options.time_to_live())
        .ok()
        .and_then(|ttl| now.checked_add(ttl))
        .unwrap_or(OffsetDateTime::new_utc(
            time::Date::MAX,
            time::Time::MIDNIGHT,
        ))
}

impl State {
    /// Drops the waiter of `step`, if it is still registered.
    pub(crate) fn signal_withdraw(
        &mut self,
        key: &InstanceKey,
        generation: Generation,
        step: &str,
    ) -> bool {
        self.sources
            .waiter_remove(&StepId::new(key, generation, step))
    }

    pub(crate) fn signal_wait(&mut self, wait: &SignalWait) -> Result<SignalWaitOutcome> {
        signal_token("waiting for a signal", &wait.token)?;
        let entry = self
            .instances
            .get(&wait.key)
            .ok_or_else(|| StoreError::NotFound {
                key: wait.key.clone(),
            })?;
        if let Some(stored) = entry.step(wait.generation, &wait.step) {
            return Ok(SignalWaitOutcome::Delivered(stored.payload.clone()));
        }
        let id = StepId::new(&wait.key, wait.generation, &wait.step);
        // The buffer is consulted even when this wait is registered (keiro_signal_wait): a
        // signal buffered beside its waiter goes to it on the re-drive.
        let waiting = self.sources.waiters.contains_key(&id);
        let now = self.clock.now();
        if let Some((seq, payload)) = self.sources.buffered_oldest(&wait.token, now) {
            let envelope = Envelope::ok(payload);
            let append = Append {
                key: wait.key.clone(),
                generation: Some(wait.generation),
                event: Event::StepRecorded {
                    step: wait.step.clone(),
                    kind: StepKind::Signal,
                    result: envelope.clone(),
                },
                fence: wait.fence.clone(),
                renew: None,
            };
            return Ok(match self.append(&append)? {
                AppendOutcome::Appended => {
                    self.sources.buffered_remove(&wait.token, seq);
                    self.sources.waiter_remove(&id);
                    SignalWaitOutcome::Delivered(envelope)
                }
                // Unreachable under the lock (the step was checked above), but if it were
                // there its value is the answer and the buffered signal is not consumed.
                AppendOutcome::AlreadyPresent(stored) => SignalWaitOutcome::Delivered(stored),
                // The signal stays for a waiter that can take it.
                AppendOutcome::RefusedTerminal(_) | AppendOutcome::Conflict => {
                    SignalWaitOutcome::Waiting
                }
            });
        }
        if !waiting {
            self.sources.waiter_push(id, &wait.token, now)?;
        }
        Ok(SignalWaitOutcome::Waiting)
    }

    pub(crate) fn signal_send(
        &mut self,
        token: &str,
        payload: &Value,
        options: &SignalOptions,
    ) -> Result<SignalSendOutcome> {
        signal_token("sending a signal", token)?;
        let now = self.clock.now();
        // Expired signals are undeliverable whatever happens below, so an error after this
        // point may leave them deleted.
        self.sources.buffered_expire(token, now);
        self.sources.buffered_sweep(now, SIGNAL_SWEEP_BATCH);
        if let Some(to) = self.signal_offer(token, payload)? {
            return Ok(SignalSendOutcome::Delivered { to });
        }
        self.sources
            .buffer_push(token, payload.clone(), signal_expiry(now, options))?;
        Ok(SignalSendOutcome::Buffered)
    }

    /// Offers a signal to `token`'s waiters, oldest first; each waiter offered is removed,
    /// and the first that takes it (the step appended, waking it) is returned. Waiters that
    /// can no longer take it (terminal, another generation, already answered) are dropped.
    fn signal_offer(&mut self, token: &str, payload: &Value) -> Result<Option<InstanceKey>> {
        let envelope = Envelope::ok(payload.clone());
        while let Some(waiter) = self.sources.waiter_pop_oldest(token) {
            let outcome = self.append_external(&waiter, StepKind::Signal, envelope.clone())?;
            if outcome == Some(AppendOutcome::Appended) {
                return Ok(Some(waiter.key));
            }
        }
        Ok(None)
    }

    /// Journals a race's `decision` and, when it was appended, gives `signals` (what the
    /// race's losing waits took) back to their tokens: each is offered to its token's waiters
    /// as a send would offer it, and the rest go to the head of their token's buffer, in the
    /// order given, for the default TTL (keiro_signal_return). Any other outcome changes
    /// nothing.
    pub(crate) fn signal_return(
        &mut self,
        decision: &Append,
        signals: &[ReturnedSignal],
    ) -> Result<AppendOutcome> {
        for signal in signals {
            signal_token("returning a signal", &signal.token)?;
        }
        let outcome = self.append(decision)?;
        if outcome != AppendOutcome::Appended {
            return Ok(outcome);
        }
        let now = self.clock.now();
        let mut untaken: Vec<(&str, Vec<Value>)> = Vec::new();
        for signal in signals {
            self.sources.buffered_expire(&signal.token, now);
            if self.signal_offer(&signal.token, &signal.payload)?.is_some() {
                continue;
            }
            match untaken.iter_mut().find(|(token, _)| *token == signal.token) {
                Some((_, payloads)) => payloads.push(signal.payload.clone()),
                None => untaken.push((&signal.token, vec![signal.payload.clone()])),
            }
        }
        let expires_at = signal_expiry(now, &SignalOptions::default());
        for (token, payloads) in untaken {
            self.sources
                .buffer_push_front(token, payloads, expires_at)?;
        }
        Ok(AppendOutcome::Appended)
    }
}
