//! Shared by the test modules: a temporary directory per test, removed when dropped, and small
//! builders.

#![allow(dead_code, unreachable_pub)] // each test module uses a part

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use keiro_journal::store::{remote_step_id, Append, RemoteArm};
use keiro_journal::{store::StartRequest, Event, Fence, InstanceKey, StepKind};
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
        attributes: Default::default(),
        key: key(id),
        input,
        parent: None,
        priority: 0,
        queue: None,
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

pub const TTL: std::time::Duration = std::time::Duration::from_secs(60);
pub const T0: time::OffsetDateTime = time::macros::datetime!(2030-01-01 0:00 UTC);

/// A fresh store whose clock is pinned at [`T0`].
pub fn pinned(test: &str) -> (TempDir, SqliteStore) {
    let (dir, store) = store(test);
    store.pin_clock(Some(T0));
    (dir, store)
}

/// Starts `wf/<id>` with a null input.
pub async fn start(store: &SqliteStore, id: &str) -> InstanceKey {
    store
        .instance_start(&start_request(id, Value::Null))
        .await
        .expect("starts");
    key(id)
}

/// Claims `key` for `owner` for [`TTL`], or panics.
pub async fn claim(store: &SqliteStore, key: &InstanceKey, owner: &str) -> Fence {
    match store
        .instance_claim(key, owner, TTL, None)
        .await
        .expect("claims")
    {
        keiro_lease::ClaimOutcome::Acquired(claim) => claim.fence,
        refused => panic!("claim of {key} by {owner} refused: {refused:?}"),
    }
}

/// Appends `event` to `key`.
pub async fn append(
    store: &SqliteStore,
    key: &InstanceKey,
    generation: Option<keiro_journal::Generation>,
    event: Event,
    fence: Option<&Fence>,
) -> keiro_journal::store::Result<keiro_journal::store::AppendOutcome> {
    store
        .journal_append(&Append {
            key: key.clone(),
            generation,
            event,
            fence: fence.cloned(),
            renew: None,
        })
        .await
}

/// The step names of `key`'s journal, in order, read from the file directly.
pub fn step_names(path: &Path, key: &InstanceKey) -> Vec<String> {
    let conn = rusqlite::Connection::open(path).expect("opens");
    let mut statement = conn
        .prepare(
            "SELECT step_name FROM journal WHERE workflow_name = ?1 AND workflow_id = ?2 \
             ORDER BY seq",
        )
        .expect("prepares");
    statement
        .query_map([key.name.as_str(), key.id.as_str()], |r| r.get(0))
        .expect("reads")
        .collect::<Result<_, _>>()
        .expect("reads")
}

/// A remote step `step` of `key`'s generation 0, in group `step`, tried once, unfenced.
pub fn remote_arm(key: &InstanceKey, step: &str) -> RemoteArm {
    RemoteArm {
        step_id: remote_step_id(key, 0, step),
        key: key.clone(),
        generation: 0,
        step: step.to_owned(),
        journal_step: format!("remote:{step}"),
        group: step.to_owned(),
        input: serde_json::json!({ "step": step }),
        priority: 0,
        traceparent: None,
        max_attempts: 1,
        backoff: keiro_journal::Backoff::default(),
        redispatch_after: None,
        redispatch_max: keiro_journal::REDISPATCH_MAX_DEFAULT,
        queue: None,
        queue_key: None,
        fence: None,
    }
}
