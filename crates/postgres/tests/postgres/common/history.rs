//! This checkout's git history, for the tests that read an earlier build's files from it (the
//! upgrade from the previous SQL layout, the rolling deploy from the previous function files).
//!
//! Such a test cannot check anything without the history, and a test that passes where it
//! checked nothing proves nothing: where git is missing, the checkout is not a repository, or a
//! shallow clone lacks the commit, the test fails and says how to get the history, unless
//! [`SKIP`] is set to say that skipping is meant. CI (`.ci/run`) unshallows its clone first.

use std::path::PathBuf;
use std::process::Command;

/// Set (to anything) to let the history tests skip where the history cannot be read.
pub(crate) const SKIP: &str = "KEIRO_SKIP_GIT_HISTORY";

/// This checkout's repository, read with the `git` command.
pub(crate) struct Git {
    root: PathBuf,
}

impl Git {
    fn new() -> Self {
        Self {
            root: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")),
        }
    }

    /// The output of `git <args>`, or why it could not be had.
    pub(crate) fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(&self.root)
            .args(args)
            .output()
            .map_err(|e| format!("running git: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`git {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        String::from_utf8(out.stdout).map_err(|e| format!("`git {}`: {e}", args.join(" ")))
    }

    /// The file at `path` as commit `commit` has it.
    pub(crate) fn show(&self, commit: &str, path: &str) -> Result<String, String> {
        self.run(&["show", &format!("{commit}:{path}")])
    }

    /// The files of commit `commit` under `folder`, with their paths, sorted.
    pub(crate) fn files(&self, commit: &str, folder: &str) -> Result<Vec<String>, String> {
        let listing = self.run(&["ls-tree", "-r", "--name-only", commit, folder])?;
        let mut files: Vec<String> = listing.lines().map(str::to_owned).collect();
        files.sort_unstable();
        Ok(files)
    }

    /// Why the history may be missing: a shallow clone says so.
    fn hint(&self) -> &'static str {
        match self.run(&["rev-parse", "--is-shallow-repository"]) {
            Ok(answer) if answer.trim() == "true" => {
                "this is a shallow clone: `git fetch --unshallow` fetches the history"
            }
            Ok(_) => "the repository lacks the commit",
            Err(_) => "this checkout has no git repository (or git is not installed)",
        }
    }
}

/// Reads what a test needs from the history with `read`. `Ok(None)`, with the reason printed,
/// when the history cannot answer and [`SKIP`] is set; an error naming what was missing, why,
/// and [`SKIP`] when it is not.
pub(crate) fn read<T>(
    what: &str,
    read: impl FnOnce(&Git) -> Result<T, String>,
) -> Result<Option<T>, String> {
    let git = Git::new();
    match read(&git) {
        Ok(value) => Ok(Some(value)),
        Err(error) => {
            let why = format!("cannot read {what} from git ({}): {error}", git.hint());
            if std::env::var_os(SKIP).is_some() {
                println!("skipped ({SKIP} is set): {why}");
                Ok(None)
            } else {
                Err(format!(
                    "{why}; this test needs the history (set {SKIP}=1 to skip it knowingly)"
                ))
            }
        }
    }
}
