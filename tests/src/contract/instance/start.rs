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
        key: key.clone(),
        input: json!("other"),
        parent: None,
        priority: 9,
    };
    let started = store.instance_start(&again).await?;
    assert!(!started.created);
    assert_eq!(
        (started.instance.input, started.instance.priority),
        (Value::Null, 0)
    );
    assert_eq!(started.instance.created_at, created_at);
    assert_eq!(
        wakes.drain(QUIET).await,
        [payload(&key)],
        "only the start that created the instance notifies"
    );
    Ok(())
}
