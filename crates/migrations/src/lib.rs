//! The SQL that makes a PostgreSQL schema a keiro store, as `&'static str` constants:
//! the numbered migrations and the function files, embedded from this crate's own folders so
//! that the store (`keiro-postgres`) builds from its published package.
//!
//! - `numbered/`: [`MIGRATIONS`], the tables, indexes and data changes, applied once each in
//!   order and never edited once shipped (a later file changes what an earlier one did).
//! - `functions/`: [`FUNCTION_FILES`], the functions and the triggers that call them, one group
//!   per file, each function in its current form only; a file is applied again whenever it
//!   changes. `functions/README.md` says which file holds what and the rules every function
//!   follows.
//!
//! This crate holds the files only: `keiro-postgres` runs them (its `PgStore::migrate`), records
//! their checksums, and names the revision of the function files it was built with, so it
//! depends on one exact version of this crate.
//!
//! ```
//! let newest = keiro_migrations::MIGRATIONS.last().expect("at least one migration");
//! assert_eq!(newest.version, keiro_migrations::MIGRATIONS.len() as i32);
//! assert!(keiro_migrations::FUNCTION_FILES
//!     .iter()
//!     .any(|file| file.name == "journal" && file.sql.contains("CREATE OR REPLACE FUNCTION")));
//! ```

/// One numbered migration file of `numbered/`: `0001_init.sql` is version 1, named `init`.
///
/// ```
/// let init = &keiro_migrations::MIGRATIONS[0];
/// assert_eq!((init.version, init.name), (1, "init"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Migration {
    /// The file's number; numbers are never reused or renumbered.
    pub version: i32,
    /// The file's name without its number and extension.
    pub name: &'static str,
    /// The file's statements.
    pub sql: &'static str,
    /// The SHA-256 (hex) of the form this file shipped in, when it was rewritten since (the
    /// rewrite that moved every function out of 0001-0016): schemas migrated by a build that
    /// embedded that form recorded its checksum.
    pub shipped: Option<&'static str>,
}

/// Every migration, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../numbered/0001_init.sql"),
        shipped: Some("1c45e716cf1cc11a8a39ec6bc4170b7e0e2b5efc1bf3090822435ee88906e278"),
    },
    Migration {
        version: 2,
        name: "wake_sources",
        sql: include_str!("../numbered/0002_wake_sources.sql"),
        shipped: Some("01e6d7cdd8eaaf3b38439739539deb48380fbf2bdf8d3d1b1d364fa672ae2726"),
    },
    Migration {
        version: 3,
        name: "claim_batch",
        sql: include_str!("../numbered/0003_claim_batch.sql"),
        shipped: Some("ea19e228f02bb337b0dc27d55891b88b39b65e9e2e9b60b8dad85f34209a3a5f"),
    },
    Migration {
        version: 4,
        name: "hot_path",
        sql: include_str!("../numbered/0004_hot_path.sql"),
        shipped: Some("1c2d79434f3b18336039df3d9e5ce14ce16ef2f0445827e709dc1d99aa7c8d83"),
    },
    Migration {
        version: 5,
        name: "remote_steps",
        sql: include_str!("../numbered/0005_remote_steps.sql"),
        shipped: Some("dd50f45abbd9c48cf6a61b1d611b3a14f65c321e92eb016a7d01cddf22619e69"),
    },
    Migration {
        version: 6,
        name: "claim_order",
        sql: include_str!("../numbered/0006_claim_order.sql"),
        shipped: Some("3bbdb2368dd148bff4c43db873e17ad5b61ba7eb4da2c675814ac35c34279f21"),
    },
    Migration {
        version: 7,
        name: "remote_hot_path",
        sql: include_str!("../numbered/0007_remote_hot_path.sql"),
        shipped: Some("e7ef7f3c1eea60312ec5026e23177b26e78146e99cf5a3bc6794228b1f8edda2"),
    },
    Migration {
        version: 8,
        name: "remote_claim_attempts",
        sql: include_str!("../numbered/0008_remote_claim_attempts.sql"),
        shipped: Some("2e2363983fc8eae87298ae207960e7d5f62fb63739ba80e2ff203c5dd7c7edca"),
    },
    Migration {
        version: 9,
        name: "function_search_path",
        sql: include_str!("../numbered/0009_function_search_path.sql"),
        shipped: Some("280eb06c8de5cf19598287f38b0f02da3d7fde147a662a219e1521d68632b9a9"),
    },
    Migration {
        version: 10,
        name: "cancel_remote_tasks",
        sql: include_str!("../numbered/0010_cancel_remote_tasks.sql"),
        shipped: Some("712f6a2adc512326e76abda88409de2f9e39d8a5cf6b98b741981baa5760f56b"),
    },
    Migration {
        version: 11,
        name: "signal_ttl_and_children",
        sql: include_str!("../numbered/0011_signal_ttl_and_children.sql"),
        shipped: Some("b2b9b3cd267ccbe36dd52cb40be4a23fcb256415d155d1869f8f825f2919e224"),
    },
    Migration {
        version: 12,
        name: "settle_abandoned_awakeables",
        sql: include_str!("../numbered/0012_settle_abandoned_awakeables.sql"),
        shipped: Some("5748b6f70cfaacc5ae014a0af02d8716ea092a01511bc69dca4af5e397e5f690"),
    },
    Migration {
        version: 13,
        name: "requeue_unhandled_failures",
        sql: include_str!("../numbered/0013_requeue_unhandled_failures.sql"),
        shipped: Some("f8eb79e4e4ce9eddc1c74d447cb2e5022dbf1583d087092da044c0e8bacf7b9f"),
    },
    Migration {
        version: 14,
        name: "settle_leftovers_of_completed_runs",
        sql: include_str!("../numbered/0014_settle_leftovers_of_completed_runs.sql"),
        shipped: Some("d76e7d5e16af40cfe7cf418f5cc00c2836d501599f2f3e241eaf7a7743f96706"),
    },
    Migration {
        version: 15,
        name: "list_and_retention_indexes",
        sql: include_str!("../numbered/0015_list_and_retention_indexes.sql"),
        shipped: None,
    },
    Migration {
        version: 16,
        name: "notify_terminal",
        sql: include_str!("../numbered/0016_notify_terminal.sql"),
        shipped: Some("f56649ec31ec8d5164b3a93cf14d985f7441c54e90c1e7d5e50deaad4eb09bd1"),
    },
    Migration {
        version: 17,
        name: "schedules",
        sql: include_str!("../numbered/0017_schedules.sql"),
        shipped: None,
    },
    Migration {
        version: 18,
        name: "schedule_backoff",
        sql: include_str!("../numbered/0018_schedule_backoff.sql"),
        shipped: None,
    },
    Migration {
        version: 19,
        name: "delivery_backlog",
        sql: include_str!("../numbered/0019_delivery_backlog.sql"),
        shipped: None,
    },
    Migration {
        version: 20,
        name: "queues",
        sql: include_str!("../numbered/0020_queues.sql"),
        shipped: None,
    },
    Migration {
        version: 21,
        name: "hot_claims",
        sql: include_str!("../numbered/0021_hot_claims.sql"),
        shipped: None,
    },
    Migration {
        version: 22,
        name: "remote_queues",
        sql: include_str!("../numbered/0022_remote_queues.sql"),
        shipped: None,
    },
    Migration {
        version: 23,
        name: "events_streams",
        sql: include_str!("../numbered/0023_events_streams.sql"),
        shipped: None,
    },
    Migration {
        version: 24,
        name: "updates",
        sql: include_str!("../numbered/0024_updates.sql"),
        shipped: None,
    },
    Migration {
        version: 25,
        name: "versions",
        sql: include_str!("../numbered/0025_versions.sql"),
        shipped: None,
    },
    Migration {
        version: 26,
        name: "search_attributes",
        sql: include_str!("../numbered/0026_search_attributes.sql"),
        shipped: None,
    },
    Migration {
        version: 27,
        name: "free_queue_runs",
        sql: include_str!("../numbered/0027_free_queue_runs.sql"),
        shipped: None,
    },
    Migration {
        version: 28,
        name: "open_refusals",
        sql: include_str!("../numbered/0028_open_refusals.sql"),
        shipped: None,
    },
    Migration {
        version: 29,
        name: "journal_without_seq_index",
        sql: include_str!("../numbered/0029_journal_without_seq_index.sql"),
        shipped: None,
    },
    Migration {
        version: 30,
        name: "list_by_queue_key_posting_lists",
        sql: include_str!("../numbered/0030_list_by_queue_key_posting_lists.sql"),
        shipped: None,
    },
];

/// One function file of `functions/`: the definitions of one group of functions (and the
/// triggers that call them), every statement a `CREATE OR REPLACE`.
///
/// ```
/// let notify = &keiro_migrations::FUNCTION_FILES[0];
/// assert_eq!(notify.name, "notify");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionFile {
    /// The file's name without its extension (`journal` for `functions/journal.sql`).
    pub name: &'static str,
    /// The file's statements.
    pub sql: &'static str,
}

/// Every function file, in the order they are applied: a `LANGUAGE sql` function is checked
/// when it is created, so the functions it calls come from an earlier file (plpgsql bodies
/// are resolved when they run).
pub const FUNCTION_FILES: &[FunctionFile] = &[
    FunctionFile {
        name: "notify",
        sql: include_str!("../functions/notify.sql"),
    },
    FunctionFile {
        name: "journal",
        sql: include_str!("../functions/journal.sql"),
    },
    FunctionFile {
        name: "instance",
        sql: include_str!("../functions/instance.sql"),
    },
    FunctionFile {
        name: "lease",
        sql: include_str!("../functions/lease.sql"),
    },
    FunctionFile {
        name: "timer",
        sql: include_str!("../functions/timer.sql"),
    },
    FunctionFile {
        name: "signal",
        sql: include_str!("../functions/signal.sql"),
    },
    FunctionFile {
        name: "awakeable",
        sql: include_str!("../functions/awakeable.sql"),
    },
    FunctionFile {
        name: "child",
        sql: include_str!("../functions/child.sql"),
    },
    FunctionFile {
        name: "remote",
        sql: include_str!("../functions/remote.sql"),
    },
    FunctionFile {
        name: "queue",
        sql: include_str!("../functions/queue.sql"),
    },
    FunctionFile {
        name: "message",
        sql: include_str!("../functions/message.sql"),
    },
    FunctionFile {
        name: "update",
        sql: include_str!("../functions/update.sql"),
    },
    FunctionFile {
        name: "attribute",
        sql: include_str!("../functions/attribute.sql"),
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of `numbered/` is in [`MIGRATIONS`], under its number and name.
    #[test]
    fn every_numbered_file_is_listed_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/numbered");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("the numbered folder")
            .map(|entry| {
                entry
                    .expect("an entry")
                    .file_name()
                    .into_string()
                    .expect("utf-8")
            })
            .collect();
        files.sort_unstable();
        let listed: Vec<String> = MIGRATIONS
            .iter()
            .map(|m| format!("{:04}_{}.sql", m.version, m.name))
            .collect();
        assert_eq!(files, listed);
    }

    /// Every `.sql` file of `functions/` is in [`FUNCTION_FILES`], once.
    #[test]
    fn every_function_file_is_listed_once() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/functions");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("the functions folder")
            .map(|entry| {
                entry
                    .expect("an entry")
                    .file_name()
                    .into_string()
                    .expect("utf-8")
            })
            .filter_map(|name| name.strip_suffix(".sql").map(str::to_owned))
            .collect();
        files.sort_unstable();
        let mut listed: Vec<String> = FUNCTION_FILES.iter().map(|f| f.name.to_owned()).collect();
        listed.sort_unstable();
        assert_eq!(files, listed);
    }
}
