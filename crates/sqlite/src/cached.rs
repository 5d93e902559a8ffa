//! `execute` and `query_row` through the connection's prepared-statement cache.
//!
//! Every rule runs a handful of fixed statements per operation; preparing one (tokenizing,
//! parsing, resolving, generating its program) costs more than running it. The writer and the
//! readers keep [`STATEMENT_CACHE`] of them prepared, so a rule's statement is compiled once
//! per connection, not once per call.

use rusqlite::{Connection, Params, Row};

/// How many prepared statements a connection keeps: more than the distinct statements the
/// rules run, so the hot ones are never evicted by a rarely used one.
pub(crate) const STATEMENT_CACHE: usize = 256;

/// `Connection::execute` and `Connection::query_row`, cached.
pub(crate) trait Cached {
    /// Runs `sql` with `params` and returns the rows changed, as `Connection::execute`.
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;

    /// The first row of `sql` with `params` through `f`, as `Connection::query_row`.
    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}
