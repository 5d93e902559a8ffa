//! The in-crate tests read metrics back through the same helper the `testing` feature exports.

use std::error::Error;

use keiro_telemetry::Metrics;

// The crate's `testing` module compiled here: its items are public there, and the tests use a
// subset of them.
#[allow(dead_code, unreachable_pub)]
#[path = "../../../src/testing.rs"]
mod testing;

pub(crate) use testing::*;

pub(crate) type TestResult = Result<(), Box<dyn Error + Send + Sync>>;

/// The in-crate tests' name for the recorder.
pub(crate) type Harness = Recorder;
