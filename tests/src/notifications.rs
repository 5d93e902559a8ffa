//! What a store announces, read the same way on every store: the payloads a store's wake
//! notifications carry (`<name>/<id>` for an instance that became runnable, `timer` for a new
//! timer, `remote` for claimable remote tasks), so a contract scenario can check who is told
//! what.
//!
//! On Postgres it is a `LISTEN` connection of its own on the schema's wake channel; on SQLite
//! the rows of
//! the file's notification table (`keiro_notifications`, migration 0002), read with a
//! connection of its own, as another process's store would.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::Harness;

/// What a helper returns: `?` works on every error.
type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

/// The notifications of one store, from the moment [`Harness::notifications`] returned.
pub struct Notifications {
    source: Source,
}

enum Source {
    Postgres {
        _client: tokio_postgres::Client,
        received: mpsc::UnboundedReceiver<String>,
    },
    Sqlite {
        connection: rusqlite::Connection,
        after: i64,
    },
}

/// The notification rows after `after`, as Postgres payloads, and the last row's number.
/// A `closed` row has no Postgres wake payload (it goes to the result waiters) and is skipped.
fn sqlite_rows(connection: &rusqlite::Connection, after: i64) -> Result<(Vec<String>, i64)> {
    let mut statement = connection.prepare(
        "SELECT seq, kind, workflow_name, workflow_id FROM keiro_notifications \
         WHERE seq > ?1 ORDER BY seq",
    )?;
    let rows = statement
        .query_map([after], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, Option<String>>(3)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let last = rows.last().map_or(after, |row| row.0);
    let payloads = rows
        .into_iter()
        .filter_map(|(_, kind, name, id)| match (kind.as_str(), name, id) {
            ("wake", Some(name), Some(id)) => Some(format!("{name}/{id}")),
            ("timer", ..) => Some("timer".to_owned()),
            ("remote", ..) => Some("remote".to_owned()),
            _ => None,
        })
        .collect();
    Ok((payloads, last))
}

impl std::fmt::Debug for Notifications {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifications").finish_non_exhaustive()
    }
}

impl Harness {
    /// Starts reading this store's notifications: every one sent after this returns.
    pub async fn notifications(&self) -> Result<Notifications> {
        if let Some(dir) = &self.sqlite_dir {
            let connection = rusqlite::Connection::open_with_flags(
                dir.file(),
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )?;
            let after: i64 = connection.query_row(
                "SELECT coalesce(max(seq), 0) FROM keiro_notifications",
                [],
                |row| row.get(0),
            )?;
            return Ok(Notifications {
                source: Source::Sqlite { connection, after },
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
                Source::Postgres { received, .. } => tokio::time::timeout(quiet, received.recv())
                    .await
                    .ok()
                    .flatten()
                    .into_iter()
                    .collect(),
                Source::Sqlite { connection, after } => {
                    // Polled: the rows committed within `quiet` of the previous ones.
                    let deadline = tokio::time::Instant::now() + quiet;
                    loop {
                        let (payloads, last) = match sqlite_rows(connection, *after) {
                            Ok(read) => read,
                            Err(e) => panic!("cannot read the notification table: {e}"),
                        };
                        *after = last;
                        if !payloads.is_empty() || tokio::time::Instant::now() >= deadline {
                            break payloads;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            };
            if next.is_empty() {
                return got;
            }
            got.extend(next);
        }
    }
}
