//! The context's wake sources: durable sleep, awakeables, signals and child workflows.
//!
//! Each is an await: a journal hit replays the recorded value; a miss arms the source once
//! (idempotently: a timer, a waiter, a spawned child) and suspends the run. Whoever resolves the
//! source journals the value into this instance and flips its row to `running` in one
//! transaction, so the next drive replays it.

use std::marker::PhantomData;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::context::{decode, Armed, RecordVia};
use crate::wake::{open, Opened};
use crate::{
    awakeable_step, child_result_step, id, validate_signal_token, ChildSpawn, Ctx, InstanceKey,
    ReturnedSignal, SignalWait, SignalWaitOutcome, StepKind, TimerArm, TimerDue, TimerKind,
    WorkflowError, WorkflowId, WorkflowName,
};

/// An awakeable: a durable promise with a random id, completed from anywhere by id.
///
/// Announce [`id`](Self::id) (from a step, so it is sent once), then await
/// [`value`](Self::value).
#[derive(Debug, Clone)]
pub struct Awakeable<T> {
    ctx: Ctx,
    id: Uuid,
    _value: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Awakeable<T> {
    /// The id to hand to whoever completes it.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// Waits for the completion value: suspends the run until `complete_awakeable(id, ..)`.
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] while pending (propagate it),
    /// [`WorkflowError::AwakeableCancelled`] when it was cancelled.
    pub async fn value(&self) -> Result<T, WorkflowError> {
        let step = awakeable_step(self.id);
        let value = self
            .ctx
            .awaited_with(&step, StepKind::Awakeable, || async {
                Ok(Armed::Deadline(None))
            })
            .await?;
        match open(value.clone()) {
            Some(Opened::Ok(v)) => decode(&step, v),
            Some(Opened::Cancelled) => Err(WorkflowError::AwakeableCancelled { id: self.id }),
            _ => decode(&step, value),
        }
    }
}

impl Ctx {
    /// Sleeps durably for `duration`: the run parks and costs nothing until a timer worker fires
    /// the sleep. The first arm fixes the deadline; a replay never postpones it. The deadline is
    /// `duration` after the store's clock at the arm (the database's `now()`), the clock that
    /// also decides when the timer is due, so a worker whose own clock is off by a minute still
    /// sleeps `duration`.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// ctx.sleep("cool-off", std::time::Duration::from_secs(3600)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until the sleep has fired (propagate it).
    pub async fn sleep(&self, name: &str, duration: Duration) -> Result<(), WorkflowError> {
        self.sleep_on(name, TimerDue::After(duration)).await
    }

    /// Sleeps durably until `at`, an instant of the store's clock (the database's `now()` for
    /// Postgres), which is what decides when the timer is due: a worker whose clock is skewed
    /// against the database's sees it fire by the database's time. See [`sleep`](Self::sleep).
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until the sleep has fired (propagate it).
    pub async fn sleep_until(&self, name: &str, at: OffsetDateTime) -> Result<(), WorkflowError> {
        self.sleep_on(name, TimerDue::At(at)).await
    }

    async fn sleep_on(&self, name: &str, due: TimerDue) -> Result<(), WorkflowError> {
        id::validate_user_step(name)?;
        let step = format!("sleep:{name}");
        let arm = TimerArm {
            key: self.key().clone(),
            generation: self.generation(),
            step: step.clone(),
            due,
            kind: TimerKind::Sleep,
        };
        self.awaited_with(&step, StepKind::Sleep, || async {
            let fire_at = self
                .store()
                .timer_arm(&arm)
                .await
                .map_err(|e| self.store_failed(&step, e))?;
            Ok(Armed::Deadline(Some(fire_at)))
        })
        .await?;
        Ok(())
    }

    /// Creates (or, on replay, recovers) the awakeable `name`: its random id is journaled, so
    /// every drive sees the same one.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// let approval = ctx.awakeable::<bool>("approval").await?;
    /// let id = approval.id();
    /// ctx.step("ask", || async move { println!("approve with {id}"); Ok::<_, std::io::Error>(()) }).await?;
    /// let approved = approval.value().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Halted`] when the run must stop.
    pub async fn awakeable<T: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<Awakeable<T>, WorkflowError> {
        id::validate_user_step(name)?;
        let step = format!("awkid:{name}");
        let recorded = match self.replayed(&step, StepKind::Awakeable)? {
            Some(value) => value,
            None => {
                self.before_fresh_work(&step).await?;
                let fresh = Uuid::new_v4();
                self.record_via(
                    &step,
                    StepKind::Awakeable,
                    Value::String(fresh.to_string()),
                    RecordVia::Awakeable(fresh),
                )
                .await?
            }
        };
        let id: Uuid = decode(&step, recorded)?;
        Ok(Awakeable {
            ctx: self.clone(),
            id,
            _value: PhantomData,
        })
    }

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
                    .map_err(|e| self.store_failed(&step, e))?;
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
                                .map_err(|e| self.store_failed(&step, e))?;
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

    /// Runs workflow `name` as a child with id `id` and waits for its output.
    ///
    /// The child instance is created in the same transaction as the spawn step (never
    /// re-spawned on replay) and driven by any worker that registers `name`. Its completion,
    /// failure (including failure at the crash ceiling) or cancellation is journaled into this
    /// run in the child's terminal transaction.
    ///
    /// A running child has one parent, which alone receives its result. When an instance with
    /// the child's key already exists:
    /// - finished: its result is journaled here at once (ids are never reused, so a spawn of a
    ///   finished child reads its outcome);
    /// - running with no parent, or for an earlier generation of this very instance (this run
    ///   continued as new since it spawned it): this generation becomes its parent;
    /// - running for another instance: the spawn is refused with
    ///   [`WorkflowError::ChildTaken`], at once and journaled, so every replay takes the same
    ///   branch. Wait for the other parent's outcome another way (a signal it sends, say), or
    ///   give children of different parents different ids.
    ///
    /// ```no_run
    /// # async fn body(ctx: keiro_journal::Ctx) -> Result<(), keiro_journal::WorkflowError> {
    /// let label: String = ctx.child("ship", "order-42-ship", &"order-42").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until the child finishes, [`WorkflowError::ChildFailed`],
    /// [`WorkflowError::ChildCancelled`], [`WorkflowError::ChildTaken`],
    /// [`WorkflowError::InvalidStep`] for a bad name or id.
    pub async fn child<I: Serialize + ?Sized, O: DeserializeOwned>(
        &self,
        name: &str,
        id: &str,
        input: &I,
    ) -> Result<O, WorkflowError> {
        self.spawn_child(name, id, input).await?;
        self.await_child(name, id).await
    }

    /// Spawns child `name`/`id` without waiting for it; await it later with
    /// [`await_child`](Self::await_child), or never (fire and forget). The child row is created
    /// in the spawn step's transaction and never re-created on replay. A child running for
    /// another parent refuses the spawn (see [`child`](Self::child)).
    ///
    /// # Errors
    ///
    /// [`WorkflowError::ChildTaken`], [`WorkflowError::InvalidStep`] for a bad name or id,
    /// [`WorkflowError::Halted`].
    pub async fn spawn_child<I: Serialize + ?Sized>(
        &self,
        name: &str,
        id: &str,
        input: &I,
    ) -> Result<(), WorkflowError> {
        let child = child_key(name, id)?;
        let spawn_step = format!("child:{}/{}", child.name, child.id);
        let recorded = match self.replayed(&spawn_step, StepKind::Child)? {
            Some(recorded) => recorded,
            None => {
                self.before_fresh_work(&spawn_step).await?;
                let input = self.encode(&spawn_step, input)?;
                let spawn = ChildSpawn {
                    await_step: child_result_step(&child),
                    child: child.clone(),
                    input,
                };
                let named = serde_json::json!({ "name": child.name, "id": child.id });
                self.record_via(&spawn_step, StepKind::Child, named, RecordVia::Child(spawn))
                    .await?
            }
        };
        // A refused spawn is recorded with the parent that holds the child.
        match recorded.get("taken") {
            None => Ok(()),
            Some(parent) => {
                let parent: InstanceKey = decode(&spawn_step, parent.clone())?;
                Err(WorkflowError::ChildTaken { child, parent })
            }
        }
    }

    /// Waits for child `name`/`id` (spawned by this run) to finish.
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Suspended`] until it finishes, [`WorkflowError::ChildFailed`],
    /// [`WorkflowError::ChildCancelled`], [`WorkflowError::ChildTaken`] when the spawn was
    /// refused.
    pub async fn await_child<O: DeserializeOwned>(
        &self,
        name: &str,
        id: &str,
    ) -> Result<O, WorkflowError> {
        let child = child_key(name, id)?;
        let await_step = child_result_step(&child);
        let value = self
            .awaited_with(&await_step, StepKind::Child, || async {
                Ok(Armed::Deadline(None))
            })
            .await?;
        match open(value.clone()) {
            Some(Opened::Ok(v)) => decode(&await_step, v),
            Some(Opened::Failed(reason)) => Err(WorkflowError::ChildFailed { child, reason }),
            Some(Opened::Cancelled) => Err(WorkflowError::ChildCancelled { child }),
            Some(Opened::Taken(parent)) => Err(WorkflowError::ChildTaken { child, parent }),
            _ => decode(&await_step, value),
        }
    }

    /// Cancels child `name`/`id` (journaled, so it happens once); a run awaiting it then sees
    /// [`WorkflowError::ChildCancelled`].
    ///
    /// # Errors
    ///
    /// [`WorkflowError::Step`] when the cancel could not be recorded (unknown child),
    /// [`WorkflowError::Halted`] when this run must stop.
    pub async fn cancel_child(&self, name: &str, id: &str) -> Result<(), WorkflowError> {
        let child = child_key(name, id)?;
        let step = format!("child:{}/{}:cancel", child.name, child.id);
        let store = self.store().clone();
        self.journaled(&step, StepKind::Child, || async move {
            store
                .instance_cancel(&child, true)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
    }
}

fn child_key(name: &str, id: &str) -> Result<InstanceKey, WorkflowError> {
    Ok(InstanceKey::new(
        WorkflowName::new(name)?,
        WorkflowId::new(id)?,
    ))
}
