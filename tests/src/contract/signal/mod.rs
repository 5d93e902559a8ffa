//! `sql/functions/signal.sql`: sending and waiting on a signal (the buffer, the waiters in
//! arrival order, the fence, the timeout, a withdrawn wait), and waits and sends racing on one
//! token that deliver each signal exactly once.

pub mod race;
pub mod send;
