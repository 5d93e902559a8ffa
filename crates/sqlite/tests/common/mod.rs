//! Shared by the integration tests: a temporary directory per test, removed when dropped, and
//! small builders.

#![allow(dead_code, unreachable_pub)] // each test file uses a part

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use keiro_journal::store::Append;
use keiro_journal::{Event, Fence, InstanceKey, StartRequest, StepKind};
use keiro_sqlite::{Config, SqliteStore};
use serde_json::Value;

/// A directory of its own under the system's temporary directory.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(test: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "keiro-sqlite-{test}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("the temporary directory can be created");
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh store in a fresh directory.
pub fn store(test: &str) -> (TempDir, SqliteStore) {
    let dir = TempDir::new(test);
    let store = SqliteStore::open(dir.file("keiro.db"), Config::default()).expect("opens");
    (dir, store)
}

pub fn key(id: &str) -> InstanceKey {
    InstanceKey::parse("wf", id).expect("a valid key")
}

pub fn start_request(id: &str, input: Value) -> StartRequest {
    StartRequest {
        key: key(id),
        input,
        parent: None,
        priority: 0,
    }
}

/// A step append to the current generation, fenced when `fence` is given.
pub fn step(key: &InstanceKey, name: &str, result: Value, fence: Option<&Fence>) -> Append {
    Append {
        key: key.clone(),
        generation: None,
        event: Event::StepRecorded {
            step: name.into(),
            kind: StepKind::Step,
            result,
        },
        fence: fence.cloned(),
        renew: None,
    }
}

/// A marker append to the current generation.
pub fn marker(key: &InstanceKey, event: Event, fence: Option<&Fence>) -> Append {
    Append {
        key: key.clone(),
        generation: None,
        event,
        fence: fence.cloned(),
        renew: None,
    }
}
