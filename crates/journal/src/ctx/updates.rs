//! Updates: requests a caller sends into the run, which the body takes
//! ([`Ctx::next_update`]) and answers once ([`Ctx::reply`], [`Ctx::reject`]).
//!
//! A take is a signal wait on the instance's token for that update name
//! ([`update_token`](crate::update::update_token)), journaled under `update:<name>:<n>` (the
//! `n`-th take of the name in the generation): a journal hit replays the same update, a miss
//! takes the oldest update sent and not taken or parks the run until one is sent. An answer is
//! a body-recorded step `update:<name>#<id>` (kind [`StepKind::Update`]) written with the
//! update's row in one transaction ([`JournalStore::update_answer`](crate::JournalStore::update_answer)).

use std::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::ctx::{Armed, RecordVia};
use crate::model::payload::decode;
use crate::model::update::{
    update_answer_step, update_take_step, update_token, validate_update_name, Update, UpdateAnswer,
};
use crate::model::wake::{open, Opened};
use crate::{Ctx, ReturnedSignal, SignalWait, SignalWaitOutcome, StepKind, WorkflowError};

/// A reply's journaled value.
#[derive(Serialize)]
struct Replied<'a, T: ?Sized> {
    ok: &'a T,
}

/// A rejection's journaled value.
#[derive(Serialize)]
struct Rejected<'a> {
    rejected: &'a str,
}

impl Ctx {
    /// Takes the next update named `name` sent to this instance (`Keiro::update` in the
    /// facade), oldest first; parks the run until one is sent. Each update is taken once, and
    /// replay takes the same one. Answer it with [`reply`](Self::reply) or
    /// [`reject`](Self::reject): its caller waits for that. It works as a
    /// [`select`](Self::select) branch (race it against a sleep for a deadline); an update a
    /// losing branch took goes back to the head of the queue.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// let update = ctx.next_update::<u32>("approve").await?;
    /// if update.request > 100 {
    ///     ctx.reject(&update, "over the limit").await?;
    /// } else {
    ///     ctx.reply(&update, &true).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until an update arrives; [`WorkflowError::InvalidStep`] for
    /// a name [`validate_update_name`](crate::update::validate_update_name) refuses;
    /// [`WorkflowError::Decode`] when the request does not decode into `T` (the update is
    /// taken, and its caller gets no answer until the run ends: take
    /// `next_update::<serde_json::Value>` to check a request yourself and reject it).
    ///
    /// An update taken and not answered when the run continues as new stays unanswered until
    /// the run ends (its caller then gets `unanswered`): answer before `continue_as_new`.
    pub async fn next_update<T: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<Update<T>, WorkflowError> {
        validate_update_name(name)?;
        let token = update_token(self.key(), name);
        // The n-th take of a name in this body is always the n-th step for it, on every drive.
        let ordinal = {
            let mut state = self.state();
            let next = state.signal_ordinals.entry(token.clone()).or_insert(0);
            *next += 1;
            *next
        };
        let step = update_take_step(name, ordinal);
        let wait = SignalWait {
            key: self.key().clone(),
            generation: self.generation(),
            step: step.clone(),
            token: token.clone(),
            fence: self.options().fence.clone(),
        };
        let value = self
            .awaited_with(&step, StepKind::Signal, || async {
                let outcome = self
                    .store()
                    .signal_wait(&wait)
                    .await
                    .map_err(|e| self.inner.store_failed(&step, e))?;
                match outcome {
                    SignalWaitOutcome::Delivered(value) => Ok(Armed::Ready(value)),
                    SignalWaitOutcome::Waiting => {
                        self.state().signal_waits_armed.push(step.clone());
                        Ok(Armed::Deadline(None))
                    }
                }
            })
            .await?;
        match open(value.clone()) {
            Some(Opened::Ok(v)) => {
                // Taken by this wait: if it is in a race's losing branch, the race gives it back.
                if let Some(marks) = &mut self.state().race_marks {
                    marks.signals.push(ReturnedSignal {
                        token,
                        payload: v.clone(),
                    });
                }
                decode(&step, v)
            }
            _ => decode(&step, value),
        }
    }

    /// Answers `update` with `reply`: journaled with the update's answer in one transaction,
    /// so its caller gets `reply` (and so does a caller retrying with the same update id). On
    /// replay it returns at once, writing nothing.
    ///
    /// # Errors
    ///
    /// [`WorkflowError::UpdateAnswered`] for a second answer to the update,
    /// [`WorkflowError::UpdateUnknown`] for an update the instance does not have; the errors
    /// of an unstorable value ([`WorkflowError::Encode`], [`WorkflowError::PayloadTooLarge`]);
    /// [`WorkflowError::Halted`] when the run must stop.
    pub async fn reply<T, R: Serialize + ?Sized>(
        &self,
        update: &Update<T>,
        reply: &R,
    ) -> Result<(), WorkflowError> {
        self.answer(update, false, &Replied { ok: reply }).await
    }

    /// Answers `update` with a typed rejection (its validation failed): its caller gets
    /// `Error::UpdateRejected` with `message`. Otherwise as [`reply`](Self::reply).
    ///
    /// # Errors
    ///
    /// As [`reply`](Self::reply).
    pub async fn reject<T>(&self, update: &Update<T>, message: &str) -> Result<(), WorkflowError> {
        self.answer(update, true, &Rejected { rejected: message })
            .await
    }

    async fn answer<T, V: Serialize>(
        &self,
        update: &Update<T>,
        rejected: bool,
        value: &V,
    ) -> Result<(), WorkflowError> {
        let step = update_answer_step(&update.name, &update.id);
        if !self.state().updates_answered.insert(step.clone()) {
            return Err(WorkflowError::UpdateAnswered {
                name: update.name.clone(),
                id: update.id.clone(),
            });
        }
        if self.replayed(&step, StepKind::Update)?.is_some() {
            return Ok(());
        }
        self.before_fresh_work(&step).await?;
        let json = self.inner.encode(&step, value)?;
        let started = Instant::now();
        let answer = UpdateAnswer {
            name: update.name.clone(),
            id: update.id.clone(),
            rejected,
        };
        self.record_via(&step, StepKind::Update, json, RecordVia::Update(answer))
            .await?;
        if let Some(observer) = &self.inner.options.observer {
            observer.step_finished(&self.inner.key.name, StepKind::Update, started.elapsed());
        }
        Ok(())
    }
}
