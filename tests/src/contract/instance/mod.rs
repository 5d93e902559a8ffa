//! `sql/functions/instance.sql`: the instance's own transitions; here cancellation, of the
//! instance alone or of its live descendants, with each cancelled child's envelope reaching
//! its parent; and the settling of a completed run's leftovers.

pub mod cancel;
pub mod settle;
pub mod start;
