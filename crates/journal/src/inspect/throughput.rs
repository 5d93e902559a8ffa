//! Throughput: how many instances went terminal (completed, failed, cancelled) in each of the
//! last few time buckets, what the dashboard's overview charts draw. Buckets are aligned on the
//! Unix epoch (bucket `n` covers `[n * bucket, (n + 1) * bucket)`), the last one holds `until`
//! (partly elapsed), and the store counts by `completed_at` over one index range (the terminal
//! index retention reads too), so a read costs the rows of the window, however old the store.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::FilterError;
use crate::Status;

/// The most buckets one read returns: a day of minutes.
pub const THROUGHPUT_BUCKETS_MAX: u32 = 1440;

/// The longest bucket: a day.
pub const THROUGHPUT_BUCKET_MAX: Duration = Duration::from_secs(86_400);

/// Which buckets to count: `buckets` of `bucket` each, the last one holding `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThroughputRequest {
    /// One bucket's length: whole seconds, 1 s to [`THROUGHPUT_BUCKET_MAX`].
    pub bucket: Duration,
    /// How many buckets: 1 to [`THROUGHPUT_BUCKETS_MAX`].
    pub buckets: u32,
    /// The instant the last bucket holds; `None`: the store's clock (the database's, for
    /// Postgres).
    pub until: Option<OffsetDateTime>,
}

impl ThroughputRequest {
    /// The last hour by minute, up to now.
    pub fn last_hour() -> Self {
        Self {
            bucket: Duration::from_secs(60),
            buckets: 60,
            until: None,
        }
    }

    /// The bucket's length in whole seconds.
    pub fn bucket_secs(&self) -> i64 {
        i64::try_from(self.bucket.as_secs()).unwrap_or(i64::MAX)
    }

    /// Refuses a bucket that is not whole seconds between 1 s and a day, and a count of
    /// buckets out of `1..=THROUGHPUT_BUCKETS_MAX`.
    ///
    /// # Errors
    ///
    /// [`FilterError::InvalidValue`] naming `bucket` or `buckets`.
    pub fn validate(&self) -> Result<(), FilterError> {
        if self.bucket.subsec_nanos() != 0
            || self.bucket.is_zero()
            || self.bucket > THROUGHPUT_BUCKET_MAX
        {
            return Err(FilterError::invalid(
                "bucket",
                &format!("{:?}", self.bucket),
                "a bucket is whole seconds, 1 s to a day",
            ));
        }
        if self.buckets == 0 || self.buckets > THROUGHPUT_BUCKETS_MAX {
            return Err(FilterError::invalid(
                "buckets",
                &self.buckets.to_string(),
                format_args!("out of range 1..={THROUGHPUT_BUCKETS_MAX}"),
            ));
        }
        Ok(())
    }
}

/// One bucket's terminal instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalCount {
    /// Where the bucket starts.
    #[serde(with = "time::serde::rfc3339")]
    pub start: OffsetDateTime,
    /// Instances that completed in it.
    pub completed: u64,
    /// Instances that failed in it.
    pub failed: u64,
    /// Instances cancelled in it.
    pub cancelled: u64,
}

/// The answer: every bucket of the request, oldest first, empty ones included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Throughput {
    /// One bucket's length in seconds.
    pub bucket_secs: i64,
    /// The buckets, oldest first; the last holds the request's `until`.
    pub buckets: Vec<TerminalCount>,
}

impl Throughput {
    /// Lays the store's sparse counts (bucket number, status, count) out on every bucket of
    /// the window that ends with bucket number `last`; rows outside the window and non-terminal
    /// statuses are left out.
    pub fn from_counts(
        request: &ThroughputRequest,
        last: i64,
        counts: impl IntoIterator<Item = (i64, Status, u64)>,
    ) -> Self {
        let secs = request.bucket_secs().max(1);
        let first = last - i64::from(request.buckets) + 1;
        let mut buckets: Vec<TerminalCount> = (first..=last)
            .map(|n| TerminalCount {
                start: OffsetDateTime::from_unix_timestamp(n.saturating_mul(secs))
                    .unwrap_or(OffsetDateTime::UNIX_EPOCH),
                completed: 0,
                failed: 0,
                cancelled: 0,
            })
            .collect();
        for (n, status, count) in counts {
            let Some(bucket) = usize::try_from(n - first)
                .ok()
                .and_then(|i| buckets.get_mut(i))
            else {
                continue;
            };
            match status {
                Status::Completed => bucket.completed += count,
                Status::Failed => bucket.failed += count,
                Status::Cancelled => bucket.cancelled += count,
                _ => {}
            }
        }
        Self {
            bucket_secs: secs,
            buckets,
        }
    }
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    #[test]
    fn sparse_counts_fill_every_bucket_of_the_window() {
        let request = ThroughputRequest {
            buckets: 3,
            ..ThroughputRequest::last_hour()
        };
        // 2030-01-01 00:02 is minute 31_556_952 of the epoch.
        let last = datetime!(2030-01-01 0:02 UTC).unix_timestamp() / 60;
        let throughput = Throughput::from_counts(
            &request,
            last,
            [
                (last, Status::Completed, 4),
                (last, Status::Failed, 1),
                (last - 2, Status::Cancelled, 2),
                (last - 3, Status::Completed, 9),
                (last, Status::Running, 7),
            ],
        );
        assert_eq!(throughput.bucket_secs, 60);
        let rows: Vec<_> = throughput
            .buckets
            .iter()
            .map(|b| (b.start, b.completed, b.failed, b.cancelled))
            .collect();
        assert_eq!(
            rows,
            [
                (datetime!(2030-01-01 0:00 UTC), 0, 0, 2),
                (datetime!(2030-01-01 0:01 UTC), 0, 0, 0),
                (datetime!(2030-01-01 0:02 UTC), 4, 1, 0),
            ]
        );
    }

    #[test]
    fn buckets_out_of_bounds_are_refused() {
        let ok = ThroughputRequest::last_hour();
        assert_eq!(ok.validate(), Ok(()));
        for bad in [
            ThroughputRequest {
                bucket: Duration::ZERO,
                ..ok
            },
            ThroughputRequest {
                bucket: Duration::from_millis(1500),
                ..ok
            },
            ThroughputRequest {
                bucket: Duration::from_secs(86_401),
                ..ok
            },
            ThroughputRequest { buckets: 0, ..ok },
            ThroughputRequest {
                buckets: THROUGHPUT_BUCKETS_MAX + 1,
                ..ok
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(FilterError::InvalidValue { .. })),
                "{bad:?}"
            );
        }
    }
}
