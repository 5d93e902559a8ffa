//! Making asynchronous commits durable before a run acts on them.
//!
//! The remote path commits its arms, claims, reports and parks with `synchronous_commit = off`
//! (migration 0005's header says why: notifying commits serialize on the WAL flush). Such a
//! commit is visible to every session at once, but written to disk only by the WAL writer,
//! within `wal_writer_delay` (or by the next synchronous commit, since WAL is flushed in
//! order). A value read from it is therefore safe to act on only after a flush:
//!
//! - a run woken by a report reads it in its claim, and the claim commits synchronously, which
//!   flushes the report first: safe;
//! - an arm that finds its task already settled hands the result straight to the body, which
//!   may act on it (send the email) before anything else commits: if PostgreSQL then crashed,
//!   the report would be gone, the handler would run again, and the journal could end with
//!   another value than the one acted on. So [`flushed`] runs first: one tiny transaction that
//!   commits synchronously, which flushes every WAL record before it, the report's included.

use keiro_journal::store::Result;

use crate::PgStore;

const FLUSH: &str = "flushing asynchronous commits";

// A commit waits for its flush only when its transaction wrote WAL before the commit record
// (a transaction id alone is not enough), so the barrier rewrites one row: the task whose
// settled result is about to be handed over. Under the session's default
// `synchronous_commit = on` its commit returns once WAL is on disk up to it, and so up to every
// earlier commit, the report's included. It runs only on this rare path.
const FLUSH_BARRIER: &str = "UPDATE remote_tasks SET step_id = step_id WHERE step_id = $1";

/// Returns once every commit visible to this session is flushed to disk, by a synchronous
/// rewrite of task `step_id`.
pub(crate) async fn flushed(store: &PgStore, step_id: &str) -> Result<()> {
    store.execute(FLUSH, FLUSH_BARRIER, &[&step_id]).await?;
    Ok(())
}
