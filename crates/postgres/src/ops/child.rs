//! `crates/migrations/functions/child.sql`: spawning a child in the parent's spawn-step transaction.
//! (Cancelling an instance with or without its live descendants is in `instance.sql`.)
//!
//! The delivery of a child's result is not here: it is part of every terminal transaction of
//! the child (a closing marker, the crash ceiling, divergence), in `keiro_child_deliver`, so a
//! parent is woken by the very commit that finishes its child.

use keiro_journal::store::ChildSpawn;
use keiro_journal::store::{Append, AppendOutcome, Result};

use tokio_postgres::types::ToSql;

use crate::db::Db;
use crate::ops::journal::{append_outcome, encoded_step, AppendArgs};

const SPAWN: &str = "spawning a child instance";

const CHILD_SPAWN: &str = "SELECT outcome, recorded, marker \
     FROM keiro_child_spawn($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";

pub(crate) async fn child_spawn(
    db: &Db,
    append: &Append,
    spawn: &ChildSpawn,
) -> Result<AppendOutcome> {
    let args = AppendArgs::new(append, encoded_step(append, SPAWN)?);
    let (child_name, child_id) = (spawn.child.name.as_str(), spawn.child.id.as_str());
    let mut params = args.params();
    params.extend([
        &child_name as &(dyn ToSql + Sync),
        &child_id,
        &spawn.input,
        &spawn.await_step,
    ]);
    let row = db.query_one(SPAWN, CHILD_SPAWN, &params).await?;
    append_outcome(&row, SPAWN, &append.key, append.fence.as_ref())
}
