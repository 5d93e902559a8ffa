//! The in-crate tests read metrics back through the same helper the `testing` feature exports.

// Each test binary compiles this module and uses a different subset of it.
#![allow(dead_code, unreachable_pub)]

use std::error::Error;

use keiro_telemetry::Metrics;

#[path = "../../src/testing.rs"]
mod testing;

pub(crate) use testing::*;

pub(crate) type TestResult = Result<(), Box<dyn Error + Send + Sync>>;

/// The in-crate tests' name for the recorder.
pub(crate) type Harness = Recorder;
