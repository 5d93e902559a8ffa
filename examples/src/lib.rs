//! Runnable examples of keiro (see `src/bin/`): `quickstart` starts and drives a workflow on
//! the local PostgreSQL; `telemetry` does the same with OpenTelemetry metrics printed to stdout.
//!
//! ```sh
//! cargo run -p keiro-examples --bin quickstart
//! cargo run -p keiro-examples --bin telemetry
//! ```
