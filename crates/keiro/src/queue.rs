//! Queues: flow control enforced where runs are claimed.
//!
//! Declare a queue ([`Keiro::declare_queue`]) with the limits it keeps — concurrency fleet-wide,
//! per worker and per key, a rate fleet-wide and per key, priority, fairness across keys,
//! dedup — start runs on it ([`Keiro::start_with`], [`Keiro::start_workflow_with`]), and let
//! workers serve it ([`WorkerBuilder::queue`](crate::worker::WorkerBuilder::queue)). Every
//! limit is checked in the transaction that leases the run, against rows every worker shares,
//! so it holds across any number of workers and processes. [`Keiro::debounce`] starts one run
//! per burst of calls with a key, after the burst goes quiet.
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use keiro::queue::{QueueSpec, StartOptions};
//! let keiro = keiro::Keiro::temporary()?;
//! keiro.declare_queue(&QueueSpec::new("llm")?.concurrency(2).key_concurrency(1)).await?;
//! # async fn call(_ctx: keiro::Ctx, prompt: String) -> Result<usize, keiro::WorkflowError> {
//! #     Ok(prompt.len())
//! # }
//! let worker = keiro.worker().register("call", call).queue("llm").build()?;
//! for (id, customer) in [("c-1", "acme"), ("c-2", "acme"), ("c-3", "globex")] {
//!     let options = StartOptions::on_queue("llm").key(customer);
//!     keiro.start_with("call", id, &"hello", &options).await?;
//! }
//! worker.drain().await?;
//! let row = keiro.instance(("call", "c-2")).await?.expect("started");
//! assert_eq!(row.status, keiro::Status::Completed);
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))] fn main() {}
//! ```

use std::time::Duration;

use serde::Serialize;
use time::OffsetDateTime;

pub use keiro_journal::queue::{
    DebounceRequest, DedupPolicy, Fairness, QueueError, QueueInfo, QueueRefusal, QueueSpec,
    QueueStart, Rate,
};

use crate::store::Started;
use crate::typed::Handle;
use crate::workflow::{AttrValue, Attributes};
use crate::{Error, Keiro, WorkflowDef};

/// How to start a run beyond its name, id and input: its queue (with key, dedup id and delay),
/// its priority and its search attributes.
///
/// ```
/// use std::time::Duration;
/// use keiro::queue::StartOptions;
/// let options = StartOptions::on_queue("payments")
///     .key("merchant-42")
///     .dedup_id("invoice-7")
///     .delay(Duration::from_secs(30))
///     .attribute("customer", "acme");
/// assert_eq!(options.queue_name(), Some("payments"));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StartOptions {
    queue: Option<String>,
    key: Option<String>,
    dedup_id: Option<String>,
    priority: i32,
    delay: Option<Duration>,
    attributes: Attributes,
}

impl StartOptions {
    /// A start on `queue`.
    pub fn on_queue(queue: impl Into<String>) -> Self {
        Self {
            queue: Some(queue.into()),
            ..Self::default()
        }
    }

    /// The run's key on its queue (a tenant, an account): per-key limits and fairness count
    /// it under this key.
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// A dedup id: while a run with it on this queue is not terminal, the queue's
    /// [`DedupPolicy`] decides what this start does.
    pub fn dedup_id(mut self, id: impl Into<String>) -> Self {
        self.dedup_id = Some(id.into());
        self
    }

    /// Admission order on a queue with priority on; higher first. 0 by default.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// No admission before `delay` from the start (a queue's run waits as delayed).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Search attribute `name` set to `value` (with or without a queue): written with the run
    /// when the start creates it, so the list finds it by them from the start on.
    pub fn attribute(mut self, name: impl Into<String>, value: impl Into<AttrValue>) -> Self {
        self.attributes.insert(name, value);
        self
    }

    /// Every attribute of `attributes` set (replacing those set before under the same names).
    pub fn attributes(mut self, attributes: &Attributes) -> Self {
        for (name, value) in attributes.iter() {
            self.attributes.insert(name, value.clone());
        }
        self
    }

    /// The queue named, if the start is on a queue.
    pub fn queue_name(&self) -> Option<&str> {
        self.queue.as_deref()
    }

    /// The store request's queue part, with the delay turned into an instant.
    ///
    /// # Errors
    ///
    /// [`QueueError::NoQueue`] for a queue option without a queue (it would be lost),
    /// [`QueueError::InvalidDelay`], and what [`QueueStart::validate`] refuses.
    fn resolve(&self) -> Result<Option<QueueStart>, QueueError> {
        let queue = self.queue.as_ref().map(|name| QueueStart {
            key: self.key.clone(),
            dedup_id: self.dedup_id.clone(),
            ..QueueStart::new(name.clone())
        });
        let given = [
            ("key", self.key.is_some()),
            ("dedup id", self.dedup_id.is_some()),
            ("priority", self.priority != 0),
            ("delay", self.delay.is_some()),
        ];
        let Some(mut queue) = keiro_journal::queue::checked_queue(queue, &given)? else {
            return Ok(None);
        };
        if let Some(delay) = self.delay {
            queue.not_before = time::Duration::try_from(delay)
                .ok()
                .and_then(|d| OffsetDateTime::now_utc().checked_add(d))
                .filter(|at| at.year() < 9999)
                .map(Some)
                .ok_or(QueueError::InvalidDelay { delay })?;
        }
        Ok(Some(queue))
    }
}

/// How a debounced start waits: `delay` of quiet after the last call, and at most `max_wait`
/// after the first (10 × `delay` unless set).
///
/// ```
/// use std::time::Duration;
/// let debounce = keiro::queue::Debounce::new(Duration::from_secs(2)).max_wait(Duration::from_secs(30));
/// assert_eq!(debounce.delay(), Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debounce {
    delay: Duration,
    max_wait: Duration,
}

impl Debounce {
    /// Starts after `delay` with no further call; at most 10 × `delay` after the first call.
    pub fn new(delay: Duration) -> Self {
        Self {
            delay,
            max_wait: delay.saturating_mul(10),
        }
    }

    /// Starts at most `max_wait` after a burst's first call, however often it is pushed back.
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// The quiet time.
    pub fn delay(&self) -> Duration {
        self.delay
    }
}

impl Keiro {
    /// Starts one run of workflow `name` per burst of calls with `key`: the run starts once
    /// `debounce.delay()` passed with no further call for `key` (or `max_wait` after the
    /// burst's first call), with the last call's input. Every call of a burst returns the same
    /// run (`created` only for the first); a call after the run started begins a new burst.
    /// The run's id is `<key>~<random hex>`.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let keiro = keiro::Keiro::temporary()?;
    /// let debounce = keiro::queue::Debounce::new(Duration::from_secs(5));
    /// let first = keiro.debounce("reindex", "doc-7", &1, &debounce).await?;
    /// let second = keiro.debounce("reindex", "doc-7", &2, &debounce).await?;
    /// assert_eq!(first.instance.key, second.instance.key);
    /// assert!(first.created && !second.created);
    /// assert_eq!(second.instance.input, serde_json::json!(2)); // the last input wins
    /// # Ok(()) }
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidId`] for an invalid name or key, [`Error::Payload`], [`Error::Store`].
    pub async fn debounce<I: Serialize + ?Sized>(
        &self,
        name: &str,
        key: &str,
        input: &I,
        debounce: &Debounce,
    ) -> Result<Started, Error> {
        keiro_journal::WorkflowId::new(key)?;
        let id = format!("{key}~{}", uuid::Uuid::new_v4().simple());
        let request = DebounceRequest {
            name: keiro_journal::WorkflowName::new(name)?,
            // A key under the id limit can still make an id over it.
            id: keiro_journal::WorkflowId::new(&id)?,
            key: key.to_owned(),
            input: keiro_journal::store::encode_payload(
                keiro_journal::store::INPUT_STEP,
                input,
                self.payload_len_max(),
            )
            .map_err(Error::Payload)?,
            delay: debounce.delay,
            max_wait: debounce.max_wait,
            now: None,
        };
        Ok(self.queue_store()?.queue_debounce(&request).await?)
    }

    /// [`debounce`](Self::debounce) for the typed workflow `W`.
    ///
    /// # Errors
    ///
    /// As [`debounce`](Self::debounce).
    pub async fn debounce_workflow<W: WorkflowDef>(
        &self,
        key: &str,
        input: &W::Input,
        debounce: &Debounce,
    ) -> Result<Handle<W>, Error> {
        let started = self.debounce(W::NAME, key, input, debounce).await?;
        Ok(Handle::from_started(self.clone(), started))
    }

    /// Records queue `spec` in the store (or replaces its limits); a paused queue stays paused.
    /// Safe to call on every process start.
    ///
    /// # Errors
    ///
    /// [`Error::Queue`] for a value refused before the store ([`QueueSpec::validate`]),
    /// [`Error::Store`].
    pub async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), Error> {
        spec.validate()?;
        Ok(self.queue_store()?.queue_declare(spec).await?)
    }

    /// Pauses admission on `queue`: runs already admitted go on, waiting ones wait.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] with [`QueueRefusal::Unknown`] for an undeclared queue.
    pub async fn pause_queue(&self, queue: &str) -> Result<(), Error> {
        self.set_paused(queue, true).await
    }

    /// Resumes admission on `queue`.
    ///
    /// # Errors
    ///
    /// As [`pause_queue`](Self::pause_queue).
    pub async fn resume_queue(&self, queue: &str) -> Result<(), Error> {
        self.set_paused(queue, false).await
    }

    async fn set_paused(&self, queue: &str, paused: bool) -> Result<(), Error> {
        if self.queue_store()?.queue_set_paused(queue, paused).await? {
            Ok(())
        } else {
            Err(unknown(queue))
        }
    }

    /// Sets `key`'s weight on `queue` under [`Fairness::Weighted`]: a key of weight 3 is
    /// admitted three times as often as a key of weight 1 while both have runs waiting.
    ///
    /// # Errors
    ///
    /// [`Error::Queue`] for a weight below 1 or an invalid key, [`Error::Store`] with
    /// [`QueueRefusal::Unknown`] for an undeclared queue.
    pub async fn queue_key_weight(&self, queue: &str, key: &str, weight: i32) -> Result<(), Error> {
        if weight < 1 {
            return Err(QueueError::InvalidWeight { weight }.into());
        }
        let mut check = QueueStart::new(queue);
        check.key = Some(key.to_owned());
        check.validate()?;
        if self
            .queue_store()?
            .queue_key_weight(queue, key, weight)
            .await?
        {
            Ok(())
        } else {
            Err(unknown(queue))
        }
    }

    /// Every declared queue with what it holds now: waiting, delayed and running runs, first
    /// admissions in the last rate window, the oldest waiting run, the busiest keys.
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn queues(&self) -> Result<Vec<QueueInfo>, Error> {
        Ok(self.queue_store()?.queues_list(None, None).await?)
    }

    /// One queue, as [`queues`](Self::queues) describes it; `None` when it was never declared.
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn queue(&self, name: &str) -> Result<Option<QueueInfo>, Error> {
        Ok(self
            .queue_store()?
            .queues_list(Some(name), None)
            .await?
            .pop())
    }

    /// [`start`](Self::start) with `options`: on a queue, the run waits for a worker serving
    /// the queue to admit it within the queue's limits.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), [`Error::Attributes`] for attributes
    /// [`Attributes::validate`] refuses, and [`Error::Queue`] for invalid options (a key, dedup id,
    /// priority or delay with no queue, a delay too far, a key too long); the store refuses
    /// an undeclared queue, a dedup id or priority the queue does not take, and a duplicate
    /// dedup id under [`DedupPolicy::Refuse`] with [`Error::Store`] carrying a
    /// [`QueueRefusal`] ([`Error::queue_refusal`]).
    pub async fn start_with<I: Serialize + ?Sized>(
        &self,
        name: &str,
        id: &str,
        input: &I,
        options: &StartOptions,
    ) -> Result<Started, Error> {
        let request = self.start_request(name, id, input, options)?;
        Ok(self.store().instance_start(&request).await?)
    }

    /// The store request of a start with `options`, checked as every start checks it.
    pub(crate) fn start_request<I: Serialize + ?Sized>(
        &self,
        name: &str,
        id: &str,
        input: &I,
        options: &StartOptions,
    ) -> Result<keiro_journal::store::StartRequest, Error> {
        let key = keiro_journal::InstanceKey::parse(name, id)?;
        options.attributes.validate()?;
        Ok(keiro_journal::store::StartRequest {
            attributes: options.attributes.clone(),
            input: keiro_journal::store::encode_payload(
                keiro_journal::store::INPUT_STEP,
                input,
                self.payload_len_max(),
            )
            .map_err(Error::Payload)?,
            key,
            parent: None,
            priority: options.priority,
            queue: options.resolve()?,
        })
    }

    /// [`start_many`](Self::start_many) with options per item: each item is what
    /// [`start_with`](Self::start_with) would start, one outcome per item in order; one item's
    /// refusal never fails the others. Plain items share one statement and commit.
    ///
    /// # Errors
    ///
    /// Per item, as [`start_with`](Self::start_with).
    pub async fn start_many_with<'a, I: Serialize + ?Sized + 'a>(
        &self,
        name: &str,
        starts: impl IntoIterator<Item = (&'a str, &'a I, StartOptions)>,
    ) -> Vec<Result<Started, Error>> {
        let mut outcomes: Vec<Option<Result<Started, Error>>> = Vec::new();
        let (mut requests, mut sent) = (Vec::new(), Vec::new());
        for (id, input, options) in starts {
            match self.start_request(name, id, input, &options) {
                Ok(request) => {
                    sent.push(outcomes.len());
                    outcomes.push(None);
                    requests.push(request);
                }
                Err(error) => outcomes.push(Some(Err(error))),
            }
        }
        if !requests.is_empty() {
            let answers = self.store().instances_start(&requests).await;
            for (at, answer) in sent.into_iter().zip(answers) {
                outcomes[at] = Some(answer.map_err(Error::from));
            }
        }
        outcomes
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(Error::Store(keiro_journal::StoreError::Malformed {
                        operation: "starting instances",
                        detail: "the store answered fewer starts than it was asked".into(),
                    }))
                })
            })
            .collect()
    }

    /// [`start_workflow`](Self::start_workflow) with `options`.
    ///
    /// # Errors
    ///
    /// As [`start_with`](Self::start_with).
    pub async fn start_workflow_with<W: WorkflowDef>(
        &self,
        id: &str,
        input: &W::Input,
        options: &StartOptions,
    ) -> Result<Handle<W>, Error> {
        let started = self.start_with(W::NAME, id, input, options).await?;
        Ok(Handle::from_started(self.clone(), started))
    }
}

impl Keiro {
    fn queue_store(&self) -> Result<&std::sync::Arc<dyn keiro_lease::QueueStore>, Error> {
        self.queues.as_ref().ok_or(Error::Unsupported {
            what: "queues (the store was built with `KeiroBuilder::lease_only`)",
        })
    }
}

fn unknown(queue: &str) -> Error {
    Error::Store(keiro_journal::StoreError::QueueRefused {
        queue: queue.to_owned(),
        refusal: QueueRefusal::Unknown,
    })
}
