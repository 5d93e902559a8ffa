//! Starting an instance: idempotent by key (a repeat changes nothing of the first start), and
//! only the start that creates the instance tells the resume loops.

use crate::contract::support::{payload, started, TestResult, QUIET};
use crate::Harness;
use keiro_journal::store::StartRequest;
use serde_json::{json, Value};

pub async fn start_is_idempotent_and_notifies_only_on_create(h: Harness) -> TestResult {
    let store = &*h.store;
    let mut wakes = h.notifications().await?;
    let key = started(store, "a").await?;
    let created_at = store.instance_get(&key).await?.ok_or("missing")?.created_at;
    let again = StartRequest {
        attributes: Default::default(),
        key: key.clone(),
        input: json!("other"),
        parent: None,
        priority: 9,
        queue: None,
    };
    let started = store.instance_start(&again).await?;
    assert!(!started.created);
    assert_eq!(
        (started.instance.input, started.instance.priority),
        (Value::Null, 0)
    );
    assert_eq!(started.instance.created_at, created_at);
    assert_eq!(
        (started.instance.status, started.instance.generation),
        (keiro_journal::Status::Running, 0)
    );
    assert_eq!(
        wakes.drain(QUIET).await,
        [payload(&key)],
        "only the start that created the instance notifies"
    );
    Ok(())
}

pub async fn many_starts_answer_in_order_and_a_started_child_names_its_parent(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let parent = started(store, "p").await?;
    let request = |id: &str, input: Value| StartRequest {
        attributes: Default::default(),
        key: crate::contract::support::key("wf", id),
        input,
        parent: Some(parent.clone()),
        priority: 1,
        queue: None,
    };
    // One call: a repeat of an id in it converges on the first, a refused input fails alone.
    let answers = store
        .instances_start(&[
            request("x", json!(1)),
            request("x", json!(2)),
            request("y", json!("\u{0}")),
            request("z", json!(3)),
        ])
        .await;
    let created: Vec<_> = answers
        .iter()
        .map(|a| {
            a.as_ref()
                .map(|s| s.created)
                .map_err(keiro_journal::StoreError::is_value_refused)
        })
        .collect();
    assert_eq!(created, [Ok(true), Ok(false), Err(true), Ok(true)]);
    let x = answers[1].as_ref().map_err(ToString::to_string)?;
    assert_eq!(x.instance.input, json!(1));
    assert_eq!(x.instance.parent.as_ref(), Some(&parent));
    let z = store
        .instance_get(&crate::contract::support::key("wf", "z"))
        .await?
        .ok_or("z was started")?;
    assert_eq!((z.parent, z.priority), (Some(parent.clone()), 1));
    assert!(store
        .instance_get(&crate::contract::support::key("wf", "y"))
        .await?
        .is_none());
    Ok(())
}
