//! `sql/functions/lease.sql`: discovery, claims, renewals, releases, parking and crash
//! accounting.

pub mod claim;
pub mod lifecycle;
pub mod park;
