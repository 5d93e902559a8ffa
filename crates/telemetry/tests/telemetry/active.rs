//! `keiro.workflow.active` goes up when a run starts and back down when it finishes, however
//! the run ends.

use crate::common::{attrs, Harness, Kind, TestResult, Value};
use keiro_telemetry::{names, Metrics, MetricsExt as _};

#[test]
fn started_and_finished_balance_per_workflow() -> TestResult {
    let h = Harness::new();
    h.metrics.run_started("checkout");
    h.metrics.run_started("checkout");
    h.metrics.run_started("refund");
    h.metrics.run_finished("checkout");

    assert_eq!(
        h.instrument(names::WORKFLOW_ACTIVE)?.kind,
        Kind::UpDownCounter
    );
    assert_eq!(
        h.points(names::WORKFLOW_ACTIVE)?,
        vec![
            (attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::I64(1)),
            (attrs(&[(names::WORKFLOW_NAME, "refund")]), Value::I64(1)),
        ]
    );
    Ok(())
}

#[test]
fn run_scope_counts_while_the_guard_lives() -> TestResult {
    let h = Harness::new();
    let first = h.metrics.run_scope("checkout");
    let second = h.metrics.run_scope("checkout");
    assert_eq!(
        h.points(names::WORKFLOW_ACTIVE)?,
        vec![(attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::I64(2))]
    );

    drop(first);
    assert_eq!(
        h.points(names::WORKFLOW_ACTIVE)?,
        vec![(attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::I64(1))]
    );

    drop(second);
    assert_eq!(
        h.points(names::WORKFLOW_ACTIVE)?,
        vec![(attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::I64(0))]
    );
    Ok(())
}

#[test]
fn run_scope_is_released_when_the_run_panics() -> TestResult {
    let h = Harness::new();
    let metrics = h.metrics.clone();
    // A panicking thread stands in for a workflow body that panics inside its task.
    let outcome = std::thread::spawn(move || {
        let _active = metrics.run_scope("checkout");
        panic!("the workflow body panicked");
    })
    .join();
    assert!(outcome.is_err());

    assert_eq!(
        h.points(names::WORKFLOW_ACTIVE)?,
        vec![(attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::I64(0))]
    );
    Ok(())
}

#[test]
fn run_scope_through_an_option_counts_while_the_guard_lives() -> TestResult {
    let h = Harness::new();
    let configured: Option<Metrics> = Some(h.metrics.clone());
    let active = configured.run_scope("checkout");
    assert!(active.is_some());
    assert_eq!(
        h.points(names::WORKFLOW_ACTIVE)?,
        vec![(attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::I64(1))]
    );

    drop(active);
    assert_eq!(
        h.points(names::WORKFLOW_ACTIVE)?,
        vec![(attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::I64(0))]
    );
    Ok(())
}
