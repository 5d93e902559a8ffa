//! `sql/functions/timer.sql`: firing due timers (what a fire journals, when it delivers, what
//! it reports back), and concurrent callers that fire each timer once.

pub mod fire;
pub mod fire_concurrent;
