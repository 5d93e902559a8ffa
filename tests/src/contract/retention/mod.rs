//! Retention: which terminal instances a collection deletes, in bounded batches, and the
//! parent-child order it keeps.

pub mod collect;
