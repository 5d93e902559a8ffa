//! Claiming an instance: the outcome, and the pure classification of a refusal.

use keiro_journal::{Fence, Instance, JournalEntry, Status};
use time::OffsetDateTime;

/// A granted lease, with everything the run needs so the claim costs one round trip.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The lease: owner and the epoch this claim minted.
    pub fence: Fence,
    /// The instance row after the claim.
    pub instance: Instance,
    /// The current generation's journal, loaded in the claim's round trip.
    pub journal: Vec<JournalEntry>,
}

/// What a worker's claim took ([`LeaseStore::claim_and_admit`](crate::LeaseStore::claim_and_admit)):
/// runs claimed the ordinary way, and runs just admitted from the queues it serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClaimBatch {
    /// Claimed as [`instances_claim_batch`](crate::LeaseStore::instances_claim_batch) claims.
    pub claimed: Vec<Claim>,
    /// Admitted as [`queue_admit`](crate::LeaseStore::queue_admit) admits.
    pub admitted: Vec<Claim>,
}

/// What a claim did.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimOutcome {
    /// The lease is ours.
    Acquired(Box<Claim>),
    /// Another owner's lease is live. Takes precedence over pacing.
    LeaseHeld,
    /// The crash backoff gate has not passed yet.
    Paced,
    /// The instance is missing or not runnable (terminal).
    Unavailable,
}

/// What a direct start did ([`LeaseStore::instance_start_claimed`](crate::LeaseStore::instance_start_claimed)):
/// the instance row exists, and when `claim` is `Acquired` its lease is the caller's.
#[derive(Debug, Clone, PartialEq)]
pub struct StartClaim {
    /// Whether this call created the instance (`false`: it existed, and its input stands).
    pub created: bool,
    /// `Acquired` for a created instance (leased from its first moment, with an empty
    /// journal), and for an existing one that a worker could claim now (running, or suspended
    /// with a due `wake_after`; lease free or expired; backoff gate open). Otherwise the
    /// refusal, classified as for [`ClaimOutcome`]: an existing instance that is terminal,
    /// parked, leased elsewhere or paced is left as it is.
    pub claim: ClaimOutcome,
}

/// Why a claim was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Another owner's lease is live.
    LeaseHeld,
    /// The backoff gate is closed.
    Paced,
    /// Missing, terminal, or otherwise not claimable.
    Unavailable,
}

impl From<Refusal> for ClaimOutcome {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::LeaseHeld => Self::LeaseHeld,
            Refusal::Paced => Self::Paced,
            Refusal::Unavailable => Self::Unavailable,
        }
    }
}

/// The row fields a refusal is classified from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimGate {
    /// The instance's status.
    pub status: Status,
    /// When its lease expires, if leased.
    pub lease_expires_at: Option<OffsetDateTime>,
    /// Its backoff gate.
    pub next_attempt_at: Option<OffsetDateTime>,
}

impl ClaimGate {
    /// Whether a claim at `now` may take the instance.
    pub fn is_claimable(&self, now: OffsetDateTime) -> bool {
        matches!(self.status, Status::Running | Status::Suspended)
            && self.lease_expires_at.is_none_or(|t| t < now)
            && self.next_attempt_at.is_none_or(|t| t <= now)
    }
}

/// Classifies a refused claim: a missing row or a non-runnable status is `Unavailable`; a live
/// lease is `LeaseHeld` (it takes precedence over pacing); a closed backoff gate is `Paced`.
///
/// ```
/// use keiro_journal::Status;
/// use keiro_lease::{classify_refusal, ClaimGate, Refusal};
/// use time::{Duration, OffsetDateTime};
/// let now = OffsetDateTime::now_utc();
/// let gate = ClaimGate {
///     status: Status::Running,
///     lease_expires_at: Some(now + Duration::seconds(5)),
///     next_attempt_at: Some(now + Duration::seconds(5)),
/// };
/// assert_eq!(classify_refusal(Some(gate), now), Refusal::LeaseHeld);
/// ```
pub fn classify_refusal(gate: Option<ClaimGate>, now: OffsetDateTime) -> Refusal {
    let Some(gate) = gate else {
        return Refusal::Unavailable;
    };
    if !matches!(gate.status, Status::Running | Status::Suspended) {
        return Refusal::Unavailable;
    }
    if gate.lease_expires_at.is_some_and(|t| t >= now) {
        return Refusal::LeaseHeld;
    }
    if gate.next_attempt_at.is_some_and(|t| t > now) {
        return Refusal::Paced;
    }
    Refusal::Unavailable
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::Duration;

    #[test]
    fn classification_follows_the_seed() {
        let now = OffsetDateTime::now_utc();
        let later = Some(now + Duration::seconds(1));
        let earlier = Some(now - Duration::seconds(1));
        let gate = |status, lease, next| {
            Some(ClaimGate {
                status,
                lease_expires_at: lease,
                next_attempt_at: next,
            })
        };
        assert_eq!(classify_refusal(None, now), Refusal::Unavailable);
        assert_eq!(
            classify_refusal(gate(Status::Completed, later, later), now),
            Refusal::Unavailable
        );
        assert_eq!(
            classify_refusal(gate(Status::Running, later, later), now),
            Refusal::LeaseHeld
        );
        assert_eq!(
            classify_refusal(gate(Status::Suspended, earlier, later), now),
            Refusal::Paced
        );
        assert_eq!(
            classify_refusal(gate(Status::Running, earlier, earlier), now),
            Refusal::Unavailable
        );
        assert!(gate(Status::Running, earlier, earlier)
            .unwrap()
            .is_claimable(now));
        assert!(!gate(Status::Running, later, None)
            .unwrap()
            .is_claimable(now));
    }
}
