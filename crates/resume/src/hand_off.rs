//! Local hand-off: a run started in a process whose worker loop serves it is started leased to
//! that loop and handed to it in memory, so it runs without a wake notification or a claim.
//!
//! A start made through the ordinary path commits the run, notifies the workers, and a worker's
//! loop wakes, claims it (one more statement and commit) and drives it. When the caller's own
//! process runs a worker loop that serves the workflow and has a free slot, that hop buys
//! nothing: the caller takes one of the loop's slots ([`HandOffs::reserve`]), starts the run
//! leased to the loop's owner in the same statement that creates it (as direct execution
//! does), and delivers the claim with the slot ([`Reservation::deliver`]); the loop drives it
//! on its next turn as if its own claim had returned it.
//!
//! A loop takes hand-offs only while its last claim came back short (nothing else was
//! runnable then), so a handed-off run does not overtake runs already waiting in the store,
//! and only into a free slot of its `max_concurrent_advances`, so none waits for a body to
//! end. If the process dies after the start, the run is leased to a loop that is gone: another
//! worker claims it once the lease expires (`lease_ttl`), as for any run of a killed worker.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use keiro_journal::WorkflowName;
use keiro_lease::{Claim, Versions};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The worker loops of one process (of one `Keiro` handle and its clones) that take runs
/// started there: where a start looks for a loop to hand its run to.
#[derive(Debug, Default)]
pub struct HandOffs {
    loops: Mutex<Vec<Weak<Inbox>>>,
}

impl HandOffs {
    /// No loop yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Opens a hand-off for a loop serving `names` of `versions`, leasing as `owner` for
    /// `ttl`: registered until the [`HandOff`] is closed or the last clone of it dropped. It
    /// takes nothing until its loop gives it its slots and says it is taking.
    #[must_use]
    pub fn open(
        &self,
        names: impl IntoIterator<Item = WorkflowName>,
        versions: Versions,
        owner: String,
        ttl: Duration,
    ) -> HandOff {
        let inbox = Arc::new(Inbox {
            names: names.into_iter().collect(),
            versions,
            owner,
            ttl,
            state: Mutex::new(State {
                open: true,
                taking: false,
                reserved: 0,
                slots: None,
                delivered: VecDeque::new(),
            }),
            notify: tokio::sync::Notify::new(),
        });
        let mut loops = self.loops.lock().unwrap_or_else(PoisonError::into_inner);
        loops.retain(|inbox| inbox.strong_count() > 0);
        loops.push(Arc::downgrade(&inbox));
        HandOff { inbox }
    }

    /// A free slot of a loop that serves workflow `name` at application `version` (`""`:
    /// unversioned) and is taking hand-offs, taken for one run; `None` when no loop of this
    /// process can take it now (start it the ordinary way).
    #[must_use]
    pub fn reserve(&self, name: &WorkflowName, version: &str) -> Option<Reservation> {
        let loops = self.loops.lock().unwrap_or_else(PoisonError::into_inner);
        loops.iter().filter_map(Weak::upgrade).find_map(|inbox| {
            if !inbox.names.iter().any(|n| n == name) || !inbox.versions.serves(version) {
                return None;
            }
            let slot = inbox.free_slot()?;
            Some(Reservation {
                inbox,
                slot: Some(slot),
            })
        })
    }
}

/// One loop's side of the hand-off: the runs delivered to it, and whether it takes more.
#[derive(Debug)]
struct Inbox {
    names: Vec<WorkflowName>,
    versions: Versions,
    owner: String,
    ttl: Duration,
    state: Mutex<State>,
    /// Woken on each delivery.
    notify: tokio::sync::Notify,
}

#[derive(Debug)]
struct State {
    /// Whether the loop still runs.
    open: bool,
    /// Whether the loop takes hand-offs now.
    taking: bool,
    /// Slots taken by reservations not delivered yet.
    reserved: usize,
    /// The loop's slots, one per run whose body runs.
    slots: Option<Arc<Semaphore>>,
    /// Delivered, not taken by the loop yet.
    delivered: VecDeque<Delivered>,
}

impl Inbox {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn free_slot(&self) -> Option<OwnedSemaphorePermit> {
        let mut state = self.state();
        if !state.open || !state.taking {
            return None;
        }
        let slot = state.slots.clone()?.try_acquire_owned().ok()?;
        state.reserved += 1;
        Some(slot)
    }

    /// A reservation ended, delivered or not: the loop looks again.
    fn settled(&self, mut state: MutexGuard<'_, State>) {
        state.reserved = state.reserved.saturating_sub(1);
        drop(state);
        self.notify.notify_one();
    }
}

/// A run handed to a loop: its claim, when its lease was asked for, and the loop's slot it
/// runs in.
#[derive(Debug)]
pub struct Delivered {
    /// The claim, as the loop's own claim would have returned it.
    pub claim: Claim,
    /// When the lease was asked for: it was granted no earlier.
    pub asked: Instant,
    /// The slot the run's body holds; given back when the body returns.
    pub slot: OwnedSemaphorePermit,
}

/// A loop's hand-off, held by the loop: it gives the hand-off its slots, says when it takes
/// runs, and takes what was delivered.
#[derive(Debug, Clone)]
pub struct HandOff {
    inbox: Arc<Inbox>,
}

impl HandOff {
    /// The slots the loop's bodies run in: a reservation takes one of them.
    pub fn attach_slots(&self, slots: Arc<Semaphore>) {
        self.inbox.state().slots = Some(slots);
    }

    /// Says whether the loop takes hand-offs now (while its last claim came back short).
    pub fn set_taking(&self, taking: bool) {
        self.inbox.state().taking = taking;
    }

    /// The runs delivered since the last call.
    pub fn take(&self) -> Vec<Delivered> {
        self.inbox.state().delivered.drain(..).collect()
    }

    /// Slots taken by starts whose run is not delivered yet: the loop cannot use them, and
    /// waits for [`delivered`](Self::delivered) rather than for its own runs.
    #[must_use]
    pub fn reserved(&self) -> usize {
        self.inbox.state().reserved
    }

    /// Waits for the next delivery, or the end of a reservation without one (at once if one
    /// came since the last wait).
    pub async fn delivered(&self) {
        self.inbox.notify.notified().await;
    }

    /// Takes no more runs; returns those delivered and not taken, whose leases the loop gives
    /// back.
    pub fn close(&self) -> Vec<Delivered> {
        let mut state = self.inbox.state();
        state.open = false;
        state.taking = false;
        state.delivered.drain(..).collect()
    }
}

/// A loop's slot taken for one run ([`HandOffs::reserve`]): start the run leased to
/// [`owner`](Self::owner) for [`ttl`](Self::ttl), then [`deliver`](Self::deliver) its claim.
/// Dropped without a delivery, the slot is given back.
#[derive(Debug)]
pub struct Reservation {
    inbox: Arc<Inbox>,
    /// Until delivered.
    slot: Option<OwnedSemaphorePermit>,
}

/// A claim the loop did not take: it comes back, and its lease is the caller's to give back.
#[derive(Debug)]
pub struct NotDelivered(pub Box<Claim>);

impl Reservation {
    /// The lease owner the run is started under.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.inbox.owner
    }

    /// The lease's time to live.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.inbox.ttl
    }

    /// Delivers the run's claim to the loop, with the slot. It comes back when the loop
    /// stopped meanwhile, or does not serve the run's application version after all (the run
    /// existed, started by another version): give its lease back, so another worker claims
    /// it at once.
    ///
    /// # Errors
    ///
    /// [`NotDelivered`], holding the claim.
    pub fn deliver(mut self, claim: Box<Claim>, asked: Instant) -> Result<(), NotDelivered> {
        let version = claim.instance.app_version.as_deref().unwrap_or_default();
        let serves = self.inbox.versions.serves(version);
        let mut state = self.inbox.state();
        let slot = self
            .slot
            .take()
            .expect("a reservation holds its slot until used");
        if !state.open || !serves {
            drop(slot);
            self.inbox.settled(state);
            return Err(NotDelivered(claim));
        }
        state.delivered.push_back(Delivered {
            claim: *claim,
            asked,
            slot,
        });
        self.inbox.settled(state);
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            drop(slot);
            self.inbox.settled(self.inbox.state());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(name: &str) -> WorkflowName {
        WorkflowName::new(name).expect("a valid name")
    }

    #[test]
    fn a_start_takes_a_free_slot_of_a_taking_loop_that_serves_it() {
        let hand_offs = HandOffs::new();
        let loop_ = hand_offs.open(
            [name("w")],
            Versions::only(["v1"]),
            "owner".into(),
            Duration::from_secs(1),
        );
        assert!(
            hand_offs.reserve(&name("w"), "v1").is_none(),
            "no slots yet"
        );
        let slots = Arc::new(Semaphore::new(1));
        loop_.attach_slots(slots.clone());
        assert!(hand_offs.reserve(&name("w"), "v1").is_none(), "not taking");
        loop_.set_taking(true);
        assert!(
            hand_offs.reserve(&name("x"), "v1").is_none(),
            "another workflow"
        );
        assert!(
            hand_offs.reserve(&name("w"), "v2").is_none(),
            "another version"
        );
        let reserved = hand_offs.reserve(&name("w"), "v1").expect("a free slot");
        assert_eq!(reserved.owner(), "owner");
        assert_eq!(loop_.reserved(), 1);
        assert_eq!(slots.available_permits(), 0);
        assert!(
            hand_offs.reserve(&name("w"), "v1").is_none(),
            "its one slot is taken"
        );
        drop(reserved);
        assert_eq!(loop_.reserved(), 0);
        assert_eq!(slots.available_permits(), 1, "given back undelivered");
        assert!(loop_.close().is_empty());
        assert!(hand_offs.reserve(&name("w"), "v1").is_none(), "closed");
    }

    #[test]
    fn a_dropped_loop_leaves_the_list() {
        let hand_offs = HandOffs::new();
        let loop_ = hand_offs.open(
            [name("w")],
            Versions::Any,
            "o".into(),
            Duration::from_secs(1),
        );
        loop_.attach_slots(Arc::new(Semaphore::new(4)));
        loop_.set_taking(true);
        assert!(hand_offs.reserve(&name("w"), "").is_some());
        drop(loop_);
        assert!(hand_offs.reserve(&name("w"), "").is_none());
    }
}
