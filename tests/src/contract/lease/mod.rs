//! `sql/functions/lease.sql`: discovery, claims, renewals, releases, parking, crash
//! accounting, and the hand-back of a run its worker cannot open.

pub mod claim;
pub mod lifecycle;
pub mod park;
pub mod refuse;
