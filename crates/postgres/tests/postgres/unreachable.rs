//! A database that cannot be reached is `Unavailable`, quickly, never a hang or a panic.

use std::time::{Duration, Instant};

use crate::common::{key, TestResult};
use keiro_journal::{JournalStore, StoreError};
use keiro_lease::LeaseStore;
use keiro_postgres::{Config, Error, PgStore};

fn nowhere() -> Config {
    Config {
        connect_timeout: Duration::from_secs(2),
        acquire_timeout: Duration::from_secs(2),
        // Port 1 on loopback: nothing listens, the connection is refused at once.
        ..Config::new("postgres://postgres@127.0.0.1:1/postgres")
    }
}

#[tokio::test]
async fn connecting_fails_as_unavailable() -> TestResult {
    let started = Instant::now();
    let err = PgStore::connect(nowhere())
        .await
        .expect_err("nothing listens on port 1");
    assert!(err.is_unavailable() && err.is_retryable(), "{err:?}");
    assert!(matches!(
        err,
        Error::Unavailable {
            operation: "connecting to the database",
            ..
        }
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
    Ok(())
}

#[tokio::test]
async fn store_operations_fail_as_unavailable_naming_the_operation() -> TestResult {
    let store = PgStore::connect_lazy(nowhere())?;
    let started = Instant::now();
    let err = store
        .instance_get(&key("order", "o-1"))
        .await
        .expect_err("unreachable");
    assert!(
        matches!(
            err,
            StoreError::Unavailable {
                operation: "reading an instance",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_retryable());
    let err = store
        .instances_runnable(None, None)
        .await
        .expect_err("unreachable");
    assert!(matches!(
        err,
        StoreError::Unavailable {
            operation: "discovering runnable instances",
            ..
        }
    ));
    assert!(started.elapsed() < Duration::from_secs(5));

    let err = store.migrate().await.expect_err("unreachable");
    assert!(err.is_unavailable(), "{err:?}");
    assert_eq!(store.round_trips(), 0, "nothing reached a server");
    Ok(())
}
