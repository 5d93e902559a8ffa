//! How one run is driven: [`RunOptions`] and its defaults.

use std::sync::Arc;
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use crate::{Fence, StepObserver, TraceContext};

/// The default lease time-to-live of a run.
pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(60);
/// The default largest JSON payload (input, step result, output), in bytes.
pub const PAYLOAD_LEN_MAX_DEFAULT: usize = 4 * 1024 * 1024;
/// The default reconcile fallback for runs parked on an event with no deadline.
pub const RECONCILE_DEFAULT: Duration = Duration::from_secs(300);

/// How one run is driven.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The lease the run holds. `None` runs unfenced (inline use, tests).
    /// Defaults to `None`.
    pub fence: Option<Fence>,
    /// How long each renewal extends the lease. Defaults to [`LEASE_TTL_DEFAULT`].
    pub lease_ttl: Duration,
    /// A fresh action starts only on a confirmation (a renewal, or an append's implicit one)
    /// younger than this. Defaults to a quarter of `lease_ttl`, fixed by [`RunOptions::new`].
    pub confirm_after: Duration,
    /// The largest encoded payload accepted. Defaults to [`PAYLOAD_LEN_MAX_DEFAULT`].
    pub payload_len_max: usize,
    /// A run parked on an event with no natural deadline becomes due again after this, so a
    /// lost wake heals by an idempotent re-drive. `None` disables it.
    /// Defaults to [`RECONCILE_DEFAULT`].
    pub reconcile: Option<Duration>,
    /// Told about each executed step. Defaults to `None`.
    pub observer: Option<Arc<dyn StepObserver>>,
    /// Stamps remote tasks with the dispatching span's trace context. Defaults to `None`.
    pub trace_context: Option<Arc<dyn TraceContext>>,
    /// When the lease in `fence` was last confirmed before the drive: the time its claim was
    /// asked for. A run that waited in a worker's queue after a batch claim so confirms again
    /// before its first fresh action when this is older than `confirm_after`. `None` counts
    /// from the start of the drive. Defaults to `None`.
    pub confirmed_at: Option<Instant>,
    /// The store's clock when the run's claim was granted (the claimed row's `updated_at`).
    /// The one deadline a run computes itself, the reconcile fallback, counts from it plus
    /// the time since `confirmed_at`, so it is on the store's clock like every other deadline
    /// and a worker whose own clock is off neither re-drives parked runs at once nor leaves
    /// them late. `None` counts from the worker's clock. Defaults to `None`.
    pub claimed_at: Option<OffsetDateTime>,
    /// How long one generation's journal may grow before fresh steps fail with
    /// [`WorkflowError::JournalFull`](crate::WorkflowError::JournalFull). Defaults to [`JournalBudget::default`](crate::JournalBudget::default).
    pub journal_budget: crate::JournalBudget,
    /// How much the run may write to its streams before a write fails with
    /// [`WorkflowError::StreamFull`](crate::WorkflowError::StreamFull). Defaults to
    /// [`StreamBudget::default`](crate::message::StreamBudget::default).
    pub stream_budget: crate::message::StreamBudget,
    /// Where runs crash on purpose, for tests. Defaults to `None`.
    pub faults: Option<Arc<dyn crate::Faults>>,
    /// Replay only: any fresh work (a step's action, an await's arm) is a divergence instead of
    /// being done, so a recorded history can be checked against the current code without
    /// running anything. Defaults to `false`.
    pub replay_only: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self::new(LEASE_TTL_DEFAULT)
    }
}

impl RunOptions {
    /// The store's clock now, as well as the run knows it: [`claimed_at`](Self::claimed_at)
    /// plus the time since [`confirmed_at`](Self::confirmed_at), or the worker's clock for an
    /// unclaimed run.
    pub(crate) fn store_now(&self) -> OffsetDateTime {
        match (self.claimed_at, self.confirmed_at) {
            (Some(at), Some(asked)) => at + asked.elapsed(),
            (Some(at), None) => at,
            (None, _) => OffsetDateTime::now_utc(),
        }
    }

    /// Options for a lease of `lease_ttl`, with `confirm_after` a quarter of it.
    pub fn new(lease_ttl: Duration) -> Self {
        Self {
            fence: None,
            lease_ttl,
            confirm_after: lease_ttl / 4,
            payload_len_max: PAYLOAD_LEN_MAX_DEFAULT,
            reconcile: Some(RECONCILE_DEFAULT),
            observer: None,
            trace_context: None,
            confirmed_at: None,
            claimed_at: None,
            journal_budget: crate::JournalBudget::default(),
            stream_budget: crate::message::StreamBudget::default(),
            faults: None,
            replay_only: false,
        }
    }
}
