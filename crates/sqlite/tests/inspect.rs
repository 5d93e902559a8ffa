//! The operators' reads (`InspectStore`), called through the trait: every filter of the list
//! against `ListFilter::matches_row` as the oracle, keyset pages in both orders, the counts,
//! and one instance's waits.

mod common;

use std::time::Duration;

use common::{pinned, T0};
use keiro_journal::store::{StartRequest, TimerArm, TimerDue};
use keiro_journal::{
    Cursor, InspectStore, InstanceKey, ListFilter, ListOrder, ListRequest, Status, TimeRange,
    TimerKind, TimerState, WorkflowName,
};
use keiro_sqlite::SqliteStore;
use serde_json::Value;

fn k(name: &str, id: &str) -> InstanceKey {
    InstanceKey::parse(name, id).expect("a valid key")
}

async fn start(store: &SqliteStore, key: &InstanceKey, parent: Option<&InstanceKey>) {
    store
        .instance_start(&StartRequest {
            key: key.clone(),
            input: Value::Null,
            parent: parent.cloned(),
            priority: 0,
        })
        .await
        .expect("starts");
}

/// Inserts a remote task of `key` in `status` (with a claim when running), in group `grp`.
fn remote_task(path: &std::path::Path, key: &InstanceKey, step: &str, grp: &str, status: &str) {
    let conn = rusqlite::Connection::open(path).expect("opens");
    let running = status == "running";
    conn.execute(
        "INSERT INTO remote_tasks (step_id, workflow_name, workflow_id, generation, step, \
             journal_step, grp, input, status, max_attempts, backoff_initial_ms, \
             backoff_max_ms, backoff_jitter, redispatch_max, available_at, claim, \
             claim_expires_at, created_at, updated_at) \
         VALUES (?1, ?2, ?3, 0, ?4, ?4, ?5, 'null', ?6, 1, 1, 1, 0, 1, 0, ?7, ?8, 0, 0)",
        rusqlite::params![
            format!("{}/{}/{step}", key.name, key.id),
            key.name.as_str(),
            key.id.as_str(),
            step,
            grp,
            status,
            running.then_some("claim"),
            running.then_some(1_i64),
        ],
    )
    .expect("inserts a task");
}

/// Every page of `request` (limit 2) joined, checked against the oracle's order.
async fn all_pages(store: &dyn InspectStore, filter: &ListFilter, order: ListOrder) -> Vec<String> {
    let mut request = ListRequest {
        filter: filter.clone(),
        order,
        limit: 2,
        cursor: None,
    };
    let mut keys = Vec::new();
    for _ in 0..50 {
        let page = store.instances_list(&request).await.expect("lists");
        assert!(page.instances.len() <= 2, "{page:?}");
        keys.extend(page.instances.iter().map(|i| i.key.to_string()));
        match page.next_cursor {
            Some(cursor) => {
                // The cursor survives its text form, as a JSON API hands it out.
                let cursor = Cursor::parse(&cursor.encode()).expect("parses");
                request.cursor = Some(cursor);
            }
            None => return keys,
        }
    }
    panic!("the pages never ended: {keys:?}");
}

#[tokio::test]
async fn every_filter_selects_what_matches_row_selects_in_pages_of_both_orders() {
    let (dir, store) = pinned("inspect-filters");
    let parent = k("batch", "p-1");
    let keys = [
        k("wf", "ab-1"),
        k("wf", "ab-2"),
        k("wf", "ac-1"),
        k("other", "ab-3"),
        k("wf", "é-1"),
        k("wf", "e-1"),
        k("wf", "abc"),
    ];
    start(&store, &parent, None).await;
    for (n, key) in keys.iter().enumerate() {
        // Two share each instant, so the keyset's name and id decide between them.
        if n % 2 == 0 {
            store.advance_clock(Duration::from_secs(10));
        }
        let child_of = (n % 3 == 0).then_some(&parent);
        start(&store, key, child_of).await;
    }
    store.advance_clock(Duration::from_secs(10));
    store
        .instance_cancel(&keys[1], false)
        .await
        .expect("cancels");
    store.advance_clock(Duration::from_secs(10));
    store
        .instance_cancel(&keys[4], false)
        .await
        .expect("cancels");
    remote_task(&dir.file("keiro.db"), &keys[2], "print", "g", "failed");
    remote_task(&dir.file("keiro.db"), &keys[3], "print", "g", "completed");

    let mut rows = Vec::new();
    for key in keys.iter().chain([&parent]) {
        rows.push(store.instance_get(key).await.expect("reads").expect("row"));
    }
    let at = |secs: i64| Some(T0 + time::Duration::seconds(secs));
    let filters = [
        ListFilter::default(),
        ListFilter {
            name: Some(WorkflowName::new("wf").expect("valid")),
            ..ListFilter::default()
        },
        ListFilter {
            status: Some(Status::Cancelled),
            ..ListFilter::default()
        },
        ListFilter {
            created: TimeRange {
                since: at(20),
                until: at(40),
            },
            ..ListFilter::default()
        },
        ListFilter {
            updated: TimeRange {
                since: at(45),
                until: None,
            },
            ..ListFilter::default()
        },
        ListFilter {
            updated: TimeRange {
                since: None,
                until: at(30),
            },
            ..ListFilter::default()
        },
        ListFilter {
            finished: TimeRange {
                since: at(50),
                until: at(70),
            },
            ..ListFilter::default()
        },
        ListFilter {
            parent: Some(parent.clone()),
            ..ListFilter::default()
        },
        ListFilter {
            id_prefix: Some("ab".into()),
            ..ListFilter::default()
        },
        ListFilter {
            id_prefix: Some("é".into()),
            ..ListFilter::default()
        },
        ListFilter {
            name: Some(WorkflowName::new("wf").expect("valid")),
            id_prefix: Some("a".into()),
            parent: Some(parent.clone()),
            ..ListFilter::default()
        },
    ];
    for filter in &filters {
        let mut expected: Vec<_> = rows.iter().filter(|r| filter.matches_row(r)).collect();
        expected.sort_by(|a, b| (a.created_at, &a.key).cmp(&(b.created_at, &b.key)));
        let oldest: Vec<String> = expected.iter().map(|r| r.key.to_string()).collect();
        // Every filter but the first leaves some rows out and keeps some: none is vacuous.
        assert!(
            !oldest.is_empty() && (*filter == ListFilter::default() || oldest.len() < rows.len()),
            "{filter:?} selects {oldest:?}"
        );
        let newest: Vec<String> = oldest.iter().rev().cloned().collect();
        assert_eq!(
            all_pages(&store, filter, ListOrder::OldestFirst).await,
            oldest,
            "{filter:?}"
        );
        assert_eq!(
            all_pages(&store, filter, ListOrder::NewestFirst).await,
            newest,
            "{filter:?}"
        );
    }

    let failed = ListFilter {
        failed_remote: true,
        ..ListFilter::default()
    };
    assert_eq!(
        all_pages(&store, &failed, ListOrder::NewestFirst).await,
        [keys[2].to_string()],
        "only a task failed for good counts"
    );
}

#[tokio::test]
async fn a_full_last_page_has_no_next_cursor_and_a_probe_row_is_never_shown() {
    let (_dir, store) = pinned("inspect-probe");
    for id in ["a", "b", "c", "d"] {
        store.advance_clock(Duration::from_secs(1));
        start(&store, &k("wf", id), None).await;
    }
    let store: &dyn InspectStore = &store;
    let page = store
        .instances_list(&ListRequest {
            limit: 4,
            ..ListRequest::default()
        })
        .await
        .expect("lists");
    assert_eq!(page.instances.len(), 4);
    assert_eq!(page.next_cursor, None, "nothing after the fourth");
    let page = store
        .instances_list(&ListRequest {
            limit: 3,
            order: ListOrder::OldestFirst,
            ..ListRequest::default()
        })
        .await
        .expect("lists");
    let ids: Vec<&str> = page.instances.iter().map(|i| i.key.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(
        page.next_cursor.map(|c| c.key),
        Some(k("wf", "c")),
        "the cursor names the last row shown, not the probe"
    );
}

#[tokio::test]
async fn counts_group_instances_and_split_the_timer_and_remote_backlogs() {
    let (dir, store) = pinned("inspect-counts");
    for key in [k("wf", "1"), k("wf", "2"), k("alpha", "1"), k("wf", "3")] {
        start(&store, &key, None).await;
    }
    store
        .instance_cancel(&k("wf", "3"), false)
        .await
        .expect("cancels");
    for (step, secs) in [("sleep:a", 10), ("sleep:b", 20), ("sleep:c", 30)] {
        store
            .timer_arm(&TimerArm {
                key: k("wf", "1"),
                generation: 0,
                step: step.into(),
                due: TimerDue::At(T0 + time::Duration::seconds(secs)),
                kind: TimerKind::Sleep,
            })
            .await
            .expect("arms");
    }
    let path = dir.file("keiro.db");
    remote_task(&path, &k("wf", "1"), "a", "printers", "pending");
    remote_task(&path, &k("wf", "1"), "b", "printers", "running");
    remote_task(&path, &k("wf", "2"), "c", "printers", "pending");
    remote_task(&path, &k("wf", "2"), "d", "mailers", "running");
    remote_task(&path, &k("wf", "2"), "e", "idle", "completed");

    let store: &dyn InspectStore = &store;
    let counts = store
        .instances_counts(Some(T0 + time::Duration::seconds(20)))
        .await
        .expect("counts");
    let instances: Vec<(&str, Status, u64)> = counts
        .instances
        .iter()
        .map(|c| (c.name.as_str(), c.status, c.count))
        .collect();
    assert_eq!(
        instances,
        [
            ("alpha", Status::Running, 1),
            ("wf", Status::Cancelled, 1),
            ("wf", Status::Running, 2),
        ]
    );
    assert_eq!((counts.timers_due, counts.timers_future), (2, 1));
    let remote: Vec<(&str, u64, u64)> = counts
        .remote
        .iter()
        .map(|g| (g.group.as_str(), g.pending, g.running))
        .collect();
    assert_eq!(remote, [("mailers", 0, 1), ("printers", 2, 1)]);
    // The store's clock when no instant is given: pinned at T0, nothing is due yet.
    let counts = store.instances_counts(None).await.expect("counts");
    assert_eq!((counts.timers_due, counts.timers_future), (0, 3));
}

#[tokio::test]
async fn waits_show_each_kind_newest_first_bounded_with_the_signal_timeout() {
    let (dir, store) = pinned("inspect-waits");
    let key = k("wf", "w-1");
    start(&store, &key, None).await;
    for step in ["sleep:a", "sleep:b", "sleep:c"] {
        store.advance_clock(Duration::from_secs(1));
        store
            .timer_arm(&TimerArm {
                key: key.clone(),
                generation: 0,
                step: step.into(),
                due: TimerDue::After(Duration::from_secs(60)),
                kind: TimerKind::Sleep,
            })
            .await
            .expect("arms");
    }
    store.advance_clock(Duration::from_secs(1));
    store
        .signal_wait(&keiro_journal::store::SignalWait {
            key: key.clone(),
            generation: 0,
            step: "sig:go".into(),
            token: "tok-go".into(),
            fence: None,
        })
        .await
        .expect("waits");
    let timeout = store
        .timer_arm(&TimerArm {
            key: key.clone(),
            generation: 0,
            step: "sig:go".into(),
            due: TimerDue::After(Duration::from_secs(300)),
            kind: TimerKind::SignalTimeout {
                token: "tok-go".into(),
            },
        })
        .await
        .expect("arms");
    let conn = rusqlite::Connection::open(dir.file("keiro.db")).expect("opens");
    for (n, id) in [
        "00000000-0000-0000-0000-000000000001",
        "00000000-0000-0000-0000-000000000002",
    ]
    .iter()
    .enumerate()
    {
        conn.execute(
            "INSERT INTO awakeables (id, workflow_name, workflow_id, generation, created_at) \
             VALUES (?1, 'wf', 'w-1', 0, ?2)",
            rusqlite::params![id, i64::try_from(n).expect("small")],
        )
        .expect("inserts");
    }
    store
        .timers_fire_due(Some(T0 + time::Duration::seconds(61)), 1)
        .await
        .expect("fires");

    let inspect: &dyn InspectStore = &store;
    let waits = inspect.instance_waits(&key, 10).await.expect("reads");
    let steps: Vec<(&str, TimerState)> = waits
        .timers
        .iter()
        .map(|t| (t.step.as_str(), t.state))
        .collect();
    assert_eq!(
        steps,
        [
            ("sig:go", TimerState::Scheduled),
            ("sleep:c", TimerState::Scheduled),
            ("sleep:b", TimerState::Scheduled),
            ("sleep:a", TimerState::Fired),
        ]
    );
    assert_eq!(waits.timers[3].attempts, 1);
    assert!(waits.timers[3].fired_at.is_some());
    assert_eq!(
        waits.timers[0].kind,
        TimerKind::SignalTimeout {
            token: "tok-go".into()
        }
    );
    let ids: Vec<String> = waits.awakeables.iter().map(|a| a.id.to_string()).collect();
    assert_eq!(
        ids,
        [
            "00000000-0000-0000-0000-000000000002",
            "00000000-0000-0000-0000-000000000001"
        ]
    );
    assert_eq!(waits.signal_waits.len(), 1);
    assert_eq!(waits.signal_waits[0].token, "tok-go");
    assert_eq!(waits.signal_waits[0].timeout_at, Some(timeout));
    assert!(!waits.truncated);

    let bounded = inspect.instance_waits(&key, 2).await.expect("reads");
    assert_eq!(bounded.timers.len(), 2);
    assert_eq!(bounded.timers[0].step, "sig:go");
    assert_eq!(bounded.awakeables.len(), 2);
    assert!(bounded.truncated, "the timers had more");
    let unknown = inspect
        .instance_waits(&k("wf", "nobody"), 10)
        .await
        .expect("reads");
    assert_eq!(unknown, keiro_journal::Waits::default());
}
