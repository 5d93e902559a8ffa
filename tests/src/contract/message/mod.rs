//! `crates/migrations/functions/message.sql` and `update.sql`: events, streams and updates. Each write is the run's
//! fenced journal step with its row in one transaction: refused with nothing written for a
//! stale holder, a closed or full stream, a value the store refuses; written once whatever
//! replays it; read in one snapshot with the instance's status; deleted with the instance.

pub mod event;
pub mod stream;
pub mod update;
