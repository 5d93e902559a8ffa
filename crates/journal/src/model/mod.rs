//! The journal's vocabulary: plain data with no run behind it.
//!
//! Identities ([`id`]), journal events and entries ([`event`]), instance rows ([`instance`]),
//! what the store keeps for wake sources ([`wake`]) and remote steps ([`remote`]), the
//! journal and delivery bounds ([`budget`], [`delivery`]), what a store can keep
//! ([`storable`]) and how payloads are encoded ([`payload`]), a step's retry policy
//! ([`retry`]), the flow-control vocabulary of queues ([`queue`]), the observers a run reports to ([`observe`]), the error a body sees
//! ([`error`]) and the error a store operation returns ([`store_error`]). Nothing here depends
//! on a run, a context or the store contract.

pub(crate) mod attribute;
pub(crate) mod budget;
pub(crate) mod codec;
pub(crate) mod delivery;
pub(crate) mod error;
pub(crate) mod event;
pub(crate) mod id;
pub(crate) mod instance;
pub(crate) mod message;
pub(crate) mod observe;
pub(crate) mod payload;
pub(crate) mod queue;
pub(crate) mod remote;
pub(crate) mod retry;
pub(crate) mod storable;
pub(crate) mod store_error;
pub(crate) mod update;
pub(crate) mod wake;
