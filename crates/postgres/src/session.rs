//! Giving back a pooled connection that a transaction step lent to the user's closure.
//!
//! Every other store operation runs keiro's own statements only, so a pooled connection keeps
//! the session keiro opened it with (`Config::session_settings`, sent as startup options). A
//! transaction step runs the user's statements on one, and those can change the session for
//! good: `SET` without `LOCAL` (`search_path`, `statement_timeout`, `synchronous_commit`,
//! `ROLE`), session advisory locks, temporary tables, `LISTEN`, cursors `WITH HOLD`, prepared
//! statements. Left in the pool, a `search_path` of `public` fails the next operation that gets
//! the connection, and a `statement_timeout` or a role changes what keiro's statements may do.
//!
//! So a step's connection goes back only through [`Lent::give_back`], which resets the session
//! in one round trip: everything `DISCARD ALL` undoes except `DEALLOCATE ALL` (the pool keeps
//! its prepared statements, which keiro's own operations reuse; the user's SQL-level `PREPARE`s
//! are deallocated by name), then keiro's pinned settings set again. A reset that fails, and a
//! step that never got to it (a panicking closure, a dropped future), close the connection
//! instead: the pool opens a fresh one when it needs it. The ordinary path pays nothing: only a
//! transaction step's connection is reset.

use std::ops::{Deref, DerefMut};

use deadpool_postgres::Object;

use crate::db::Db;

/// The statements that reset a session a transaction step's closure may have changed, for a
/// store whose pinned settings are `settings` ([`Config::session_settings`](crate::Config)).
/// One simple query, which PostgreSQL runs as one implicit transaction block: each statement
/// may run in one (`DISCARD ALL` may not, hence its parts).
pub(crate) fn reset_sql(settings: &[(&'static str, String)]) -> String {
    // Role first, so the rest runs with the session's own privileges.
    let mut sql = String::from(
        "SET SESSION AUTHORIZATION DEFAULT; RESET ALL; CLOSE ALL; UNLISTEN *; \
         SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES; \
         DO $keiro$ DECLARE v_name text; BEGIN \
         FOR v_name IN SELECT name FROM pg_prepared_statements WHERE from_sql LOOP \
         EXECUTE format('DEALLOCATE %I', v_name); END LOOP; END $keiro$;",
    );
    // The values are keiro's own (a validated schema name, constants), written as literals
    // because SET takes no bind parameter.
    for (name, value) in settings {
        sql.push_str(&format!(" SET {name} TO '{}';", value.replace('\'', "''")));
    }
    sql
}

/// A pooled connection lent to a transaction step. It goes back to the pool only through
/// [`give_back`](Self::give_back); dropped any other way it is closed, since the closure may
/// have left anything on it.
pub(crate) struct Lent(Option<Object>);

impl Lent {
    pub(crate) fn new(client: Object) -> Self {
        Self(Some(client))
    }

    /// Resets the session (one round trip) and returns the connection to the pool; closes it
    /// when the reset fails. The transaction must have ended (committed, rolled back, or
    /// dropped, which queues its `ROLLBACK` ahead of the reset). `db` is the store's pool, which
    /// counts the round trip; `reset` is the store's [`reset_sql`].
    pub(crate) async fn give_back(mut self, db: &Db, reset: &str) {
        let client = self
            .0
            .as_ref()
            .expect("a lent connection is held until given back");
        db.count_round_trips(1);
        match client.batch_execute(reset).await {
            // Dropped here, into the pool.
            Ok(()) => drop(self.0.take()),
            Err(error) => tracing::debug!(
                error = %keiro_journal::error_chain(&error),
                "closing a connection whose session could not be reset after a transaction step"
            ),
        }
    }
}

impl Deref for Lent {
    type Target = Object;

    fn deref(&self) -> &Object {
        self.0
            .as_ref()
            .expect("a lent connection is held until given back")
    }
}

impl DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut Object {
        self.0
            .as_mut()
            .expect("a lent connection is held until given back")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            // Out of the pool for good; dropping the client closes the connection.
            drop(Object::take(client));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reset_sets_every_pinned_setting_again_after_resetting_all() {
        let sql = reset_sql(&[
            ("search_path", "keiro".to_owned()),
            ("default_transaction_isolation", "read committed".to_owned()),
        ]);
        let reset = sql.find("RESET ALL").unwrap();
        let path = sql.find("SET search_path TO 'keiro';").unwrap();
        let isolation = sql
            .find("SET default_transaction_isolation TO 'read committed';")
            .unwrap();
        assert!(reset < path && path < isolation, "{sql}");
        assert!(
            sql.starts_with("SET SESSION AUTHORIZATION DEFAULT;"),
            "{sql}"
        );
        assert!(
            !sql.contains("DISCARD ALL") && !sql.contains("DEALLOCATE ALL"),
            "{sql}"
        );
        assert!(reset_sql(&[("x", "it's".into())]).ends_with(" SET x TO 'it''s';"));
    }
}
