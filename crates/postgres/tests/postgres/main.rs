//! What is true of the Postgres store alone, one module per behaviour: query plans, round
//! trips, lock races held with a test transaction, search_path, TLS, LISTEN health,
//! migrations and function files. The rules every store keeps are the contract suite's
//! (`keiro_tests::contract`, run by `tests/tests/contract.rs`).

mod common;

mod append_steps;
mod async_commit;
mod attribute_plans;
mod child_delivery;
mod claim_snapshot;
mod closed_notify;
mod credentials;
mod discovery_plan;
mod drop_schema;
mod free_queue_runs;
mod function_files;
mod group_commit;
mod hot_claims;
mod hot_path;
mod isolation;
mod journal_append;
mod journal_indexes;
mod lane_phases;
mod list_plans;
mod listen_health;
mod malformed_rows;
mod message_batch;
mod message_notify;
mod migrations_checksum;
mod migrations_idempotent;
mod open_refusals;
mod queued_starts;
mod remote_tasks;
mod retention_locks;
mod rolling_deploy;
mod round_trips;
mod scale_plans;
mod schema_isolation;
mod schema_not_migrated;
mod search_path;
mod signal_race;
mod signals;
mod timer_requeue_stuck;
mod tls;
mod unreachable;
mod waits_plan;
mod wake_listener;
mod wake_notify;
mod wake_round_trips;
