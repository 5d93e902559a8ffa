//! An instance's stored payloads (`PayloadStore`, plain statements on both stores): every
//! place read with its value, and a rewrite applied only where the value read is still stored.

pub mod rewrite;
