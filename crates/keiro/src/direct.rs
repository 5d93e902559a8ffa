//! Direct execution: [`Worker::run_workflow`] and [`Worker::run_named`] start an instance and
//! drive it at once in the calling task, holding its lease, then return its output.
//!
//! Through [`Keiro::start`](crate::Keiro::start) a run waits for a worker to notice it (a
//! notification or a poll), to claim it (a round trip), and the caller waits again for the
//! worker to finish it. A direct run skips all three: the instance row is inserted already
//! leased to the caller, in the one statement that starts it, and the caller drives the body
//! itself with the worker's registry and options.
//!
//! # Design
//!
//! ```text
//!   run_workflow(id, input)
//!     │ start + lease, one transaction (no NOTIFY)
//!     ├─ created, or existing and claimable now ──► drive here, as a worker pass drives a claim
//!     │                                               │ completed ──────────────► Ok(output)
//!     │                                               │ continued as new ───────► claim again, drive again
//!     │                                               │ parked, crashed, failed,
//!     │                                               │ cancelled, lease lost,
//!     │                                               ▼ store error
//!     └─ existing, not claimable now ────────────► await the result (push, poll fallback),
//!                                                   while workers resume the instance
//! ```
//!
//! - **The database is authoritative** for the lease, as for any claim: the row is inserted
//!   with `lease_owner`, epoch 1 and `lease_expires_at = now() + lease_ttl` by the database
//!   clock, so no worker can claim the instance before that lease expires, and nothing is
//!   notified (no worker could take it).
//! - **The drive is the worker's** ([`keiro_resume::drive_claim`]): the same replay,
//!   confirmation (`confirm_after`), heartbeat while an action runs, fenced appends and parks,
//!   and the same handling of each ending: a crash (an error or a panic out of a step) is
//!   recorded with backoff against `max_attempts`, a park releases the lease, a store error
//!   releases it, a divergence fails the instance. Whatever did not complete is then resumed
//!   by the resume workers, and the caller awaits it like [`Keiro::result`](crate::Keiro::result):
//!   woken by the worker's push notifier when it has one, else reading the row once per
//!   `poll_interval`.
//! - **An existing id** keeps its instance and its original input, as `start` does. It is
//!   driven here only when a worker could claim it now (running, or suspended with a due
//!   wake-up; lease free or expired; backoff gate open), and then under a proper claim that
//!   fences any earlier holder; a completed instance answers its recorded output at once, a
//!   parked, leased or paced one is awaited.
//! - **If the caller goes away** (the future is dropped, the task aborted, the process dies)
//!   mid-run, the lease simply stops being renewed: a resume worker claims the instance when it
//!   expires, within `lease_ttl` plus one poll interval, and replays its journal. Nothing is
//!   lost and no journaled step runs again.
//!
//! A name the worker has not registered is refused before anything is written
//! ([`DirectError::Unregistered`]): a run this worker cannot drive would only wait for
//! another one.

use std::time::Instant;

use keiro_journal::{
    store::encode_payload, store::StartRequest, store::INPUT_STEP, IdError, InstanceKey,
    RunOutcome, StoreError, WorkflowError, WorkflowName,
};
use keiro_lease::ClaimOutcome;
use keiro_resume::ResumeLogEvent;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::result::await_result;
use crate::{ResultError, ResultOptions, Worker, WorkflowDef};

/// Why a direct run gave no output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DirectError {
    /// The workflow name or instance id is invalid; nothing was started.
    #[error("invalid identifier")]
    InvalidId(#[from] IdError),
    /// This worker has no workflow registered under the name; nothing was started.
    #[error("workflow {name} is not registered on this worker")]
    Unregistered {
        /// The name asked for.
        name: WorkflowName,
    },
    /// The input does not encode, exceeds the payload limit or holds a value no store keeps;
    /// nothing was started.
    #[error("invalid input")]
    Payload(#[source] WorkflowError),
    /// Starting the instance failed. When the connection broke while the start committed, the
    /// instance may exist all the same: running the same id again answers it.
    #[error("starting instance {key}")]
    Start {
        /// The instance.
        key: InstanceKey,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The instance exists but gave no output: it failed or was cancelled, its output does not
    /// decode, or reading it failed.
    #[error("awaiting the result")]
    Result(#[from] ResultError),
}

impl DirectError {
    /// Whether the instance is known to have failed or been cancelled: running or awaiting it
    /// again gives the same answer until an operator acts.
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Result(result) if result.is_final())
    }
}

impl Worker {
    /// Starts instance `id` of the typed workflow `W` with `input` and drives it here and now,
    /// holding its lease: no worker has to notice, claim or finish it. Returns its output once
    /// it completes. If the run parks (a sleep, an await, a signal, a child, a remote step) or
    /// crashes, the lease is released as a worker releases it, the resume workers take over,
    /// and this call waits for the result (woken by push when the worker has it).
    ///
    /// Idempotent by id like [`Keiro::start_workflow`](crate::Keiro::start_workflow): an
    /// existing instance keeps its input; it is driven here only when a worker could claim it
    /// now, and awaited otherwise (a completed one answers at once). Dropping the future
    /// mid-run is safe: a resume worker recovers the instance when its lease expires.
    ///
    /// ```no_run
    /// # use keiro::{Ctx, Keiro, WorkflowDef, WorkflowError};
    /// #[derive(Default)]
    /// struct Double;
    ///
    /// impl WorkflowDef for Double {
    ///     const NAME: &'static str = "double";
    ///     type Input = u32;
    ///     type Output = u64;
    ///     async fn run(&self, ctx: Ctx, n: u32) -> Result<u64, WorkflowError> {
    ///         ctx.step("double", || async move { Ok::<_, std::io::Error>(u64::from(n) * 2) }).await
    ///     }
    /// }
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let keiro = Keiro::connect("postgres://postgres@127.0.0.1:5432/postgres").await?;
    /// let worker = keiro.worker().register_workflow::<Double>().build()?;
    /// tokio::spawn({
    ///     let worker = worker.clone();
    ///     async move { worker.run().await } // resumes what parks, and what a crash leaves
    /// });
    /// let doubled = worker.run_workflow::<Double>("double-1", &21).await?; // driven here
    /// assert_eq!(doubled, 42);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Before anything is written: [`DirectError::InvalidId`] (also for an invalid `W::NAME`),
    /// [`DirectError::Unregistered`] when this worker did not register `W::NAME`,
    /// [`DirectError::Payload`]. Then [`DirectError::Start`] when the start fails, and
    /// [`DirectError::Result`] for a run that failed or was cancelled
    /// ([`ResultError::Failed`], [`ResultError::Cancelled`]), an output that does not decode,
    /// or a failure to read it.
    pub async fn run_workflow<W: WorkflowDef>(
        &self,
        id: &str,
        input: &W::Input,
    ) -> Result<W::Output, DirectError> {
        let key = InstanceKey::parse(W::NAME, id)?;
        self.run_direct(key, input).await
    }

    /// [`run_workflow`](Self::run_workflow) for a workflow registered by name, with its output
    /// decoded as `T`: the stringly form, for dynamic callers.
    ///
    /// ```no_run
    /// # async fn demo(worker: keiro::Worker) -> Result<(), keiro::DirectError> {
    /// let receipt: String = worker.run_named("order", "order-42", &"order-42").await?;
    /// # let _ = receipt; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`run_workflow`](Self::run_workflow); an unknown `name` is
    /// [`DirectError::Unregistered`], and nothing is started.
    pub async fn run_named<T: DeserializeOwned, I: Serialize + ?Sized>(
        &self,
        name: &str,
        id: &str,
        input: &I,
    ) -> Result<T, DirectError> {
        let key = InstanceKey::parse(name, id)?;
        self.run_direct(key, input).await
    }

    async fn run_direct<T: DeserializeOwned, I: Serialize + ?Sized>(
        &self,
        key: InstanceKey,
        input: &I,
    ) -> Result<T, DirectError> {
        let Some(workflow) = self.registry.get(&key.name).cloned() else {
            return Err(DirectError::Unregistered { name: key.name });
        };
        let input = encode_payload(INPUT_STEP, input, self.options.payload_len_max)
            .map_err(DirectError::Payload)?;
        let owner = self
            .options
            .owner
            .clone()
            .unwrap_or_else(|| format!("keiro-{}", uuid::Uuid::new_v4()));
        let request = StartRequest::new(key, input);
        let ttl = self.options.lease_ttl;
        // The lease is granted no earlier than this: the drive's first confirmation time.
        let mut asked = Instant::now();
        let mut claim = self
            .store
            .instance_start_claimed(&request, &owner, ttl, None)
            .await
            .map_err(|source| DirectError::Start {
                key: request.key.clone(),
                source,
            })?
            .claim;
        let key = request.key;
        if let ClaimOutcome::Acquired(granted) = &claim {
            // An existing run of a version this worker does not serve is left to the workers
            // that do (`keiro::versions`): the claim goes back untouched (nothing ran under
            // it), and the caller waits for the result like any other.
            let version = granted.instance.app_version.as_deref().unwrap_or_default();
            if !self.options.versions.serves(version) {
                let released = self
                    .store
                    .instance_release(&key, &granted.fence, false)
                    .await;
                if let Err(error) = released {
                    (self.options.log)(&ResumeLogEvent::TransientError {
                        key: Some(key.clone()),
                        error: error.to_string(),
                    });
                }
                claim = ClaimOutcome::Unavailable;
            }
        }
        while let ClaimOutcome::Acquired(granted) = claim {
            let driven = keiro_resume::drive_claim(
                &self.store,
                workflow.clone(),
                &self.options,
                *granted,
                asked,
            )
            .await;
            match driven.outcome {
                Some(RunOutcome::Completed(output)) => {
                    return serde_json::from_value(output)
                        .map_err(|source| ResultError::Decode { key, source }.into());
                }
                // The next generation is runnable at once: take it under a proper claim, as
                // a worker's next pass would, unless a worker was quicker.
                Some(RunOutcome::ContinuedAsNew { .. }) => {
                    asked = Instant::now();
                    claim = match self
                        .store
                        .instance_claim_serving(&key, &self.options.versions, &owner, ttl, None)
                        .await
                    {
                        Ok(claim) => claim,
                        Err(error) => {
                            (self.options.log)(&ResumeLogEvent::TransientError {
                                key: Some(key.clone()),
                                error: error.to_string(),
                            });
                            break;
                        }
                    };
                }
                _ => break,
            }
        }
        let options = ResultOptions {
            timeout: None,
            poll_interval: self.options.poll_interval,
        };
        Ok(await_result(self.store.as_ref(), self.push.as_ref(), &key, &options).await?)
    }
}
