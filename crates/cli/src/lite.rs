//! A connection of the CLI's own to a SQLite store's file, beside the store's writer: the
//! demo's ledger and the chaos run's witnesses and reads. Its calls run off the async runtime,
//! one at a time. Instants are microseconds since the Unix epoch on the host's wall clock, as
//! the store keeps them.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::Connection;
use serde_json::Value;
use time::OffsetDateTime;

use crate::common::{Result, ResultExt};

/// One connection, shared by the tasks of one command.
pub(crate) struct Lite {
    conn: Arc<Mutex<Connection>>,
}

impl Lite {
    /// Opens the file at `path` for `who` ("the demo", "the chaos witnesses") with
    /// `busy_timeout` and `synchronous = NORMAL`: in WAL mode a commit survives the process
    /// being killed, which is all the command's own rows must survive.
    pub(crate) async fn open(
        path: &Path,
        who: &'static str,
        busy_timeout: Duration,
    ) -> Result<Self> {
        let path = path.to_owned();
        let conn = tokio::task::spawn_blocking(move || open(&path, who, busy_timeout))
            .await
            .context(format!("opening the connection of {who}"))??;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `call` on the connection on a blocking thread; `what` names it in an error.
    pub(crate) async fn call<T, F>(&self, what: &str, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            call(&conn)
        })
        .await
        .context(what.to_owned())?
        .context(what.to_owned())
    }
}

/// Opens the file at `path` for `who`, as [`Lite::open`] does, on the calling thread.
pub(crate) fn open(path: &Path, who: &str, busy_timeout: Duration) -> Result<Connection> {
    let conn = Connection::open(path).context(format!("opening {} for {who}", path.display()))?;
    conn.busy_timeout(busy_timeout)
        .context(format!("setting the busy timeout of {who}"))?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .context(format!("setting the synchronous level of {who}"))?;
    Ok(conn)
}

/// The instant a stored number of microseconds names.
pub(crate) fn instant(micros: i64) -> rusqlite::Result<OffsetDateTime> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1000)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

/// A stored JSON text, parsed.
pub(crate) fn json(text: &str) -> rusqlite::Result<Value> {
    serde_json::from_str(text).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}
