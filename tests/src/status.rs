//! Looking up an instance's status, and waiting for one (or for any condition the test can
//! read at once): what tests that drive runs through a facade handle (a harness's, or one
//! they built on a store of their own) repeat otherwise.

use std::future::Future;
use std::time::Duration;

use keiro::{Keiro, Status};

use crate::TestResult;

/// How long [`until_status`] waits before it fails the test.
pub const UNTIL_STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// The pause between two looks of [`until_status`].
const UNTIL_STATUS_POLL: Duration = Duration::from_millis(20);

/// The status of `name/id`, or `None` when there is no such instance.
///
/// # Errors
///
/// The facade's, when the key is invalid or the store fails.
pub async fn status(keiro: &Keiro, name: &str, id: &str) -> Result<Option<Status>, keiro::Error> {
    Ok(keiro.instance((name, id)).await?.map(|row| row.status))
}

/// Waits until `name/id` has `status`, calling `pass` before each look: a resume pass when the
/// test drives the runs itself, `|| async { Ok(()) }` when a worker does. Fails after
/// [`UNTIL_STATUS_TIMEOUT`], naming the status it saw last.
///
/// # Errors
///
/// `pass`'s, the facade's, or the timeout.
pub async fn until_status<F, Fut>(
    keiro: &Keiro,
    name: &str,
    id: &str,
    status: Status,
    mut pass: F,
) -> TestResult
where
    F: FnMut() -> Fut,
    Fut: Future<Output = TestResult>,
{
    let deadline = tokio::time::Instant::now() + UNTIL_STATUS_TIMEOUT;
    loop {
        pass().await?;
        let seen = self::status(keiro, name, id).await?;
        if seen == Some(status) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{name}/{id} is {seen:?}, not {status}").into());
        }
        tokio::time::sleep(UNTIL_STATUS_POLL).await;
    }
}

/// Waits until `done` holds, looking every 5 ms; panics naming `what` after
/// [`UNTIL_STATUS_TIMEOUT`]. For conditions a test reads without the store (counters its
/// workflows or a counting store keep).
pub async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + UNTIL_STATUS_TIMEOUT;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "waited for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
