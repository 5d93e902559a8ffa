//! What one branch of a [`Ctx::select`](crate::Ctx::select) has read in this drive, the
//! evidence a race is decided by (journal order).

use crate::ReturnedSignal;

/// What one branch of a race has read in this drive: where in the journal the values it
/// replayed sit, whether it did fresh work, and the signals its waits took.
#[derive(Debug, Default)]
pub(crate) struct RaceMarks {
    /// The latest journal position (`seq`) among the values it replayed that were loaded with
    /// the run.
    pub(crate) latest: Option<i64>,
    /// Whether it resolved anything in this drive (a fresh step, an arm that found its value,
    /// a value recorded earlier in this drive): then it resolved after everything loaded.
    pub(crate) fresh: bool,
    /// The signals its waits took, in the order they took them.
    pub(crate) signals: Vec<ReturnedSignal>,
}

impl RaceMarks {
    /// Notes a replayed value at journal position `position` (`None`: recorded in this drive).
    pub(crate) fn read(&mut self, position: Option<i64>) {
        match position {
            Some(seq) => self.latest = Some(self.latest.map_or(seq, |l| l.max(seq))),
            None => self.fresh = true,
        }
    }

    /// When the branch resolved, for ordering the resolved branches of an undecided race:
    /// journal order for one resolved by loaded values only, and after all of them
    /// (`None`) for one that did fresh work or read nothing at all.
    pub(crate) fn resolved_at(&self) -> Option<i64> {
        if self.fresh {
            None
        } else {
            self.latest
        }
    }

    /// Adds what a nested race's winning branch read to the branch around the race.
    pub(crate) fn absorb(&mut self, inner: RaceMarks) {
        if let Some(seq) = inner.latest {
            self.read(Some(seq));
        }
        self.fresh |= inner.fresh;
        self.signals.extend(inner.signals);
    }
}
