//! Claims, crash accounting, resurrection, discovery, renew and release (lease.sql and the
//! Postgres store's lease statements), with the assertions of the memory store's lease tests
//! (crates/memory/src/lease.rs), minus their notifications.

mod common;

use std::time::Duration;

use common::{append, claim, event_step as step, pinned, start, step_names, T0, TTL};
use keiro_journal::store::{AppendOutcome, Park};
use keiro_journal::{
    store::marker_name, store::StartRequest, Event, Fence, InstanceKey, Marker, Status,
};
use keiro_lease::{ClaimOutcome, Crash, CrashOutcome, ResurrectOutcome};
use keiro_sqlite::SqliteStore;
use serde_json::json;
use time::{Duration as Span, OffsetDateTime};

fn crash(max_attempts: i32) -> Crash {
    Crash {
        error: "boom".into(),
        retry_delay: Duration::from_secs(30),
        max_attempts,
    }
}

/// Claims past the lease of an earlier claim the test left behind.
async fn claim_at(store: &SqliteStore, key: &InstanceKey, at: OffsetDateTime) -> Fence {
    let later = Some(at + Span::hours(1));
    match store.instance_claim(key, "w", TTL, later).await.unwrap() {
        ClaimOutcome::Acquired(claim) => claim.fence,
        refused => panic!("refused: {refused:?}"),
    }
}

#[tokio::test]
async fn crashes_pace_the_next_claim_and_fail_the_run_at_the_ceiling() {
    let (_dir, store) = pinned("l-crash");
    let key = start(&store, "a").await;
    let fence = claim(&store, &key, "w").await;
    let outcome = store
        .instance_record_crash(&key, &fence, &crash(2))
        .await
        .unwrap();
    let gate = T0 + Span::seconds(30);
    assert_eq!(
        outcome,
        CrashOutcome::Retrying {
            attempts: 1,
            next_attempt_at: gate
        }
    );
    assert!(store
        .instance_record_crash(&key, &fence, &crash(2))
        .await
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(
        store.instance_claim(&key, "w", TTL, None).await.unwrap(),
        ClaimOutcome::Paced
    );
    assert!(matches!(
        store
            .instance_claim(&key, "w", TTL, Some(gate))
            .await
            .unwrap(),
        ClaimOutcome::Acquired(_)
    ));

    let fence = claim_at(&store, &key, gate).await;
    assert_eq!(
        store
            .instance_record_crash(&key, &fence, &crash(2))
            .await
            .unwrap(),
        CrashOutcome::Failed { attempts: 2 }
    );
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.attempts, row.lease_owner),
        (Status::Failed, 2, None)
    );
    let events: Vec<_> = store
        .journal_history(&key)
        .await
        .unwrap()
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
            .instance_record_crash(&key, &fence, &crash(2))
            .await
            .unwrap(),
        CrashOutcome::AlreadyTerminal
    );
}

#[tokio::test]
async fn resurrection_keeps_history_and_numbers_repeated_markers() {
    let (dir, store) = pinned("l-resurrect");
    let key = start(&store, "a").await;
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert_eq!(
        store.instance_resurrect(&missing).await.unwrap(),
        ResurrectOutcome::NotFound
    );
    assert_eq!(
        store.instance_resurrect(&key).await.unwrap(),
        ResurrectOutcome::NotFailed(Status::Running)
    );
    for _round in 0..2 {
        let fence = claim(&store, &key, "w").await;
        assert_eq!(
            store
                .instance_record_crash(&key, &fence, &crash(1))
                .await
                .unwrap(),
            CrashOutcome::Failed { attempts: 1 }
        );
        assert_eq!(
            store.instance_resurrect(&key).await.unwrap(),
            ResurrectOutcome::Resurrected
        );
    }
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.attempts, row.last_error, row.completed_at),
        (Status::Running, 0, None, None)
    );
    let names = step_names(&dir.file("keiro.db"), &key);
    let (failed, resurrected) = (marker_name::FAILED, marker_name::RESURRECTED);
    assert_eq!(
        names,
        [
            failed.to_owned(),
            resurrected.to_owned(),
            format!("{failed}/2"),
            format!("{resurrected}/2"),
        ]
    );
    assert_eq!(store.journal_load(&key, 0).await.unwrap().len(), 4);
}

#[tokio::test]
async fn refusals_are_classified_lease_first_and_claims_carry_the_current_generation() {
    let (_dir, store) = pinned("l-classify");
    let key = start(&store, "a").await;
    append(&store, &key, None, step("old", json!(1)), None)
        .await
        .unwrap();
    let rotate = Event::WorkflowContinuedAsNew {
        next_generation: 1,
        input: json!(2),
    };
    append(&store, &key, None, rotate, None).await.unwrap();
    append(&store, &key, None, step("new", json!(2)), None)
        .await
        .unwrap();

    let fence = claim(&store, &key, "w").await;
    store
        .instance_record_crash(&key, &fence, &crash(5))
        .await
        .unwrap();
    store
        .instance_claim(&key, "w", TTL, Some(T0 + Span::minutes(1)))
        .await
        .unwrap();
    // Leased and paced at once: the live lease is what the caller hears about.
    assert_eq!(
        store
            .instance_claim(&key, "v", TTL, Some(T0 + Span::seconds(20)))
            .await
            .unwrap(),
        ClaimOutcome::LeaseHeld
    );
    let ClaimOutcome::Acquired(claim) = store
        .instance_claim(&key, "v", TTL, Some(T0 + Span::hours(1)))
        .await
        .unwrap()
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

    append(&store, &key, None, Event::WorkflowCancelled, None)
        .await
        .unwrap();
    assert_eq!(
        store.instance_claim(&key, "v", TTL, None).await.unwrap(),
        ClaimOutcome::Unavailable
    );
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert_eq!(
        store
            .instance_claim(&missing, "v", TTL, None)
            .await
            .unwrap(),
        ClaimOutcome::Unavailable
    );
}

#[tokio::test]
async fn a_stale_holder_fails_and_the_new_holder_succeeds() {
    let (_dir, store) = pinned("l-fencing");
    let key = start(&store, "a").await;
    let old = claim(&store, &key, "old").await;
    store.advance_clock(Duration::from_secs(61));
    let new = claim(&store, &key, "new").await;
    assert!(store
        .instance_confirm(&key, &old, TTL)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert!(store
        .instance_lease_renew(&key, &old, TTL)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert!(!store.instance_release(&key, &old, true).await.unwrap());
    let old_park = Park {
        key: key.clone(),
        generation: 0,
        fence: Some(old.clone()),
        awaited: vec!["awk:x".into()],
        wake_after: None,
    };
    assert!(store
        .instance_park(&old_park)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert!(store
        .instance_record_crash(&key, &old, &crash(3))
        .await
        .unwrap_err()
        .is_lease_lost());
    assert!(append(&store, &key, None, step("s", json!(1)), Some(&old))
        .await
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(
        append(&store, &key, None, step("s", json!(2)), Some(&new))
            .await
            .unwrap(),
        AppendOutcome::Appended
    );
    assert_eq!(
        store.instance_confirm(&key, &new, TTL).await.unwrap(),
        Status::Running
    );
    store.instance_lease_renew(&key, &new, TTL).await.unwrap();
    let new_park = Park {
        fence: Some(new),
        ..old_park
    };
    assert_eq!(
        store.instance_park(&new_park).await.unwrap(),
        keiro_journal::store::ParkOutcome::Suspended
    );
}

#[tokio::test]
async fn discovery_is_exact_and_ordered() {
    let (_dir, store) = pinned("l-discovery");
    let start_with = |id: &str, priority: i32| StartRequest {
        key: InstanceKey::parse("wf", id).unwrap(),
        input: json!(null),
        parent: None,
        priority,
    };
    for (id, priority) in [("c", 0), ("b", 0), ("urgent", 5)] {
        store
            .instance_start(&start_with(id, priority))
            .await
            .unwrap();
    }
    store.pin_clock(Some(T0 - Span::minutes(1)));
    store.instance_start(&start_with("older", 0)).await.unwrap();
    store.pin_clock(Some(T0));
    let parked = start(&store, "parked").await;
    let due = start(&store, "due").await;
    let done = start(&store, "done").await;
    for (key, wake_after) in [(&parked, None), (&due, Some(T0 + Span::minutes(1)))] {
        let park = Park {
            key: key.clone(),
            generation: 0,
            fence: None,
            awaited: vec!["awk:x".into()],
            wake_after,
        };
        store.instance_park(&park).await.unwrap();
    }
    append(&store, &done, None, Event::WorkflowCancelled, None)
        .await
        .unwrap();

    let ids = |keys: Vec<InstanceKey>| keys.iter().map(|k| k.id.to_string()).collect::<Vec<_>>();
    assert_eq!(
        ids(store.instances_runnable(None, None).await.unwrap()),
        ["urgent", "older", "b", "c"]
    );
    let at_wake = Some(T0 + Span::minutes(1));
    assert_eq!(
        ids(store.instances_runnable(at_wake, None).await.unwrap()),
        ["urgent", "older", "b", "c", "due"]
    );
    assert_eq!(
        ids(store.instances_runnable(None, Some(2)).await.unwrap()),
        ["urgent", "older"]
    );
    assert!(store
        .instances_runnable(None, Some(-1))
        .await
        .unwrap()
        .is_empty());

    // The batch claim takes the same order, only for the names asked, and skips held rows.
    let names = [keiro_journal::WorkflowName::new("wf").unwrap()];
    let claimed = store
        .instances_claim_batch(&names, "w", TTL, 2, None)
        .await
        .unwrap();
    let claimed_ids: Vec<_> = claimed
        .iter()
        .map(|c| c.instance.key.id.to_string())
        .collect();
    assert_eq!(claimed_ids, ["urgent", "older"]);
    assert!(claimed
        .iter()
        .all(|c| c.fence.owner == "w" && c.fence.epoch == 1));
    let rest = store
        .instances_claim_batch(&names, "v", TTL, 10, at_wake)
        .await
        .unwrap();
    let rest_ids: Vec<_> = rest.iter().map(|c| c.instance.key.id.to_string()).collect();
    assert_eq!(rest_ids, ["b", "c", "due"]);
    let other = [keiro_journal::WorkflowName::new("other").unwrap()];
    assert!(store
        .instances_claim_batch(&other, "v", TTL, 10, at_wake)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn release_renew_and_force_release_are_fenced() {
    let (_dir, store) = pinned("l-release");
    let key = start(&store, "a").await;
    let fence = claim(&store, &key, "w").await;
    store
        .instance_record_crash(&key, &fence, &crash(5))
        .await
        .unwrap();
    let fence = claim_at(&store, &key, T0).await;

    store.pin_clock(Some(T0 + Span::minutes(10)));
    store.instance_lease_renew(&key, &fence, TTL).await.unwrap();
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(row.lease_expires_at, Some(T0 + Span::minutes(11)));

    let stale = Fence {
        epoch: fence.epoch - 1,
        ..fence.clone()
    };
    assert!(!store.instance_release(&key, &stale, true).await.unwrap());
    assert!(store
        .instance_lease_renew(&key, &stale, TTL)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert!(store.instance_release(&key, &fence, true).await.unwrap());
    let row = store.instance_get(&key).await.unwrap().unwrap();
    assert_eq!(
        (row.attempts, row.last_error, row.next_attempt_at),
        (0, None, None)
    );
    assert!(!store.instance_release(&key, &fence, true).await.unwrap());
    assert!(!store.instance_lease_force_release(&key).await.unwrap());

    let fence = claim(&store, &key, "w").await;
    append(
        &store,
        &key,
        None,
        Event::WorkflowCompleted { output: json!(1) },
        Some(&fence),
    )
    .await
    .unwrap();
    assert!(store
        .instance_lease_renew(&key, &fence, TTL)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(
        append(&store, &key, None, Event::WorkflowCancelled, None)
            .await
            .unwrap(),
        AppendOutcome::RefusedTerminal(Marker::Completed)
    );
    let missing = InstanceKey::parse("wf", "missing").unwrap();
    assert!(store
        .instance_lease_renew(&missing, &fence, TTL)
        .await
        .unwrap_err()
        .is_not_found());
    assert!(!store
        .instance_release(&missing, &fence, false)
        .await
        .unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_file_never_grant_one_lease_twice() {
    let dir = common::TempDir::new("l-two-stores");
    let path = dir.file("keiro.db");
    let stores = [
        SqliteStore::open(&path, keiro_sqlite::Config::default()).unwrap(),
        SqliteStore::open(&path, keiro_sqlite::Config::default()).unwrap(),
    ];
    for i in 0..20 {
        start(&stores[0], &format!("i{i}")).await;
    }
    let mut tasks = Vec::new();
    for (n, store) in stores.iter().enumerate() {
        for i in 0..20 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let key = common::key(&format!("i{i}"));
                store
                    .instance_claim(&key, &format!("w{n}"), TTL, None)
                    .await
            }));
        }
    }
    let mut granted = 0;
    for task in tasks {
        if let ClaimOutcome::Acquired(_) = task.await.unwrap().unwrap() {
            granted += 1;
        }
    }
    assert_eq!(granted, 20, "each instance claimed exactly once");
}

#[tokio::test]
async fn a_direct_start_is_leased_from_its_first_moment_and_claims_only_what_a_worker_could() {
    let (_dir, store) = pinned("l-start-claimed");
    let request = |id: &str, input| StartRequest {
        key: InstanceKey::parse("wf", id).unwrap(),
        input,
        parent: None,
        priority: 0,
    };
    let fresh = store
        .instance_start_claimed(&request("new", json!(1)), "d", TTL, None)
        .await
        .unwrap();
    assert!(fresh.created);
    let ClaimOutcome::Acquired(claim) = fresh.claim else {
        panic!("a created instance is leased to its caller");
    };
    assert_eq!(
        claim.fence,
        Fence {
            owner: "d".into(),
            epoch: 1
        }
    );
    assert!(claim.journal.is_empty());
    assert_eq!(claim.instance.lease_expires_at, Some(T0 + Span::minutes(1)));
    // Nobody else can take it while that lease lives.
    let again = store
        .instance_start_claimed(&request("new", json!(2)), "e", TTL, None)
        .await
        .unwrap();
    assert_eq!(
        (again.created, again.claim),
        (false, ClaimOutcome::LeaseHeld)
    );

    // An existing runnable row keeps its input and is claimed with its journal.
    let key = start(&store, "old").await;
    append(&store, &key, None, step("s", json!(1)), None)
        .await
        .unwrap();
    let existing = store
        .instance_start_claimed(&request("old", json!("ignored")), "d", TTL, None)
        .await
        .unwrap();
    let ClaimOutcome::Acquired(claim) = existing.claim else {
        panic!("a runnable row is claimed");
    };
    assert!(!existing.created);
    assert_eq!(claim.instance.input, json!(null));
    assert_eq!(claim.journal.len(), 1);

    // A parked row whose wake has not come, and a closed one, are left alone.
    let parked = start(&store, "parked").await;
    let park = Park {
        key: parked.clone(),
        generation: 0,
        fence: None,
        awaited: vec!["awk:x".into()],
        wake_after: Some(T0 + Span::hours(1)),
    };
    store.instance_park(&park).await.unwrap();
    let done = start(&store, "done").await;
    append(&store, &done, None, Event::WorkflowCancelled, None)
        .await
        .unwrap();
    for id in ["parked", "done"] {
        let left = store
            .instance_start_claimed(&request(id, json!(null)), "d", TTL, None)
            .await
            .unwrap();
        assert_eq!(
            (left.created, left.claim),
            (false, ClaimOutcome::Unavailable)
        );
    }
    let row = store.instance_get(&parked).await.unwrap().unwrap();
    assert_eq!((row.status, row.lease_owner), (Status::Suspended, None));
    // Its wake due, the parked row is claimed.
    let due = store
        .instance_start_claimed(
            &request("parked", json!(null)),
            "d",
            TTL,
            Some(T0 + Span::hours(1)),
        )
        .await
        .unwrap();
    assert!(matches!(due.claim, ClaimOutcome::Acquired(_)));
}
