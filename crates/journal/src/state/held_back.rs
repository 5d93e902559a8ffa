//! A run's last step shares its completion's commit.
//!
//! A body that returns right after its last step would pay two commits in a row, one for the
//! step and one for the completion. So a plain step's append is held back once its action has
//! run, when nothing else of the run is in flight, and the body gets the value at once. What
//! the body does next decides where the append goes:
//!
//! - it returns its output: the completion carries the step, and both are journaled in one
//!   transaction ([`JournalStore::journal_append_closing`]), the completion only if the step
//!   left the value the body saw;
//! - it calls the context again (another step, an await, a patch, a select): the call sends the
//!   held-back append first and goes on once it is answered, exactly as if the step had waited
//!   for it;
//! - it waits on anything else (its own I/O, a timer of its own): the driver sends the append
//!   as soon as the body's poll comes back pending, so nothing durable waits on the body;
//! - it ends otherwise (an error, a park, a continue-as-new): the append is sent alone before
//!   the run's closing write.
//!
//! A crash before the append is sent loses the step's result, as a crash between an action and
//! its append always could: the step runs again when the run is resumed. A context call
//! dropped while it sends the append (a `timeout` around it) puts it back to be held, so the
//! next call, the driver or the settle sends it again. A held-back append
//! that meets a journal holding another value for its step (a racing writer) stops the run
//! (`Conflict`), since the body already went on with its own value; the resumed run replays the
//! recorded one.
//!
//! Only plain steps ([`Ctx::step`](crate::Ctx::step)) of a fenced run driven by [`drive`](crate::drive) are held
//! back, never while another action runs beside them or remote dispatches wait for the park,
//! and never under fault injection, whose crash points name journaled steps.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::model::budget::encoded_len;
use crate::model::payload::decode;
use crate::state::{Halt, Run};
use crate::store::contract::{Append, AppendOutcome};
use crate::{StepKind, WorkflowError};

/// A fresh step's append the run has not sent yet.
#[derive(Debug)]
pub(crate) struct HeldBack {
    /// The step's name.
    pub(crate) step: String,
    /// The append, with the run's fence and renewal.
    pub(crate) append: Append,
    /// The encoded length of the value, for the journal budget.
    len: usize,
    /// The step's kind and when its action started: the step observer times a step to the end
    /// of its append, which comes later for a held-back one.
    kind: StepKind,
    started: Instant,
}

impl Run {
    /// Holds back the append of the step whose action just ran, when it may be (see the module
    /// docs), and returns the value the body gets; `None` when the step must be recorded now.
    pub(crate) fn hold_back<T>(
        &self,
        step: &str,
        kind: StepKind,
        started: Instant,
        value: &T,
    ) -> Option<Result<T, WorkflowError>>
    where
        T: Serialize + DeserializeOwned,
    {
        let options = &self.options;
        if kind != StepKind::Step || options.fence.is_none() || options.faults.is_some() {
            return None;
        }
        {
            let state = self.state();
            let quiet = state.drives_held_back
                && state.held_back.is_none()
                && !state.held_back_sending
                && state.actions_running == 1
                && state.deferred.is_empty()
                && state.halt.is_none();
            if !quiet {
                return None;
            }
        }
        let json = match self.encode(step, value) {
            Ok(json) => json,
            Err(error) => return Some(Err(self.fail_at_once(error))),
        };
        let len = encoded_len(&json);
        if let Err(error) = self.check_budget_for(step, len) {
            return Some(Err(error));
        }
        let append = self.fresh_append(step, kind, json.clone());
        {
            let mut state = self.state();
            state.replay.record_fresh(step, kind, json.clone());
            state.held_back = Some(HeldBack {
                step: step.to_owned(),
                append,
                len,
                kind,
                started,
            });
        }
        Some(decode(step, json))
    }

    /// Whether an append is held back and nobody is sending it yet.
    pub(crate) fn holds_back(&self) -> bool {
        self.state().held_back.is_some()
    }

    /// Sends the held-back append, if any, or waits for whoever is sending it; returns once
    /// the journal holds it. Every context call that writes or runs an action calls this
    /// first, so the journal keeps the body's order.
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Halted`] when the append did not record the body's value.
    pub(crate) async fn send_held_back(&self) -> Result<(), WorkflowError> {
        let mut waited = false;
        loop {
            let sent = self.held_back_sent.notified();
            tokio::pin!(sent);
            sent.as_mut().enable();
            let taken = {
                let mut state = self.state();
                match state.held_back.take() {
                    Some(held) => {
                        state.held_back_sending = true;
                        Some(held)
                    }
                    None if state.held_back_sending => None,
                    // Nothing held back; or someone else's send ended, whose error halted
                    // the run if it did not record the body's value.
                    None => {
                        return match &state.halt {
                            Some(halt) if waited => Err(WorkflowError::Halted {
                                reason: halt.describe(),
                            }),
                            _ => Ok(()),
                        }
                    }
                }
            };
            match taken {
                Some(held) => {
                    let mut sending = Sending {
                        run: self,
                        held: Some(held),
                    };
                    let outcome = match &sending.held {
                        Some(held) => self.append_held_back(held).await,
                        None => Ok(()),
                    };
                    sending.held = None;
                    return outcome;
                }
                None => {
                    sent.await;
                    waited = true;
                }
            }
        }
    }

    /// The held-back append, for the completion to carry; `None` when there is none.
    pub(crate) fn take_held_back(&self) -> Option<HeldBack> {
        self.state().held_back.take()
    }

    async fn append_held_back(&self, held: &HeldBack) -> Result<(), WorkflowError> {
        let sent_at = Instant::now();
        let outcome = self
            .store
            .journal_append(&held.append)
            .await
            .map_err(|e| self.store_failed(&held.step, e))?;
        self.held_back_answered(held, &outcome, sent_at)
    }

    /// What the body must learn of the answer to its held-back append: nothing when it recorded
    /// the body's value, a halt otherwise.
    pub(crate) fn held_back_answered(
        &self,
        held: &HeldBack,
        outcome: &AppendOutcome,
        sent_at: Instant,
    ) -> Result<(), WorkflowError> {
        match outcome {
            AppendOutcome::Appended => {
                self.confirmed(sent_at);
                self.count_appended(held.len);
                self.state().stats.appended += 1;
                self.observe_held_back(held);
                Ok(())
            }
            AppendOutcome::AlreadyPresent(_) if held.append.recorded_by(outcome) => {
                self.observe_held_back(held);
                Ok(())
            }
            // The body went on with a value the journal does not hold.
            AppendOutcome::AlreadyPresent(_) | AppendOutcome::Conflict => {
                Err(self.halt(Halt::Conflict {
                    step: held.step.clone(),
                }))
            }
            AppendOutcome::RefusedTerminal(marker) => Err(self.halt(Halt::Terminal(*marker))),
        }
    }

    /// Tells the step observer that a held-back step is journaled, as an unheld one is told
    /// after its append.
    fn observe_held_back(&self, held: &HeldBack) {
        if let Some(observer) = &self.options.observer {
            observer.step_finished(&self.key.name, held.kind, held.started.elapsed());
        }
    }
}

/// A send of the held-back append under way. Its caller's future may be dropped before the
/// store answers (a body's `timeout` or `select!` around a context call, a failing sibling in
/// a `try_join!`): then the append goes back to be held, to be sent again by the next context
/// call, the driver or the settle (an append is idempotent: one that landed after all answers
/// `AlreadyPresent` with the same value). Either way the run's other callers stop waiting for
/// this send.
struct Sending<'a> {
    run: &'a Run,
    /// The append, until the store answered it.
    held: Option<HeldBack>,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        {
            let mut state = self.run.state();
            if let Some(held) = self.held.take() {
                state.held_back.get_or_insert(held);
            }
            state.held_back_sending = false;
        }
        self.run.held_back_sent.notify_waiters();
    }
}

/// Polls `body` to its end, sending the run's held-back append whenever the body waits on
/// something else (see the module docs). A send under way when the body returns is finished
/// before this returns.
pub(crate) async fn drive_body<F: Future>(run: &Run, body: F) -> F::Output {
    run.state().drives_held_back = true;
    let mut body = std::pin::pin!(body);
    let mut sending: Option<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = None;
    let mut output = None;
    std::future::poll_fn(|cx| loop {
        if output.is_none() {
            if let Poll::Ready(out) = body.as_mut().poll(cx) {
                output = Some(out);
            }
        }
        if let Some(send) = sending.as_mut() {
            if send.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            sending = None;
            if output.is_none() {
                // The body may have waited for this send: its turn again.
                continue;
            }
        }
        if let Some(out) = output.take() {
            return Poll::Ready(out);
        }
        if run.holds_back() {
            // Its errors halt the run, which the body's next call or the settle reports.
            sending = Some(Box::pin(async move {
                let _ = run.send_held_back().await;
            }));
            continue;
        }
        return Poll::Pending;
    })
    .await
}
