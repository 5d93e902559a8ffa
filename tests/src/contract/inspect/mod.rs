//! Inspection for operators: the instance list and its counts, and an instance's waits.

pub mod list;
pub mod waits;
