//! Queues: the flow-control rules a run is admitted under, and what a start on a queue asks.
//!
//! A queue is declared in code ([`QueueSpec`]) and recorded in the store, which admits its
//! runs inside the claim transaction: no limit here is ever exceeded by any number of workers,
//! because every worker's admission reads and writes the same rows under the queue's lock.
//! This module is plain data and its validation; the rules live in the stores.

use std::time::Duration;

use time::OffsetDateTime;

use crate::model::id::ID_LEN_MAX;
use crate::InstanceKey;

/// A rate limit: at most `limit` admissions in any window of `period`.
///
/// ```
/// use std::time::Duration;
/// let rate = keiro_journal::queue::Rate::new(100, Duration::from_secs(60)).unwrap();
/// assert_eq!(rate.limit(), 100);
/// assert!(keiro_journal::queue::Rate::new(0, Duration::from_secs(1)).is_err());
/// assert!(keiro_journal::queue::Rate::new(1, Duration::ZERO).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    limit: i32,
    period: Duration,
}

impl Rate {
    /// `limit` admissions per `period`.
    ///
    /// # Errors
    ///
    /// [`QueueError::InvalidLimit`] for a limit below 1, [`QueueError::InvalidPeriod`] for a
    /// period under one millisecond (or over about 24 days, which the stores cannot keep).
    pub fn new(limit: i32, period: Duration) -> Result<Self, QueueError> {
        if limit < 1 {
            return Err(QueueError::InvalidLimit {
                what: "rate limit",
                value: i64::from(limit),
            });
        }
        let ms = period.as_millis();
        if ms < 1 || ms > i32::MAX as u128 {
            return Err(QueueError::InvalidPeriod { period });
        }
        Ok(Self { limit, period })
    }

    /// Admissions allowed per window.
    pub fn limit(&self) -> i32 {
        self.limit
    }

    /// The window.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The window in whole milliseconds, as the stores keep it.
    pub fn period_ms(&self) -> i64 {
        i64::try_from(self.period.as_millis()).unwrap_or(i64::MAX)
    }
}

/// What a start with a dedup id does while a run with that id on the queue is not terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DedupPolicy {
    /// Refuse the start with [`QueueRefusal::Duplicate`], naming the run that holds the id.
    Refuse,
    /// Return the holder's instance as the start's answer (`created == false`).
    ReturnExisting,
}

impl DedupPolicy {
    /// The text stored in `keiro_queues.dedup`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refuse => "refuse",
            Self::ReturnExisting => "existing",
        }
    }

    /// Parses the stored text.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "refuse" => Some(Self::Refuse),
            "existing" => Some(Self::ReturnExisting),
            _ => None,
        }
    }
}

/// How waiting runs of different keys share a queue's admissions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Fairness {
    /// Oldest first (highest priority first when priority is on), whatever its key.
    #[default]
    Fifo,
    /// Keys take turns, in proportion to their weights (1 unless set with
    /// `queue_key_weight`): a key of weight 3 gets three admissions for every one of a key of
    /// weight 1 while both have runs waiting. With every weight 1 this is round-robin.
    Weighted,
}

impl Fairness {
    /// The text stored in `keiro_queues.fairness`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Weighted => "weighted",
        }
    }

    /// Parses the stored text.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "fifo" => Some(Self::Fifo),
            "weighted" => Some(Self::Weighted),
            _ => None,
        }
    }
}

/// A queue's declaration: its name and limits. Every limit is optional; a queue with none
/// admits whatever a worker has room for, in its order.
///
/// ```
/// use std::time::Duration;
/// use keiro_journal::queue::{QueueSpec, Rate};
/// let llm = QueueSpec::new("llm")
///     .unwrap()
///     .concurrency(10)
///     .key_rate(Rate::new(100, Duration::from_secs(60)).unwrap());
/// assert!(llm.validate().is_ok());
/// assert!(QueueSpec::new("llm").unwrap().concurrency(0).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueSpec {
    /// The queue's name: a workflow-name-like identifier.
    pub name: String,
    /// Runs holding a slot at once, across every worker.
    pub concurrency: Option<i32>,
    /// Runs holding a slot at once on one worker (one lease owner).
    pub worker_concurrency: Option<i32>,
    /// Runs holding a slot at once per key.
    pub key_concurrency: Option<i32>,
    /// First admissions per window, across every key.
    pub rate: Option<Rate>,
    /// First admissions per window, per key.
    pub key_rate: Option<Rate>,
    /// Whether a start's priority orders admission (higher first). Off: a start that gives
    /// one is refused.
    pub priority: bool,
    /// How keys share admissions.
    pub fairness: Fairness,
    /// Dedup ids: refused when `None`.
    pub dedup: Option<DedupPolicy>,
    /// Whether a run parked on a wait gives its slot back (and is admitted again when it
    /// wakes). Default: it does.
    pub release_on_park: bool,
}

impl QueueSpec {
    /// A queue with no limits, FIFO, priority off, no dedup, releasing slots on park.
    ///
    /// # Errors
    ///
    /// [`QueueError::InvalidName`] when `name` is not a valid identifier.
    pub fn new(name: impl Into<String>) -> Result<Self, QueueError> {
        let name = name.into();
        validate_name(&name)?;
        Ok(Self {
            name,
            concurrency: None,
            worker_concurrency: None,
            key_concurrency: None,
            rate: None,
            key_rate: None,
            priority: false,
            fairness: Fairness::Fifo,
            dedup: None,
            release_on_park: true,
        })
    }

    /// At most `n` runs hold a slot at once, fleet-wide.
    pub fn concurrency(mut self, n: i32) -> Self {
        self.concurrency = Some(n);
        self
    }

    /// At most `n` runs hold a slot at once on one worker.
    pub fn worker_concurrency(mut self, n: i32) -> Self {
        self.worker_concurrency = Some(n);
        self
    }

    /// At most `n` runs of one key hold a slot at once.
    pub fn key_concurrency(mut self, n: i32) -> Self {
        self.key_concurrency = Some(n);
        self
    }

    /// At most `rate.limit()` first admissions in any window of `rate.period()`.
    pub fn rate(mut self, rate: Rate) -> Self {
        self.rate = Some(rate);
        self
    }

    /// The same, per key.
    pub fn key_rate(mut self, rate: Rate) -> Self {
        self.key_rate = Some(rate);
        self
    }

    /// Orders admission by the start's priority, higher first.
    pub fn with_priority(mut self) -> Self {
        self.priority = true;
        self
    }

    /// How keys share admissions.
    pub fn fairness(mut self, fairness: Fairness) -> Self {
        self.fairness = fairness;
        self
    }

    /// Accepts dedup ids, with `policy` for a duplicate.
    pub fn dedup(mut self, policy: DedupPolicy) -> Self {
        self.dedup = Some(policy);
        self
    }

    /// Whether a parked run gives its slot back (default `true`).
    pub fn release_on_park(mut self, release: bool) -> Self {
        self.release_on_park = release;
        self
    }

    /// Checks every value: the name, and each limit at least 1.
    ///
    /// # Errors
    ///
    /// The first value that is refused.
    pub fn validate(&self) -> Result<(), QueueError> {
        validate_name(&self.name)?;
        for (what, value) in [
            ("concurrency", self.concurrency),
            ("worker concurrency", self.worker_concurrency),
            ("key concurrency", self.key_concurrency),
        ] {
            if let Some(value) = value.filter(|v| *v < 1) {
                return Err(QueueError::InvalidLimit {
                    what,
                    value: i64::from(value),
                });
            }
        }
        for rate in [self.rate, self.key_rate].into_iter().flatten() {
            Rate::new(rate.limit, rate.period)?;
        }
        Ok(())
    }
}

/// What a start on a queue asks beyond a plain start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueStart {
    /// The queue, which must have been declared.
    pub queue: String,
    /// The key per-key limits and fairness count the run under (a tenant, an account).
    pub key: Option<String>,
    /// A dedup id: while a run with it on this queue is not terminal, the queue's policy
    /// decides what a second start does.
    pub dedup_id: Option<String>,
    /// No admission before this instant (a delayed start).
    pub not_before: Option<OffsetDateTime>,
}

impl QueueStart {
    /// A start on `queue`, with no key, dedup id or delay.
    pub fn new(queue: impl Into<String>) -> Self {
        Self {
            queue: queue.into(),
            key: None,
            dedup_id: None,
            not_before: None,
        }
    }

    /// Checks the queue name, the key and the dedup id.
    ///
    /// # Errors
    ///
    /// [`QueueError::InvalidName`], [`QueueError::InvalidKey`].
    pub fn validate(&self) -> Result<(), QueueError> {
        validate_name(&self.queue)?;
        for (what, value) in [("queue key", &self.key), ("dedup id", &self.dedup_id)] {
            if let Some(value) = value {
                if value.is_empty() || value.len() > ID_LEN_MAX {
                    return Err(QueueError::InvalidKey {
                        what,
                        len: value.len(),
                    });
                }
            }
        }
        Ok(())
    }
}

/// Checks the queue part of a start or a remote step, one rule for both: with no queue, the
/// first of `options` (each its name and whether it was given) that was given is refused with
/// [`QueueError::NoQueue`], since it would be silently lost; with one, what
/// [`QueueStart::validate`] checks. Returns the queue part, if any.
///
/// ```
/// use keiro_journal::queue::{checked_queue, QueueError, QueueStart};
/// let refused = checked_queue(None, &[("key", true)]);
/// assert_eq!(refused, Err(QueueError::NoQueue { option: "key" }));
/// let plain = checked_queue(None, &[("key", false)]);
/// assert_eq!(plain, Ok(None));
/// assert!(checked_queue(Some(QueueStart::new("payments")), &[]).is_ok());
/// ```
///
/// # Errors
///
/// [`QueueError::NoQueue`], and what [`QueueStart::validate`] refuses.
pub fn checked_queue(
    queue: Option<QueueStart>,
    options: &[(&'static str, bool)],
) -> Result<Option<QueueStart>, QueueError> {
    let Some(queue) = queue else {
        return match options.iter().find(|(_, given)| *given) {
            Some((option, _)) => Err(QueueError::NoQueue { option }),
            None => Ok(None),
        };
    };
    queue.validate()?;
    Ok(Some(queue))
}

fn validate_name(name: &str) -> Result<(), QueueError> {
    crate::WorkflowName::new(name)
        .map(drop)
        .map_err(|source| QueueError::InvalidName {
            name: name.to_owned(),
            source,
        })
}

/// A queue value keiro refuses before it reaches the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The queue name is not a valid identifier.
    #[error("queue name {name:?} is invalid: {source}")]
    InvalidName {
        /// The name given.
        name: String,
        /// Why.
        source: crate::IdError,
    },
    /// A limit below 1.
    #[error("{what} must be at least 1, got {value}")]
    InvalidLimit {
        /// Which limit.
        what: &'static str,
        /// The value given.
        value: i64,
    },
    /// A rate period under a millisecond or too long to store.
    #[error("a rate period must be between 1 ms and about 24 days, got {period:?}")]
    InvalidPeriod {
        /// The period given.
        period: Duration,
    },
    /// A key or dedup id that is empty or longer than the id limit.
    #[error("{what} must be 1 to {ID_LEN_MAX} bytes long, got {len}")]
    InvalidKey {
        /// Key or dedup id.
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// A queue option (key, dedup id, priority, delay) on a start, or a key on a remote step,
    /// that names no queue.
    #[error("a start with a {option} must name a queue")]
    NoQueue {
        /// Which option.
        option: &'static str,
    },
    /// A delay that puts the start past the latest instant keiro can store.
    #[error("a delay of {delay:?} is past the latest instant a start can wait for")]
    InvalidDelay {
        /// The delay given.
        delay: Duration,
    },
    /// A key weight below 1.
    #[error("a key weight must be at least 1, got {weight}")]
    InvalidWeight {
        /// The weight given.
        weight: i32,
    },
}

/// Why the store refused a queue operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QueueRefusal {
    /// No queue of that name was declared.
    Unknown,
    /// The start gave a dedup id and the queue takes none.
    DedupNotEnabled,
    /// The start gave a priority and the queue's priority is off.
    PriorityNotEnabled,
    /// A run with the same dedup id is not terminal, and the queue refuses duplicates.
    Duplicate {
        /// The run holding the dedup id.
        holder: InstanceKey,
    },
}

impl std::fmt::Display for QueueRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unknown => f.write_str("no such queue was declared"),
            Self::DedupNotEnabled => f.write_str("the queue takes no dedup ids"),
            Self::PriorityNotEnabled => f.write_str("the queue's priority is off"),
            Self::Duplicate { holder } => write!(f, "the dedup id is held by {holder}"),
        }
    }
}

/// What a debounce call asks: start one run of `name` per burst of calls with `key`, after
/// `delay` of quiet, with the last call's input, and no later than `max_wait` after the burst's
/// first call.
#[derive(Debug, Clone, PartialEq)]
pub struct DebounceRequest {
    /// The workflow.
    pub name: crate::WorkflowName,
    /// The burst's key (validated like a workflow id).
    pub key: String,
    /// The id a new run gets; a call that joins a pending run answers that run's id instead.
    pub id: crate::WorkflowId,
    /// The input as JSON; the last call's wins.
    pub input: serde_json::Value,
    /// Quiet time after the last call before the run may start.
    pub delay: Duration,
    /// The longest a burst's run waits after its first call, however often it is pushed back.
    pub max_wait: Duration,
    /// Pins the clock (tests); `None` uses the store's.
    pub now: Option<OffsetDateTime>,
}

/// A declared queue as the store keeps it, with what it holds now.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueInfo {
    /// The declaration.
    pub spec: QueueSpec,
    /// Whether admission is paused.
    pub paused: bool,
    /// Runs waiting for admission (including delayed ones).
    pub waiting: i64,
    /// Runs waiting whose `not_before` has not come.
    pub delayed: i64,
    /// Runs holding a slot now; on a queue that counts nothing (no limit of any kind, first in
    /// first out), which marks no run admitted, the runs leased now.
    pub running: i64,
    /// First admissions in the last rate window (the last minute when the queue has no rate).
    /// Always 0 on a queue that counts nothing: it records no admission, so that leasing one
    /// of its runs costs what an ordinary claim costs.
    pub admitted_recently: i64,
    /// When the oldest run ready to be admitted (waiting, not delayed) was started.
    pub oldest_waiting: Option<OffsetDateTime>,
    /// The ten keys with the most runs waiting, then the most holding a slot: key (`""` for
    /// runs with no key), waiting, holding a slot.
    pub top_keys: Vec<(String, i64, i64)>,
}
