//! Whether the store's schema holds what this build needs: it exists, every migration this
//! build embeds is applied, and the function files it records are not of an older revision.
//!
//! A store on a schema that was never migrated, or that an older build migrated, would
//! otherwise fail its first call with whatever PostgreSQL finds missing ("function
//! keiro_instance_start(...) does not exist"), or, worse, run this build against an older
//! build's function bodies without any error. The check costs no round trip of an operation:
//!
//! - [`PgStore::connect`](crate::PgStore::connect) runs it on the connection it opens anyway
//!   (two catalog and bookkeeping reads) and remembers the answer;
//! - a store that found its schema lacking checks again before each operation, on the
//!   operation's own connection, until the schema is migrated (by this process's
//!   [`migrate`](crate::PgStore::migrate), which marks it ready, or by another process), and
//!   answers [`StoreError::SchemaNotMigrated`] meanwhile;
//! - an operation that fails because an object is missing (SQLSTATE 3F000, 42P01, 42703 or
//!   42883: the schema was dropped or is older than the store thought, or a store built with
//!   `connect_lazy` never checked) answers `SchemaNotMigrated` with the server's message, and
//!   the next operation checks again.
//!
//! A store whose role may not read `keiro_migrations` cannot tell, and goes on unchecked; one
//! that may not read `keiro_function_revisions` (granted before it existed) checks the
//! migrations alone. A schema a newer build migrated is ready: an older build keeps working
//! against a newer schema during a rolling deploy.

use std::sync::atomic::{AtomicU8, Ordering};

use deadpool_postgres::Object;
use keiro_journal::StoreError;
use tokio_postgres::types::Type;

use crate::migrate::{functions_revision, migrations_needed};

/// What a store knows of its schema.
#[derive(Debug, Default)]
pub(crate) struct SchemaCheck(AtomicU8);

/// Not checked (a lazy store), or the role may not read the bookkeeping: operations go on.
const UNKNOWN: u8 = 0;
/// Checked and found to hold what this build needs.
const READY: u8 = 1;
/// Checked and found lacking: every operation checks again first.
const LACKING: u8 = 2;

impl SchemaCheck {
    /// Whether an operation must check the schema before it runs.
    pub(crate) fn lacking(&self) -> bool {
        self.0.load(Ordering::Relaxed) == LACKING
    }

    /// Records what a check found.
    pub(crate) fn set(&self, found: &Readiness) {
        let state = match found {
            Readiness::Ready => READY,
            Readiness::Lacking(_) => LACKING,
            Readiness::Unknown => UNKNOWN,
        };
        self.0.store(state, Ordering::Relaxed);
    }

    /// The schema was migrated by this store.
    pub(crate) fn migrated(&self) {
        self.0.store(READY, Ordering::Relaxed);
    }

    /// An operation met a missing object: check again before the next one.
    pub(crate) fn suspect(&self) {
        self.0.store(LACKING, Ordering::Relaxed);
    }
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Everything this build needs is there (or a newer build's).
    Ready,
    /// What is missing, for [`StoreError::SchemaNotMigrated`]'s `problem`.
    Lacking(String),
    /// The role may not read the bookkeeping.
    Unknown,
}

impl Readiness {
    /// The operation's error when the schema is lacking.
    pub(crate) fn error(&self, operation: &'static str, schema: &str) -> Option<StoreError> {
        match self {
            Self::Lacking(problem) => Some(StoreError::SchemaNotMigrated {
                operation,
                schema: schema.to_owned(),
                problem: problem.clone(),
            }),
            Self::Ready | Self::Unknown => None,
        }
    }
}

/// From the catalogs, which every role may read: whether the schema and the two bookkeeping
/// tables exist, and whether the role may read them.
const CATALOG: &str = "SELECT n.oid IS NOT NULL, m.oid IS NOT NULL, \
         coalesce(has_table_privilege(m.oid, 'SELECT'), false), \
         coalesce(has_table_privilege(r.oid, 'SELECT'), false) \
     FROM (SELECT $1::text AS name) s \
     LEFT JOIN pg_namespace n ON n.nspname = s.name \
     LEFT JOIN pg_class m ON m.relnamespace = n.oid AND m.relname = 'keiro_migrations' \
     LEFT JOIN pg_class r ON r.relnamespace = n.oid AND r.relname = 'keiro_function_revisions'";
/// The applied migrations and the newest function-files revision, in the schema the
/// connection's `search_path` names (the store's).
const RECORDED: &str = "SELECT (SELECT coalesce(array_agg(version), '{}') FROM keiro_migrations), \
         (SELECT max(revision) FROM keiro_function_revisions)";
/// The same, for a role that may not read the revisions.
const RECORDED_MIGRATIONS: &str =
    "SELECT (SELECT coalesce(array_agg(version), '{}') FROM keiro_migrations), NULL::integer";

/// Checks `schema` on `client` (one of the store's connections): two round trips at most.
pub(crate) async fn check(
    client: &Object,
    schema: &str,
) -> Result<Readiness, tokio_postgres::Error> {
    let row = client
        .query_typed_one(CATALOG, &[(&schema, Type::TEXT)])
        .await?;
    let (exists, bookkept, migrations_readable, revisions_readable): (bool, bool, bool, bool) = (
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
    );
    if !exists {
        return Ok(Readiness::Lacking("does not exist".into()));
    }
    if !bookkept {
        return Ok(Readiness::Lacking(
            "was never migrated (it has no keiro_migrations table)".into(),
        ));
    }
    if !migrations_readable {
        return Ok(Readiness::Unknown);
    }
    let recorded = if revisions_readable {
        RECORDED
    } else {
        RECORDED_MIGRATIONS
    };
    let row = client.query_typed_one(recorded, &[]).await?;
    let applied: Vec<i32> = row.try_get(0)?;
    let revision: Option<i32> = row.try_get(1)?;
    Ok(judge(&applied, revision))
}

/// The verdict on what a schema records.
fn judge(applied: &[i32], revision: Option<i32>) -> Readiness {
    if let Some((version, name)) = migrations_needed().find(|(v, _)| !applied.contains(v)) {
        return Readiness::Lacking(format!(
            "lacks migration {version} ({name}), which this build needs"
        ));
    }
    let ours = functions_revision();
    match revision {
        // None: a build from before revisions were recorded, or a runner role that may not
        // read them; the migrations decide.
        Some(recorded) if recorded < ours => Readiness::Lacking(format!(
            "holds function files of revision {recorded}, older than this build's {ours}"
        )),
        _ => Readiness::Ready,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_is_ready_with_every_migration_and_a_revision_no_older_than_ours() {
        let all: Vec<i32> = migrations_needed().map(|(v, _)| v).collect();
        let ours = functions_revision();
        assert_eq!(judge(&all, Some(ours)), Readiness::Ready);
        assert_eq!(judge(&all, None), Readiness::Ready);
        // A newer build's schema: a migration this build does not know, newer files.
        let mut newer = all.clone();
        newer.push(9_999);
        assert_eq!(judge(&newer, Some(ours + 1)), Readiness::Ready);
        // An older build's: a migration or the files' revision behind.
        let last = *all.last().expect("migrations");
        let older: Vec<i32> = all.iter().copied().filter(|v| *v != last).collect();
        assert!(
            matches!(judge(&older, Some(ours)), Readiness::Lacking(p) if p.contains(&format!("migration {last}")))
        );
        assert!(
            matches!(judge(&all, Some(ours - 1)), Readiness::Lacking(p) if p.contains("revision"))
        );
        assert!(matches!(judge(&[], None), Readiness::Lacking(_)));
    }
}
