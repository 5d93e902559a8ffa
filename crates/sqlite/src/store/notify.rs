//! [`Notifier`] for [`SqliteStore`]: subscriptions over the store's notifications (the
//! crate's `notify` module publishes them, from its own commits and, through its poller, from
//! other processes' on the same file).

use keiro_journal::InstanceKey;
use keiro_resume::{BroadcastWake, Notifier, WakeFilter, WakeSource};

use super::SqliteStore;

/// Push wake-ups from the store's commits and, within about
/// [`Config::notify_poll_interval`](crate::Config::notify_poll_interval), from the commits of
/// other stores (processes) on the same file.
///
/// [`WakeFilter::Instances`] wakes when an instance may have become runnable (a start, a
/// wake, a continue-as-new, a resurrection, a spawn), [`WakeFilter::Timers`] when a timer was
/// armed, [`WakeFilter::RemoteTasks`] when a remote task became claimable: what the Postgres
/// store's listener hears on its channel. A wait returns [`WakeReason::Reconnected`] when the
/// store's poller failed to read or fell behind, since notifications may have been missed:
/// poll now. Once the store (its last clone) is dropped, a subscription waits out its
/// fallback.
///
/// [`WakeReason::Reconnected`]: keiro_resume::WakeReason::Reconnected
///
/// ```
/// use std::time::Duration;
/// use keiro_journal::{InstanceKey, store::StartRequest};
/// use keiro_resume::{Notifier, WakeFilter, WakeReason};
/// use keiro_sqlite::{Config, SqliteStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("keiro-sqlite-doc-notify-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let store = SqliteStore::open(dir.join("app.db"), Config::default())?;
/// let mut wakes = store.subscribe(WakeFilter::Instances);
/// let key = InstanceKey::parse("greet", "greet-1")?;
/// let request = StartRequest { key, input: serde_json::json!("ada"), parent: None, priority: 0, queue: None, attributes: Default::default() };
/// store.instance_start(&request).await?;
/// assert_eq!(wakes.wait(Duration::from_secs(30)).await, WakeReason::Notified);
/// # drop(store);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
impl Notifier for SqliteStore {
    fn subscribe(&self, filter: WakeFilter) -> Box<dyn WakeSource> {
        Box::new(BroadcastWake::new(filter, self.inner.notify.receiver()))
    }

    /// Wakes when `key` reaches a terminal status (completed, failed, cancelled, however it
    /// got there) after this call, in this store or another on the same file, or when the
    /// poller failed or fell behind. A close notifies only the waiters of its instance.
    fn subscribe_closed(&self, key: &InstanceKey) -> Box<dyn WakeSource> {
        Box::new(self.inner.notify.closed(key))
    }

    /// Wakes when `key` sets an event, writes to or closes a stream, or reaches a terminal
    /// status after this call, in this store or another on the same file, or when the poller
    /// failed or fell behind. Only the readers of that instance are woken.
    fn subscribe_messages(&self, key: &InstanceKey) -> Box<dyn WakeSource> {
        Box::new(self.inner.notify.messages(key))
    }
}
