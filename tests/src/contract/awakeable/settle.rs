//! Awakeables: created with their allocation step, settled once, delivered into the owner's
//! journal in the settling transaction, and nothing journaled for an owner that is gone.

#[allow(clippy::wildcard_imports)] // the shared tools, some of them per scenario
use crate::contract::support::*;
use crate::Harness;
use keiro_journal::{
    store::awakeable_step, Append, AppendOutcome, AwakeableOutcome, AwakeableStatus, Event,
    InstanceKey, Marker, Status, StepKind,
};
use serde_json::json;
use serde_json::Value;
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

pub async fn awakeables_settle_once_and_never_journal_into_a_terminal_owner(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let owner = started(store, "owner").await?;
    let id = Uuid::from_u128(1);
    let allocate = |step: &str, id: Uuid| {
        Append::external(
            owner.clone(),
            Event::StepRecorded {
                step: step.to_owned(),
                kind: StepKind::Awakeable,
                result: json!(id.to_string()),
            },
        )
    };
    assert_eq!(
        store.awakeable_create(&allocate("awkid:a", id), id).await?,
        AppendOutcome::Appended
    );
    let replayed = Uuid::from_u128(2);
    assert_eq!(
        store
            .awakeable_create(&allocate("awkid:a", replayed), replayed)
            .await?,
        AppendOutcome::AlreadyPresent(json!(id.to_string()))
    );
    assert_eq!(
        store.awakeable_complete(replayed, &json!(1)).await?,
        AwakeableOutcome::NotFound
    );
    // An id registered twice is refused before the second allocation step is journaled.
    assert!(store
        .awakeable_create(&allocate("awkid:b", id), id)
        .await
        .is_err());
    assert_eq!(store.awakeables_pending().await?, 1);

    park_on(store, &owner, &awakeable_step(id)).await?;
    assert_eq!(
        store.awakeable_complete(id, &json!("paid")).await?,
        AwakeableOutcome::Delivered
    );
    assert_eq!(status(store, &owner).await?, Status::Running);
    assert_eq!(
        store.awakeable_complete(id, &json!("again")).await?,
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Completed)
    );
    assert_eq!(
        store.awakeable_cancel(id).await?,
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Completed)
    );

    let orphaned = Uuid::from_u128(3);
    store
        .awakeable_create(&allocate("awkid:c", orphaned), orphaned)
        .await?;
    store.instance_cancel(&owner, false).await?;
    let before = journal_rows(store, &owner).await?;
    // The cancel settled it: nothing will await it any more.
    assert_eq!(
        store.awakeable_cancel(orphaned).await?,
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
    );
    assert_eq!(journal_rows(store, &owner).await?, before);
    assert_eq!(
        store.awakeable_complete(orphaned, &json!(1)).await?,
        AwakeableOutcome::AlreadySettled(AwakeableStatus::Cancelled)
    );
    assert_eq!(store.awakeables_pending().await?, 0);
    assert_eq!(
        before,
        [
            ("awkid:a".to_owned(), json!(id.to_string())),
            (awakeable_step(id), json!({"ok": "paid"})),
            ("awkid:c".to_owned(), json!(orphaned.to_string())),
            (Marker::Cancelled.step_name().to_owned(), Value::Null),
        ]
    );
    Ok(())
}
