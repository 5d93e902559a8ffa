//! Runs per version, and the move of a version's live runs to another.

use keiro_journal::{Append, Event, Status};
use keiro_lease::versions::VersionCount;
use keiro_lease::Versions;
use serde_json::json;

use super::{claim_serving, ids};
use crate::contract::support::{key, start, TestResult};
use crate::Harness;

pub async fn a_move_hands_the_live_runs_of_a_version_to_another(h: Harness) -> TestResult {
    let v1 = h.versioned("v1").await;
    for id in ["a", "b", "done"] {
        v1.store
            .instance_start(&start(&key("wf", id), json!(null)))
            .await?;
    }
    h.store
        .instance_start(&start(&key("wf", "old"), json!(null)))
        .await?;
    let completed = Append {
        generation: Some(0),
        ..Append::external(
            key("wf", "done"),
            Event::WorkflowCompleted { output: json!(1) },
        )
    };
    h.store.journal_append(&completed).await?;

    let count = |v: &str, status, runs| VersionCount {
        app_version: v.into(),
        status,
        runs,
    };
    assert_eq!(
        h.versions.versions_count().await?,
        [
            count("", Status::Running, 1),
            count("v1", Status::Completed, 1),
            count("v1", Status::Running, 2),
        ]
    );
    let live = h.versions.version_live_runs("v1", 10).await?;
    assert_eq!(live, [key("wf", "a"), key("wf", "b")]);

    assert_eq!(h.versions.versions_move("v1", "v2").await?, 2);
    assert_eq!(
        h.versions.versions_move("v1", "v2").await?,
        0,
        "nothing left"
    );
    assert_eq!(
        h.versions.versions_count().await?,
        [
            count("", Status::Running, 1),
            count("v1", Status::Completed, 1),
            count("v2", Status::Running, 2),
        ],
        "a terminal run keeps the version that ran it"
    );
    assert!(claim_serving(&*h.store, &Versions::only(["v1"]), "w1")
        .await?
        .is_empty());
    let got = claim_serving(&*h.store, &Versions::only(["v2"]), "w2").await?;
    assert_eq!(ids(&got), ["a", "b"]);

    // The unversioned runs move under "".
    assert_eq!(h.versions.versions_move("", "v2").await?, 1);
    let row = h.store.instance_get(&key("wf", "old")).await?.expect("old");
    assert_eq!(row.app_version.as_deref(), Some("v2"));
    Ok(())
}
