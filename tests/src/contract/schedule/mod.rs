//! Schedules: ticks, catch-up and overlap policies, racing schedulers, pause, trigger and bad
//! definitions; and the schedule rows at the store.

pub mod scheduler;
pub mod store;
