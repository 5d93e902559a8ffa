//! `sql/functions/awakeable.sql`: awakeables are created with their allocation step, settled
//! once, delivered into the owner's journal in the settling call, and journal nothing for an
//! owner that is gone.

pub mod settle;
