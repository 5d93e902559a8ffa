//! The bound on deliveries that no await has read.
//!
//! A delivery (`deliver`, `deliver_to`) is journaled into the instance's generation whether or
//! not any await will ever read it: whether some later code awaits a name is unknowable when the
//! value arrives. Left unbounded, a caller delivering under fresh names (a public webhook)
//! would grow a journal that every drive loads, past what a claim can load. So every store
//! keeps, per generation, how many deliveries it journaled and how many of them the run's awaits
//! have read (the run reports its total when it parks, [`JournalStore::deliveries_read`]), and
//! refuses a delivery that would take the unread ones past the caller's [`DeliveryBacklog`]
//! ([`DeliveryRefusal::Backlog`], nothing written), unless it answers a wait the parked run
//! waits on: that one the next drive reads.
//!
//! The journal budget ([`JournalBudget`]) does not count unread deliveries, and counts a
//! delivery once an await has read it: what the body did not read cannot make its next step
//! fail with [`WorkflowError::JournalFull`]. The two bounds together keep a generation loadable.
//!
//! [`JournalStore::deliveries_read`]: crate::JournalStore::deliveries_read
//! [`DeliveryRefusal::Backlog`]: crate::DeliveryRefusal::Backlog
//! [`JournalBudget`]: crate::JournalBudget
//! [`WorkflowError::JournalFull`]: crate::WorkflowError::JournalFull

/// The default number of deliveries a generation holds that no await has read.
pub const DELIVERIES_UNREAD_MAX_DEFAULT: usize = 1_000;
/// The default number of encoded payload bytes of the deliveries a generation holds that no
/// await has read.
pub const DELIVERIES_UNREAD_BYTES_MAX_DEFAULT: usize = 16 * 1024 * 1024;

/// How many deliveries no await has read a generation may hold (see the module docs): a
/// delivery past either bound is refused, unless it answers a wait the parked run waits on.
///
/// ```
/// use keiro_journal::{DeliveryBacklog, DELIVERIES_UNREAD_MAX_DEFAULT};
///
/// let backlog = DeliveryBacklog::default();
/// assert_eq!(backlog.deliveries, DELIVERIES_UNREAD_MAX_DEFAULT);
/// let strict = DeliveryBacklog { deliveries: 10, ..backlog };
/// assert!(strict.admits(keiro_journal::Deliveries { count: 9, bytes: 0 }, 100));
/// assert!(!strict.admits(keiro_journal::Deliveries { count: 10, bytes: 0 }, 100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryBacklog {
    /// Unread deliveries per generation. Defaults to [`DELIVERIES_UNREAD_MAX_DEFAULT`].
    pub deliveries: usize,
    /// Encoded payload bytes of the unread deliveries per generation. Defaults to
    /// [`DELIVERIES_UNREAD_BYTES_MAX_DEFAULT`].
    pub bytes: usize,
}

impl Default for DeliveryBacklog {
    fn default() -> Self {
        Self {
            deliveries: DELIVERIES_UNREAD_MAX_DEFAULT,
            bytes: DELIVERIES_UNREAD_BYTES_MAX_DEFAULT,
        }
    }
}

impl DeliveryBacklog {
    /// Whether a new delivery of `len` encoded bytes may join `unread` ones (when it answers
    /// no wait the parked run waits on).
    pub fn admits(&self, unread: Deliveries, len: usize) -> bool {
        unread.count < self.deliveries && unread.bytes.saturating_add(len) <= self.bytes
    }
}

/// A number of deliveries and their encoded payload bytes (as [`encoded_len`] measures).
///
/// [`encoded_len`]: crate::encoded_len
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deliveries {
    /// How many.
    pub count: usize,
    /// Their encoded payload bytes.
    pub bytes: usize,
}

impl Deliveries {
    /// `self` less `read`, never below zero (a store counts only the deliveries it journaled
    /// itself, so a run may have read more: older ones).
    pub fn less(self, read: Self) -> Self {
        Self {
            count: self.count.saturating_sub(read.count),
            bytes: self.bytes.saturating_sub(read.bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_is_admitted_below_both_bounds_only() {
        let backlog = DeliveryBacklog {
            deliveries: 2,
            bytes: 100,
        };
        let unread = |count, bytes| Deliveries { count, bytes };
        assert!(backlog.admits(unread(0, 0), 100));
        assert!(backlog.admits(unread(1, 60), 40));
        assert!(!backlog.admits(unread(1, 60), 41), "past the bytes");
        assert!(!backlog.admits(unread(2, 0), 0), "past the count");
        assert!(!backlog.admits(unread(0, 0), usize::MAX));
    }

    #[test]
    fn reads_beyond_what_was_counted_leave_nothing_unread() {
        let delivered = Deliveries {
            count: 2,
            bytes: 30,
        };
        let read = Deliveries {
            count: 3,
            bytes: 10,
        };
        assert_eq!(
            delivered.less(read),
            Deliveries {
                count: 0,
                bytes: 20
            }
        );
    }
}
