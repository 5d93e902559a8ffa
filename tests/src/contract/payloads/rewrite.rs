//! `payloads_read` finds the instance's input, output, journal, events and stream items with
//! their places; `payloads_rewrite` changes the places whose value is still the one read, in
//! one transaction, and leaves the others.

use keiro::store::{PayloadPlace, PayloadRewrite};
use keiro::{Ctx, WorkflowError};
use serde_json::json;

use crate::{FastWorker, Harness, TestResult};

pub async fn payloads_are_read_with_their_places_and_rewritten_only_where_unchanged(
    h: Harness,
) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("wf", |ctx: Ctx, n: u32| async move {
            let doubled: u32 = ctx
                .step("double", || async move { Ok::<_, std::io::Error>(n * 2) })
                .await?;
            ctx.set_event("seen", &doubled).await?;
            ctx.write_stream("log", &"one").await?;
            Ok::<_, WorkflowError>(doubled + 1)
        })
        .build()?;
    let key = crate::key("wf", "p-1");
    h.keiro.start("wf", "p-1", &21).await?;
    worker.drain().await?;

    let read = h.payloads.payloads_read(&key).await?;
    let at = |place: &PayloadPlace| {
        read.iter()
            .find(|p| &p.place == place)
            .map(|p| p.value.clone())
    };
    assert_eq!(at(&PayloadPlace::Input), Some(json!(21)));
    assert_eq!(at(&PayloadPlace::Output), Some(json!(43)));
    let event = PayloadPlace::Event { key: "seen".into() };
    assert_eq!(at(&event), Some(json!(42)));
    let item = PayloadPlace::StreamItem {
        key: "log".into(),
        offset: 0,
    };
    assert_eq!(at(&item), Some(json!("one")));
    let step = read
        .iter()
        .find(|p| matches!(p.place, PayloadPlace::Journal { .. }) && p.value == json!(42))
        .expect("the step's journal row")
        .place
        .clone();
    assert!(h
        .payloads
        .payloads_read(&crate::key("wf", "nobody"))
        .await?
        .is_empty());

    let applied = h
        .payloads
        .payloads_rewrite(
            &key,
            &[
                PayloadRewrite {
                    place: PayloadPlace::Input,
                    old: json!(21),
                    new: json!({"n": 21}),
                },
                PayloadRewrite {
                    place: step.clone(),
                    old: json!(42),
                    new: json!([42]),
                },
                // Not the value stored: left alone.
                PayloadRewrite {
                    place: event.clone(),
                    old: json!(7),
                    new: json!("changed"),
                },
                PayloadRewrite {
                    place: item.clone(),
                    old: json!("one"),
                    new: json!("uno"),
                },
            ],
        )
        .await?;
    assert_eq!(applied, 3);
    let again = h.payloads.payloads_read(&key).await?;
    let now = |place: &PayloadPlace| {
        again
            .iter()
            .find(|p| &p.place == place)
            .map(|p| p.value.clone())
    };
    assert_eq!(now(&PayloadPlace::Input), Some(json!({"n": 21})));
    assert_eq!(now(&step), Some(json!([42])));
    assert_eq!(now(&event), Some(json!(42)));
    assert_eq!(now(&item), Some(json!("uno")));
    Ok(())
}
