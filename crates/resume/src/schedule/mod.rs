//! Schedules: cron-style and fixed-interval starts of a workflow, exactly once per tick across
//! any number of workers. The definition and its checks ([`spec`]), when it ticks
//! ([`cadence`]), the pure plan of one pass ([`plan`]), the storage contract ([`store`]) and
//! the elected scheduler loop ([`scheduler`]).

pub(crate) mod cadence;
pub(crate) mod plan;
pub(crate) mod scheduler;
pub(crate) mod spec;
pub(crate) mod store;
