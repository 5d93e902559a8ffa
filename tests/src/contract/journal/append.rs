//! Append outcomes, in the order the store contract checks them: one value per step, kinds
//! and generations that conflict, terminal rows, resurrection, continue-as-new and fences.

use std::time::Duration;

use crate::contract::support::{
    append, claim, key, payload, start, started, step, step_event, TestResult, QUIET, SLACK, TTL,
};
use crate::Harness;
use keiro_journal::{
    Append, AppendOutcome, Event, InstanceKey, Marker, Status, StepKind, StoreError,
};
use keiro_lease::{ClaimOutcome, ResurrectOutcome};
use serde_json::{json, Value};
use time::OffsetDateTime;

fn marker(k: &InstanceKey, event: Event) -> Append {
    Append {
        generation: Some(0),
        ..Append::external(k.clone(), event)
    }
}

pub async fn steps_converge_on_the_first_record_and_kinds_conflict(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!({"n": 1}))).await?;

    assert_eq!(
        store
            .journal_append(&step(&k, "a", StepKind::Step, json!(1)))
            .await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        store
            .journal_append(&step(&k, "a", StepKind::Step, json!(2)))
            .await?,
        AppendOutcome::AlreadyPresent(json!(1))
    );
    assert_eq!(
        store
            .journal_append(&step(&k, "a", StepKind::Sleep, json!(1)))
            .await?,
        AppendOutcome::Conflict
    );
    let other_generation = Append {
        generation: Some(3),
        ..step(&k, "b", StepKind::Step, json!(1))
    };
    assert_eq!(
        store.journal_append(&other_generation).await?,
        AppendOutcome::Conflict
    );

    let missing = step(&key("order", "nope"), "a", StepKind::Step, json!(1));
    assert!(store
        .journal_append(&missing)
        .await
        .unwrap_err()
        .is_not_found());
    let resurrect = Append::external(k.clone(), Event::Resurrected);
    assert!(matches!(
        store.journal_append(&resurrect).await,
        Err(StoreError::Database {
            retryable: false,
            ..
        })
    ));

    let journal = store.journal_load(&k, 0).await?;
    assert_eq!(journal.len(), 1);
    assert_eq!(
        journal[0].event,
        Event::StepRecorded {
            step: "a".into(),
            kind: StepKind::Step,
            result: json!(1)
        }
    );
    Ok(())
}

pub async fn terminal_rows_refuse_steps_and_other_markers(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    store
        .journal_append(&step(&k, "a", StepKind::Step, json!(1)))
        .await?;
    let done = marker(
        &k,
        Event::WorkflowCompleted {
            output: json!("out"),
        },
    );
    assert_eq!(store.journal_append(&done).await?, AppendOutcome::Appended);

    // A recorded step is still idempotent; a new one is refused; markers converge or are refused.
    assert_eq!(
        store
            .journal_append(&step(&k, "a", StepKind::Step, json!(9)))
            .await?,
        AppendOutcome::AlreadyPresent(json!(1))
    );
    assert_eq!(
        store
            .journal_append(&step(&k, "b", StepKind::Step, json!(9)))
            .await?,
        AppendOutcome::RefusedTerminal(Marker::Completed)
    );
    let again = marker(
        &k,
        Event::WorkflowCompleted {
            output: json!("other"),
        },
    );
    assert_eq!(
        store.journal_append(&again).await?,
        AppendOutcome::AlreadyPresent(json!("out"))
    );
    assert_eq!(
        store
            .journal_append(&marker(&k, Event::WorkflowCancelled))
            .await?,
        AppendOutcome::RefusedTerminal(Marker::Completed)
    );

    let row = store.instance_get(&k).await?.expect("exists");
    assert_eq!(row.status, Status::Completed);
    assert_eq!(row.output, Some(json!("out")));
    assert!(row.completed_at.is_some() && row.lease_owner.is_none());
    Ok(())
}

pub async fn failures_repeat_after_resurrection_under_unique_names(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let fail = |reason: &str| {
        marker(
            &k,
            Event::WorkflowFailed {
                reason: reason.into(),
            },
        )
    };
    assert_eq!(
        store.journal_append(&fail("first")).await?,
        AppendOutcome::Appended
    );
    assert_eq!(
        store.journal_append(&fail("again")).await?,
        AppendOutcome::AlreadyPresent(json!("first"))
    );
    assert_eq!(
        store.instance_resurrect(&k).await?,
        ResurrectOutcome::Resurrected
    );
    assert_eq!(
        store.journal_append(&fail("second")).await?,
        AppendOutcome::Appended
    );
    let row = store.instance_get(&k).await?.expect("exists");
    assert_eq!(
        (row.status, row.last_error.as_deref()),
        (Status::Failed, Some("second")),
        "the row carries this run's failure"
    );
    // A repeat converges on this run's failure, not the first one.
    assert_eq!(
        store.journal_append(&fail("third")).await?,
        AppendOutcome::AlreadyPresent(json!("second"))
    );
    assert_eq!(
        store.instance_resurrect(&k).await?,
        ResurrectOutcome::Resurrected
    );
    assert_eq!(
        store.instance_resurrect(&k).await?,
        ResurrectOutcome::NotFailed(Status::Running)
    );
    assert_eq!(
        store.instance_resurrect(&key("order", "nope")).await?,
        ResurrectOutcome::NotFound
    );

    let events: Vec<Event> = store
        .journal_history(&k)
        .await?
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(
        events,
        [
            Event::WorkflowFailed {
                reason: "first".into()
            },
            Event::Resurrected,
            Event::WorkflowFailed {
                reason: "second".into()
            },
            Event::Resurrected,
        ]
    );
    let row = store.instance_get(&k).await?.expect("exists");
    assert_eq!(
        (row.status, row.last_error, row.completed_at),
        (Status::Running, None, None)
    );
    Ok(())
}

pub async fn continue_as_new_moves_the_generation_and_a_retry_converges(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(0))).await?;
    store
        .journal_append(&step(&k, "a", StepKind::Step, json!(1)))
        .await?;
    let next = marker(
        &k,
        Event::WorkflowContinuedAsNew {
            next_generation: 1,
            input: json!([1, 2]),
        },
    );
    assert_eq!(store.journal_append(&next).await?, AppendOutcome::Appended);
    let recorded = json!({"next_generation": 1, "input": [1, 2]});
    assert_eq!(
        store.journal_append(&next).await?,
        AppendOutcome::AlreadyPresent(recorded)
    );

    let row = store.instance_get(&k).await?.expect("exists");
    assert_eq!(
        (row.generation, row.status, row.input),
        (1, Status::Running, json!([1, 2]))
    );
    assert!(store.journal_load(&k, 1).await?.is_empty());
    // Wake sources append to the current generation.
    assert_eq!(
        store
            .journal_append(&step(&k, "a", StepKind::Step, json!(5)))
            .await?,
        AppendOutcome::Appended
    );
    let history = store.journal_history(&k).await?;
    let generations: Vec<i32> = history.iter().map(|e| e.generation).collect();
    assert_eq!(generations, [0, 0, 1]);
    assert!(history.windows(2).all(|w| w[0].seq < w[1].seq));
    Ok(())
}

pub async fn fenced_appends_need_the_current_lease_and_renew_it(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let ttl = Duration::from_secs(60);
    let ClaimOutcome::Acquired(old) = store.instance_claim(&k, "old", ttl, None).await? else {
        panic!("claimable");
    };
    assert!(store.instance_lease_force_release(&k).await?);
    let ClaimOutcome::Acquired(new) = store.instance_claim(&k, "new", ttl, None).await? else {
        panic!("released");
    };
    assert_eq!(new.fence.epoch, old.fence.epoch + 1);

    let fenced = |fence: &keiro_journal::Fence, name: &str| Append {
        fence: Some(fence.clone()),
        renew: Some(Duration::from_secs(3600)),
        generation: Some(0),
        ..step(&k, name, StepKind::Step, json!(name))
    };
    let err = store
        .journal_append(&fenced(&old.fence, "a"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::LeaseLost { owner, epoch: 1, .. } if owner == "old"),
        "{err:?}"
    );
    assert_eq!(
        store.journal_append(&fenced(&new.fence, "a")).await?,
        AppendOutcome::Appended
    );
    // The stale holder learns the recorded value but cannot change it.
    assert_eq!(
        store.journal_append(&fenced(&old.fence, "a")).await?,
        AppendOutcome::AlreadyPresent(json!("a"))
    );
    let row = store.instance_get(&k).await?.expect("exists");
    let renewed = row.lease_expires_at.expect("leased");
    assert!(renewed > new.instance.lease_expires_at.expect("leased") + time::Duration::minutes(30));
    Ok(())
}

pub async fn terminal_rows_refuse_with_their_own_marker_and_repeat_it_as_already_present(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let done = started(store, "done").await?;
    let completed = Event::WorkflowCompleted {
        output: json!({"ok": 1}),
    };
    assert_eq!(
        append(store, &done, None, completed.clone(), None).await?,
        AppendOutcome::Appended
    );
    let refused = AppendOutcome::RefusedTerminal(Marker::Completed);
    assert_eq!(
        append(store, &done, None, step_event("late", json!(1)), None).await?,
        refused
    );
    assert_eq!(
        append(store, &done, None, Event::WorkflowCancelled, None).await?,
        refused
    );
    let other = Event::WorkflowCompleted {
        output: json!("different"),
    };
    assert_eq!(
        append(store, &done, None, other, None).await?,
        AppendOutcome::AlreadyPresent(json!({"ok": 1}))
    );

    let failed = started(store, "failed").await?;
    assert!(
        store
            .instance_fail_diverged(&failed, None, "diverged")
            .await?
    );
    let fail = Event::WorkflowFailed { reason: "x".into() };
    assert_eq!(
        append(store, &failed, None, fail, None).await?,
        AppendOutcome::AlreadyPresent(json!("diverged"))
    );
    assert_eq!(
        append(store, &failed, None, completed, None).await?,
        AppendOutcome::RefusedTerminal(Marker::Failed)
    );

    let cancelled = started(store, "cancelled").await?;
    append(store, &cancelled, None, Event::WorkflowCancelled, None).await?;
    assert_eq!(
        append(store, &cancelled, None, Event::WorkflowCancelled, None).await?,
        AppendOutcome::AlreadyPresent(Value::Null)
    );
    assert_eq!(store.journal_history(&cancelled).await?.len(), 1);
    Ok(())
}

pub async fn terminal_refusal_comes_before_the_fence_check(h: Harness) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    let fence = claim(store, &key, "w").await?;
    append(store, &key, None, Event::WorkflowCancelled, None).await?;
    let outcome = append(
        store,
        &key,
        Some(0),
        step_event("s", json!(1)),
        Some(&fence),
    )
    .await?;
    assert_eq!(outcome, AppendOutcome::RefusedTerminal(Marker::Cancelled));
    assert_eq!(
        store.instance_confirm(&key, &fence, TTL).await?,
        Status::Cancelled
    );
    Ok(())
}

pub async fn a_recorded_step_is_already_present_even_after_the_instance_closed(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    append(store, &key, None, step_event("s", json!("first")), None).await?;
    append(store, &key, None, Event::WorkflowCancelled, None).await?;
    assert_eq!(
        append(store, &key, Some(0), step_event("s", json!("second")), None).await?,
        AppendOutcome::AlreadyPresent(json!("first"))
    );
    let as_sleep = Event::StepRecorded {
        step: "s".into(),
        kind: StepKind::Sleep,
        result: json!("second"),
    };
    assert_eq!(
        append(store, &key, Some(0), as_sleep, None).await?,
        AppendOutcome::Conflict
    );
    Ok(())
}

pub async fn only_the_current_holder_may_append_and_its_append_renews(h: Harness) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    let stale = claim(store, &key, "old").await?;
    // Past the first lease's expiry (the claim takes its `now`), the lease is claimable.
    let after_expiry = Some(OffsetDateTime::now_utc() + time::Duration::minutes(2));
    let ClaimOutcome::Acquired(fresh) =
        store.instance_claim(&key, "new", TTL, after_expiry).await?
    else {
        panic!("an expired lease is claimable");
    };
    assert_eq!(fresh.fence.epoch, stale.epoch + 1);
    let err = append(
        store,
        &key,
        Some(0),
        step_event("s", json!(1)),
        Some(&stale),
    )
    .await
    .unwrap_err();
    assert!(err.is_lease_lost());
    assert!(store.journal_history(&key).await?.is_empty());

    let renewing = Append {
        key: key.clone(),
        generation: Some(0),
        event: step_event("s", json!(2)),
        fence: Some(fresh.fence.clone()),
        renew: Some(RENEW),
    };
    const RENEW: std::time::Duration = std::time::Duration::from_secs(3600);
    let before = OffsetDateTime::now_utc();
    assert_eq!(
        store.journal_append(&renewing).await?,
        AppendOutcome::Appended
    );
    let after = OffsetDateTime::now_utc();
    // Renewed from the append's own time (past the lease's old end, so both stores move it).
    let row = store.instance_get(&key).await?.ok_or("missing")?;
    let expires = row.lease_expires_at.ok_or("leased")?;
    assert!(
        expires >= before + RENEW - SLACK && expires <= after + RENEW + SLACK,
        "{expires} not {RENEW:?} after the append ({before} .. {after})"
    );
    assert!(
        row.updated_at >= before - SLACK && row.updated_at <= after + SLACK,
        "{}",
        row.updated_at
    );

    assert!(store.instance_lease_force_release(&key).await?);
    let err = store
        .instance_confirm(&key, &fresh.fence, TTL)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::LeaseLost { ref owner, .. } if owner == "new"));
    Ok(())
}

pub async fn writers_on_an_old_generation_converge_or_conflict(h: Harness) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    append(store, &key, None, step_event("s", json!(1)), None).await?;
    let mut wakes = h.notifications().await?;
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!("next"),
    };
    assert_eq!(
        append(store, &key, Some(0), rotate.clone(), None).await?,
        AppendOutcome::Appended
    );
    assert_eq!(wakes.drain(QUIET).await, [payload(&key)]);
    let row = store.instance_get(&key).await?.unwrap();
    assert_eq!(
        (row.generation, row.status, row.input),
        (1, Status::Running, json!("next"))
    );

    let retried = append(store, &key, Some(0), rotate, None).await?;
    assert_eq!(
        retried,
        AppendOutcome::AlreadyPresent(json!({"next_generation": 1, "input": "next"}))
    );
    assert_eq!(
        append(store, &key, Some(0), step_event("s", json!(2)), None).await?,
        AppendOutcome::AlreadyPresent(json!(1))
    );
    assert_eq!(
        append(store, &key, Some(0), step_event("t", json!(2)), None).await?,
        AppendOutcome::Conflict
    );
    assert_eq!(
        append(store, &key, None, step_event("s", json!(3)), None).await?,
        AppendOutcome::Appended
    );
    assert_eq!(store.journal_load(&key, 0).await?.len(), 2);
    assert_eq!(store.journal_load(&key, 1).await?.len(), 1);
    Ok(())
}

pub async fn resurrected_is_not_appendable_and_missing_instances_are_not_found(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    let err = append(store, &key, None, Event::Resurrected, None)
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
        append(store, &missing, None, Event::WorkflowCancelled, None)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(store.journal_load(&missing, 0).await?.is_empty());
    assert!(store.instance_get(&missing).await?.is_none());
    Ok(())
}

pub async fn a_fenced_step_renews_the_lease_only_once_it_is_no_longer_fresh(
    h: Harness,
) -> TestResult {
    // The contract lets a store skip the renewal while more than three quarters of it are
    // left on the lease, so that back-to-back steps do not rewrite the instance row; both
    // stores do (a store that did not would branch on its `Backend` here).
    let store = &*h.store;
    let k = started(store, "a").await?;
    let ttl = Duration::from_secs(600);
    let ClaimOutcome::Acquired(claimed) = store.instance_claim(&k, "w", ttl, None).await? else {
        panic!("claimable");
    };
    let granted = store.instance_get(&k).await?.ok_or("missing")?;
    let fenced = |name: &str, renew: Duration| Append {
        generation: Some(0),
        fence: Some(claimed.fence.clone()),
        renew: Some(renew),
        ..step(&k, name, StepKind::Step, json!(name))
    };

    // Just claimed: more than three quarters of the TTL left, so the row is not rewritten.
    assert_eq!(
        store.journal_append(&fenced("a", ttl)).await?,
        AppendOutcome::Appended
    );
    let kept = store.instance_get(&k).await?.ok_or("missing")?;
    assert_eq!(kept.lease_expires_at, granted.lease_expires_at, "kept");
    assert_eq!(kept.updated_at, granted.updated_at, "not rewritten");

    // A longer renewal finds the lease short of three quarters of it, and renews it.
    let long = Duration::from_secs(3600);
    let before = OffsetDateTime::now_utc();
    assert_eq!(
        store.journal_append(&fenced("b", long)).await?,
        AppendOutcome::Appended
    );
    let after = OffsetDateTime::now_utc();
    let renewed = store.instance_get(&k).await?.ok_or("missing")?;
    let expires = renewed.lease_expires_at.ok_or("leased")?;
    assert!(
        expires >= before + long - SLACK && expires <= after + long + SLACK,
        "{expires} not {long:?} after the append ({before} .. {after})"
    );
    assert_eq!(store.journal_load(&k, 0).await?.len(), 2);
    Ok(())
}

pub async fn a_cancelled_marker_settles_the_generations_tasks_and_awakeables(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let k = started(store, "a").await?;
    let id = uuid::Uuid::from_u128(1);
    let allocation = step(&k, "awkid:a", StepKind::Awakeable, json!(id.to_string()));
    store.awakeable_create(&allocation, id).await?;
    store
        .remote_arm(&crate::contract::remote::arm(&k, "r", json!(null)))
        .await?;
    assert_eq!(store.awakeables_pending().await?, 1);

    // The marker appended as any other (not through `instance_cancel`).
    assert_eq!(
        append(store, &k, None, Event::WorkflowCancelled, None).await?,
        AppendOutcome::Appended
    );
    assert_eq!(store.awakeables_pending().await?, 0);
    assert_eq!(
        store.awakeable_complete(id, &json!(1)).await?,
        keiro_journal::AwakeableOutcome::AlreadySettled(keiro_journal::AwakeableStatus::Cancelled)
    );
    let statuses: Vec<keiro_remote::TaskStatus> = h
        .admin
        .remote_tasks(&k)
        .await?
        .iter()
        .map(|t| t.status)
        .collect();
    assert_eq!(statuses, [keiro_remote::TaskStatus::Cancelled]);
    Ok(())
}
