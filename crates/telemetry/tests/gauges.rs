//! Gauge recorders report the last value set, without attributes.

mod common;

use common::{attrs, Harness, Kind, TestResult, Value};
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
