//! Inspection for operators: the instance list and its counts, the terminal instances per time
//! bucket, and an instance's waits; the same reads at the store, with the instant they take.

pub mod list;
pub mod reads;
pub mod throughput;
pub mod waits;
