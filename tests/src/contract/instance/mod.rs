//! `sql/functions/instance.sql`: the instance's own transitions; here cancellation, of the
//! instance alone or of its live descendants, with each cancelled child's envelope reaching
//! its parent.

pub mod cancel;
pub mod start;
