//! What is true of the SQLite store alone, one module per behaviour: the file's opening,
//! locking and pragmas, the writer thread's group commit, the notification table's polling,
//! several stores on one file (as several processes), and the rows only SQL can make or show.
//! The rules every store keeps are the contract suite's (`keiro_tests::contract`, run by
//! `tests/tests/contract.rs`).

mod common;

mod group_commit;
mod lease;
mod notify;
mod open;
mod remote;
mod retention;
mod rows;
mod schedules;
mod signals;
mod timers;
