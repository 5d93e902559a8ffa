//! Signals: [`Ctx::wait_signal`] waits for the next value sent on a token.
//!
//! Each wake source is an await: a journal hit replays the recorded value; a miss arms the
//! source once, idempotently, and suspends the run. Whoever resolves the source journals the
//! value into this instance and flips its row to `running` in one transaction, so the next drive
//! replays it.

use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::ctx::{decode, Armed};
use crate::model::wake::{open, Opened};
use crate::{
    validate_signal_token, Ctx, ReturnedSignal, SignalWait, SignalWaitOutcome, StepKind, TimerArm,
    TimerDue, TimerKind, WorkflowError,
};

impl Ctx {
    /// Waits for the next signal sent on `token` (by `signal(token, payload)` from anywhere).
    /// Signals sent before the wait are buffered first-in first-out per token, and a signal is
    /// delivered to exactly one wait. With `timeout`, the wait ends with
    /// [`WorkflowError::SignalTimeout`] if no signal arrives in time.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// let paid: u64 = ctx.wait_signal("order-42/paid", None).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until a signal (or the timeout) arrives,
    /// [`WorkflowError::SignalTimeout`], [`WorkflowError::InvalidStep`] for a bad token.
    pub async fn wait_signal<T: DeserializeOwned>(
        &self,
        token: &str,
        timeout: Option<Duration>,
    ) -> Result<T, WorkflowError> {
        validate_signal_token(token)?;
        // The n-th wait on a token in this body is always the n-th step for it, on every drive.
        let ordinal = {
            let mut state = self.state();
            let next = state.signal_ordinals.entry(token.to_owned()).or_insert(0);
            *next += 1;
            *next
        };
        let step = format!("signal:{token}:{ordinal}");
        let wait = SignalWait {
            key: self.key().clone(),
            generation: self.generation(),
            step: step.clone(),
            token: token.to_owned(),
            fence: self.options().fence.clone(),
        };
        let value = self
            .awaited_with(&step, StepKind::Signal, || async {
                let outcome = self
                    .store()
                    .signal_wait(&wait)
                    .await
                    .map_err(|e| self.inner.store_failed(&step, e))?;
                if outcome == SignalWaitOutcome::Waiting {
                    self.state().signal_waits_armed.push(step.clone());
                }
                match outcome {
                    SignalWaitOutcome::Delivered(value) => Ok(Armed::Ready(value)),
                    SignalWaitOutcome::Waiting => match timeout {
                        None => Ok(Armed::Deadline(None)),
                        Some(timeout) => {
                            let arm = TimerArm {
                                key: self.key().clone(),
                                generation: self.generation(),
                                step: step.clone(),
                                due: TimerDue::After(timeout),
                                kind: TimerKind::SignalTimeout {
                                    token: token.to_owned(),
                                },
                            };
                            let fire_at = self
                                .store()
                                .timer_arm(&arm)
                                .await
                                .map_err(|e| self.inner.store_failed(&step, e))?;
                            Ok(Armed::Deadline(Some(fire_at)))
                        }
                    },
                }
            })
            .await?;
        match open(value.clone()) {
            Some(Opened::Ok(v)) => {
                // Taken by this wait: if it is in a race's losing branch, the race gives it back.
                if let Some(marks) = &mut self.state().race_marks {
                    marks.signals.push(ReturnedSignal {
                        token: token.to_owned(),
                        payload: v.clone(),
                    });
                }
                decode(&step, v)
            }
            Some(Opened::Timeout) => Err(WorkflowError::SignalTimeout {
                token: token.to_owned(),
            }),
            _ => decode(&step, value),
        }
    }
}
