//! Schedules: ticks, catch-up and overlap policies, racing schedulers, pause, trigger and bad
//! definitions.

pub mod scheduler;
