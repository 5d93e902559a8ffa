//! Discovery, claims, renewals, releases, parking and crash accounting against the real SQL.

use std::time::Duration;

use crate::contract::support::{key, start, TestResult};
use crate::Harness;
use keiro_journal::{
    store::Park, store::ParkOutcome, store::StartRequest, Append, Event, InstanceKey, Status,
    StepKind,
};
use keiro_lease::{Claim, ClaimOutcome, Crash, CrashOutcome, LeaseStore};
use serde_json::json;
use time::OffsetDateTime;

const TTL: Duration = Duration::from_secs(60);

async fn claim(
    store: &dyn LeaseStore,
    k: &InstanceKey,
    owner: &str,
) -> Result<Claim, Box<dyn std::error::Error + Send + Sync>> {
    match store.instance_claim(k, owner, TTL, None).await? {
        ClaimOutcome::Acquired(claim) => Ok(*claim),
        refused => Err(format!("claim refused: {refused:?}").into()),
    }
}

pub async fn a_claim_carries_the_row_and_the_current_journal(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!({"sku": 7}))).await?;
    for (name, result) in [("a", json!(1)), ("b", json!({"x": [true, null]}))] {
        let append = Append::external(
            k.clone(),
            Event::StepRecorded {
                step: name.into(),
                kind: StepKind::Step,
                result,
            },
        );
        store.journal_append(&append).await?;
    }
    let claim = claim(store, &k, "w1").await?;
    assert_eq!(claim.fence.owner, "w1");
    assert_eq!(claim.instance.lease_owner.as_deref(), Some("w1"));
    assert_eq!(claim.instance.input, json!({"sku": 7}));
    assert_eq!(claim.journal, store.journal_load(&k, 0).await?);
    assert_eq!(claim.journal.len(), 2);

    // An empty generation claims with an empty journal.
    let fresh = key("order", "o-2");
    store.instance_start(&start(&fresh, json!(null))).await?;
    assert!(claim_fresh(store, &fresh).await?.journal.is_empty());
    Ok(())
}

async fn claim_fresh(
    store: &dyn LeaseStore,
    k: &InstanceKey,
) -> Result<Claim, Box<dyn std::error::Error + Send + Sync>> {
    claim(store, k, "w").await
}

pub async fn refusals_are_classified_and_leases_fence(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    assert_eq!(
        store.instance_claim(&k, "w", TTL, None).await?,
        ClaimOutcome::Unavailable
    );
    store.instance_start(&start(&k, json!(null))).await?;
    let first = claim(store, &k, "w1").await?;
    assert_eq!(
        store.instance_claim(&k, "w2", TTL, None).await?,
        ClaimOutcome::LeaseHeld
    );
    // Past the expiry (a pinned clock stands in for waiting), anyone may claim.
    let later = OffsetDateTime::now_utc() + time::Duration::minutes(2);
    let ClaimOutcome::Acquired(second) = store.instance_claim(&k, "w2", TTL, Some(later)).await?
    else {
        panic!("the first lease expired");
    };
    assert_eq!(second.fence.epoch, first.fence.epoch + 1);

    assert!(store
        .instance_lease_renew(&k, &first.fence, TTL)
        .await
        .unwrap_err()
        .is_lease_lost());
    store.instance_lease_renew(&k, &second.fence, TTL).await?;
    assert!(store
        .instance_lease_renew(&key("order", "nope"), &second.fence, TTL)
        .await
        .unwrap_err()
        .is_not_found());
    assert!(store
        .instance_confirm(&k, &first.fence, TTL)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(
        store.instance_confirm(&k, &second.fence, TTL).await?,
        Status::Running
    );
    assert!(!store.instance_release(&k, &first.fence, true).await?);
    assert!(store.instance_release(&k, &second.fence, true).await?);
    assert!(!store.instance_lease_force_release(&k).await?);
    Ok(())
}

pub async fn crashes_back_off_then_fail_with_a_journaled_marker(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let crash = Crash {
        error: "boom".into(),
        retry_delay: Duration::from_secs(30),
        max_attempts: 2,
    };
    let first = claim(store, &k, "w").await?;
    let CrashOutcome::Retrying {
        attempts: 1,
        next_attempt_at,
    } = store
        .instance_record_crash(&k, &first.fence, &crash)
        .await?
    else {
        panic!("the first crash retries");
    };
    assert!(next_attempt_at > OffsetDateTime::now_utc() + time::Duration::seconds(20));
    assert_eq!(
        store.instance_claim(&k, "w", TTL, None).await?,
        ClaimOutcome::Paced
    );
    assert!(store
        .instance_record_crash(&k, &first.fence, &crash)
        .await
        .unwrap_err()
        .is_lease_lost());

    let later = next_attempt_at + time::Duration::seconds(1);
    let ClaimOutcome::Acquired(second) = store.instance_claim(&k, "w", TTL, Some(later)).await?
    else {
        panic!("the gate passed");
    };
    assert_eq!(
        store
            .instance_record_crash(&k, &second.fence, &crash)
            .await?,
        CrashOutcome::Failed { attempts: 2 }
    );
    let row = store.instance_get(&k).await?.expect("exists");
    assert_eq!(
        (
            row.status,
            row.attempts,
            row.last_error.as_deref(),
            row.lease_owner
        ),
        (Status::Failed, 2, Some("boom"), None)
    );
    let events: Vec<Event> = store
        .journal_load(&k, 0)
        .await?
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(
        events,
        [Event::WorkflowFailed {
            reason: "boom".into()
        }]
    );
    assert_eq!(
        store
            .instance_record_crash(&k, &second.fence, &crash)
            .await?,
        CrashOutcome::AlreadyTerminal
    );
    assert_eq!(
        store.instance_claim(&k, "w", TTL, Some(later)).await?,
        ClaimOutcome::Unavailable
    );
    Ok(())
}

pub async fn parking_never_masks_a_wake_and_discovery_is_exact(h: Harness) -> TestResult {
    let store = &*h.store;
    let (parked, due, woken) = (
        key("order", "parked"),
        key("order", "due"),
        key("order", "woken"),
    );
    for k in [&parked, &due, &woken] {
        store.instance_start(&start(k, json!(null))).await?;
    }
    let now = OffsetDateTime::now_utc();
    let park = |k: &InstanceKey, fence, wake_after| Park {
        key: k.clone(),
        generation: 0,
        fence: Some(fence),
        awaited: vec!["sleep:nap".into()],
        wake_after,
    };
    let c = claim(store, &parked, "w").await?;
    assert_eq!(
        store.instance_park(&park(&parked, c.fence, None)).await?,
        ParkOutcome::Suspended
    );
    let c = claim(store, &due, "w").await?;
    let soon = Some(now + time::Duration::minutes(5));
    assert_eq!(
        store.instance_park(&park(&due, c.fence, soon)).await?,
        ParkOutcome::Suspended
    );
    let c = claim(store, &woken, "w").await?;
    let wake = Append::external(
        woken.clone(),
        Event::StepRecorded {
            step: "sleep:nap".into(),
            kind: StepKind::Sleep,
            result: json!(null),
        },
    );
    store.journal_append(&wake).await?;
    assert_eq!(
        store.instance_park(&park(&woken, c.fence, None)).await?,
        ParkOutcome::WokenBeforePark
    );

    let runnable = store.instances_runnable(Some(now), None).await?;
    assert_eq!(runnable, vec![woken.clone()]);
    let later = now + time::Duration::minutes(10);
    assert_eq!(
        store.instances_runnable(Some(later), None).await?,
        [due.clone(), woken.clone()]
    );
    assert_eq!(
        store.instances_runnable(Some(later), Some(1)).await?,
        vec![due.clone()]
    );
    assert!(store
        .instances_runnable(Some(later), Some(-1))
        .await?
        .is_empty());

    // A wake flips the parked row.
    let wake = Append {
        key: parked.clone(),
        ..wake
    };
    store.journal_append(&wake).await?;
    assert_eq!(
        store.instance_get(&parked).await?.map(|i| i.status),
        Some(Status::Running)
    );
    Ok(())
}

pub async fn discovery_orders_by_priority_then_age(h: Harness) -> TestResult {
    let store = &*h.store;
    for (id, priority) in [("low", 0), ("high", 5), ("low-later", 0)] {
        let request = StartRequest {
            attributes: Default::default(),
            priority,
            ..start(&key("order", id), json!(null))
        };
        store.instance_start(&request).await?;
    }
    // A finished run is never runnable.
    let done = key("order", "done");
    store.instance_start(&start(&done, json!(null))).await?;
    store.instance_cancel(&done, false).await?;
    let ids: Vec<String> = store
        .instances_runnable(None, None)
        .await?
        .into_iter()
        .map(|k| k.id.to_string())
        .collect();
    assert_eq!(ids, ["high", "low", "low-later"]);
    Ok(())
}

pub async fn a_diverged_run_fails_without_a_journal_row(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let c = claim(store, &k, "w").await?;
    let stale = keiro_journal::Fence {
        owner: "w".into(),
        epoch: 0,
    };
    assert!(store
        .instance_fail_diverged(&k, Some(&stale), "diverged")
        .await
        .unwrap_err()
        .is_lease_lost());
    assert!(
        store
            .instance_fail_diverged(&k, Some(&c.fence), "diverged")
            .await?
    );
    assert!(!store.instance_fail_diverged(&k, None, "again").await?);
    assert!(store.journal_history(&k).await?.is_empty());
    let row = store.instance_get(&k).await?.expect("exists");
    assert_eq!(
        (row.status, row.last_error.as_deref()),
        (Status::Failed, Some("diverged"))
    );
    assert_eq!(
        store.instance_confirm(&k, &c.fence, TTL).await?,
        Status::Failed
    );
    Ok(())
}

pub async fn racing_claims_grant_exactly_one_lease(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    let claims = (0..8).map(|n| {
        let (store, k) = (h.store.clone(), k.clone());
        tokio::spawn(async move { store.instance_claim(&k, &format!("w{n}"), TTL, None).await })
    });
    let mut acquired = 0;
    for claim in claims {
        match claim.await?? {
            ClaimOutcome::Acquired(claim) => {
                acquired += 1;
                assert_eq!(claim.fence.epoch, 1);
            }
            refused => assert_eq!(refused, ClaimOutcome::LeaseHeld),
        }
    }
    assert_eq!(acquired, 1);
    Ok(())
}

/// The step names of a claim's journal, in its order.
fn step_names(journal: &[keiro_journal::JournalEntry]) -> Vec<String> {
    journal
        .iter()
        .map(|entry| entry.event.step_name().into_owned())
        .collect()
}

pub async fn claims_carry_the_journal_in_append_order(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("order", "o-1");
    store.instance_start(&start(&k, json!(null))).await?;
    // Appended in an order that is not the step names' order.
    for name in ["zeta", "alpha", "mu"] {
        let append = Append {
            generation: Some(0),
            ..crate::contract::support::step(&k, name, StepKind::Step, json!(name))
        };
        store.journal_append(&append).await?;
    }
    let single = claim(store, &k, "one").await?;
    assert_eq!(step_names(&single.journal), ["zeta", "alpha", "mu"]);
    assert!(single.journal.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(store.instance_release(&k, &single.fence, false).await?);

    let names = [keiro_journal::WorkflowName::new("order")?];
    let batch = store
        .instances_claim_batch(&names, "many", TTL, 10, None)
        .await?;
    assert_eq!(batch.len(), 1);
    assert_eq!(step_names(&batch[0].journal), ["zeta", "alpha", "mu"]);
    assert_eq!(batch[0].journal, store.journal_load(&k, 0).await?);
    Ok(())
}

pub async fn a_batch_claim_takes_discovery_order_for_the_names_asked_and_skips_held_rows(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    // Started one after the other, so age and key order agree among equal priorities.
    for (id, priority) in [("a-1", 0), ("a-2", 0), ("a-3", 0), ("z", 5)] {
        let request = StartRequest {
            attributes: Default::default(),
            priority,
            ..start(&key("wf", id), json!(null))
        };
        store.instance_start(&request).await?;
    }
    let now = OffsetDateTime::now_utc();
    let (parked, due, done) = (key("wf", "parked"), key("wf", "due"), key("wf", "done"));
    for k in [&parked, &due, &done] {
        store.instance_start(&start(k, json!(null))).await?;
    }
    for (k, wake_after) in [
        (&parked, None),
        (&due, Some(now + time::Duration::minutes(5))),
    ] {
        let park = Park {
            key: k.clone(),
            generation: 0,
            fence: None,
            awaited: vec!["awk:x".into()],
            wake_after,
        };
        store.instance_park(&park).await?;
    }
    store.instance_cancel(&done, false).await?;

    let ids = |keys: Vec<InstanceKey>| keys.iter().map(|k| k.id.to_string()).collect::<Vec<_>>();
    assert_eq!(
        ids(store.instances_runnable(None, None).await?),
        ["z", "a-1", "a-2", "a-3"]
    );
    let at_wake = Some(now + time::Duration::minutes(10));
    assert_eq!(
        ids(store.instances_runnable(at_wake, None).await?),
        ["z", "a-1", "a-2", "a-3", "due"]
    );

    // The batch claim takes the same order, only for the names asked, and skips held rows.
    let hour = Duration::from_secs(3600);
    let names = [keiro_journal::WorkflowName::new("wf")?];
    let claimed = store
        .instances_claim_batch(&names, "w", hour, 2, None)
        .await?;
    let claimed_ids: Vec<_> = claimed
        .iter()
        .map(|c| c.instance.key.id.to_string())
        .collect();
    assert_eq!(claimed_ids, ["z", "a-1"]);
    assert!(claimed
        .iter()
        .all(|c| c.fence.owner == "w" && c.fence.epoch == 1));
    let rest = store
        .instances_claim_batch(&names, "v", hour, 10, at_wake)
        .await?;
    let rest_ids: Vec<_> = rest.iter().map(|c| c.instance.key.id.to_string()).collect();
    assert_eq!(rest_ids, ["a-2", "a-3", "due"]);
    let other = [keiro_journal::WorkflowName::new("other")?];
    assert!(store
        .instances_claim_batch(&other, "u", hour, 10, at_wake)
        .await?
        .is_empty());
    Ok(())
}

pub async fn a_direct_start_is_leased_at_once_and_claims_only_what_a_worker_could(
    h: Harness,
) -> TestResult {
    use crate::contract::support::{SLACK, T0};
    let store = &*h.store;
    let request = |id: &str, input| start(&key("wf", id), input);
    let before = OffsetDateTime::now_utc();
    let fresh = store
        .instance_start_claimed(&request("new", json!(1)), "d", TTL, None)
        .await?;
    let after = OffsetDateTime::now_utc();
    assert!(fresh.created);
    let ClaimOutcome::Acquired(claim) = fresh.claim else {
        panic!("a created instance is leased to its caller");
    };
    assert_eq!(
        claim.fence,
        keiro_journal::Fence {
            owner: "d".into(),
            epoch: 1
        }
    );
    assert!(claim.journal.is_empty());
    let expires = claim.instance.lease_expires_at.ok_or("leased")?;
    assert!(
        expires >= before + TTL - SLACK && expires <= after + TTL + SLACK,
        "{expires}"
    );
    // Nobody else can take it while that lease lives.
    let again = store
        .instance_start_claimed(&request("new", json!(2)), "e", TTL, None)
        .await?;
    assert_eq!(
        (again.created, again.claim),
        (false, ClaimOutcome::LeaseHeld)
    );

    // An existing runnable row keeps its input and is claimed with its journal.
    let old = key("wf", "old");
    store.instance_start(&start(&old, json!(null))).await?;
    store
        .journal_append(&crate::contract::support::step(
            &old,
            "s",
            StepKind::Step,
            json!(1),
        ))
        .await?;
    let existing = store
        .instance_start_claimed(&request("old", json!("ignored")), "d", TTL, None)
        .await?;
    let ClaimOutcome::Acquired(claim) = existing.claim else {
        panic!("a runnable row is claimed");
    };
    assert!(!existing.created);
    assert_eq!(claim.instance.input, json!(null));
    assert_eq!(claim.journal.len(), 1);

    // A parked row whose wake has not come, and a closed one, are left alone.
    let parked = key("wf", "parked");
    store.instance_start(&start(&parked, json!(null))).await?;
    let park = Park {
        key: parked.clone(),
        generation: 0,
        fence: None,
        awaited: vec!["awk:x".into()],
        wake_after: Some(T0 + time::Duration::hours(1)),
    };
    store.instance_park(&park).await?;
    let done = key("wf", "done");
    store.instance_start(&start(&done, json!(null))).await?;
    store.instance_cancel(&done, false).await?;
    for id in ["parked", "done"] {
        let left = store
            .instance_start_claimed(&request(id, json!(null)), "d", TTL, None)
            .await?;
        assert_eq!(
            (left.created, left.claim),
            (false, ClaimOutcome::Unavailable),
            "{id}"
        );
    }
    let row = store.instance_get(&parked).await?.ok_or("missing")?;
    assert_eq!((row.status, row.lease_owner), (Status::Suspended, None));
    // Its wake due, the parked row is claimed.
    let due = store
        .instance_start_claimed(
            &request("parked", json!(null)),
            "d",
            TTL,
            Some(T0 + time::Duration::hours(1)),
        )
        .await?;
    assert!(matches!(due.claim, ClaimOutcome::Acquired(_)));
    Ok(())
}
