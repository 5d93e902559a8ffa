//! keiro-memory: keiro's store in memory.
//!
//! [`MemoryStore`] implements [`JournalStore`](keiro_journal::JournalStore),
//! [`LeaseStore`](keiro_lease::LeaseStore) and, for remote steps,
//! [`Transport`](keiro_remote::Transport) and [`RemoteAdmin`](keiro_remote::RemoteAdmin) with
//! exactly the semantics of the Postgres store (the workspace's conformance suite runs against
//! both). Use it to test workflows and workers without a database, to embed keiro where
//! durability across restarts is not needed, and as the model the Postgres store is checked
//! against in property tests.
//!
//! ```
//! use std::sync::Arc;
//! use keiro_journal::{run, start, workflow_fn, Ctx, InstanceKey, RunOptions, RunOutcome, WorkflowError};
//! use keiro_memory::MemoryStore;
//!
//! async fn greet(ctx: Ctx, name: String) -> Result<String, WorkflowError> {
//!     let compose = || async move { Ok::<_, std::io::Error>(format!("hello {name}")) };
//!     ctx.step("compose", compose).await
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::new();
//! let key = InstanceKey::parse("greet", "greet-1")?;
//! start(&store, &key, "ada", keiro_journal::PAYLOAD_LEN_MAX_DEFAULT).await?;
//! let driven = run(Arc::new(store.clone()), &key, workflow_fn(greet).as_ref(), RunOptions::default()).await;
//! assert_eq!(driven.result?, RunOutcome::Completed(serde_json::json!("hello ada")));
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//!
//! - Each store operation is atomic: it runs as one critical section of one lock, which is
//!   never held across an `.await`, so concurrent callers see operations one after another.
//! - The rules match the Postgres store's: idempotent start, same-step writers converging on the
//!   first result, first-writer-wins markers, terminal refusal, fencing by owner and epoch,
//!   parks that never mask a wake, the crash ceiling, and resurrection that keeps history.
//! - Wake sources (durable timers, awakeables, signals, child workflows, cascading cancels)
//!   follow the Postgres store's rules too: each resolution journals the awaited step through
//!   the same append rules and wakes the owner in the same critical section, and a child's
//!   terminal transaction journals its result envelope into its parent.
//! - Remote steps follow them too: a task is written once per step id, a report settles it
//!   and journals its result into the owner (waking it) in one critical section, and an
//!   operator's requeue supersedes failed results with `StepReset` rows, never rewriting one.
//! - Notifications ([`MemoryStore::notifications`], and the
//!   [`Notifier`](keiro_resume::Notifier) subscriptions over them) fire at the points where
//!   Postgres NOTIFYs, after the operation's state change is visible.
//! - Nothing survives the process: the store is exactly as durable as the value holding it.
//!
//! # Errors
//!
//! Operations return [`StoreError`](keiro_journal::StoreError): `NotFound` and `LeaseLost` as in
//! Postgres, `Malformed` for a journal row that does not decode, and a non-retryable
//! `Database` error for a request the store refuses (appending `Resurrected` through
//! `journal_append`, an exhausted sequence or epoch, a timer kind it does not know, an
//! awakeable id registered twice, or a lock poisoned by a panic in an earlier operation).
//! A value PostgreSQL would refuse (a NUL character in a JSON string or in a stored text) is
//! refused with `ValueRefused`, before anything is decided or written, as in Postgres. There
//! is no `Unavailable`: memory is always reachable.

mod clock;
#[cfg(test)]
mod fixtures;
mod inspect;
mod journal;
mod lease;
mod notify;
mod remote;
mod retention;
mod schedule;
mod sources;
mod state;
mod storable;
mod store;

pub use notify::Notification;
pub use store::{MemoryStore, WAKE_BUFFER_LEN};

use std::collections::{BTreeMap, BTreeSet};

use keiro_journal::InstanceKey;

/// Everything the store holds, the data behind the lock. The crate root owns it; each module
/// adds the table it keeps here (`remote::Tasks`, `sources::Sources`, `schedule::Schedules`) and
/// its operations as `impl State` blocks. Each trait method runs as one function over `&mut State` under
/// the store's lock, which is what makes it atomic.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// "now" for operations that are not given one.
    pub(crate) clock: clock::Clock,
    /// The instance rows with their journals, ordered like the Postgres primary key.
    pub(crate) instances: BTreeMap<InstanceKey, state::Entry>,
    /// The journal's global order.
    pub(crate) seq: state::Sequence,
    /// Timers, awakeables and signals.
    pub(crate) sources: sources::Sources,
    /// Remote tasks by step id: the `remote_tasks` table.
    pub(crate) tasks: remote::Tasks,
    /// Parent -> the instances whose `parent` names it: the lookup a cascading cancel needs,
    /// kept beside the rows because a row's parent only ever goes from none to some.
    pub(crate) children: BTreeMap<InstanceKey, BTreeSet<InstanceKey>>,
    /// The schedules and the scheduler's leadership.
    pub(crate) schedules: schedule::Schedules,
    /// Notifications to send once the operation has finished (the memory form of NOTIFY,
    /// which Postgres also delivers only at commit).
    notifications: Vec<notify::Notification>,
    /// Instances the operation closed (completed, failed, cancelled), whose result waiters to
    /// wake once it has finished: the memory form of migration 0016's `done:` NOTIFY.
    closed: Vec<InstanceKey>,
}
