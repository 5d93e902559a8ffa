//! Workers' heartbeat rows: written, refreshed, listed, judged live, removed.

use std::time::Duration;

use keiro_lease::versions::{live, unserved, VersionCount, WorkerBeat};
use keiro_lease::Versions;
use serde_json::json;
use time::OffsetDateTime;

use crate::contract::support::{key, start, TestResult};
use crate::Harness;

pub async fn heartbeats_are_written_refreshed_listed_and_removed(h: Harness) -> TestResult {
    let beat = WorkerBeat {
        worker_id: "w-1".into(),
        app_version: "v1".into(),
        serves: Versions::only(["v1", ""]),
        queues: vec!["q".into()],
    };
    h.versions.worker_beat(&beat).await?;
    let any = WorkerBeat {
        worker_id: "w-2".into(),
        app_version: String::new(),
        serves: Versions::Any,
        queues: Vec::new(),
    };
    h.versions.worker_beat(&any).await?;
    let rows = h.versions.workers_list().await?;
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (
            rows[0].worker_id.as_str(),
            rows[0].app_version.as_str(),
            &rows[0].serves,
            &rows[0].queues
        ),
        (
            "w-1",
            "v1",
            &Versions::only(["", "v1"]),
            &vec!["q".to_owned()]
        )
    );
    assert_eq!(
        (rows[1].app_version.as_str(), &rows[1].serves),
        ("", &Versions::Any)
    );
    let first_seen = rows[0].last_seen;

    tokio::time::sleep(Duration::from_millis(5)).await;
    h.versions
        .worker_beat(&WorkerBeat {
            serves: Versions::only(["v2"]),
            ..beat
        })
        .await?;
    let rows = h.versions.workers_list().await?;
    assert!(rows[0].last_seen > first_seen, "a beat refreshes last_seen");
    assert_eq!(rows[0].started_at, first_seen, "and keeps started_at");
    assert_eq!(rows[0].serves, Versions::only(["v2"]));

    let now = OffsetDateTime::now_utc();
    assert_eq!(live(&rows, now, Duration::from_secs(30)).len(), 2);
    assert!(live(
        &rows,
        now + Duration::from_secs(60),
        Duration::from_secs(30)
    )
    .is_empty());

    assert!(h.versions.worker_leave("w-2").await?);
    assert!(!h.versions.worker_leave("w-2").await?);
    let rows = h.versions.workers_list().await?;
    assert_eq!(rows.len(), 1);
    Ok(())
}

pub async fn runs_of_a_version_no_live_worker_serves_are_found(h: Harness) -> TestResult {
    let (v1, v2) = (h.versioned("v1").await, h.versioned("v2").await);
    v1.store
        .instance_start(&start(&key("wf", "a"), json!(null)))
        .await?;
    v2.store
        .instance_start(&start(&key("wf", "b"), json!(null)))
        .await?;
    h.versions
        .worker_beat(&WorkerBeat {
            worker_id: "w-2".into(),
            app_version: "v2".into(),
            serves: Versions::only(["v2"]),
            queues: Vec::new(),
        })
        .await?;
    let rows = h.versions.workers_list().await?;
    let counts = h.versions.versions_count().await?;
    let alive = live(&rows, OffsetDateTime::now_utc(), Duration::from_secs(30));
    assert_eq!(
        unserved(&counts, &alive),
        [VersionCount {
            app_version: "v1".into(),
            status: keiro_journal::Status::Running,
            runs: 1
        }]
    );
    Ok(())
}

/// A killed worker never deletes its own row: `workers_forget` deletes the rows not seen for
/// the window given, and keeps the rest.
pub async fn rows_of_workers_not_seen_for_a_while_are_forgotten(h: Harness) -> TestResult {
    let beat = |id: &str| WorkerBeat {
        worker_id: id.into(),
        app_version: String::new(),
        serves: Versions::Any,
        queues: Vec::new(),
    };
    h.versions.worker_beat(&beat("w-killed")).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.versions.worker_beat(&beat("w-alive")).await?;
    assert_eq!(
        h.versions.workers_forget(Duration::from_secs(3600)).await?,
        0,
        "both were seen within the hour"
    );
    assert_eq!(
        h.versions
            .workers_forget(Duration::from_millis(150))
            .await?,
        1
    );
    let rows = h.versions.workers_list().await?;
    let ids: Vec<&str> = rows.iter().map(|row| row.worker_id.as_str()).collect();
    assert_eq!(ids, ["w-alive"]);
    Ok(())
}
