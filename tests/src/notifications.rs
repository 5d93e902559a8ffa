//! What a store announces, read the same way on every store: the payloads a store's wake
//! notifications carry (`<name>/<id>` for an instance that became runnable, `timer` for a new
//! timer, `remote` for claimable remote tasks), so a contract scenario can check who is told
//! what.
//!
//! On Postgres it is a `LISTEN` connection of its own on the schema's wake channel; on the
//! memory store a receiver of [`MemoryStore::notifications`](keiro_memory::MemoryStore::notifications),
//! each notification written as the payload Postgres would send for it.

use std::time::Duration;

use keiro_memory::Notification;
use tokio::sync::{broadcast, mpsc};
use tokio_postgres::{AsyncMessage, NoTls};

use crate::Harness;

/// What a helper returns: `?` works on every error.
type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

/// The notifications of one store, from the moment [`Harness::notifications`] returned.
pub struct Notifications {
    source: Source,
}

enum Source {
    Memory(broadcast::Receiver<Notification>),
    Postgres {
        _client: tokio_postgres::Client,
        received: mpsc::UnboundedReceiver<String>,
    },
}

impl std::fmt::Debug for Notifications {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifications").finish_non_exhaustive()
    }
}

impl Harness {
    /// Starts reading this store's notifications: every one sent after this returns.
    pub async fn notifications(&self) -> Result<Notifications> {
        if let Some(store) = &self.memory {
            return Ok(Notifications {
                source: Source::Memory(store.notifications()),
            });
        }
        let db = self
            .db
            .as_ref()
            .ok_or("a harness without a store to listen to")?;
        let store = db.store();
        let (client, mut connection) = store.connection_config().connect(NoTls).await?;
        let (sender, received) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(n))) => {
                        if sender.send(n.payload().to_owned()).is_err() {
                            break;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                }
            }
        });
        // The channel contains a dot, so it must be quoted.
        client
            .batch_execute(&format!("LISTEN \"{}\"", store.wake_channel()))
            .await?;
        Ok(Notifications {
            source: Source::Postgres {
                _client: client,
                received,
            },
        })
    }
}

impl Notifications {
    /// Every payload that arrives within `quiet` of the previous one (or of the call), in
    /// order.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<String> {
        let mut got = Vec::new();
        loop {
            let next = match &mut self.source {
                Source::Memory(receiver) => {
                    match tokio::time::timeout(quiet, receiver.recv()).await {
                        Ok(Ok(notification)) => Some(payload(&notification)),
                        Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
                        Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => None,
                    }
                }
                Source::Postgres { received, .. } => tokio::time::timeout(quiet, received.recv())
                    .await
                    .ok()
                    .flatten(),
            };
            match next {
                Some(payload) => got.push(payload),
                None => return got,
            }
        }
    }
}

/// The Postgres payload for a memory notification.
fn payload(notification: &Notification) -> String {
    match notification {
        Notification::Instance(key) => format!("{}/{}", key.name, key.id),
        Notification::TimerArmed => "timer".to_owned(),
        Notification::RemoteTasks => "remote".to_owned(),
        other => format!("{other:?}"),
    }
}
