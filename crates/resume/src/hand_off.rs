//! Local hand-off: a run started in a process whose worker loop serves it is started leased to
//! that loop and handed to it in memory, so it runs without a wake notification or a claim.
//!
//! A start made through the ordinary path commits the run, notifies the workers, and a worker's
//! loop wakes, claims it (one more statement and commit) and drives it. When the caller's own
//! process runs a worker loop that serves the workflow and has room, that hop buys nothing: the
//! caller asks the loop's [`HandOff`] for a place ([`HandOffs::reserve`]), starts the run leased
//! to the loop's owner in the same statement that creates it (as direct execution does), and
//! delivers the claim ([`Reservation::deliver`]); the loop takes it on its next turn as if its
//! own claim had returned it.
//!
//! A loop offers room only while its last claim came back short (nothing else was runnable),
//! so a handed-off run never overtakes runs already waiting in the store, and only up to the
//! runs it would claim itself (`max_concurrent_advances`-based, as its claims are sized). If
//! the process dies after the start, the run is leased to a loop that is gone: another worker
//! claims it once the lease expires (`lease_ttl`), as for any run of a killed worker.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use keiro_journal::WorkflowName;
use keiro_lease::{Claim, Versions};

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
    /// `ttl`: registered until the [`HandOff`] is closed or dropped. It offers no room until
    /// its loop says it has some.
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
                room: 0,
                reserved: 0,
                claims: VecDeque::new(),
            }),
            notify: tokio::sync::Notify::new(),
        });
        let mut loops = self.loops.lock().unwrap_or_else(PoisonError::into_inner);
        loops.retain(|inbox| inbox.strong_count() > 0);
        loops.push(Arc::downgrade(&inbox));
        HandOff { inbox }
    }

    /// A place in a loop that serves workflow `name` at application `version` (`""`:
    /// unversioned) and has room, taken for one run; `None` when no loop of this process can
    /// take it now (start it the ordinary way).
    #[must_use]
    pub fn reserve(&self, name: &WorkflowName, version: &str) -> Option<Reservation> {
        let loops = self.loops.lock().unwrap_or_else(PoisonError::into_inner);
        loops
            .iter()
            .filter_map(Weak::upgrade)
            .find(|inbox| {
                inbox.names.iter().any(|n| n == name)
                    && inbox.versions.serves(version)
                    && inbox.take_room()
            })
            .map(|inbox| Reservation { inbox: Some(inbox) })
    }
}

/// One loop's side of the hand-off: the runs delivered to it and the room it offers.
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
    /// Whether the loop still takes runs.
    open: bool,
    /// Runs the loop can take beyond those reserved and delivered.
    room: usize,
    /// Places taken whose run is not delivered yet.
    reserved: usize,
    /// Delivered, not taken by the loop yet, each with when its lease was asked for.
    claims: VecDeque<(Claim, Instant)>,
}

impl Inbox {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_room(&self) -> bool {
        let mut state = self.state();
        if !state.open || state.room == 0 {
            return false;
        }
        state.room -= 1;
        state.reserved += 1;
        true
    }
}

/// A loop's hand-off, held by the loop: it says how much room it has and takes what was
/// delivered. Closed (no more deliveries) when dropped.
#[derive(Debug, Clone)]
pub struct HandOff {
    inbox: Arc<Inbox>,
}

impl HandOff {
    /// Says the loop can take `room` more runs now, counting those reserved and delivered but
    /// not taken yet; 0 offers none.
    pub fn set_room(&self, room: usize) {
        let mut state = self.inbox.state();
        state.room = room.saturating_sub(state.reserved + state.claims.len());
    }

    /// The runs delivered since the last call, each with when its lease was asked for.
    pub fn take(&self) -> Vec<(Claim, Instant)> {
        self.inbox.state().claims.drain(..).collect()
    }

    /// Waits for the next delivery (at once if one came since the last wait).
    pub async fn delivered(&self) {
        self.inbox.notify.notified().await;
    }

    /// Takes no more runs; returns those delivered and not taken, whose leases the loop gives
    /// back.
    pub fn close(&self) -> Vec<(Claim, Instant)> {
        let mut state = self.inbox.state();
        state.open = false;
        state.room = 0;
        state.claims.drain(..).collect()
    }
}

/// A place in a loop for one run ([`HandOffs::reserve`]): start the run leased to
/// [`owner`](Self::owner) for [`ttl`](Self::ttl), then [`deliver`](Self::deliver) its claim.
/// Dropped without a delivery, the place is given back.
#[derive(Debug)]
pub struct Reservation {
    inbox: Option<Arc<Inbox>>,
}

/// Why a claim was not delivered: it comes back, and its lease is the caller's to give back.
#[derive(Debug)]
pub struct NotDelivered(pub Box<Claim>);

impl Reservation {
    fn inbox(&self) -> &Inbox {
        self.inbox
            .as_ref()
            .expect("a reservation holds its inbox until used")
    }

    /// The lease owner the run is started under.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.inbox().owner
    }

    /// The lease's time to live.
    #[must_use]
    pub fn ttl(&self) -> Duration {
        self.inbox().ttl
    }

    /// Delivers the run's claim to the loop. It comes back when the loop closed meanwhile, or
    /// does not serve the run's application version after all (the run existed, started by
    /// another version): give its lease back, so another worker claims it at once.
    ///
    /// # Errors
    ///
    /// [`NotDelivered`], holding the claim.
    pub fn deliver(mut self, claim: Box<Claim>, asked: Instant) -> Result<(), NotDelivered> {
        let inbox = self.inbox.take().expect("a reservation is used once");
        let version = claim.instance.app_version.as_deref().unwrap_or_default();
        let serves = inbox.versions.serves(version);
        let mut state = inbox.state();
        state.reserved = state.reserved.saturating_sub(1);
        if !state.open || !serves {
            return Err(NotDelivered(claim));
        }
        state.claims.push_back((*claim, asked));
        drop(state);
        inbox.notify.notify_one();
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(inbox) = self.inbox.take() {
            let mut state = inbox.state();
            state.reserved = state.reserved.saturating_sub(1);
            if state.open {
                state.room += 1;
            }
        }
    }
}
