//! The append rules (journal.sql's `keiro_journal_append_to`), with the assertions of the
//! memory store's journal tests (crates/memory/src/journal.rs) and the Postgres store's
//! (crates/postgres/tests/journal_append.rs, hot_path.rs), minus their notifications, which
//! this store does not send yet.

mod common;

use common::{append, claim, event_step as step, pinned, start, step_names, T0, TTL};
use keiro_journal::store::{Append, AppendOutcome};
use keiro_journal::{store::marker_name, Event, InstanceKey, Marker, Status, StepKind, StoreError};
use keiro_lease::ClaimOutcome;
use rusqlite::Connection;
use serde_json::{json, Value};
use time::Duration as Span;

#[tokio::test]
async fn terminal_rows_refuse_with_their_own_marker_and_repeat_it_as_already_present() {
    let (_dir, store) = pinned("j-terminal");
    let done = start(&store, "done").await;
    let completed = Event::WorkflowCompleted {
        output: json!({"ok": 1}),
    };
    assert_eq!(
        append(&store, &done, None, completed.clone(), None)
            .await
            .unwrap(),
        AppendOutcome::Appended
    );
    let refused = AppendOutcome::RefusedTerminal(Marker::Completed);
    assert_eq!(
        append(&store, &done, None, step("late", json!(1)), None)
            .await
            .unwrap(),
        refused
    );
    assert_eq!(
        append(&store, &done, None, Event::WorkflowCancelled, None)
            .await
            .unwrap(),
        refused
    );
    let other = Event::WorkflowCompleted {
        output: json!("different"),
    };
    assert_eq!(
        append(&store, &done, None, other, None).await.unwrap(),
        AppendOutcome::AlreadyPresent(json!({"ok": 1}))
    );
    let row = store.instance_get(&done).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.output, row.completed_at),
        (Status::Completed, Some(json!({"ok": 1})), Some(T0))
    );

    let failed = start(&store, "failed").await;
    assert!(store
        .instance_fail_diverged(&failed, None, "diverged")
        .await
        .unwrap());
    let fail = Event::WorkflowFailed { reason: "x".into() };
    assert_eq!(
        append(&store, &failed, None, fail, None).await.unwrap(),
        AppendOutcome::AlreadyPresent(json!("diverged"))
    );
    assert_eq!(
        append(&store, &failed, None, completed, None)
            .await
            .unwrap(),
        AppendOutcome::RefusedTerminal(Marker::Failed)
    );

    let cancelled = start(&store, "cancelled").await;
    append(&store, &cancelled, None, Event::WorkflowCancelled, None)
        .await
        .unwrap();
    assert_eq!(
        append(&store, &cancelled, None, Event::WorkflowCancelled, None)
            .await
            .unwrap(),
        AppendOutcome::AlreadyPresent(Value::Null)
    );
    assert_eq!(store.journal_history(&cancelled).await.unwrap().len(), 1);
}

#[tokio::test]
async fn terminal_refusal_comes_before_the_fence_check() {
    let (_dir, store) = pinned("j-terminal-fence");
    let key = start(&store, "a").await;
    let fence = claim(&store, &key, "w").await;
    append(&store, &key, None, Event::WorkflowCancelled, None)
        .await
        .unwrap();
    let outcome = append(&store, &key, Some(0), step("s", json!(1)), Some(&fence))
        .await
        .unwrap();
    assert_eq!(outcome, AppendOutcome::RefusedTerminal(Marker::Cancelled));
    assert_eq!(
        store.instance_confirm(&key, &fence, TTL).await.unwrap(),
        Status::Cancelled
    );
}

#[tokio::test]
async fn a_recorded_step_is_already_present_even_after_the_instance_closed() {
    let (_dir, store) = pinned("j-recorded");
    let key = start(&store, "a").await;
    append(&store, &key, None, step("s", json!("first")), None)
        .await
        .unwrap();
    append(&store, &key, None, Event::WorkflowCancelled, None)
        .await
        .unwrap();
    assert_eq!(
        append(&store, &key, Some(0), step("s", json!("second")), None)
            .await
            .unwrap(),
        AppendOutcome::AlreadyPresent(json!("first"))
    );
    let as_sleep = Event::StepRecorded {
        step: "s".into(),
        kind: StepKind::Sleep,
        result: json!("second"),
    };
    assert_eq!(
        append(&store, &key, Some(0), as_sleep.clone(), None)
            .await
            .unwrap(),
        AppendOutcome::Conflict
    );
}

#[tokio::test]
async fn on_a_live_row_a_step_of_another_kind_conflicts() {
    let (_dir, store) = pinned("j-kind");
    let key = start(&store, "a").await;
    append(&store, &key, None, step("s", json!(1)), None)
        .await
        .unwrap();
    let as_sleep = Event::StepRecorded {
        step: "s".into(),
        kind: StepKind::Sleep,
        result: json!(1),
    };
    assert_eq!(
        append(&store, &key, None, as_sleep, None).await.unwrap(),
        AppendOutcome::Conflict
    );
}

#[tokio::test]
async fn only_the_current_holder_may_append_and_its_append_renews() {
    let (_dir, store) = pinned("j-holder");
    let key = start(&store, "a").await;
    let stale = claim(&store, &key, "old").await;
    let after_expiry = Some(T0 + Span::minutes(2));
    let ClaimOutcome::Acquired(fresh) = store
        .instance_claim(&key, "new", TTL, after_expiry)
        .await
        .unwrap()
    else {
        panic!("an expired lease is claimable");
    };
    assert_eq!(fresh.fence.epoch, stale.epoch + 1);
    let err = append(&store, &key, Some(0), step("s", json!(1)), Some(&stale))
        .await
        .unwrap_err();
    assert!(err.is_lease_lost());
    assert!(store.journal_history(&key).await.unwrap().is_empty());

    store.pin_clock(Some(T0 + Span::minutes(3)));
    let renewing = Append {
        key: key.clone(),
        generation: Some(0),
        event: step("s", json!(2)),
        fence: Some(fresh.fence.clone()),
        renew: Some(TTL),
    };
    assert_eq!(
        store.journal_append(&renewing).await.unwrap(),
        AppendOutcome::Appended
    );
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(row.lease_expires_at, Some(T0 + Span::minutes(4)));
    assert_eq!(row.updated_at, T0 + Span::minutes(3));

    assert!(store.instance_lease_force_release(&key).await.unwrap());
    let err = store
        .instance_confirm(&key, &fresh.fence, TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { ref owner, .. } if owner == "new"));
}

#[tokio::test]
async fn a_fresh_lease_is_not_rewritten_by_every_step() {
    // The fast path's renewal skip (journal.sql): a fenced step renews only when less than
    // three quarters of the renewal are left.
    let (_dir, store) = pinned("j-skip");
    let key = start(&store, "a").await;
    let fence = claim(&store, &key, "w").await;
    let renewing = |name: &str| Append {
        key: key.clone(),
        generation: None,
        event: step(name, json!(1)),
        fence: Some(fence.clone()),
        renew: Some(TTL),
    };
    store.pin_clock(Some(T0 + Span::seconds(10)));
    store.journal_append(&renewing("a")).await.unwrap();
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(row.lease_expires_at, Some(T0 + Span::minutes(1)), "kept");
    assert_eq!(row.updated_at, T0, "not rewritten");

    store.pin_clock(Some(T0 + Span::seconds(16)));
    store.journal_append(&renewing("b")).await.unwrap();
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(
        row.lease_expires_at,
        Some(T0 + Span::seconds(76)),
        "renewed past a quarter"
    );
}

#[tokio::test]
async fn writers_on_an_old_generation_converge_or_conflict() {
    let (_dir, store) = pinned("j-generation");
    let key = start(&store, "a").await;
    append(&store, &key, None, step("s", json!(1)), None)
        .await
        .unwrap();
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!("next"),
    };
    assert_eq!(
        append(&store, &key, Some(0), rotate.clone(), None)
            .await
            .unwrap(),
        AppendOutcome::Appended
    );
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.generation, row.status, row.input),
        (1, Status::Running, json!("next"))
    );

    let retried = append(&store, &key, Some(0), rotate, None).await.unwrap();
    assert_eq!(
        retried,
        AppendOutcome::AlreadyPresent(json!({"next_generation": 1, "input": "next"}))
    );
    assert_eq!(
        append(&store, &key, Some(0), step("s", json!(2)), None)
            .await
            .unwrap(),
        AppendOutcome::AlreadyPresent(json!(1))
    );
    assert_eq!(
        append(&store, &key, Some(0), step("t", json!(2)), None)
            .await
            .unwrap(),
        AppendOutcome::Conflict
    );
    assert_eq!(
        append(&store, &key, None, step("s", json!(3)), None)
            .await
            .unwrap(),
        AppendOutcome::Appended
    );
    assert_eq!(store.journal_load(&key, 0).await.unwrap().len(), 2);
    assert_eq!(store.journal_load(&key, 1).await.unwrap().len(), 1);
    let history: Vec<_> = store
        .journal_history(&key)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.generation)
        .collect();
    assert_eq!(history, [0, 0, 1]);
}

#[tokio::test]
async fn resurrected_is_not_appendable_and_missing_instances_are_not_found() {
    let (_dir, store) = pinned("j-missing");
    let key = start(&store, "a").await;
    let err = append(&store, &key, None, Event::Resurrected, None)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        StoreError::Database {
            retryable: false,
            ..
        }
    ));
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert!(
        append(&store, &missing, None, Event::WorkflowCancelled, None)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(store.journal_load(&missing, 0).await.unwrap().is_empty());
    assert!(store.instance_get(&missing).await.unwrap().is_none());
}

#[tokio::test]
async fn a_failure_after_resurrection_gets_a_numbered_row() {
    let (dir, store) = pinned("j-numbered");
    let key = start(&store, "a").await;
    let fail = |reason: &str| Event::WorkflowFailed {
        reason: reason.into(),
    };
    append(&store, &key, None, fail("one"), None).await.unwrap();
    store.instance_resurrect(&key).await.unwrap();
    assert_eq!(
        append(&store, &key, None, fail("two"), None).await.unwrap(),
        AppendOutcome::Appended
    );
    let names = step_names(&dir.file("keiro.db"), &key);
    assert_eq!(
        names,
        [
            marker_name::FAILED.to_owned(),
            marker_name::RESURRECTED.to_owned(),
            format!("{}/2", marker_name::FAILED)
        ]
    );
    let events: Vec<_> = store
        .journal_history(&key)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(events, [fail("one"), Event::Resurrected, fail("two")]);
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(row.last_error.as_deref(), Some("two"));
}

#[tokio::test]
async fn a_step_landing_on_a_parked_row_wakes_it() {
    let (_dir, store) = pinned("j-wake");
    let key = start(&store, "a").await;
    let park = keiro_journal::store::Park {
        key: key.clone(),
        generation: 0,
        fence: None,
        awaited: vec!["awk:x".into()],
        wake_after: None,
    };
    store.instance_park(&park).await.unwrap();
    assert_eq!(
        store.instance_get(&key).await.unwrap().unwrap().status,
        Status::Suspended
    );
    append(&store, &key, None, step("awk:x", json!("paid")), None)
        .await
        .unwrap();
    assert_eq!(
        store.instance_get(&key).await.unwrap().unwrap().status,
        Status::Running
    );
}

#[tokio::test]
async fn values_postgres_refuses_are_refused_and_nothing_is_written() {
    let (_dir, store) = pinned("j-refused");
    let key = start(&store, "a").await;
    for event in [
        step("s", json!({"a": "b\u{0}"})),
        step("s\u{0}", json!(1)),
        Event::WorkflowFailed {
            reason: "\u{0}".into(),
        },
        Event::WorkflowCompleted {
            output: json!(["\u{0}"]),
        },
    ] {
        let err = append(&store, &key, None, event, None).await.unwrap_err();
        assert!(err.is_value_refused() && !err.is_retryable(), "{err}");
    }
    // Refused before anything is decided: even for a missing instance.
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert!(
        append(&store, &missing, None, step("s", json!("\u{0}")), None)
            .await
            .unwrap_err()
            .is_value_refused()
    );
    assert!(store
        .instance_start(&common::start_request("b", json!("\u{0}")))
        .await
        .unwrap_err()
        .is_value_refused());
    assert!(store.journal_history(&key).await.unwrap().is_empty());
    assert!(store
        .instance_get(&common::key("b"))
        .await
        .unwrap()
        .is_none());
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(row.status, Status::Running);
}

#[tokio::test]
async fn closing_appends_the_completion_only_after_its_own_step() {
    let (_dir, store) = pinned("j-closing");
    let key = start(&store, "a").await;
    let fence = claim(&store, &key, "w").await;
    let last = common::step(&key, "last", json!(1), Some(&fence));
    let done = common::marker(
        &key,
        Event::WorkflowCompleted { output: json!(1) },
        Some(&fence),
    );
    let closed = store.journal_append_closing(&last, &done).await.unwrap();
    assert_eq!(closed.step, AppendOutcome::Appended);
    assert_eq!(closed.completion, Some(AppendOutcome::Appended));

    let other = start(&store, "b").await;
    append(&store, &other, None, step("last", json!("recorded")), None)
        .await
        .unwrap();
    let fence = claim(&store, &other, "w").await;
    let last = common::step(&other, "last", json!("computed"), Some(&fence));
    let done = common::marker(
        &other,
        Event::WorkflowCompleted {
            output: json!("computed"),
        },
        Some(&fence),
    );
    let closed = store.journal_append_closing(&last, &done).await.unwrap();
    assert_eq!(
        closed.step,
        AppendOutcome::AlreadyPresent(json!("recorded"))
    );
    assert_eq!(closed.completion, None, "another value: not closed");
    assert_eq!(
        store.instance_get(&other).await.unwrap().unwrap().status,
        Status::Running
    );
}

/// Each append of a pair is as `journal_append` alone: a refused completion leaves the step it
/// follows (the run's to keep), a refused step writes nothing.
#[tokio::test]
async fn a_refused_completion_keeps_its_step_and_a_refused_step_writes_nothing() {
    let (dir, store) = pinned("j-closing-refused");
    let key = start(&store, "a").await;
    let fence = claim(&store, &key, "w").await;
    let last = common::step(&key, "last", json!(1), Some(&fence));
    let done = common::marker(
        &key,
        Event::WorkflowCompleted {
            output: json!("\u{0}"),
        },
        Some(&fence),
    );
    let refused = store.journal_append_closing(&last, &done).await;
    assert!(
        matches!(&refused, Err(e) if e.is_value_refused()),
        "{refused:?}"
    );
    assert_eq!(step_names(&dir.file("keiro.db"), &key), ["last"]);
    assert_eq!(
        store.instance_get(&key).await.unwrap().unwrap().status,
        Status::Running
    );

    let other = start(&store, "b").await;
    let fence = claim(&store, &other, "w").await;
    let last = common::step(&other, "last", json!("\u{0}"), Some(&fence));
    let done = common::marker(
        &other,
        Event::WorkflowCompleted { output: json!(1) },
        Some(&fence),
    );
    let refused = store.journal_append_closing(&last, &done).await;
    assert!(
        matches!(&refused, Err(e) if e.is_value_refused()),
        "{refused:?}"
    );
    assert!(step_names(&dir.file("keiro.db"), &other).is_empty());
}

#[tokio::test]
async fn a_closing_marker_delivers_the_result_to_a_waiting_parent() {
    let (dir, store) = pinned("j-child");
    let parent = start(&store, "parent").await;
    for (id, event) in [
        ("ok", Event::WorkflowCompleted { output: json!(7) }),
        (
            "failed",
            Event::WorkflowFailed {
                reason: "no".into(),
            },
        ),
        ("cancelled", Event::WorkflowCancelled),
    ] {
        let child = start(&store, id).await;
        // The link a spawn writes (child_spawn is not in this store yet).
        let raw = Connection::open(dir.file("keiro.db")).unwrap();
        raw.execute(
            "UPDATE workflows SET parent_name = 'wf', parent_id = 'parent', \
             parent_generation = 0, parent_step = ?2 WHERE workflow_id = ?1",
            [id, &format!("child:{id}")],
        )
        .unwrap();
        append(&store, &child, None, event, None).await.unwrap();
    }
    let delivered: Vec<_> = store
        .journal_load(&parent, 0)
        .await
        .unwrap()
        .into_iter()
        .map(|e| match e.event {
            Event::StepRecorded { step, kind, result } => (step, kind, result),
            other => panic!("a step, got {other:?}"),
        })
        .collect();
    assert_eq!(
        delivered,
        [
            ("child:ok".into(), StepKind::Child, json!({"ok": 7})),
            (
                "child:failed".into(),
                StepKind::Child,
                json!({"failed": "no"})
            ),
            (
                "child:cancelled".into(),
                StepKind::Child,
                json!({"cancelled": true})
            ),
        ]
    );
}

#[tokio::test]
async fn a_cancel_or_continue_settles_the_generations_tasks_and_awakeables() {
    let (dir, store) = pinned("j-settle");
    let key = start(&store, "a").await;
    let raw = Connection::open(dir.file("keiro.db")).unwrap();
    raw.execute_batch(
        "INSERT INTO awakeables (id, workflow_name, workflow_id, generation, created_at) \
             VALUES ('00000000-0000-0000-0000-000000000001', 'wf', 'a', 0, 0); \
         INSERT INTO remote_tasks (step_id, workflow_name, workflow_id, generation, step, \
             journal_step, grp, input, max_attempts, backoff_initial_ms, backoff_max_ms, \
             backoff_jitter, redispatch_max, available_at, created_at, updated_at) \
             VALUES ('t1', 'wf', 'a', 0, 'r', 'remote:r', 'r', 'null', 1, 1, 1, 0, 1, 0, 0, 0);",
    )
    .unwrap();
    append(&store, &key, None, Event::WorkflowCancelled, None)
        .await
        .unwrap();
    let awakeable: String = raw
        .query_row("SELECT status FROM awakeables", [], |r| r.get(0))
        .unwrap();
    let task: String = raw
        .query_row("SELECT status FROM remote_tasks", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        (awakeable.as_str(), task.as_str()),
        ("cancelled", "cancelled")
    );
}
