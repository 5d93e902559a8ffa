//! Each counter recorder adds to the right instrument, with the workflow name or kind as its
//! only attributes.

use crate::common::{attrs, Harness, Kind, TestResult, Value};
use keiro_telemetry::names;

#[test]
fn step_executed_adds_n_per_workflow() -> TestResult {
    let h = Harness::new();
    h.metrics.step_executed("checkout", 1);
    h.metrics.step_executed("checkout", 2);
    h.metrics.step_executed("refund", 1);

    let exported = h.instrument(names::WORKFLOW_STEPS_EXECUTED)?;
    assert_eq!(exported.kind, Kind::Counter);
    assert_eq!(
        h.points(names::WORKFLOW_STEPS_EXECUTED)?,
        vec![
            (attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::U64(3)),
            (attrs(&[(names::WORKFLOW_NAME, "refund")]), Value::U64(1)),
        ]
    );
    Ok(())
}

#[test]
fn step_replayed_adds_n_per_workflow() -> TestResult {
    let h = Harness::new();
    h.metrics.step_replayed("checkout", 5);

    assert_eq!(
        h.instrument(names::WORKFLOW_STEPS_REPLAYED)?.kind,
        Kind::Counter
    );
    assert_eq!(
        h.points(names::WORKFLOW_STEPS_REPLAYED)?,
        vec![(attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::U64(5))]
    );
    Ok(())
}

#[test]
fn resumed_counts_one_per_call_per_workflow() -> TestResult {
    let h = Harness::new();
    h.metrics.resumed("checkout");
    h.metrics.resumed("checkout");
    h.metrics.resumed("refund");

    assert_eq!(h.instrument(names::WORKFLOW_RESUMED)?.kind, Kind::Counter);
    assert_eq!(
        h.points(names::WORKFLOW_RESUMED)?,
        vec![
            (attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::U64(2)),
            (attrs(&[(names::WORKFLOW_NAME, "refund")]), Value::U64(1)),
        ]
    );
    Ok(())
}

#[test]
fn failed_counts_one_per_call() -> TestResult {
    let h = Harness::new();
    h.metrics.failed("checkout");
    h.metrics.failed("checkout");

    assert_eq!(h.instrument(names::WORKFLOW_FAILED)?.kind, Kind::Counter);
    assert_eq!(
        h.points(names::WORKFLOW_FAILED)?,
        vec![(attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::U64(2))]
    );
    Ok(())
}

#[test]
fn resume_error_counts_by_kind_only() -> TestResult {
    let h = Harness::new();
    h.metrics.resume_error("connection");
    h.metrics.resume_error("serialization");
    h.metrics.resume_error("connection");

    assert_eq!(
        h.instrument(names::WORKFLOW_RESUME_ERRORS)?.kind,
        Kind::Counter
    );
    assert_eq!(
        h.points(names::WORKFLOW_RESUME_ERRORS)?,
        vec![
            (attrs(&[(names::ERROR_KIND, "connection")]), Value::U64(2)),
            (
                attrs(&[(names::ERROR_KIND, "serialization")]),
                Value::U64(1)
            ),
        ]
    );
    Ok(())
}

#[test]
fn lease_skipped_counts_one_per_call() -> TestResult {
    let h = Harness::new();
    h.metrics.lease_skipped("checkout");

    assert_eq!(
        h.instrument(names::WORKFLOW_LEASE_SKIPPED)?.kind,
        Kind::Counter
    );
    assert_eq!(
        h.points(names::WORKFLOW_LEASE_SKIPPED)?,
        vec![(attrs(&[(names::WORKFLOW_NAME, "checkout")]), Value::U64(1))]
    );
    Ok(())
}

#[test]
fn remote_counters_count_per_group() -> TestResult {
    let h = Harness::new();
    h.metrics.remote_dispatched("print-label");
    h.metrics.remote_dispatched("print-label");
    h.metrics.remote_dispatched("charge-card");
    h.metrics.remote_redispatched("print-label");
    h.metrics.remote_lost("charge-card");

    for name in [
        names::REMOTE_DISPATCHED,
        names::REMOTE_REDISPATCHED,
        names::REMOTE_LOST,
    ] {
        assert_eq!(h.instrument(name)?.kind, Kind::Counter, "{name}");
    }
    assert_eq!(
        h.points(names::REMOTE_DISPATCHED)?,
        vec![
            (
                attrs(&[(names::REMOTE_GROUP, "charge-card")]),
                Value::U64(1)
            ),
            (
                attrs(&[(names::REMOTE_GROUP, "print-label")]),
                Value::U64(2)
            ),
        ]
    );
    assert_eq!(
        h.points(names::REMOTE_REDISPATCHED)?,
        vec![(
            attrs(&[(names::REMOTE_GROUP, "print-label")]),
            Value::U64(1)
        )]
    );
    assert_eq!(
        h.points(names::REMOTE_LOST)?,
        vec![(
            attrs(&[(names::REMOTE_GROUP, "charge-card")]),
            Value::U64(1)
        )]
    );
    Ok(())
}

#[test]
fn a_recorder_touches_only_its_own_instrument() -> TestResult {
    let h = Harness::new();
    h.metrics.failed("checkout");

    let exported: Vec<String> = h.collect()?.into_iter().map(|e| e.name).collect();
    assert_eq!(exported, vec![names::WORKFLOW_FAILED.to_owned()]);
    Ok(())
}

#[test]
fn remote_counters_leave_the_partition_out_of_the_group() -> TestResult {
    let h = Harness::new();
    // Partitions are user-chosen (a tenant, a region): one series per partition would grow
    // without bound, so they count under their step's group.
    h.metrics.remote_dispatched("print-label@tenant-1");
    h.metrics.remote_dispatched("print-label@tenant-2");
    h.metrics.remote_dispatched("print-label");
    h.metrics.remote_redispatched("print-label@tenant-3");
    h.metrics.remote_lost("charge-card@eu");

    let group = |g| attrs(&[(names::REMOTE_GROUP, g)]);
    assert_eq!(
        h.points(names::REMOTE_DISPATCHED)?,
        vec![(group("print-label"), Value::U64(3))]
    );
    assert_eq!(
        h.points(names::REMOTE_REDISPATCHED)?,
        vec![(group("print-label"), Value::U64(1))]
    );
    assert_eq!(
        h.points(names::REMOTE_LOST)?,
        vec![(group("charge-card"), Value::U64(1))]
    );
    Ok(())
}
