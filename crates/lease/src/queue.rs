//! The storage contract of queues: declaring them, pausing them, weighting their keys and
//! describing them. Admission itself is a claim ([`LeaseStore::queue_admit`]).

use keiro_journal::queue::{DebounceRequest, QueueInfo, QueueSpec};
use keiro_journal::store::Result;
use keiro_journal::Started;
use time::OffsetDateTime;

use crate::LeaseStore;

/// Queue operations, each one transaction.
#[async_trait::async_trait]
pub trait QueueStore: LeaseStore {
    /// Records `spec`, or replaces the limits of the queue of that name. Pause state, key
    /// weights and fairness progress stay. `spec` is validated by the caller
    /// ([`QueueSpec::validate`]); the store's own checks refuse what slips through.
    async fn queue_declare(&self, spec: &QueueSpec) -> Result<()>;

    /// Pauses (`true`) or resumes admission; runs already admitted go on. Returns whether the
    /// queue exists.
    async fn queue_set_paused(&self, queue: &str, paused: bool) -> Result<bool>;

    /// Sets `key`'s weight under weighted fairness (1 when never set). Returns whether the
    /// queue exists.
    async fn queue_key_weight(&self, queue: &str, key: &str, weight: i32) -> Result<bool>;

    /// Debounces `request`: while the key's pending run was never claimed, replaces its input
    /// and moves its start to `now + delay` (never past its first call + `max_wait`); else
    /// starts run `request.id`, gated at `now + min(delay, max_wait)`. Returns the pending run
    /// (`created` when this call made it). Concurrent calls of one key converge on one run.
    async fn queue_debounce(&self, request: &DebounceRequest) -> Result<Started>;

    /// Every declared queue, or only `only`, in name order, with what it holds at `now`
    /// (`None`: the store's clock).
    async fn queues_list(
        &self,
        only: Option<&str>,
        now: Option<OffsetDateTime>,
    ) -> Result<Vec<QueueInfo>>;
}
