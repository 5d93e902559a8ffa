//! keiro-remote: remote steps, the part of a workflow that runs in another process.
//!
//! This crate is where `ctx.remote(name, input, options)`, the `Transport` trait (with the
//! Postgres task table as its default), the `RemoteWorker` runtime, durable retry with
//! backoff, lost-dispatch redispatch, the operator's `redispatch_pending` and `requeue`, and
//! fix-and-replay (`retry_with_input`) will live. None of it exists yet: the crate sits in the
//! dependency graph of the design (journal, lease and resume below it, the facade above) so that
//! it can be filled without moving anything else.
//!
//! Until then, work that must run elsewhere can be modelled with the journal's wake sources: a
//! step that enqueues the work and an awakeable whose id travels with it.
