//! Handing back a claim whose payload the worker could not open (`instance_refuse_open`): it
//! releases the lease and gates the next claim like a crash, but counts in `open_refusals`,
//! never in `attempts`, so any number of refusals leaves the run's crash budget whole. It is
//! fenced like a crash record, and every kind of progress resets the count.

use std::time::Duration;

use crate::contract::support::{append, claim, started, step_event, TestResult, SLACK, TTL};
use crate::Harness;
use keiro_journal::{store::Park, store::ParkOutcome, Append, Event, InstanceKey, Status};
use keiro_lease::{
    ClaimOutcome, Crash, CrashOutcome, LeaseStore, OpenRefusal, RefusalOutcome, ResurrectOutcome,
};
use keiro_remote::RequeueOutcome;
use serde_json::json;
use time::OffsetDateTime;

/// What the scenarios record as the reason, as the codec words it.
const REASON: &str = "payload cannot be opened by this worker: key \"k2\"";

/// A refusal whose gate is `delay` from the store's clock.
fn refusal(delay: Duration) -> OpenRefusal {
    OpenRefusal {
        error: REASON.into(),
        retry_delay: delay,
    }
}

/// The gate of a refusal, checked to be `delay` from now (within the clocks' slack).
fn gate_of(outcome: RefusalOutcome, refusals: i32, delay: Duration) -> OffsetDateTime {
    let RefusalOutcome::Released {
        refusals: counted,
        next_attempt_at,
    } = outcome
    else {
        panic!("the refusal released the lease: {outcome:?}");
    };
    assert_eq!(counted, refusals);
    let expected = OffsetDateTime::now_utc() + delay;
    assert!(
        (next_attempt_at - expected).abs() <= SLACK * 2,
        "gate {next_attempt_at}, expected about {expected}"
    );
    next_attempt_at
}

/// Claims `k` for `owner` as of `at`, failing the test when refused.
async fn claim_at(
    store: &dyn LeaseStore,
    k: &InstanceKey,
    owner: &str,
    at: OffsetDateTime,
) -> Result<keiro_journal::Fence, Box<dyn std::error::Error + Send + Sync>> {
    match store.instance_claim(k, owner, TTL, Some(at)).await? {
        ClaimOutcome::Acquired(claim) => Ok(claim.fence),
        refused => Err(format!("claim of {k} at {at} refused: {refused:?}").into()),
    }
}

pub async fn refusals_gate_the_next_claim_and_never_spend_the_crash_budget(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let k = started(store, "r-1").await?;
    let delay = Duration::from_secs(30);
    // More refusals than the ceiling of the crash below.
    let max_attempts = 2;
    let mut at = OffsetDateTime::now_utc();
    for refusals in 1..=max_attempts + 3 {
        let fence = claim_at(store, &k, "keyless", at).await?;
        let next = gate_of(
            store
                .instance_refuse_open(&k, &fence, &refusal(delay))
                .await?,
            refusals,
            delay,
        );
        // The gate holds the run back as a crash's would, and says so.
        assert_eq!(
            store.instance_claim(&k, "keyless", TTL, None).await?,
            ClaimOutcome::Paced
        );
        let row = store.instance_get(&k).await?.expect("exists");
        assert_eq!(
            (
                row.status,
                row.attempts,
                row.open_refusals,
                row.last_error.as_deref(),
                row.next_attempt_at,
                row.lease_owner
            ),
            (Status::Running, 0, refusals, Some(REASON), Some(next), None)
        );
        // A refusal of the same claim again finds the lease gone.
        assert!(store
            .instance_refuse_open(&k, &fence, &refusal(delay))
            .await
            .unwrap_err()
            .is_lease_lost());
        at = next + time::Duration::seconds(1);
    }

    // Claimable after the gate, with its whole crash budget: the first crash retries.
    let fence = claim_at(store, &k, "keyed", at).await?;
    let crash = Crash {
        error: "boom".into(),
        retry_delay: delay,
        max_attempts,
    };
    let CrashOutcome::Retrying {
        attempts: 1,
        next_attempt_at,
    } = store.instance_record_crash(&k, &fence, &crash).await?
    else {
        panic!("the first crash after the refusals retries");
    };
    // A crash is no progress: the refusals stay counted.
    let row = store.instance_get(&k).await?.expect("exists");
    assert_eq!((row.attempts, row.open_refusals), (1, max_attempts + 3));

    // Progress resets both counts, the error and the gate.
    let fence = claim_at(
        store,
        &k,
        "keyed",
        next_attempt_at + time::Duration::seconds(1),
    )
    .await?;
    assert!(store.instance_release(&k, &fence, true).await?);
    let row = store.instance_get(&k).await?.expect("exists");
    assert_eq!(
        (
            row.attempts,
            row.open_refusals,
            row.last_error,
            row.next_attempt_at
        ),
        (0, 0, None, None)
    );
    Ok(())
}

pub async fn a_refusal_is_fenced_and_leaves_a_finished_run_alone(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = started(store, "r-1").await?;
    let stale = claim(store, &k, "w1").await?;
    // The first lease expires and another worker claims the run.
    let later = OffsetDateTime::now_utc() + TTL * 2;
    let current = claim_at(store, &k, "w2", later).await?;
    let before = store.instance_get(&k).await?.expect("exists");
    assert!(store
        .instance_refuse_open(&k, &stale, &refusal(Duration::from_secs(30)))
        .await
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(
        store.instance_get(&k).await?.expect("exists"),
        before,
        "a stale refusal changes nothing"
    );

    let ghost = started(store, "r-2").await?;
    let ghost_fence = claim(store, &ghost, "w").await?;
    let missing = keiro_journal::InstanceKey::parse("wf", "missing")?;
    assert!(store
        .instance_refuse_open(&missing, &ghost_fence, &refusal(Duration::ZERO))
        .await
        .unwrap_err()
        .is_not_found());

    append(
        store,
        &k,
        None,
        Event::WorkflowCompleted { output: json!(1) },
        Some(&current),
    )
    .await?;
    let done = store.instance_get(&k).await?.expect("exists");
    assert_eq!(
        store
            .instance_refuse_open(&k, &current, &refusal(Duration::from_secs(30)))
            .await?,
        RefusalOutcome::AlreadyTerminal
    );
    assert_eq!(store.instance_get(&k).await?.expect("exists"), done);
    Ok(())
}

/// Starts `wf/<id>`, claims it and refuses it once with no wait, and returns its key and a
/// fresh claim's fence: a run one refusal old, held again.
async fn refused_once(
    store: &dyn LeaseStore,
    id: &str,
) -> Result<(InstanceKey, keiro_journal::Fence), Box<dyn std::error::Error + Send + Sync>> {
    let k = started(store, id).await?;
    let fence = claim(store, &k, "keyless").await?;
    store
        .instance_refuse_open(&k, &fence, &refusal(Duration::ZERO))
        .await?;
    let fence = claim(store, &k, "keyed").await?;
    assert_eq!(
        store.instance_get(&k).await?.expect("exists").open_refusals,
        1
    );
    Ok((k, fence))
}

/// `k`'s `(attempts, open_refusals, last_error)`.
async fn counts(
    store: &dyn LeaseStore,
    k: &InstanceKey,
) -> Result<(i32, i32, Option<String>), Box<dyn std::error::Error + Send + Sync>> {
    let row = store.instance_get(k).await?.expect("exists");
    Ok((row.attempts, row.open_refusals, row.last_error))
}

pub async fn every_kind_of_progress_resets_the_refusals(h: Harness) -> TestResult {
    let store = &*h.store;
    let fresh = (0, 0, None);

    // A park that suspends, and one that finds its wake already there.
    let (k, fence) = refused_once(store, "park").await?;
    let park = Park {
        key: k.clone(),
        generation: 0,
        fence: Some(fence),
        awaited: vec!["x".into()],
        wake_after: None,
    };
    assert_eq!(store.instance_park(&park).await?, ParkOutcome::Suspended);
    assert_eq!(counts(store, &k).await?, fresh, "suspended");

    let (k, fence) = refused_once(store, "woken").await?;
    append(store, &k, None, step_event("x", json!(1)), Some(&fence)).await?;
    let park = Park {
        key: k.clone(),
        generation: 0,
        fence: Some(fence),
        awaited: vec!["x".into()],
        wake_after: None,
    };
    assert_eq!(
        store.instance_park(&park).await?,
        ParkOutcome::WokenBeforePark
    );
    assert_eq!(counts(store, &k).await?, fresh, "woken");

    // A completion alone, and completions in a batch of appends.
    let (k, fence) = refused_once(store, "complete").await?;
    let completed = Event::WorkflowCompleted { output: json!(1) };
    append(store, &k, None, completed.clone(), Some(&fence)).await?;
    assert_eq!(counts(store, &k).await?, fresh, "completed");

    let (a, fence_a) = refused_once(store, "batch-a").await?;
    let (b, fence_b) = refused_once(store, "batch-b").await?;
    let batch = [
        Append {
            key: a.clone(),
            generation: None,
            event: completed.clone(),
            fence: Some(fence_a),
            renew: None,
        },
        Append {
            key: b.clone(),
            generation: None,
            event: completed,
            fence: Some(fence_b),
            renew: None,
        },
    ];
    for outcome in store.journal_append_batch(&batch).await {
        outcome?;
    }
    assert_eq!(counts(store, &a).await?, fresh, "completed in a batch");
    assert_eq!(counts(store, &b).await?, fresh, "completed in a batch");

    // A continue-as-new, and a release after progress.
    let (k, fence) = refused_once(store, "continue").await?;
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!(2),
    };
    append(store, &k, None, rotate, Some(&fence)).await?;
    assert_eq!(counts(store, &k).await?, fresh, "continued");

    let (k, fence) = refused_once(store, "release").await?;
    assert!(store.instance_release(&k, &fence, false).await?);
    assert_eq!(
        counts(store, &k).await?,
        (0, 1, Some(REASON.to_owned())),
        "a release without progress keeps them"
    );
    let fence = claim(store, &k, "keyed").await?;
    assert!(store.instance_release(&k, &fence, true).await?);
    assert_eq!(counts(store, &k).await?, fresh, "released after progress");

    // A resurrection and a requeue of a run that failed after a refusal.
    let fail = Crash {
        error: "boom".into(),
        retry_delay: Duration::ZERO,
        max_attempts: 1,
    };
    let (k, fence) = refused_once(store, "resurrect").await?;
    store.instance_record_crash(&k, &fence, &fail).await?;
    assert_eq!(
        counts(store, &k).await?,
        (1, 1, Some("boom".to_owned())),
        "failed"
    );
    assert_eq!(
        store.instance_resurrect(&k).await?,
        ResurrectOutcome::Resurrected
    );
    assert_eq!(counts(store, &k).await?, fresh, "resurrected");

    let (k, fence) = refused_once(store, "requeue").await?;
    store.instance_record_crash(&k, &fence, &fail).await?;
    assert!(matches!(
        h.admin.instance_requeue(&k).await?,
        RequeueOutcome::Requeued { .. }
    ));
    assert_eq!(counts(store, &k).await?, fresh, "requeued");
    Ok(())
}
