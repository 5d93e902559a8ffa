//! The chaos command's own connection to the store's database, beside the store: it creates
//! the witness table, reads progress, and after the run reads the instance rows, the journal
//! and the witnesses into the plain rows of [`invariants`](super::invariants), whose pure
//! checks then decide on either store alike.
//!
//! `pg.rs` asks in SQL on the chaos schema (reconnecting across PostgreSQL restarts),
//! `sqlite.rs` in SQL on the store's file (a connection of the chaos command's own).

mod pg;
mod sqlite;

use std::path::Path;
use std::time::Duration;

pub(crate) use self::pg::Pg;
use super::invariants::{InstanceRow, JournalRow, Rows, WitnessRow};
use crate::common::Result;

/// Steps journaled, and instances that reached a terminal status: the same SQL on both stores.
const PROGRESS: &str = "SELECT
    (SELECT count(*) FROM journal WHERE kind IN ('step', 'remote')),
    (SELECT count(*) FROM workflows WHERE status IN ('completed', 'failed', 'cancelled'))";

/// How long loading the rows may keep trying while the server is away.
const LOAD_WITHIN: Duration = Duration::from_secs(120);

/// The chaos command's connection to the database its store runs on.
pub(crate) enum Db {
    /// The PostgreSQL chaos schema (boxed: its configuration and client are large).
    Pg(Box<Pg>),
    /// The SQLite file.
    Sqlite(sqlite::Lite),
}

impl Db {
    /// A connection to the chaos schema (its `search_path`), opened by the first query.
    pub(crate) fn postgres(config: &tokio_postgres::Config) -> Self {
        Self::Pg(Box::new(Pg::new(config)))
    }

    /// A connection to the SQLite file at `path`, which the store has created.
    pub(crate) async fn sqlite(path: &Path) -> Result<Self> {
        Ok(Self::Sqlite(sqlite::Lite::open(path).await?))
    }

    /// Creates the witness table.
    pub(crate) async fn create_witness_table(&mut self) -> Result<()> {
        match self {
            Self::Pg(db) => db.create_witness_table().await,
            Self::Sqlite(db) => db.create_witness_table().await,
        }
    }

    /// Steps journaled and instances done, one try (a restart may fail it; the loop reads
    /// again later).
    pub(crate) async fn progress(&mut self) -> Result<(u64, u64)> {
        let (steps, done) = match self {
            Self::Pg(db) => db.progress().await?,
            Self::Sqlite(db) => db.progress().await?,
        };
        Ok((
            u64::try_from(steps).unwrap_or(0),
            u64::try_from(done).unwrap_or(0),
        ))
    }

    /// Reads the rows the checks need: the instances and journal rows of `workflows`, and
    /// every witness.
    pub(crate) async fn load(&mut self, workflows: &[&str]) -> Result<Rows> {
        match self {
            Self::Pg(db) => db.load(workflows).await,
            Self::Sqlite(db) => db.load(workflows).await,
        }
    }
}
