//! `crash_after`: one-shot crash points, consulted by every run the test worker drives.

use std::collections::HashMap;
use std::sync::Mutex;

use keiro_journal::{store::Faults, InstanceKey};

/// The crash points still armed: step name to how many more runs crash after journaling it.
#[derive(Debug, Default)]
pub(crate) struct CrashPoints {
    armed: Mutex<HashMap<String, u32>>,
}

impl CrashPoints {
    /// Arms one crash right after the next journaling of `step`, by any instance.
    pub(crate) fn arm(&self, step: &str) {
        *self.lock().entry(step.to_owned()).or_default() += 1;
    }

    /// How many armed crashes have not fired yet.
    pub(crate) fn pending(&self) -> u32 {
        self.lock().values().sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        // A test that panicked while holding the lock left the map consistent anyway.
        self.armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Faults for CrashPoints {
    fn crash_after(&self, _key: &InstanceKey, step: &str) -> bool {
        let mut armed = self.lock();
        match armed.get_mut(step) {
            Some(left) if *left > 0 => {
                *left -= 1;
                true
            }
            _ => false,
        }
    }
}
