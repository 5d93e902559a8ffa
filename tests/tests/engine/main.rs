//! keiro's engine tests, one module per behaviour: workers, resume, direct runs, the typed
//! API, telemetry, failure semantics, and the multi-process tests (which run the binaries of
//! `tests/src/bin`). The store rules are the contract suite's (`tests/tests/contract.rs`).

mod attributes;
mod completed_runs;
mod database_outage;
mod direct;
mod failure_semantics;
mod generation_bound;
mod hand_off;
mod instance_keys;
mod journal_budget;
mod least_privilege;
mod metric_queries;
mod one_way_in;
mod payload_codec;
mod payload_poison;
mod race;
mod remote;
mod remote_processes;
mod remote_queue;
mod remote_telemetry;
mod replay_divergence;
mod requeue_handled;
mod result;
mod resume;
mod retention;
mod schedules;
mod sqlite_processes;
mod start_in;
mod streams;
mod telemetry;
mod testing_kit;
mod timer_clock;
mod transaction_step;
mod two_workers;
mod typed;
mod typed_remote;
mod updates;
mod versions;
mod wake;
mod wake_edges;
