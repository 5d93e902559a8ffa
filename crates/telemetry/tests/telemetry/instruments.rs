//! Every instrument is exported under keiro's scope with the name, unit and description the
//! `names` module documents.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::{Harness, TestResult};
use keiro_telemetry::names;

#[test]
fn names_are_unique_and_prefixed() {
    let unique: BTreeSet<&str> = names::INSTRUMENTS.iter().copied().collect();
    assert_eq!(unique.len(), names::INSTRUMENTS.len());
    for name in names::INSTRUMENTS {
        assert!(name.starts_with("keiro."), "{name}");
    }
}

#[test]
fn every_instrument_carries_its_unit_description_and_scope() -> TestResult {
    let h = Harness::new();
    let m = &h.metrics;
    m.step_executed("checkout", 1);
    m.step_replayed("checkout", 1);
    m.resumed("checkout");
    m.failed("checkout");
    m.resume_error("connection");
    m.lease_skipped("checkout");
    m.run_started("checkout");
    m.journal_length("checkout", 1);
    m.awakeables_pending(1);
    m.timer_backlog(1);
    m.timer_fire_lag(Duration::from_millis(1));
    m.remote_dispatched("print-label");
    m.remote_redispatched("print-label");
    m.remote_lost("print-label");
    m.step_duration("checkout", "local", Duration::from_millis(1));
    m.queue_depth("llm", 3, 1);
    m.queue_admitted("llm", Some(Duration::from_millis(1)));
    m.queue_throttled("llm");

    let expected = [
        (
            names::WORKFLOW_STEPS_EXECUTED,
            names::WORKFLOW_STEPS_EXECUTED_UNIT,
            names::WORKFLOW_STEPS_EXECUTED_DESCRIPTION,
        ),
        (
            names::WORKFLOW_STEPS_REPLAYED,
            names::WORKFLOW_STEPS_REPLAYED_UNIT,
            names::WORKFLOW_STEPS_REPLAYED_DESCRIPTION,
        ),
        (
            names::WORKFLOW_RESUMED,
            names::WORKFLOW_RESUMED_UNIT,
            names::WORKFLOW_RESUMED_DESCRIPTION,
        ),
        (
            names::WORKFLOW_FAILED,
            names::WORKFLOW_FAILED_UNIT,
            names::WORKFLOW_FAILED_DESCRIPTION,
        ),
        (
            names::WORKFLOW_RESUME_ERRORS,
            names::WORKFLOW_RESUME_ERRORS_UNIT,
            names::WORKFLOW_RESUME_ERRORS_DESCRIPTION,
        ),
        (
            names::WORKFLOW_LEASE_SKIPPED,
            names::WORKFLOW_LEASE_SKIPPED_UNIT,
            names::WORKFLOW_LEASE_SKIPPED_DESCRIPTION,
        ),
        (
            names::WORKFLOW_ACTIVE,
            names::WORKFLOW_ACTIVE_UNIT,
            names::WORKFLOW_ACTIVE_DESCRIPTION,
        ),
        (
            names::WORKFLOW_JOURNAL_LENGTH,
            names::WORKFLOW_JOURNAL_LENGTH_UNIT,
            names::WORKFLOW_JOURNAL_LENGTH_DESCRIPTION,
        ),
        (
            names::WORKFLOW_AWAKEABLES_PENDING,
            names::WORKFLOW_AWAKEABLES_PENDING_UNIT,
            names::WORKFLOW_AWAKEABLES_PENDING_DESCRIPTION,
        ),
        (
            names::TIMER_BACKLOG,
            names::TIMER_BACKLOG_UNIT,
            names::TIMER_BACKLOG_DESCRIPTION,
        ),
        (
            names::TIMER_FIRE_LAG,
            names::TIMER_FIRE_LAG_UNIT,
            names::TIMER_FIRE_LAG_DESCRIPTION,
        ),
        (
            names::REMOTE_DISPATCHED,
            names::REMOTE_DISPATCHED_UNIT,
            names::REMOTE_DISPATCHED_DESCRIPTION,
        ),
        (
            names::REMOTE_REDISPATCHED,
            names::REMOTE_REDISPATCHED_UNIT,
            names::REMOTE_REDISPATCHED_DESCRIPTION,
        ),
        (
            names::REMOTE_LOST,
            names::REMOTE_LOST_UNIT,
            names::REMOTE_LOST_DESCRIPTION,
        ),
        (
            names::STEP_DURATION,
            names::STEP_DURATION_UNIT,
            names::STEP_DURATION_DESCRIPTION,
        ),
        (
            names::QUEUE_WAITING,
            names::QUEUE_WAITING_UNIT,
            names::QUEUE_WAITING_DESCRIPTION,
        ),
        (
            names::QUEUE_RUNNING,
            names::QUEUE_RUNNING_UNIT,
            names::QUEUE_RUNNING_DESCRIPTION,
        ),
        (
            names::QUEUE_ADMITTED,
            names::QUEUE_ADMITTED_UNIT,
            names::QUEUE_ADMITTED_DESCRIPTION,
        ),
        (
            names::QUEUE_THROTTLED,
            names::QUEUE_THROTTLED_UNIT,
            names::QUEUE_THROTTLED_DESCRIPTION,
        ),
        (
            names::QUEUE_ADMISSION_WAIT,
            names::QUEUE_ADMISSION_WAIT_UNIT,
            names::QUEUE_ADMISSION_WAIT_DESCRIPTION,
        ),
    ];
    assert_eq!(expected.len(), names::INSTRUMENTS.len());

    let exported = h.collect()?;
    assert_eq!(exported.len(), names::INSTRUMENTS.len());
    for (name, unit, description) in expected {
        let instrument = exported
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| format!("instrument {name} was not exported"))?;
        assert_eq!(instrument.unit, unit, "{name}");
        assert_eq!(instrument.description, description, "{name}");
        assert_eq!(instrument.scope, names::METER, "{name}");
        assert_eq!(
            instrument.scope_version.as_deref(),
            Some(env!("CARGO_PKG_VERSION")),
            "{name}"
        );
    }
    Ok(())
}
