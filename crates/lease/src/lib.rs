//! keiro-lease: leases with fencing, crash accounting and backoff for keiro workflow instances.
//!
//! One worker at a time advances an instance. It claims a lease (owner, epoch, expiry) with one
//! conditional update; every write it makes carries the epoch, so a holder whose lease was
//! taken over is refused (`LeaseLost`) before any further side effect. A run that errors or
//! panics is a crash: attempts are counted, the next claim waits out a backoff, and at the
//! ceiling the instance is failed. The decisions (backoff, refusal classification) are pure
//! functions; the store traits carry them out atomically.
//!
//! ```no_run
//! use std::time::Duration;
//! use keiro_journal::InstanceKey;
//! use keiro_lease::{ClaimOutcome, LeaseStore};
//!
//! # async fn demo(store: &dyn LeaseStore) -> Result<(), Box<dyn std::error::Error>> {
//! let key = InstanceKey::parse("order", "order-42")?;
//! match store.instance_claim(&key, "worker-a", Duration::from_secs(60), None).await? {
//!     ClaimOutcome::Acquired(claim) => {
//!         // drive the run with claim.fence, then release
//!         store.instance_release(&key, &claim.fence, true).await?;
//!     }
//!     refused => println!("not now: {refused:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! # Design
//!
//! ```text
//!   free ──claim (epoch+1)──▶ held by (owner, epoch) ──release / park / complete──▶ free
//!                               │  ▲ renew (append or confirm extends expiry)
//!                               │  └─────────────┘
//!                               └── expiry passes ──▶ claimable by anyone (epoch+1 fences the old holder)
//! ```
//!
//! The database is authoritative for expiry (its clock decides). A holder trusts its lease for
//! `confirm_after` (a quarter of the TTL by default) after its last successful fenced write;
//! past that it renews before the next side effect. Fenced writes: step appends, markers,
//! parks, crash records, releases.
//!
//! # Errors
//!
//! Store operations return `keiro_journal::StoreError`; `LeaseLost` is
//! [`is_lease_lost`](keiro_journal::StoreError::is_lease_lost).

mod backoff;
mod claim;
mod crash;
mod queue;
mod store;
pub mod versions;

pub use backoff::{crash_delay, CRASH_BACKOFF_DEFAULT, MAX_ATTEMPTS_DEFAULT};
pub use claim::{
    classify_refusal, Claim, ClaimBatch, ClaimGate, ClaimOutcome, Refusal, StartClaim,
};
pub use crash::{Crash, CrashOutcome, OpenRefusal, RefusalOutcome, ResurrectOutcome};
pub use queue::QueueStore;
pub use store::LeaseStore;
pub use versions::{VersionStore, Versions};
