//! The ledger the multi-process tests on one SQLite file keep beside the store: every execution
//! of a step body appends a line naming the instance, the step and the process, and holds an
//! exclusive lock on its instance's lock file while it runs, so that two executions of one
//! instance's steps at the same moment (in two processes, or in two tasks of one) are recorded
//! as an overlap. The store's own journal cannot witness either: a step executed again, or
//! executed by a holder whose lease was taken over, is exactly what it would not record.
//!
//! Why plain files. A line appended to a file opened with `O_APPEND` is one `write(2)` that the
//! kernel places at the end of the file whichever process writes, and it is in the page cache
//! when the call returns, so it survives a SIGKILL of its writer an instant later (the tests
//! kill processes, they do not cut the power, so there is no fsync). The lock is `flock(2)`
//! (std's `File::try_lock`), which the kernel drops when the holder's descriptor closes, SIGKILL
//! included: a killed process leaves no stale lock that would read as an overlap, as a lock row
//! in a table or a lock file created with `O_EXCL` would. A SQLite ledger would have to hold a
//! write transaction for the whole of each step, and so serialize every step of every instance.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The input of the tests' `ledgered` workflow: run `steps` steps for job `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Which job, folded into every step's value.
    pub index: u64,
    /// How many steps the run takes.
    pub steps: u32,
}

impl Job {
    /// Step `n`'s value: different for every job and step.
    pub fn value(&self, n: u32) -> u64 {
        self.index * 1000 + u64::from(n)
    }

    /// The workflow's output: the sum of its steps' values, as the body computes it from the
    /// results it executed or replayed.
    pub fn output(&self) -> u64 {
        (0..self.steps).map(|n| self.value(n)).sum()
    }
}

/// What a step of the `ledgered` workflow returns and the journal records: its value and the
/// process that executed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Executed {
    /// [`Job::value`] of the step.
    pub value: u64,
    /// The id of the process that executed the step.
    pub pid: u32,
}

/// One line of the ledger: one execution of a step body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// The instance's id.
    pub id: String,
    /// The step's name.
    pub step: String,
    /// The process that executed it.
    pub pid: u32,
    /// Whether another execution of the same instance held the instance's lock at the time.
    pub overlapped: bool,
}

/// A ledger directory: the `executions` file of lines and the `locks` directory of one lock
/// file per instance.
#[derive(Debug, Clone)]
pub struct StepLedger {
    dir: PathBuf,
}

/// An execution in progress: holds its instance's lock (when it got it) until dropped.
#[derive(Debug)]
#[must_use = "the instance's lock is held until this is dropped"]
pub struct Inside {
    _lock: File,
}

impl StepLedger {
    /// The ledger in `dir`, creating the directory and its `locks` directory if needed.
    ///
    /// # Errors
    ///
    /// When a directory cannot be created.
    pub fn open(dir: impl AsRef<Path>) -> io::Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(dir.join("locks"))?;
        Ok(Self { dir })
    }

    fn executions_path(&self) -> PathBuf {
        self.dir.join("executions")
    }

    /// Records that this process starts executing `step` of instance `id`: takes the instance's
    /// lock without waiting (another execution holding it is an overlap) and appends the line.
    /// The lock is held until the returned [`Inside`] is dropped.
    ///
    /// # Errors
    ///
    /// An id or step that would not stay one path component and one field of a line
    /// (`InvalidInput`), or a failed file operation.
    pub fn enter(&self, id: &str, step: &str) -> io::Result<Inside> {
        for field in [id, step] {
            if field.is_empty()
                || field
                    .chars()
                    .any(|c| c.is_whitespace() || c == '/' || c == '\\' || c == '.')
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{field:?} is not a ledger field (no space, dot or slash)"),
                ));
            }
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join("locks").join(id))?;
        let overlapped = match lock.try_lock() {
            Ok(()) => false,
            Err(TryLockError::WouldBlock) => true,
            Err(TryLockError::Error(e)) => return Err(e),
        };
        let line = format!("{id} {step} {} {overlapped}\n", std::process::id());
        // One `write` call with O_APPEND: the line lands whole at the end of the file.
        let written = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.executions_path())?
            .write(line.as_bytes())?;
        if written != line.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "appended {written} of the ledger line's {} bytes",
                    line.len()
                ),
            ));
        }
        Ok(Inside { _lock: lock })
    }

    /// Every execution recorded so far, in the order they were appended.
    ///
    /// # Errors
    ///
    /// A failed read, or a line that is not one [`enter`](Self::enter) writes
    /// (`InvalidData`).
    pub fn executions(&self) -> io::Result<Vec<Execution>> {
        let text = match std::fs::read_to_string(self.executions_path()) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            other => other?,
        };
        text.lines().map(parse).collect()
    }
}

fn parse(line: &str) -> io::Result<Execution> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("ledger line {line:?}"));
    let fields: Vec<&str> = line.split(' ').collect();
    let [id, step, pid, overlapped] = fields[..] else {
        return Err(bad());
    };
    Ok(Execution {
        id: id.to_owned(),
        step: step.to_owned(),
        pid: pid.parse().map_err(|_| bad())?,
        overlapped: overlapped.parse().map_err(|_| bad())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own for one test, removed however the test ends.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(test: &str) -> Scratch {
        Scratch(
            std::env::temp_dir().join(format!("keiro-step-ledger-{test}-{}", uuid::Uuid::new_v4())),
        )
    }

    #[test]
    fn an_execution_inside_another_of_its_instance_is_recorded_as_an_overlap() -> io::Result<()> {
        let dir = scratch("overlap");
        let ledger = StepLedger::open(&dir.0)?;
        let first = ledger.enter("j-1", "step-0")?;
        // Another instance is not an overlap; the same instance is, even from another open
        // file description of this process (flock locks one description, not a process).
        let other = ledger.enter("j-2", "step-0")?;
        let overlapping = ledger.enter("j-1", "step-1")?;
        drop((first, other, overlapping));
        let after = ledger.enter("j-1", "step-2")?;
        drop(after);
        let pid = std::process::id();
        let line = |id: &str, step: &str, overlapped| Execution {
            id: id.into(),
            step: step.into(),
            pid,
            overlapped,
        };
        // A second handle on the directory reads what the first appended.
        assert_eq!(
            StepLedger::open(&dir.0)?.executions()?,
            [
                line("j-1", "step-0", false),
                line("j-2", "step-0", false),
                line("j-1", "step-1", true),
                line("j-1", "step-2", false),
            ]
        );
        Ok(())
    }

    #[test]
    fn a_field_that_is_not_one_path_component_and_one_word_is_refused() -> io::Result<()> {
        let dir = scratch("fields");
        let ledger = StepLedger::open(&dir.0)?;
        for (id, step) in [
            ("", "s"),
            ("a b", "s"),
            ("../x", "s"),
            ("a", "s\n1"),
            ("a", ""),
        ] {
            let refused = ledger.enter(id, step).map(drop).map_err(|e| e.kind());
            assert_eq!(refused, Err(io::ErrorKind::InvalidInput), "{id:?} {step:?}");
        }
        assert!(ledger.executions()?.is_empty());
        Ok(())
    }

    #[test]
    fn a_line_the_ledger_did_not_write_is_refused() -> io::Result<()> {
        let dir = scratch("parse");
        let ledger = StepLedger::open(&dir.0)?;
        std::fs::write(
            dir.0.join("executions"),
            "j-1 step-0 12 false\nj-1 step-1 12\n",
        )?;
        assert_eq!(
            ledger.executions().map_err(|e| e.kind()),
            Err(io::ErrorKind::InvalidData)
        );
        Ok(())
    }
}
