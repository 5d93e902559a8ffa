//! keiro-sqlite: keiro's durable store on one SQLite file, with no server.
//!
//! It opens, checks and migrates a file, writes through one writer thread with group commit,
//! and implements the rules listed below as inherent methods of [`SqliteStore`], and through
//! them every store trait:
//! `JournalStore`, `LeaseStore`, `QueueStore`, `Transport`, `RemoteAdmin`, `InspectStore`,
//! `RetentionStore` and `ScheduleStore` (every method of each), so `keiro::Keiro::builder`
//! takes it and the conformance suite runs on it, and `Notifier` (push wake-ups, below).
//!
//! Implemented and tested (each the twin of its plpgsql function, same name, same order):
//! - instance.sql: `instance_start`, `instance_confirm`, `instance_park`,
//!   `instance_fail_diverged`, `instance_settle_leftovers`, `instance_cancel_tree`,
//!   `instance_cancel`, `journal_written_by_body`, `failure_mention`, `instance_requeue_one`,
//!   `instance_requeue`, `instance_retry_with_input`;
//! - journal.sql: `step_logical`, `step_revision` (unit-tested against keiro-journal's own,
//!   for the requeue), `journal_repeatable_name`, `journal_append_to` (every append outcome,
//!   markers included, with the renewal skip of the fast path), used by `journal_append`,
//!   `journal_append_batch` and `journal_append_closing`; `delivery_append`, and the Postgres
//!   store's one-statement `deliveries_read`;
//! - lease.sql: `instance_claim`, `instance_start_claimed`, `instances_claim_batch`,
//!   `instance_record_crash`, `instance_refuse_open`, `instance_resurrect`; and the Postgres
//!   store's one-statement `instances_runnable`, `instance_lease_renew`, `instance_release`,
//!   `instance_lease_force_release`;
//! - queue.sql: `queue_declare`, `queue_set_paused`, `queue_key_weight`, `queue_start` (which
//!   `instance_start` routes a start on a queue to), `queue_admit` (concurrency fleet-wide, per
//!   worker and per key, rates, priority, weighted fairness), `queue_park` (the park trigger's
//!   rule, asked by `instance_park`), the slot-freed trigger (in migration 0003); and the
//!   Postgres store's plain-statement `queues_list`; lease.sql's claims skip a run waiting for
//!   admission, and a crash gives its slot back;
//! - timer.sql: `timer_arm`, `timers_fire_due`; and the Postgres store's one-statement
//!   `timers_requeue_stuck`, `timers_due_count`;
//! - signal.sql: `signal_wait`, `signal_offer`, `signal_send` (with its TTL and the sweep of
//!   expired signals), `signal_return`; and the Postgres store's one-statement
//!   `signal_withdraw`;
//! - awakeable.sql: `awakeable_create`, `awakeable_settle` (complete and cancel), the
//!   settle-on-close trigger (in migration 0001); and the one-statement `awakeables_pending`;
//! - child.sql: `child_envelope`, `child_deliver` (a closing marker delivers to a parent),
//!   `child_spawn` (create, adopt, deliver a finished child's result, refuse a taken one);
//! - remote.sql: `remote_error_envelope`, `remote_deliver`, `remote_arm` (dispatch, wait,
//!   redispatch, loss, an expired claim counted), `remote_claims_expire`,
//!   `remote_tasks_claim`, `remote_task_heartbeat`, `remote_task_complete`,
//!   `remote_tasks_complete`, `remote_task_fail`, `remote_redispatch_pending`,
//!   `remote_tasks_cancel` (a cancel or continue marker cancels the tasks),
//!   `instance_park_dispatch` (arms and park in one transaction); and the Postgres store's
//!   one-statement `remote_tasks` list (the batched `instances_park_dispatch` has no twin: the
//!   writer already shares a transaction between parks);
//! - message.sql: `event_set`, `stream_write` (closed and full streams refused),
//!   `stream_close`, and the reads `event_get`, `stream_read`, `instance_messages` (a
//!   transaction step's `stream_append_in` is the Postgres store's alone);
//! - update.sql: `update_send` (with or without a start), `update_answer`, `update_get`, the
//!   settle of a finished run's unanswered updates (a trigger in migration 0006); signal.sql's
//!   `signal_with_start` in `signal.rs`;
//! - reads: `instance_get`, `journal_load`, `journal_history`;
//! - notify.sql: `keiro_notify_wake`, `keiro_notify_timer`, `keiro_notify_remote`,
//!   `keiro_notify_message` (a row of
//!   migration 0002's notification table, where each rule above calls its twin) and the
//!   trigger of terminal transitions, published through `keiro_resume::Notifier`;
//! - crates/postgres/src/inspect.rs (plain SQL there too): `instances_list` (every filter, both
//!   orders, keyset pages), `instances_counts`, `instance_waits`;
//! - crates/postgres/src/retention.rs: `instances_gc` (one batch in rounds, leaves first, with
//!   everything an instance owns; `locked_out` for a second batch of the same store, and
//!   SQLite's write lock between stores), `instances_gc_eligible`;
//! - crates/postgres/src/schedule.rs: every `ScheduleStore` operation, the scheduler's lease
//!   and fencing epoch, `schedule_fire` (`Stale`, `NotLeader`, the starts with the row in one
//!   transaction), `schedule_record_error`.
//!
//! These are the one Rust implementation of keiro's rules: beside the plpgsql, nothing else
//! implements them. [`SqliteStore::temporary`] (a file in a directory removed with the store)
//! is what the test kit (`keiro::testing::TestEnv::sqlite`) and `keiro::Keiro::temporary` run
//! on. The PostgreSQL-only features (a step in the application's own transaction, starting
//! inside one) answer `Unsupported` from the facade on this store.
//!
//! ```no_run
//! use keiro_journal::{InstanceKey, store::StartRequest};
//! use keiro_sqlite::{Config, SqliteStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::open("app.db", Config::default())?;
//! let key = InstanceKey::parse("greet", "greet-1")?;
//! let started = store
//!     .instance_start(&StartRequest {
//!         key: key.clone(),
//!         input: serde_json::json!("ada"),
//!         parent: None,
//!         priority: 0,
//!         queue: None,
//!         attributes: Default::default(),
//!     })
//!     .await?;
//! assert!(started.created);
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//!
//! - Durable commits: the file is in WAL mode with `synchronous = FULL`, both read back when
//!   the store opens; [`Synchronous::NormalLosesCommitsOnPowerLoss`] is the one, explicit,
//!   weaker setting.
//! - Every write operation runs on one writer thread in a `BEGIN IMMEDIATE` transaction shared
//!   with the operations queued beside it, inside its own savepoint: a failing operation
//!   leaves nothing and does not affect the others, and every caller is answered only after
//!   the `COMMIT` (see the `writer` module).
//! - Several stores (processes) on one file take its write lock in turn; a lock held past the
//!   busy timeout fails the operation as retryable (`Unavailable`), never corrupts or loses
//!   one. One file on one host: SQLite's locking does not hold on network filesystems.
//! - Push wake-ups (`keiro_resume::Notifier`): a subscription in the store that committed a
//!   change is woken once the `COMMIT` returned, never before and never for an operation that
//!   rolled back; a subscription in another store (process) on the same file, within about
//!   [`Config::notify_poll_interval`] (each store polls a notification table, reading it only
//!   when `PRAGMA data_version` says another connection committed). A poller that fails or
//!   falls behind wakes every subscription with `Reconnected`, as a LISTEN reconnection does
//!   on PostgreSQL. Only on one host's local filesystem, as the locking: SQLite's shared
//!   memory, which the poller relies on, does not work across hosts. A wake-up only shortens
//!   a wait; the loops' fallback polls still guarantee progress.
//! - Values: the refusals of PostgreSQL (`ValueRefused` for a NUL in a text or a JSON string,
//!   and for a value past [`Config::value_len_max`]).
//! - Times come from the store's clock ([`SqliteStore::pin_clock`],
//!   [`SqliteStore::advance_clock`]), never from SQLite's.
//!
//! # Errors
//!
//! Opening answers [`Error`]: a directory, a file that is not a database, a read-only file,
//! a file migrated by a newer keiro, a durability setting that did not take. Operations
//! answer `keiro_journal::StoreError` as the Postgres store does.

mod attribute;
mod awakeable;
mod cached;
mod child;
mod clock;
mod config;
mod error;
mod inspect;
mod instance;
mod journal;
mod lease;
mod message;
mod notify;
mod open;
mod payloads;
mod queue;
mod remote;
mod retention;
mod row;
mod schedule;
mod signal;
mod storable;
mod store;
mod temporary;
mod timer;
mod update;
mod versions;
mod writer;

pub use config::{
    Config, Synchronous, BATCH_MAX_DEFAULT, BUSY_TIMEOUT_DEFAULT, NOTIFY_POLL_INTERVAL_DEFAULT,
    READERS_DEFAULT, VALUE_LEN_MAX_DEFAULT, VALUE_LEN_MIN,
};
pub use error::{Error, Result};
pub use open::SCHEMA_VERSION;
pub use store::SqliteStore;
