//! A lease's life after the claim: which refusal a caller hears first, the journal a claim
//! carries (the current generation's), renewals and releases under the fence, and
//! resurrection of a failed run.

use crate::contract::support::{
    append, claim, payload, started, step_event, TestResult, QUIET, SLACK, TTL,
};
use crate::Harness;
use keiro_journal::{Event, Fence, InstanceKey, Marker, Status};
use keiro_lease::{ClaimOutcome, Crash, CrashOutcome, ResurrectOutcome};
use serde_json::json;
use time::OffsetDateTime;

fn crash(max_attempts: i32) -> Crash {
    Crash {
        error: "boom".into(),
        retry_delay: std::time::Duration::from_secs(30),
        max_attempts,
    }
}

pub async fn refusals_are_classified_lease_first_and_claims_carry_the_current_generation(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    let t0 = OffsetDateTime::now_utc();
    append(store, &key, None, step_event("old", json!(1)), None).await?;
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!(2),
    };
    append(store, &key, None, rotate, None).await?;
    append(store, &key, None, step_event("new", json!(2)), None).await?;

    let fence = claim(store, &key, "w").await?;
    store.instance_record_crash(&key, &fence, &crash(5)).await?;
    store
        .instance_claim(&key, "w", TTL, Some(t0 + time::Duration::minutes(1)))
        .await?;
    // Leased and paced at once: the live lease is what the caller hears about.
    assert_eq!(
        store
            .instance_claim(&key, "v", TTL, Some(t0 + time::Duration::seconds(20)))
            .await?,
        ClaimOutcome::LeaseHeld
    );
    let ClaimOutcome::Acquired(claim) = store
        .instance_claim(&key, "v", TTL, Some(t0 + time::Duration::hours(1)))
        .await?
    else {
        panic!("an expired lease past the backoff gate is claimable");
    };
    assert_eq!(claim.fence.epoch, 3);
    assert_eq!(claim.instance.lease_owner.as_deref(), Some("v"));
    let steps: Vec<_> = claim
        .journal
        .iter()
        .map(|e| (e.generation, e.event.step_name().into_owned()))
        .collect();
    assert_eq!(steps, [(1, "new".to_owned())]);

    append(store, &key, None, Event::WorkflowCancelled, None).await?;
    assert_eq!(
        store.instance_claim(&key, "v", TTL, None).await?,
        ClaimOutcome::Unavailable
    );
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert_eq!(
        store.instance_claim(&missing, "v", TTL, None).await?,
        ClaimOutcome::Unavailable
    );
    Ok(())
}

pub async fn release_renew_and_force_release_are_fenced(h: Harness) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    let fence = claim(store, &key, "w").await?;
    store.instance_record_crash(&key, &fence, &crash(5)).await?;
    // Past the crash's backoff gate (the claim takes its `now`).
    let later = OffsetDateTime::now_utc() + time::Duration::hours(1);
    let ClaimOutcome::Acquired(claimed) = store.instance_claim(&key, "w", TTL, Some(later)).await?
    else {
        panic!("past the gate the run is claimable");
    };
    let fence = claimed.fence;

    // A renewal runs the lease from the renewal's own time.
    let before = OffsetDateTime::now_utc();
    store.instance_lease_renew(&key, &fence, TTL).await?;
    let after = OffsetDateTime::now_utc();
    let row = store.instance_get(&key).await?.ok_or("missing")?;
    let expires = row.lease_expires_at.ok_or("leased")?;
    assert!(
        expires >= before + TTL - SLACK && expires <= after + TTL + SLACK,
        "{expires} not {TTL:?} after the renewal ({before} .. {after})"
    );

    let stale = Fence {
        epoch: fence.epoch - 1,
        ..fence.clone()
    };
    assert!(!store.instance_release(&key, &stale, true).await?);
    assert!(store
        .instance_lease_renew(&key, &stale, TTL)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert!(store.instance_release(&key, &fence, true).await?);
    let row = store.instance_get(&key).await?.unwrap();
    assert_eq!(
        (row.attempts, row.last_error, row.next_attempt_at),
        (0, None, None)
    );
    assert!(!store.instance_release(&key, &fence, true).await?);
    assert!(!store.instance_lease_force_release(&key).await?);

    let fence = claim(store, &key, "w").await?;
    append(
        store,
        &key,
        None,
        Event::WorkflowCompleted { output: json!(1) },
        Some(&fence),
    )
    .await?;
    assert!(store
        .instance_lease_renew(&key, &fence, TTL)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(
        append(store, &key, None, Event::WorkflowCancelled, None).await?,
        keiro_journal::AppendOutcome::RefusedTerminal(Marker::Completed)
    );
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert!(store
        .instance_lease_renew(&missing, &fence, TTL)
        .await
        .unwrap_err()
        .is_not_found());
    assert!(!store.instance_release(&missing, &fence, false).await?);
    Ok(())
}

pub async fn resurrection_keeps_history_and_wakes_the_run_each_time(h: Harness) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert_eq!(
        store.instance_resurrect(&missing).await?,
        ResurrectOutcome::NotFound
    );
    assert_eq!(
        store.instance_resurrect(&key).await?,
        ResurrectOutcome::NotFailed(Status::Running)
    );
    for round in 0..2 {
        let fence = claim(store, &key, "w").await?;
        assert_eq!(
            store.instance_record_crash(&key, &fence, &crash(1)).await?,
            CrashOutcome::Failed { attempts: 1 }
        );
        let mut wakes = h.notifications().await?;
        assert_eq!(
            store.instance_resurrect(&key).await?,
            ResurrectOutcome::Resurrected
        );
        assert_eq!(wakes.drain(QUIET).await, [payload(&key)], "round {round}");
    }
    let row = store.instance_get(&key).await?.unwrap();
    assert_eq!(
        (row.status, row.attempts, row.last_error, row.completed_at),
        (Status::Running, 0, None, None)
    );
    // Each failure and resurrection is its own journal row.
    let events: Vec<Event> = store
        .journal_history(&key)
        .await?
        .into_iter()
        .map(|e| e.event)
        .collect();
    let failed = Event::WorkflowFailed {
        reason: "boom".into(),
    };
    assert_eq!(
        events,
        [
            failed.clone(),
            Event::Resurrected,
            failed,
            Event::Resurrected
        ]
    );
    assert_eq!(store.journal_load(&key, 0).await?.len(), 4);
    Ok(())
}

pub async fn confirm_renews_the_lease_and_refuses_a_stale_fence_or_a_missing_instance(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let key = started(store, "a").await?;
    let fence = claim(store, &key, "w").await?;
    // The confirmation runs the lease the TTL it is given from its own time.
    const LONG: std::time::Duration = std::time::Duration::from_secs(3600);
    let before = OffsetDateTime::now_utc();
    assert_eq!(
        store.instance_confirm(&key, &fence, LONG).await?,
        Status::Running
    );
    let after = OffsetDateTime::now_utc();
    let row = store.instance_get(&key).await?.ok_or("missing")?;
    let expires = row.lease_expires_at.ok_or("leased")?;
    assert!(
        expires >= before + LONG - SLACK && expires <= after + LONG + SLACK,
        "{expires} not {LONG:?} after the confirmation ({before} .. {after})"
    );
    let stale = Fence {
        epoch: fence.epoch + 1,
        ..fence.clone()
    };
    assert!(store
        .instance_confirm(&key, &stale, TTL)
        .await
        .unwrap_err()
        .is_lease_lost());
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert!(store
        .instance_confirm(&missing, &fence, TTL)
        .await
        .unwrap_err()
        .is_not_found());
    Ok(())
}
