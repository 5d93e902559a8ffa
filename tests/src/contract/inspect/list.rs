//! Operators' list and counts (issue 13, item 1), on both stores: every filter, keyset pages
//! that add up to the whole list in both orders, typed errors for bad requests, and the
//! overview counts (instances by workflow and status, timer backlog, remote tasks by group).

use std::time::Duration;

use crate::{FastWorker, Harness, TestResult};
use keiro::{
    operate::FilterError, operate::ListOrder, operate::ListRequest, remote::RemoteOptions,
    remote::TaskContext, remote::TaskError, Ctx, Error, InstanceKey, Status, Worker,
};
use time::OffsetDateTime;

fn worker(h: &Harness) -> Result<Worker, Error> {
    h.keiro
        .worker()
        .fast()
        .register("order", |ctx: Ctx, (): ()| async move {
            ctx.step("reserve", || async { Ok::<_, std::io::Error>(1) })
                .await?;
            ctx.await_step::<bool>("go").await
        })
        .register("batch", |ctx: Ctx, kid: String| async move {
            ctx.child::<_, bool>("order", &kid, &()).await
        })
        .register("label", |ctx: Ctx, (): ()| async move {
            ctx.remote::<_, String>("print", &"x", &RemoteOptions::default())
                .await
        })
        .register("nap", |ctx: Ctx, (): ()| async move {
            ctx.sleep("nap", Duration::from_secs(3600)).await
        })
        .build()
}

/// Runs a remote worker whose "print" handler fails for good until `label`/`id` has failed.
async fn fail_label(h: &Harness, worker: &Worker, id: &str) -> TestResult {
    let remote = h
        .keiro
        .remote_worker()?
        .handle("print", |_: String, _task: TaskContext| async move {
            Err::<String, _>(TaskError::fatal("printer on fire"))
        })
        .build();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(async move {
        remote
            .run_until(async {
                let _ = stopped.await;
            })
            .await;
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        worker.drain().await?;
        let row = h.keiro.instance(("label", id)).await?.expect("row");
        if row.status == Status::Failed {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{row:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(());
    running.await?;
    Ok(())
}

/// Every row of `request`'s list, page by page, and how many pages it took.
async fn all_pages(
    h: &Harness,
    mut request: ListRequest,
) -> Result<(Vec<InstanceKey>, usize), Error> {
    let mut keys = Vec::new();
    let mut pages = 0;
    loop {
        let page = h.keiro.list(&request).await?;
        pages += 1;
        keys.extend(page.instances.iter().map(|row| row.key.clone()));
        match page.next_cursor {
            Some(cursor) => request.cursor = Some(cursor),
            None => return Ok((keys, pages)),
        }
    }
}

async fn keys(h: &Harness, pairs: &[(&str, &str)]) -> Result<Vec<String>, Error> {
    let request = ListRequest::from_pairs(pairs.iter().copied())?;
    let (keys, _) = all_pages(h, request).await?;
    let mut keys: Vec<String> = keys.iter().map(ToString::to_string).collect();
    keys.sort();
    Ok(keys)
}

pub async fn list_filters_and_pages_add_up(h: Harness) -> TestResult {
    let worker = worker(&h)?;
    let started = OffsetDateTime::now_utc() - time::Duration::seconds(1);
    for id in ["o-1", "o-2", "o-3", "o-4", "o-5"] {
        h.keiro.start("order", id, &()).await?;
    }
    h.keiro.start("batch", "b-1", &"b-1-kid").await?;
    h.keiro.start("label", "l-1", &()).await?;
    h.keiro.start("nap", "n-1", &()).await?;
    worker.drain().await?;
    for id in ["o-1", "o-2"] {
        h.keiro.deliver(("order", id), "go", &true).await?;
    }
    worker.drain().await?;
    fail_label(&h, &worker, "l-1").await?;

    // Pages of 3 add up to the whole list, newest first, without repeats; oldest first is the
    // same list reversed.
    let everything = ListRequest {
        limit: 100,
        ..ListRequest::default()
    };
    let whole = h.keiro.list(&everything).await?;
    assert_eq!(whole.instances.len(), 9, "{whole:?}");
    assert!(whole.next_cursor.is_none());
    for pair in whole.instances.windows(2) {
        assert!(
            (pair[0].created_at, &pair[0].key) > (pair[1].created_at, &pair[1].key),
            "not newest first: {pair:?}"
        );
    }
    let whole: Vec<InstanceKey> = whole.instances.into_iter().map(|row| row.key).collect();
    let (paged, pages) = all_pages(
        &h,
        ListRequest {
            limit: 3,
            ..ListRequest::default()
        },
    )
    .await?;
    assert_eq!(paged, whole);
    assert_eq!(
        pages, 3,
        "9 rows in pages of 3: the third knows it is the last"
    );
    let (mut oldest, _) = all_pages(
        &h,
        ListRequest {
            limit: 2,
            order: ListOrder::OldestFirst,
            ..ListRequest::default()
        },
    )
    .await?;
    oldest.reverse();
    assert_eq!(oldest, whole);

    // Each filter.
    assert_eq!(
        keys(&h, &[("name", "order")]).await?,
        [
            "order/b-1-kid",
            "order/o-1",
            "order/o-2",
            "order/o-3",
            "order/o-4",
            "order/o-5"
        ]
    );
    assert_eq!(
        keys(&h, &[("status", "completed")]).await?,
        ["order/o-1", "order/o-2"]
    );
    assert_eq!(
        keys(
            &h,
            &[("name", "order"), ("status", "suspended"), ("limit", "1")]
        )
        .await?,
        ["order/b-1-kid", "order/o-3", "order/o-4", "order/o-5"]
    );
    assert_eq!(
        keys(&h, &[("parent", "batch/b-1")]).await?,
        ["order/b-1-kid"]
    );
    assert_eq!(
        keys(&h, &[("id_prefix", "o-")]).await?,
        [
            "order/o-1",
            "order/o-2",
            "order/o-3",
            "order/o-4",
            "order/o-5"
        ]
    );
    assert_eq!(keys(&h, &[("failed_remote", "true")]).await?, ["label/l-1"]);
    let since = started.format(&time::format_description::well_known::Rfc3339)?;
    assert_eq!(keys(&h, &[("created_since", &since)]).await?.len(), 9);
    assert_eq!(
        keys(&h, &[("created_until", &since)]).await?,
        Vec::<String>::new()
    );
    assert_eq!(
        keys(&h, &[("finished_since", &since)]).await?,
        ["label/l-1", "order/o-1", "order/o-2"]
    );
    assert_eq!(keys(&h, &[("updated_since", &since)]).await?.len(), 9);
    let later = (OffsetDateTime::now_utc() + time::Duration::hours(1))
        .format(&time::format_description::well_known::Rfc3339)?;
    assert_eq!(
        keys(&h, &[("updated_since", &later)]).await?,
        Vec::<String>::new()
    );

    // A listed row carries what an operator looks for.
    let failed = h
        .keiro
        .list(&ListRequest::from_pairs([("status", "failed")])?)
        .await?;
    let row = &failed.instances[0];
    assert!(row.completed_at.is_some());
    assert!(
        row.last_error
            .as_deref()
            .unwrap_or("")
            .contains("printer on fire"),
        "{row:?}"
    );
    let kid = h
        .keiro
        .list(&ListRequest::from_pairs([("parent", "batch/b-1")])?)
        .await?;
    assert_eq!(
        kid.instances[0].parent,
        Some(InstanceKey::parse("batch", "b-1")?)
    );
    // And it serializes for a JSON API, the page's cursor as an opaque string.
    let json = serde_json::to_value(
        h.keiro
            .list(&ListRequest {
                limit: 1,
                ..ListRequest::default()
            })
            .await?,
    )?;
    assert!(json["next_cursor"].is_string(), "{json}");
    assert!(json["instances"][0]["status"].is_string(), "{json}");
    Ok(())
}

pub async fn bad_list_requests_are_typed_errors(h: Harness) -> TestResult {
    h.keiro.start("order", "o-1", &()).await?;
    for pairs in [
        vec![("colour", "red")],
        vec![("status", "sleeping")],
        vec![("cursor", "not-a-cursor")],
        vec![("cursor", "76313a313a613a")],
        vec![("limit", "0")],
        vec![("limit", "100000")],
        vec![("created_since", "yesterday")],
        vec![("failed_remote", "maybe")],
        vec![("parent", "no-slash")],
        vec![("name", "bad name/")],
    ] {
        let refused = ListRequest::from_pairs(pairs.iter().copied());
        assert!(refused.is_err(), "{pairs:?} was accepted: {refused:?}");
    }
    assert!(matches!(
        ListRequest::from_pairs([("since", "1h")]),
        Err(FilterError::UnknownFilter { field }) if field == "since"
    ));
    assert!(matches!(
        ListRequest::from_pairs([("cursor", "zz")]),
        Err(FilterError::MalformedCursor { .. })
    ));
    // The facade checks a request built by hand too.
    for request in [
        ListRequest {
            limit: 0,
            ..ListRequest::default()
        },
        ListRequest {
            limit: keiro::operate::LIST_LIMIT_MAX + 1,
            ..ListRequest::default()
        },
    ] {
        assert!(matches!(
            h.keiro.list(&request).await,
            Err(Error::Filter(FilterError::Limit { .. }))
        ));
    }
    let mut empty_prefix = ListRequest::default();
    empty_prefix.filter.id_prefix = Some(String::new());
    assert!(matches!(
        h.keiro.list(&empty_prefix).await,
        Err(Error::Filter(FilterError::InvalidValue {
            field: "id_prefix",
            ..
        }))
    ));
    // Deserializing (what a JSON API does) refuses unknown fields and values.
    assert!(serde_json::from_str::<ListRequest>(r#"{"filter":{"colour":"red"}}"#).is_err());
    assert!(serde_json::from_str::<ListRequest>(r#"{"cursor":"00"}"#).is_err());
    Ok(())
}

pub async fn counts_show_statuses_timers_and_remote_backlog(h: Harness) -> TestResult {
    let worker = worker(&h)?;
    for id in ["o-1", "o-2", "o-3"] {
        h.keiro.start("order", id, &()).await?;
    }
    h.keiro.start("nap", "n-1", &()).await?;
    h.keiro.start("label", "l-1", &()).await?;
    worker.drain().await?;
    h.keiro.deliver(("order", "o-1"), "go", &true).await?;
    h.keiro.cancel(("order", "o-2")).await?;
    worker.drain().await?;
    let counts = h.keiro.counts().await?;
    let pairs: Vec<(String, Status, u64)> = counts
        .instances
        .iter()
        .map(|c| (c.name.to_string(), c.status, c.count))
        .collect();
    assert_eq!(
        pairs,
        [
            ("label".to_owned(), Status::Suspended, 1),
            ("nap".to_owned(), Status::Suspended, 1),
            ("order".to_owned(), Status::Cancelled, 1),
            ("order".to_owned(), Status::Completed, 1),
            ("order".to_owned(), Status::Suspended, 1),
        ]
    );
    assert_eq!((counts.timers_due, counts.timers_future), (0, 1));
    assert_eq!(counts.remote.len(), 1, "{counts:?}");
    assert_eq!(
        (
            counts.remote[0].group.as_str(),
            counts.remote[0].pending,
            counts.remote[0].running
        ),
        ("print", 1, 0)
    );
    let json = serde_json::to_value(&counts)?;
    assert_eq!(json["instances"][0]["status"], "suspended", "{json}");
    Ok(())
}
