//! Gauge recorders report the last value set, without attributes.

use crate::common::{attrs, Harness, Kind, TestResult, Value};
use keiro_telemetry::names;

#[test]
fn awakeables_pending_reports_the_last_count() -> TestResult {
    let h = Harness::new();
    h.metrics.awakeables_pending(7);
    h.metrics.awakeables_pending(4);

    assert_eq!(
        h.instrument(names::WORKFLOW_AWAKEABLES_PENDING)?.kind,
        Kind::Gauge
    );
    assert_eq!(
        h.points(names::WORKFLOW_AWAKEABLES_PENDING)?,
        vec![(attrs(&[]), Value::U64(4))]
    );
    Ok(())
}

#[test]
fn timer_backlog_reports_the_last_count() -> TestResult {
    let h = Harness::new();
    h.metrics.timer_backlog(12);
    h.metrics.timer_backlog(0);

    assert_eq!(h.instrument(names::TIMER_BACKLOG)?.kind, Kind::Gauge);
    assert_eq!(
        h.points(names::TIMER_BACKLOG)?,
        vec![(attrs(&[]), Value::U64(0))]
    );
    Ok(())
}

#[test]
fn a_sampled_gauge_is_due_once_per_interval_across_clones() {
    use keiro_telemetry::SampledGauge;
    use std::time::Duration;

    let h = Harness::new();
    let metrics = h.metrics.clone().gauge_interval(Duration::from_millis(200));
    let clone = metrics.clone();
    assert!(metrics.sample_due(SampledGauge::AwakeablesPending));
    // Claimed: neither this handle nor a clone samples again within the interval...
    assert!(!metrics.sample_due(SampledGauge::AwakeablesPending));
    assert!(!clone.sample_due(SampledGauge::AwakeablesPending));
    // ...while each gauge has its own slot.
    assert!(clone.sample_due(SampledGauge::TimerBacklog));
    assert!(!metrics.sample_due(SampledGauge::TimerBacklog));
    std::thread::sleep(Duration::from_millis(250));
    assert!(clone.sample_due(SampledGauge::AwakeablesPending));
    assert!(!metrics.sample_due(SampledGauge::AwakeablesPending));
}

#[test]
fn gauges_are_sampled_every_ten_seconds_unless_told_otherwise() {
    use keiro_telemetry::{SampledGauge, GAUGE_INTERVAL_DEFAULT};
    use std::time::Duration;

    assert_eq!(GAUGE_INTERVAL_DEFAULT, Duration::from_secs(10));
    let h = Harness::new();
    assert_eq!(h.metrics.sampling_interval(), GAUGE_INTERVAL_DEFAULT);
    assert!(h.metrics.sample_due(SampledGauge::AwakeablesPending));
    assert!(!h.metrics.sample_due(SampledGauge::AwakeablesPending));
    // Zero samples at every call, for tests and for callers that pace themselves.
    let every = h.metrics.clone().gauge_interval(Duration::ZERO);
    assert!(every.sample_due(SampledGauge::AwakeablesPending));
    assert!(every.sample_due(SampledGauge::AwakeablesPending));
}
