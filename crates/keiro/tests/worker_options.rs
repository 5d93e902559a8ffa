//! A worker's builder sets each option one way: its own methods set what people change day to
//! day, [`WorkerBuilder::tuning`] sets the rest as a whole, and no option is reached by both.
//! So the calls can come in any order: a worker built with every method in one order has the
//! options of one built in the reverse order.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keiro::store::{LeaseStore, RetentionStore};
use keiro::worker::{LogHook, ResumeLogEvent, ResumeOptions, Tuning};
use keiro::workflow::{JournalBudget, StreamBudget};
use keiro::{Backoff, Metrics, Tracing, WorkerBuilder};
use keiro_sqlite::SqliteStore;

type Call = Box<dyn Fn(WorkerBuilder) -> WorkerBuilder>;

/// Every method that sets a resume option, each with a value other than its default.
fn calls(log: &LogHook) -> Vec<Call> {
    let log = log.clone();
    vec![
        Box::new(|b| {
            b.tuning(Tuning {
                max_attempts: 4,
                backoff: backoff(),
                reconcile: None,
                pass_limit: Some(17),
                journal_budget: budget(),
                stream_budget: stream_budget(),
            })
        }),
        Box::new(|b| b.poll_interval(Duration::from_millis(250))),
        Box::new(|b| b.lease_ttl(Duration::from_secs(9))),
        Box::new(|b| b.concurrency(6)),
        Box::new(|b| b.owner("billing-1")),
        Box::new(move |b| b.log(log.clone())),
        Box::new(|b| b.metrics(Metrics::global())),
        Box::new(|b| b.tracing(Tracing::global())),
        Box::new(|b| b.payload_len_max(4096)),
        Box::new(|b| b.retention(Some(Duration::from_secs(3600)))),
        Box::new(|b| b.queue("llm")),
        Box::new(|b| b.serve(keiro::versions::Versions::only(["v1", "v2"]))),
    ]
}

fn backoff() -> Backoff {
    Backoff::exponential(Duration::from_millis(5), Duration::from_millis(40)).without_jitter()
}

fn budget() -> JournalBudget {
    JournalBudget {
        steps: 900,
        bytes: 1 << 20,
    }
}

fn stream_budget() -> StreamBudget {
    StreamBudget {
        items: 100,
        bytes: 1 << 16,
        generation_items: 50,
        generation_bytes: 1 << 15,
    }
}

fn built(calls: impl IntoIterator<Item = Call>) -> Result<ResumeOptions, keiro::Error> {
    let store = Arc::new(SqliteStore::temporary().expect("a temporary sqlite store"));
    let retention: Arc<dyn RetentionStore> = store.clone();
    let lease: Arc<dyn LeaseStore> = store;
    let builder = WorkerBuilder::new(lease).retention_store(Some(retention));
    let worker = calls.into_iter().fold(builder, |b, call| call(b)).build()?;
    Ok(worker.options().clone())
}

#[test]
fn the_order_of_the_calls_does_not_matter() -> Result<(), keiro::Error> {
    let log: LogHook = Arc::new(|_: &ResumeLogEvent| {});
    // Every field named, none left to `..Default::default()`: a new resume option fails to
    // compile here until it is given its one way in (and a call above).
    let expected = ResumeOptions {
        poll_interval: Duration::from_millis(250),
        max_attempts: 4,
        lease_ttl: Duration::from_secs(9),
        max_concurrent_advances: 6,
        reconcile: None,
        backoff: backoff(),
        pass_limit: Some(17),
        payload_len_max: 4096,
        journal_budget: budget(),
        stream_budget: stream_budget(),
        owner: Some("billing-1".to_owned()),
        log: log.clone(),
        metrics: Some(Metrics::global()),
        tracing: Some(Tracing::global()),
        // Only the test kit sets it (`keiro::testing`).
        faults: None,
        retention: Some(Duration::from_secs(3600)),
        queues: vec!["llm".to_owned()],
        versions: keiro::versions::Versions::only(["v1", "v2"]),
        // Opened by the worker's loop while it runs, on `WorkerBuilder::hand_offs`.
        hand_off: None,
    };
    let forward = built(calls(&log))?;
    let backward = built(calls(&log).into_iter().rev())?;
    for options in [&forward, &backward] {
        assert_eq!(format!("{options:?}"), format!("{expected:?}"));
        assert!(
            Arc::ptr_eq(&options.log, &log),
            "the log hook is the one set"
        );
    }
    Ok(())
}

#[test]
fn a_later_tuning_replaces_an_earlier_one_and_nothing_else() -> Result<(), keiro::Error> {
    let log: LogHook = Arc::new(|_: &ResumeLogEvent| {});
    let mut calls = calls(&log);
    calls.push(Box::new(|b| b.tuning(Tuning::default())));
    let options = built(calls)?;
    let defaults = ResumeOptions::default();
    assert_eq!(
        (options.max_attempts, options.reconcile, options.pass_limit),
        (
            defaults.max_attempts,
            defaults.reconcile,
            defaults.pass_limit
        )
    );
    assert_eq!(options.backoff, defaults.backoff);
    assert_eq!(options.journal_budget, defaults.journal_budget);
    // The builder's own options are untouched.
    assert_eq!(options.max_concurrent_advances, 6);
    assert_eq!(options.lease_ttl, Duration::from_secs(9));
    Ok(())
}

/// Read from the source: no builder method has the name of a [`Tuning`] field, and none takes
/// a whole [`ResumeOptions`] (which would set every option a second way).
#[test]
fn no_option_has_two_ways_in() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/worker");
    let read = |file: &str| std::fs::read_to_string(src.join(file)).expect("a readable source");
    let builder = read("builder.rs");
    let tuning = read("tuning.rs");
    let methods: Vec<&str> = builder
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("pub fn "))
        .collect();
    let fields: Vec<&str> = tuning
        .lines()
        .filter_map(|line| line.strip_prefix("    pub "))
        .filter_map(|rest| rest.split_once(':').map(|(name, _)| name))
        .collect();
    assert!(
        fields.contains(&"max_attempts"),
        "read Tuning's fields: {fields:?}"
    );
    assert!(
        methods.iter().any(|m| m.starts_with("tuning(")),
        "read the methods: {methods:?}"
    );
    for method in &methods {
        let name = method.split(['(', '<']).next().unwrap_or_default();
        assert!(
            !fields.contains(&name),
            "WorkerBuilder::{name} sets a Tuning field a second way"
        );
        assert!(
            !method.contains("ResumeOptions"),
            "WorkerBuilder::{name} takes a whole ResumeOptions"
        );
    }
}
