//! Awakeables: created with their allocation step, settled once, delivered into the owner's
//! journal in the settling transaction, and nothing journaled for an owner that is gone.

use crate::contract::support::{claim, key, recorded, start_parked, status, TestResult};
use crate::Harness;
use keiro_journal::{
    store::awakeable_step, Append, AppendOutcome, AwakeableOutcome, AwakeableStatus, Event,
    InstanceKey, Marker, Status, StepKind,
};
use serde_json::json;
use uuid::Uuid;

/// The allocation append of awakeable `name`, whose value is `id`.
fn allocation(k: &InstanceKey, name: &str, id: Uuid) -> Append {
    Append::external(
        k.clone(),
        Event::StepRecorded {
            step: format!("awkid:{name}"),
            kind: StepKind::Awakeable,
            result: json!(id.to_string()),
        },
    )
}

pub async fn completion_delivers_once_and_repeats_are_idempotent(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("approver", "a-1");
    start_parked(store, &k).await?;
    let id = Uuid::new_v4();
    assert_eq!(
        store
            .awakeable_create(&allocation(&k, "approval", id), id)
            .await?,
        AppendOutcome::Appended
    );
    assert_eq!(store.awakeables_pending().await?, 1);

    // A replayed allocation keeps the first id and registers nothing.
    let other = Uuid::new_v4();
    assert_eq!(
        store
            .awakeable_create(&allocation(&k, "approval", other), other)
            .await?,
        AppendOutcome::AlreadyPresent(json!(id.to_string()))
    );
    assert_eq!(store.awakeables_pending().await?, 1);
    assert_eq!(
        store.awakeable_complete(other, &json!("x")).await?,
        AwakeableOutcome::NotFound
    );

    assert_eq!(
        store.awakeable_complete(id, &json!("ada")).await?,
        AwakeableOutcome::Delivered
    );
    assert_eq!(store.awakeables_pending().await?, 0);
    assert_eq!(
        recorded(store, &k, &awakeable_step(id)).await?,
        vec![json!({"ok": "ada"})]
    );
    assert_eq!(
        status(store, &k).await?,
        Status::Running,
        "the owner was woken"
    );

    for repeat in [
        store.awakeable_complete(id, &json!("bob")).await?,
        store.awakeable_cancel(id).await?,
    ] {
        assert_eq!(
            repeat,
            AwakeableOutcome::AlreadySettled(AwakeableStatus::Completed)
        );
    }
    assert_eq!(
        recorded(store, &k, &awakeable_step(id)).await?,
        vec![json!({"ok": "ada"})],
        "the first value stands"
    );
    assert_eq!(
        store.awakeable_complete(Uuid::new_v4(), &json!(1)).await?,
        AwakeableOutcome::NotFound
    );
    Ok(())
}

pub async fn cancellation_delivers_the_cancelled_envelope(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("approver", "a-2");
    start_parked(store, &k).await?;
    let id = Uuid::new_v4();
    store
        .awakeable_create(&allocation(&k, "approval", id), id)
        .await?;
    assert_eq!(
        store.awakeable_cancel(id).await?,
        AwakeableOutcome::Delivered
    );
    assert_eq!(
        recorded(store, &k, &awakeable_step(id)).await?,
        vec![json!({"cancelled": true})]
    );
    assert_eq!(
        store.awakeable_complete(id, &json!(1)).await?,
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
    );
    Ok(())
}

pub async fn racing_completions_settle_once(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("approver", "a-3");
    start_parked(store, &k).await?;
    for n in 0..20 {
        let id = Uuid::new_v4();
        store
            .awakeable_create(&allocation(&k, &format!("a{n}"), id), id)
            .await?;
        let payload = json!("a");
        let (a, b) = tokio::join!(
            store.awakeable_complete(id, &payload),
            store.awakeable_cancel(id)
        );
        let outcomes = [a?, b?];
        let delivered = outcomes
            .iter()
            .filter(|o| **o == AwakeableOutcome::Delivered)
            .count();
        assert_eq!(delivered, 1, "{outcomes:?}");
        assert_eq!(recorded(store, &k, &awakeable_step(id)).await?.len(), 1);
    }
    Ok(())
}

pub async fn a_terminal_owner_gets_nothing_journaled(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("approver", "a-4");
    start_parked(store, &k).await?;
    let id = Uuid::new_v4();
    store
        .awakeable_create(&allocation(&k, "approval", id), id)
        .await?;
    store
        .journal_append(&Append::external(
            k.clone(),
            Event::WorkflowCompleted { output: json!(7) },
        ))
        .await?;

    assert_eq!(
        store.awakeable_complete(id, &json!("late")).await?,
        AwakeableOutcome::OwnerGone
    );
    assert!(recorded(store, &k, &awakeable_step(id)).await?.is_empty());
    assert_eq!(status(store, &k).await?, Status::Completed);
    // Settled all the same: it is not pending, and a repeat says so.
    assert_eq!(store.awakeables_pending().await?, 0);
    assert_eq!(
        store.awakeable_cancel(id).await?,
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Completed)
    );
    Ok(())
}

pub async fn creation_is_fenced_and_refused_on_a_terminal_owner(h: Harness) -> TestResult {
    let store = &*h.store;
    let k = key("approver", "a-5");
    start_parked(store, &k).await?;
    let fence = claim(store, &k, "w1").await?;
    let stale = keiro_journal::Fence {
        epoch: fence.epoch - 1,
        ..fence.clone()
    };
    let id = Uuid::new_v4();
    let fenced = |fence| Append {
        fence: Some(fence),
        ..allocation(&k, "approval", id)
    };
    assert!(store
        .awakeable_create(&fenced(stale), id)
        .await
        .unwrap_err()
        .is_lease_lost());
    assert_eq!(
        store.awakeables_pending().await?,
        0,
        "a refused append registers nothing"
    );
    assert_eq!(
        store.awakeable_create(&fenced(fence), id).await?,
        AppendOutcome::Appended
    );

    store
        .journal_append(&Append::external(k.clone(), Event::WorkflowCancelled))
        .await?;
    let late = Uuid::new_v4();
    assert_eq!(
        store
            .awakeable_create(&allocation(&k, "second", late), late)
            .await?,
        AppendOutcome::RefusedTerminal(Marker::Cancelled)
    );
    assert_eq!(
        store.awakeable_complete(late, &json!(1)).await?,
        AwakeableOutcome::NotFound
    );
    Ok(())
}
