//! Inspection for operators: the instance list and its counts, and an instance's waits; the
//! same reads at the store, with the instant they take.

pub mod list;
pub mod reads;
pub mod waits;
