//! `sql/functions/journal.sql`: appends (one winner per step, terminal rows refuse, fences),
//! replay of what was journaled, deliveries, values a store refuses, batched appends and the
//! closing pair of a run's last step and its completion.

pub mod append;
pub mod deliveries;
pub mod group_commit;
pub mod last_step;
pub mod refused_values;
pub mod replay;
