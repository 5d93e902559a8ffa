//! The `keiro` binary's tests, one binary: each module runs the command line (or the dashboard it
//! serves) as a user would, against a real PostgreSQL schema or a SQLite file.

mod attributes;
mod bench_phases;
mod bench_sqlite;
mod bench_suite;
mod credentials;
mod migrate;
mod queue;
mod reencrypt;
mod schedule_list;
mod scratch_sqlite;
mod sqlite_commands;
mod ui_api;
mod ui_browser;
mod ui_support;
mod versions;
