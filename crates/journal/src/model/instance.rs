//! The instance row: the one row per workflow instance that is the complete wake ledger.

use serde_json::Value;
use time::OffsetDateTime;

use crate::{Generation, InstanceKey};

/// Where an instance is in its lifecycle.
///
/// ```text
///            start                 park (awaited step absent)
///  (none) ──────────▶ running ─────────────────────────────▶ suspended
///                      │  ▲  ◀──────── any wake / journal append ──┘
///                      │  └───── resurrect (operator) ──┐
///                      ▼                                │
///      completed | cancelled | failed ──────────────────┘ (failed only)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Runnable now: discovered by every resume pass until a worker drives it.
    Running,
    /// Parked on a wake source; discovered only once `wake_after` is due or a wake flips it.
    Suspended,
    /// The body returned; terminal.
    Completed,
    /// Failed at the crash ceiling, by divergence, or by an operator; terminal but revivable.
    Failed,
    /// Cancelled; terminal.
    Cancelled,
}

impl Status {
    /// The text stored in the `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Suspended => "suspended",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Parses the `status` column.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "running" => Self::Running,
            "suspended" => Self::Suspended,
            "completed" => Self::Completed,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }

    /// Whether no run will ever drive the instance again without an operator.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The lease a worker holds on an instance: who, which claim (the fencing token), until when.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The holder's owner id.
    pub owner: String,
    /// Bumped by every successful claim; a write carrying an older epoch is refused.
    pub epoch: i64,
}

/// A snapshot of an instance row.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// Name and id.
    pub key: InstanceKey,
    /// The current journal generation.
    pub generation: Generation,
    /// Lifecycle status.
    pub status: Status,
    /// The current generation's input.
    pub input: Value,
    /// The output, once completed.
    pub output: Option<Value>,
    /// Crashes since the last progress.
    pub attempts: i32,
    /// Claims handed back since the last progress because the claiming worker could not open
    /// the run's payload (it lacks the key): they gate the next claim on their own backoff and
    /// never count as crashes, so they spend none of `attempts`' budget.
    pub open_refusals: i32,
    /// The last crash's error, or the failure reason.
    pub last_error: Option<String>,
    /// The backoff gate: no claim before this time.
    pub next_attempt_at: Option<OffsetDateTime>,
    /// The current or last lease holder.
    pub lease_owner: Option<String>,
    /// The fencing token of the latest claim.
    pub lease_epoch: i64,
    /// When the current lease expires.
    pub lease_expires_at: Option<OffsetDateTime>,
    /// When a suspended instance becomes due again (sleep deadline or reconcile fallback).
    pub wake_after: Option<OffsetDateTime>,
    /// The parent, for a child workflow.
    pub parent: Option<InstanceKey>,
    /// Higher runs first among instances discovered together.
    pub priority: i32,
    /// The queue the run was started on, if any.
    pub queue: Option<String>,
    /// The run's key on its queue, if any.
    pub queue_key: Option<String>,
    /// The application version of the process that started the run (or continued it into its
    /// current generation); `None` when unversioned. Workers claim only runs of the versions
    /// they serve.
    pub app_version: Option<String>,
    /// When it was started.
    pub created_at: OffsetDateTime,
    /// Last change to the row.
    pub updated_at: OffsetDateTime,
    /// When it went terminal.
    pub completed_at: Option<OffsetDateTime>,
}

/// What `start` asks the store to create.
#[derive(Debug, Clone, PartialEq)]
pub struct StartRequest {
    /// Name and id.
    pub key: InstanceKey,
    /// The input as JSON.
    pub input: Value,
    /// The parent, for a child workflow.
    pub parent: Option<InstanceKey>,
    /// Discovery priority; higher first. Defaults to 0.
    pub priority: i32,
    /// The queue to start the run on, with its key, dedup id and delay; `None` for a run
    /// any worker may claim at once.
    pub queue: Option<crate::queue::QueueStart>,
    /// The run's search attributes, written with the row when the start creates it (a start
    /// that finds the instance writes none). Only `instance_start` and `instances_start` keep
    /// them; the other operations that take a start refuse them. Empty by default.
    pub attributes: crate::attribute::Attributes,
}

impl StartRequest {
    /// A plain start of `key` with `input`: no parent, priority 0, no queue, no attributes
    /// (what `start` sends).
    ///
    /// ```
    /// use keiro_journal::{store::StartRequest, InstanceKey};
    /// let request = StartRequest::new(InstanceKey::parse("order", "o-1")?, serde_json::json!(7));
    /// assert_eq!((request.priority, request.queue.is_none()), (0, true));
    /// # Ok::<_, keiro_journal::IdError>(())
    /// ```
    #[must_use]
    pub fn new(key: InstanceKey, input: Value) -> Self {
        Self {
            key,
            input,
            parent: None,
            priority: 0,
            queue: None,
            attributes: crate::attribute::Attributes::default(),
        }
    }
}

/// The result of `start`.
#[derive(Debug, Clone, PartialEq)]
pub struct Started {
    /// The instance row as it now is.
    pub instance: Instance,
    /// `false` when an instance with this key already existed (start is idempotent by key).
    pub created: bool,
}
