//! `sql/functions/timer.sql`: arming a timer (one per step, the first deadline stands), firing
//! due timers (what a fire journals, when it delivers, what it reports back), and concurrent
//! callers that fire each timer once.

pub mod arm;
pub mod fire;
pub mod fire_concurrent;
