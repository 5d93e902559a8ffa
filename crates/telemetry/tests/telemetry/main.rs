//! keiro-telemetry's tests, one binary: a module per instrument family, over the in-process
//! metric reader of `common`.

mod active;
mod common;
mod counters;
mod disabled;
mod gauges;
mod histograms;
mod instruments;
