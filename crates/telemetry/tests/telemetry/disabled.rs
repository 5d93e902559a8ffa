//! Under `None` every recorder does nothing and cannot panic; under `Some` the same calls
//! reach the instruments.

use std::time::Duration;

use crate::common::{Harness, TestResult};
use keiro_telemetry::{names, Metrics, MetricsExt};
use opentelemetry::metrics::NoopMeterProvider;

/// Calls every recorder once through `metrics`, whatever handle type it is.
fn record_everything(metrics: &impl MetricsExt) {
    metrics.step_executed("checkout", 1);
    metrics.step_replayed("checkout", 1);
    metrics.resumed("checkout");
    metrics.failed("checkout");
    metrics.resume_error("connection");
    metrics.lease_skipped("checkout");
    metrics.run_started("checkout");
    metrics.run_finished("checkout");
    let _active = metrics.run_scope("checkout");
    metrics.journal_length("checkout", 3);
    metrics.awakeables_pending(1);
    metrics.timer_backlog(1);
    metrics.timer_fire_lag(Duration::from_millis(10));
    metrics.remote_dispatched("print-label");
    metrics.remote_redispatched("print-label");
    metrics.remote_lost("print-label");
    metrics.step_duration("checkout", "local", Duration::from_millis(10));
    metrics.queue_depth("llm", 3, 1);
    metrics.queue_admitted("llm", Some(Duration::from_millis(10)));
    metrics.queue_throttled("llm");
}

#[test]
fn none_records_nothing() -> TestResult {
    // A live provider with keiro's instruments registered, so the export below would show
    // any recording that slipped through, however it got there.
    let h = Harness::new();

    let owned: Option<Metrics> = None;
    record_everything(&owned);
    let borrowed: Option<&Metrics> = None;
    record_everything(&borrowed);

    assert_eq!(h.collect()?, Vec::new());
    Ok(())
}

#[test]
fn none_run_scope_returns_no_guard() {
    let metrics: Option<Metrics> = None;
    assert!(metrics.run_scope("checkout").is_none());
}

#[test]
fn method_syntax_works_on_every_handle_shape() -> TestResult {
    let h = Harness::new();
    let owned: Option<Metrics> = Some(h.metrics.clone());
    let field: &Option<Metrics> = &owned;
    let borrowed: Option<&Metrics> = owned.as_ref();

    owned.failed("checkout");
    field.failed("checkout");
    borrowed.failed("checkout");
    MetricsExt::failed(&h.metrics, "checkout");

    assert_eq!(
        h.points(names::WORKFLOW_FAILED)?,
        vec![(
            crate::common::attrs(&[(names::WORKFLOW_NAME, "checkout")]),
            crate::common::Value::U64(4),
        )]
    );
    Ok(())
}

#[test]
fn some_records_every_instrument() -> TestResult {
    let h = Harness::new();
    record_everything(&Some(h.metrics.clone()));

    let mut exported: Vec<String> = h.collect()?.into_iter().map(|e| e.name).collect();
    exported.sort();
    let mut expected: Vec<String> = names::INSTRUMENTS.iter().map(|n| (*n).to_owned()).collect();
    expected.sort();
    assert_eq!(exported, expected);
    Ok(())
}

#[test]
fn a_noop_meter_accepts_every_recording() {
    let metrics = Metrics::from_provider(&NoopMeterProvider::new());
    record_everything(&metrics);
    record_everything(&Metrics::global());
}
