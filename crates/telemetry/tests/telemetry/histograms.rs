//! Histogram recorders convert to the documented unit and use keiro's bucket boundaries.

use std::time::Duration;

use crate::common::{attrs, Harness, Kind, TestResult, Value};
use keiro_telemetry::names;

#[test]
fn journal_length_records_each_length() -> TestResult {
    let h = Harness::new();
    h.metrics.journal_length("checkout", 3);
    h.metrics.journal_length("checkout", 9);

    assert_eq!(
        h.instrument(names::WORKFLOW_JOURNAL_LENGTH)?.kind,
        Kind::Histogram
    );
    assert_eq!(
        h.points(names::WORKFLOW_JOURNAL_LENGTH)?,
        vec![(
            attrs(&[(names::WORKFLOW_NAME, "checkout")]),
            Value::Histogram {
                count: 2,
                sum: 12.0,
                bounds: names::WORKFLOW_JOURNAL_LENGTH_BOUNDARIES.to_vec(),
            },
        )]
    );
    Ok(())
}

#[test]
fn timer_fire_lag_records_milliseconds() -> TestResult {
    let h = Harness::new();
    h.metrics.timer_fire_lag(Duration::from_millis(250));
    h.metrics.timer_fire_lag(Duration::from_secs(2));

    let exported = h.instrument(names::TIMER_FIRE_LAG)?;
    assert_eq!(exported.kind, Kind::Histogram);
    assert_eq!(exported.unit, "ms");
    assert_eq!(
        h.points(names::TIMER_FIRE_LAG)?,
        vec![(
            attrs(&[]),
            Value::Histogram {
                count: 2,
                sum: 2_250.0,
                bounds: names::TIMER_FIRE_LAG_BOUNDARIES.to_vec(),
            },
        )]
    );
    Ok(())
}

#[test]
fn step_duration_records_seconds_per_workflow_and_kind() -> TestResult {
    let h = Harness::new();
    h.metrics
        .step_duration("checkout", "local", Duration::from_millis(500));
    h.metrics
        .step_duration("checkout", "local", Duration::from_millis(250));
    h.metrics
        .step_duration("checkout", "remote", Duration::from_secs(3));

    let exported = h.instrument(names::STEP_DURATION)?;
    assert_eq!(exported.kind, Kind::Histogram);
    assert_eq!(exported.unit, "s");
    let bounds = names::STEP_DURATION_BOUNDARIES.to_vec();
    assert_eq!(
        h.points(names::STEP_DURATION)?,
        vec![
            (
                attrs(&[
                    (names::STEP_KIND, "local"),
                    (names::WORKFLOW_NAME, "checkout"),
                ]),
                Value::Histogram {
                    count: 2,
                    sum: 0.75,
                    bounds: bounds.clone(),
                },
            ),
            (
                attrs(&[
                    (names::STEP_KIND, "remote"),
                    (names::WORKFLOW_NAME, "checkout"),
                ]),
                Value::Histogram {
                    count: 1,
                    sum: 3.0,
                    bounds,
                },
            ),
        ]
    );
    Ok(())
}
