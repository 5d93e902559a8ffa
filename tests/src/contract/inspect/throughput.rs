//! The terminal instances per time bucket (`Keiro::throughput`, `InspectStore::
//! instances_throughput`): completed, failed and cancelled runs counted in the epoch-aligned
//! bucket their `completed_at` falls in, against an oracle computed from the rows themselves;
//! live runs and runs outside the window left out; typed errors for bad requests.

use std::time::Duration;

use crate::{FastWorker, Harness, TestResult};
use keiro::{
    operate::FilterError, operate::Throughput, operate::ThroughputRequest, Ctx, Error, Status,
    WorkflowError,
};
use time::OffsetDateTime;

/// The oracle: `(bucket start, completed, failed, cancelled)` of every bucket of `request`,
/// from the instances' own `(status, completed_at)`.
fn expected(
    request: &ThroughputRequest,
    until: OffsetDateTime,
    ends: &[(Status, OffsetDateTime)],
) -> Vec<(OffsetDateTime, u64, u64, u64)> {
    let secs = i64::try_from(request.bucket.as_secs()).expect("a small bucket");
    let number = |at: OffsetDateTime| at.unix_timestamp().div_euclid(secs);
    let last = number(until);
    (last - i64::from(request.buckets) + 1..=last)
        .map(|n| {
            let of = |status: Status| {
                ends.iter()
                    .filter(|(s, at)| *s == status && number(*at) == n)
                    .count() as u64
            };
            (
                OffsetDateTime::from_unix_timestamp(n * secs).expect("in range"),
                of(Status::Completed),
                of(Status::Failed),
                of(Status::Cancelled),
            )
        })
        .collect()
}

fn rows(throughput: &Throughput) -> Vec<(OffsetDateTime, u64, u64, u64)> {
    throughput
        .buckets
        .iter()
        .map(|b| (b.start, b.completed, b.failed, b.cancelled))
        .collect()
}

pub async fn throughput_counts_terminal_instances_per_bucket_of_the_window(
    h: Harness,
) -> TestResult {
    let worker = h
        .keiro
        .worker()
        .fast()
        .register("ok", |_ctx: Ctx, (): ()| async move {
            Ok::<_, WorkflowError>(1)
        })
        .register("boom", |_ctx: Ctx, (): ()| async move {
            Err::<i64, _>(WorkflowError::app("declined"))
        })
        .register("wait", |ctx: Ctx, (): ()| async move {
            ctx.await_step::<i64>("go").await
        })
        .build()?;
    for id in ["o-1", "o-2", "o-3"] {
        h.keiro.start("ok", id, &()).await?;
    }
    h.keiro.start("boom", "b-1", &()).await?;
    h.keiro.start("wait", "w-1", &()).await?;
    h.keiro.start("wait", "w-2", &()).await?;
    worker.drain().await?;
    h.keiro.cancel(("wait", "w-2")).await?;
    worker.drain().await?;

    let mut ends = Vec::new();
    for (name, id) in [
        ("ok", "o-1"),
        ("ok", "o-2"),
        ("ok", "o-3"),
        ("boom", "b-1"),
        ("wait", "w-1"),
        ("wait", "w-2"),
    ] {
        let row = h.keiro.instance((name, id)).await?.expect("started");
        if let Some(at) = row.completed_at {
            ends.push((row.status, at));
        }
    }
    let statuses: Vec<Status> = ends.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        statuses,
        [
            Status::Completed,
            Status::Completed,
            Status::Completed,
            Status::Failed,
            Status::Cancelled
        ],
        "the live run has no completed_at"
    );
    let latest = ends.iter().map(|(_, at)| *at).max().expect("ends");
    let earliest = ends.iter().map(|(_, at)| *at).min().expect("ends");

    // By minute and by second, up to the last end: every bucket as the oracle has it.
    for request in [
        ThroughputRequest {
            until: Some(latest),
            ..ThroughputRequest::last_hour()
        },
        ThroughputRequest {
            bucket: Duration::from_secs(1),
            buckets: 5,
            until: Some(latest),
        },
        ThroughputRequest {
            bucket: Duration::from_secs(7),
            buckets: 3,
            until: Some(latest + time::Duration::seconds(9)),
        },
    ] {
        let throughput = h.keiro.throughput(&request).await?;
        assert_eq!(
            throughput.bucket_secs,
            i64::try_from(request.bucket.as_secs())?
        );
        assert_eq!(
            rows(&throughput),
            expected(&request, request.until.expect("set"), &ends),
            "{request:?}"
        );
    }

    // Now, by the store's clock: the last hour holds every end.
    let now = h.keiro.throughput(&ThroughputRequest::last_hour()).await?;
    assert_eq!(now.buckets.len(), 60);
    let total = |t: &Throughput| -> (u64, u64, u64) {
        t.buckets.iter().fold((0, 0, 0), |(c, f, x), b| {
            (c + b.completed, f + b.failed, x + b.cancelled)
        })
    };
    assert_eq!(total(&now), (3, 1, 1));

    // A window that ends before the first end, or starts after the last, counts nothing.
    for until in [
        earliest - time::Duration::minutes(1) - time::Duration::seconds(1),
        latest + time::Duration::hours(2),
    ] {
        let request = ThroughputRequest {
            until: Some(until),
            ..ThroughputRequest::last_hour()
        };
        let none = h.keiro.throughput(&request).await?;
        assert_eq!(total(&none), (0, 0, 0), "{until}");
        assert_eq!(none.buckets.len(), 60);
    }
    Ok(())
}

pub async fn bad_throughput_requests_are_typed_errors(h: Harness) -> TestResult {
    let ok = ThroughputRequest::last_hour();
    for (request, field) in [
        (
            ThroughputRequest {
                bucket: Duration::ZERO,
                ..ok
            },
            "bucket",
        ),
        (
            ThroughputRequest {
                bucket: Duration::from_millis(2500),
                ..ok
            },
            "bucket",
        ),
        (ThroughputRequest { buckets: 0, ..ok }, "buckets"),
        (
            ThroughputRequest {
                buckets: keiro::operate::THROUGHPUT_BUCKETS_MAX + 1,
                ..ok
            },
            "buckets",
        ),
    ] {
        match h.keiro.throughput(&request).await {
            Err(Error::Filter(FilterError::InvalidValue { field: named, .. })) => {
                assert_eq!(named, field, "{request:?}");
            }
            other => panic!("{request:?}: {other:?}"),
        }
    }
    Ok(())
}
