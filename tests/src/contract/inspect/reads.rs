//! The operators' reads called at the store (`InspectStore`, with the instant the facade does
//! not pass): every filter of the list against `ListFilter::matches_row` as the oracle, keyset
//! pages in both orders, and the counts' split of the backlogs at a given instant.

use std::time::Duration;

use crate::contract::remote::{arm, claim_one, failure};
use crate::contract::support::{key, start, TestResult, T0};
use crate::Harness;
use keiro_journal::store::{RemoteArm, StartRequest, TimerArm, TimerDue};
use keiro_journal::{
    Cursor, InspectStore, InstanceKey, ListFilter, ListOrder, ListRequest, Status, TimeRange,
    TimerKind, WorkflowName,
};
use serde_json::{json, Value};

/// Every page of `filter` in `order`, two rows a page, the cursor passed on in its text form
/// (as a JSON API hands it out).
async fn all_pages(
    inspect: &dyn InspectStore,
    filter: &ListFilter,
    order: ListOrder,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let mut request = ListRequest {
        filter: filter.clone(),
        order,
        limit: 2,
        cursor: None,
    };
    let mut keys = Vec::new();
    for _ in 0..50 {
        let page = inspect.instances_list(&request).await?;
        assert!(page.instances.len() <= 2, "{page:?}");
        keys.extend(page.instances.iter().map(|i| i.key.to_string()));
        match page.next_cursor {
            Some(cursor) => request.cursor = Some(Cursor::parse(&cursor.encode())?),
            None => return Ok(keys),
        }
    }
    Err(format!("the pages never ended: {keys:?}").into())
}

pub async fn every_filter_selects_what_matches_row_selects_in_pages_of_both_orders(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    let parent = key("batch", "p-1");
    let keys = [
        key("wf", "ab-1"),
        key("wf", "ab-2"),
        key("wf", "ac-1"),
        key("other", "ab-3"),
        key("wf", "é-1"),
        key("wf", "e-1"),
        key("wf", "abc"),
    ];
    store.instance_start(&start(&parent, Value::Null)).await?;
    for (n, k) in keys.iter().enumerate() {
        let request = StartRequest {
            attributes: Default::default(),
            parent: (n % 3 == 0).then(|| parent.clone()),
            ..start(k, Value::Null)
        };
        store.instance_start(&request).await?;
    }
    store.instance_cancel(&keys[1], false).await?;
    store.instance_cancel(&keys[4], false).await?;
    // A remote task failed for good, and one completed.
    let failing = arm(&keys[2], "print", json!(null));
    store.remote_arm(&failing).await?;
    let claimed = claim_one(&*h.transport, "print").await?;
    h.transport
        .task_fail(
            &claimed.step_id,
            claimed.claim,
            &failure("out of paper", None, false),
            Duration::ZERO,
        )
        .await?;
    let completing = arm(&keys[3], "print", json!(null));
    store.remote_arm(&completing).await?;
    claim_one(&*h.transport, "print").await?;
    h.transport
        .task_complete(&completing.step_id, &json!("printed"))
        .await?;

    let mut rows = Vec::new();
    for k in keys.iter().chain([&parent]) {
        rows.push(store.instance_get(k).await?.ok_or("missing")?);
    }
    let row = |k: &InstanceKey| rows.iter().find(|r| r.key == *k).expect("read");
    let filters = [
        ListFilter::default(),
        ListFilter {
            name: Some(WorkflowName::new("wf")?),
            ..ListFilter::default()
        },
        ListFilter {
            status: Some(Status::Cancelled),
            ..ListFilter::default()
        },
        ListFilter {
            created: TimeRange {
                since: Some(row(&keys[2]).created_at),
                until: Some(row(&keys[5]).created_at),
            },
            ..ListFilter::default()
        },
        ListFilter {
            updated: TimeRange {
                since: Some(row(&keys[1]).updated_at),
                until: None,
            },
            ..ListFilter::default()
        },
        ListFilter {
            updated: TimeRange {
                since: None,
                until: Some(row(&keys[4]).updated_at),
            },
            ..ListFilter::default()
        },
        ListFilter {
            finished: TimeRange {
                since: row(&keys[1]).completed_at,
                until: row(&keys[4]).completed_at,
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
            name: Some(WorkflowName::new("wf")?),
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
            all_pages(&*h.inspect, filter, ListOrder::OldestFirst).await?,
            oldest,
            "{filter:?}"
        );
        assert_eq!(
            all_pages(&*h.inspect, filter, ListOrder::NewestFirst).await?,
            newest,
            "{filter:?}"
        );
    }

    let failed = ListFilter {
        failed_remote: true,
        ..ListFilter::default()
    };
    assert_eq!(
        all_pages(&*h.inspect, &failed, ListOrder::NewestFirst).await?,
        [keys[2].to_string()],
        "only a task failed for good counts"
    );
    Ok(())
}

pub async fn a_full_last_page_has_no_next_cursor_and_a_cursor_names_the_last_row_shown(
    h: Harness,
) -> TestResult {
    for id in ["a", "b", "c", "d"] {
        h.store
            .instance_start(&start(&key("wf", id), Value::Null))
            .await?;
    }
    let page = h
        .inspect
        .instances_list(&ListRequest {
            limit: 4,
            ..ListRequest::default()
        })
        .await?;
    assert_eq!(page.instances.len(), 4);
    assert_eq!(page.next_cursor, None, "nothing after the fourth");
    let page = h
        .inspect
        .instances_list(&ListRequest {
            limit: 3,
            order: ListOrder::OldestFirst,
            ..ListRequest::default()
        })
        .await?;
    let ids: Vec<&str> = page.instances.iter().map(|i| i.key.id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(
        page.next_cursor.map(|c| c.key),
        Some(key("wf", "c")),
        "the cursor names the last row shown, not the one read past it"
    );
    Ok(())
}

pub async fn counts_split_the_timer_backlog_at_the_given_instant_and_tasks_by_group(
    h: Harness,
) -> TestResult {
    let store = &*h.store;
    for k in [
        key("wf", "1"),
        key("wf", "2"),
        key("alpha", "1"),
        key("wf", "3"),
    ] {
        store.instance_start(&start(&k, Value::Null)).await?;
    }
    store.instance_cancel(&key("wf", "3"), false).await?;
    for (step, secs) in [("sleep:a", 10), ("sleep:b", 20), ("sleep:c", 30)] {
        store
            .timer_arm(&TimerArm {
                key: key("wf", "1"),
                generation: 0,
                step: step.into(),
                due: TimerDue::At(T0 + time::Duration::seconds(secs)),
                kind: TimerKind::Sleep,
            })
            .await?;
    }
    let in_group = |k: &InstanceKey, step: &str, group: &str| RemoteArm {
        group: group.into(),
        ..arm(k, step, Value::Null)
    };
    // Running: b of the printers, d of the mailers; pending: a and c; e completed.
    store
        .remote_arm(&in_group(&key("wf", "1"), "b", "printers"))
        .await?;
    claim_one(&*h.transport, "printers").await?;
    store
        .remote_arm(&in_group(&key("wf", "2"), "d", "mailers"))
        .await?;
    claim_one(&*h.transport, "mailers").await?;
    let done = in_group(&key("wf", "2"), "e", "idle");
    store.remote_arm(&done).await?;
    h.transport.task_complete(&done.step_id, &json!(1)).await?;
    store
        .remote_arm(&in_group(&key("wf", "1"), "a", "printers"))
        .await?;
    store
        .remote_arm(&in_group(&key("wf", "2"), "c", "printers"))
        .await?;

    let counts = h
        .inspect
        .instances_counts(Some(T0 + time::Duration::seconds(20)))
        .await?;
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
    // The store's clock when no instant is given: the timers are years ahead of it.
    let counts = h.inspect.instances_counts(None).await?;
    assert_eq!((counts.timers_due, counts.timers_future), (0, 3));
    Ok(())
}
