//! Runnable examples of keiro (see `src/bin/`): `quickstart` starts and drives a workflow on
//! the local PostgreSQL; `telemetry` does the same with OpenTelemetry metrics printed to stdout;
//! `transfer` moves money between two accounts of the application's own tables as an
//! exactly-once database step, with a crash injected at every point; `trial` tests a 7-day
//! trial workflow in milliseconds with the test kit's time skipping; `find_runs` finds orders
//! by their search attributes; `encrypted` stores its payloads sealed with AES-256-GCM and
//! reads its row back with and without the key.
//!
//! ```sh
//! cargo run -p keiro-examples --bin quickstart
//! cargo run -p keiro-examples --bin telemetry
//! cargo run -p keiro-examples --bin transfer
//! cargo run -p keiro-examples --bin trial
//! cargo run -p keiro-examples --bin find_runs
//! cargo run -p keiro-examples --bin encrypted
//! ```
