//! keiro-tests: keiro's workspace integration tests and the helpers they share (unpublished).
//!
//! The store conformance suite and the multi-process tests live in `tests/`; this library
//! holds what they and the crates' own integration tests need, such as [`pg::TestDb`], a fresh
//! migrated Postgres schema per test that reads `TEST_DATABASE_URL` and is dropped afterwards.

pub mod contract;
pub mod counting;
pub mod faulty;
pub mod harness;
pub mod notifications;
pub mod pg;
pub mod remote_fixtures;
pub mod status;
pub mod step_ledger;
pub mod worker;
pub mod workflows;

pub use faulty::FaultyStore;
pub use harness::{
    crash, journal_steps, key, run_inline, run_with, Backend, FastWorker, Harness, Ledger,
    SqliteDir, TestResult, Versioned,
};
pub use status::{status, until, until_status};
pub use worker::{spawn_worker, RunningWorker};
