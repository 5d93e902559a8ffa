//! What a run records, and which runs a claim serving some versions takes: the batch claim,
//! the claim of one run, queue admission; a continue-as-new records the continuing version.

use keiro::queue::{QueueSpec, StartOptions};
use keiro_journal::{Append, Event, WorkflowName};
use keiro_lease::{ClaimOutcome, Versions};
use serde_json::json;

use super::{claim_serving, ids, TTL};
use crate::contract::support::{key, start, TestResult};
use crate::Harness;

pub async fn runs_record_the_version_of_the_store_that_started_them(h: Harness) -> TestResult {
    let v1 = h.versioned("v1").await;
    let (a, b) = (key("wf", "a"), key("wf", "b"));
    v1.store.instance_start(&start(&a, json!(1))).await?;
    h.store.instance_start(&start(&b, json!(2))).await?;
    // A second start of an existing run changes nothing, whoever sends it.
    h.store.instance_start(&start(&a, json!(3))).await?;
    let store = h.store.clone();
    let row = |k: &keiro_journal::InstanceKey| {
        let (store, k) = (store.clone(), k.clone());
        async move { store.instance_get(&k).await }
    };
    assert_eq!(
        row(&a).await?.expect("a").app_version.as_deref(),
        Some("v1")
    );
    assert_eq!(row(&b).await?.expect("b").app_version, None);
    // A start on a queue records it too.
    h.keiro
        .declare_queue(&QueueSpec::new("q")?.concurrency(1))
        .await?;
    v1.keiro
        .start_with("wf", "c", &json!(null), &StartOptions::on_queue("q"))
        .await?;
    let c = row(&key("wf", "c")).await?.expect("c");
    assert_eq!(c.app_version.as_deref(), Some("v1"));
    assert_eq!(v1.versions.app_version(), "v1");
    assert_eq!(h.versions.app_version(), "");
    Ok(())
}

pub async fn a_claim_takes_only_the_runs_of_the_versions_it_serves(h: Harness) -> TestResult {
    let (v1, v2) = (h.versioned("v1").await, h.versioned("v2").await);
    v1.store
        .instance_start(&start(&key("wf", "one"), json!(null)))
        .await?;
    v2.store
        .instance_start(&start(&key("wf", "two"), json!(null)))
        .await?;
    h.store
        .instance_start(&start(&key("wf", "old"), json!(null)))
        .await?;

    let v3 = claim_serving(&*h.store, &Versions::only(["v3"]), "w3").await?;
    assert!(v3.is_empty(), "nobody's runs are v3's");
    let got = claim_serving(&*h.store, &Versions::only(["v2"]), "w2").await?;
    assert_eq!(ids(&got), ["two"]);
    let got = claim_serving(&*h.store, &Versions::only([""]), "w0").await?;
    assert_eq!(ids(&got), ["old"], "\"\" serves the unversioned runs");
    let got = claim_serving(&*h.store, &Versions::Any, "any").await?;
    assert_eq!(ids(&got), ["one"], "any serves the rest");
    Ok(())
}

pub async fn a_claim_of_one_run_of_another_version_is_refused_and_changes_nothing(
    h: Harness,
) -> TestResult {
    let v1 = h.versioned("v1").await;
    let k = key("wf", "one");
    v1.store.instance_start(&start(&k, json!(null))).await?;
    let before = h.store.instance_get(&k).await?.expect("started");
    let refused = h
        .store
        .instance_claim_serving(&k, &Versions::only(["v2"]), "w2", TTL, None)
        .await?;
    assert!(!matches!(refused, ClaimOutcome::Acquired(_)), "{refused:?}");
    let after = h.store.instance_get(&k).await?.expect("started");
    assert_eq!(
        (after.lease_epoch, after.lease_owner),
        (before.lease_epoch, None)
    );
    let granted = h
        .store
        .instance_claim_serving(&k, &Versions::only(["v1", "v2"]), "w", TTL, None)
        .await?;
    assert!(matches!(granted, ClaimOutcome::Acquired(_)), "{granted:?}");
    Ok(())
}

pub async fn queue_admission_takes_only_the_runs_of_the_versions_it_serves(
    h: Harness,
) -> TestResult {
    let v1 = h.versioned("v1").await;
    h.keiro
        .declare_queue(&QueueSpec::new("q")?.concurrency(5))
        .await?;
    for id in ["a", "b"] {
        v1.keiro
            .start_with("wf", id, &json!(null), &StartOptions::on_queue("q"))
            .await?;
    }
    h.keiro
        .start_with("wf", "c", &json!(null), &StartOptions::on_queue("q"))
        .await?;
    let names = [WorkflowName::new("wf")?];
    let queues = ["q".to_owned()];
    let admit = |versions: Versions, owner: &'static str| {
        let (store, names, queues) = (h.store.clone(), names.clone(), queues.clone());
        async move {
            store
                .claim_and_admit_serving(&names, &queues, &versions, owner, TTL, 10, None)
                .await
        }
    };
    let none = admit(Versions::only(["v2"]), "w2").await?;
    assert!(none.claimed.is_empty() && none.admitted.is_empty());
    let v1s = admit(Versions::only(["v1"]), "w1").await?;
    assert_eq!(ids(&v1s.admitted), ["a", "b"]);
    let rest = admit(Versions::Any, "any").await?;
    assert_eq!(ids(&rest.admitted), ["c"]);
    Ok(())
}

pub async fn continue_as_new_records_the_version_that_continued_the_run(h: Harness) -> TestResult {
    let (v1, v2) = (h.versioned("v1").await, h.versioned("v2").await);
    let k = key("wf", "loop");
    v1.store.instance_start(&start(&k, json!(0))).await?;
    let next = Append {
        generation: Some(0),
        ..Append::external(
            k.clone(),
            Event::WorkflowContinuedAsNew {
                next_generation: 1,
                input: json!(1),
            },
        )
    };
    v2.store.journal_append(&next).await?;
    let row = h.store.instance_get(&k).await?.expect("exists");
    assert_eq!(
        (row.generation, row.app_version.as_deref()),
        (1, Some("v2"))
    );
    Ok(())
}

pub async fn a_child_records_the_version_of_the_worker_that_spawned_it(h: Harness) -> TestResult {
    use keiro_journal::store::{child_result_step, ChildSpawn};
    use keiro_journal::StepKind;
    let (v1, v2) = (h.versioned("v1").await, h.versioned("v2").await);
    let (parent, child) = (key("wf", "parent"), key("wf", "child"));
    v1.store
        .instance_start(&start(&parent, json!(null)))
        .await?;
    // The parent was moved to v2, whose worker spawns the child.
    v2.versions.versions_move("v1", "v2").await?;
    let spawn = Append::external(
        parent.clone(),
        Event::StepRecorded {
            step: format!("child:{}/{}", child.name, child.id),
            kind: StepKind::Child,
            result: json!({"name": "wf", "id": "child"}),
        },
    );
    let request = ChildSpawn {
        child: child.clone(),
        input: json!(1),
        await_step: child_result_step(&child),
    };
    v2.store.child_spawn(&spawn, &request).await?;
    let row = h.store.instance_get(&child).await?.expect("spawned");
    assert_eq!(row.app_version.as_deref(), Some("v2"));
    Ok(())
}
